// small.cuh: helpers of the n <= 32 row-per-thread Cholesky kernel
// (cholesky.cu).
//
// Layout conventions:
//   * matrices are row-major, contiguous, n*n elements each;
//   * one thread per row; the rows of one matrix live in one "segment" of
//     SEG = next power of two >= n lanes of a warp, so warp-level reductions
//     and broadcasts never cross a warp;
//   * a block holds blockDim.x / SEG matrices (tunable from Python);
//   * global memory is read and written through shared memory so that the
//     accesses are coalesced (a block's matrices are one contiguous range).
#pragma once

#include "batched.cuh"

#ifndef STAGE_UNROLL
#define STAGE_UNROLL 8   // loads in flight per thread while staging (tunable)
#endif

namespace gpuqr_batched {

// Odd leading dimension: conflict-free row-per-thread access to the staging area.
template <int N>
struct Ld {
    static constexpr int value = N | 1;
};

// Broadcast buffer length per matrix: n rounded up to the vector width.
template <typename T, int N>
struct Bcast {
    static constexpr int value = ((N + Vec<T>::width - 1) / Vec<T>::width) * Vec<T>::width;
};

template <typename T> __device__ __forceinline__ bool finite(T x) { return isfinite(x); }

// Copy nmat matrices of order n <= N (contiguous, starting at src) into the
// staging area of N x LD per matrix; rows and columns >= n are not stored.
template <typename T, int N>
__device__ __forceinline__ void stage_in_n(T *sm, const T *__restrict__ src, int nmat, int n) {
    constexpr int LD = Ld<N>::value;
    const int total = nmat * n * n;
    int e = threadIdx.x;
    for (; e + (STAGE_UNROLL - 1) * (int)blockDim.x < total; e += STAGE_UNROLL * blockDim.x) {
        T v[STAGE_UNROLL];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) v[u] = src[e + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) {
            int f = e + u * blockDim.x;
            int m = f / (n * n);
            int r = f - m * (n * n);
            int i = r / n;
            int j = r - i * n;
            sm[(m * N + i) * LD + j] = v[u];
        }
    }
    for (; e < total; e += blockDim.x) {
        int m = e / (n * n);
        int r = e - m * (n * n);
        int i = r / n;
        int j = r - i * n;
        sm[(m * N + i) * LD + j] = src[e];
    }
}

// The staging area back to nmat contiguous n x n matrices at dst.
template <typename T, int N>
__device__ __forceinline__ void stage_out_n(T *__restrict__ dst, const T *sm, int nmat, int n) {
    constexpr int LD = Ld<N>::value;
    const int total = nmat * n * n;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int m = e / (n * n);
        int r = e - m * (n * n);
        int i = r / n;
        int j = r - i * n;
        dst[e] = sm[(m * N + i) * LD + j];
    }
}

}  // namespace gpuqr_batched
