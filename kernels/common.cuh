// Shared tunables and helpers for every kernel family.
// NVRTC is run without system headers: use builtin types only.
#pragma once

typedef long long gpuqr_int64;
typedef int gpuqr_int32;

#define GPUQR_WARP 32

// Smallest positive normal number (LAPACK's sfmin): a pivot at least this
// large has a representable reciprocal, so the column below it is scaled by
// the reciprocal; a smaller pivot divides (as LAPACK's getf2 / getrf2).
template <typename T> __device__ __forceinline__ T gpuqr_sfmin();
template <> __device__ __forceinline__ double gpuqr_sfmin<double>() { return 2.2250738585072014e-308; }
template <> __device__ __forceinline__ float gpuqr_sfmin<float>() { return 1.17549435e-38f; }
