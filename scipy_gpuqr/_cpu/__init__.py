"""SuiteSparse (COLAMD through ctypes; AMD, SuiteSparseQR through cffi in ABI mode), loaded at run time.

No compiler and no SuiteSparse headers are needed: the libraries are opened
when first used (:mod:`._libs` finds them, ``SUITESPARSE_LIBDIR`` overrides),
and a missing library is a :class:`~scipy_gpuqr._errors.LibraryNotFound`
that callers turn into a fallback. cffi's C declarations are parsed once per
cache folder, not once per process (:mod:`._ffi_cache`). This part imports
numpy, scipy, ctypes, cffi and ``scipy_gpuqr._errors``, ``._mapped_files`` and
``._cachedir`` only; nothing in it knows about the GPU.
"""
