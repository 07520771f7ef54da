// The sparse-QR uberkernel's TILE-64 variants (uberkernel.cu, the same
// templates): a file of their own, so that they compile as a module of their
// own, only for a factorization that asks for TILE 64, never beside the
// default TILE-32 variants (scipy_gpuqr/_engine/gpu/factorize_kernels.py).
#include "uberkernel.cu"
