"""SuiteSparse (COLAMD, SuiteSparseQR) through cffi in ABI mode, loaded at run time."""
