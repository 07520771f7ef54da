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

namespace gpuqr {

// The sum of v over a block of NT threads (a multiple of 32), valid in thread 0
// only: warp shuffles, then thread 0 adds the warps' sums in warp order (a fixed
// order: the same bits every run). red: NT / 32 elements of shared memory; the
// barrier before it is written lets one red serve consecutive sums.
template <typename T, int NT>
__device__ __forceinline__ T block_sum(T v, T* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T s = 0;
    if (threadIdx.x == 0) {
        for (int w = 0; w < NT / 32; ++w) s += red[w];
    }
    return s;  // valid in thread 0 only
}

}  // namespace gpuqr
