// small.cuh: helpers shared by the n <= 32 batched register kernels.
//
// Layout conventions (every kernel of cholesky.cu):
//   * matrices are row-major, contiguous, n*n elements each;
//   * one thread per row; the rows of one matrix live in one "segment" of
//     SEG = next power of two >= n lanes of a warp, so warp-level reductions
//     and broadcasts never cross a warp;
//   * a block holds blockDim.x / SEG matrices (tunable from Python);
//   * global memory is read and written through shared memory so that the
//     accesses are coalesced (a block's matrices are one contiguous range).
#pragma once

#include "common.cuh"

#ifndef STAGE_UNROLL
#define STAGE_UNROLL 8   // loads in flight per thread while staging (tunable)
#endif

namespace gpuqr_batched {

template <int N>
struct Seg {
    static constexpr int value = N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 :
                                 N <= 8 ? 8 : N <= 16 ? 16 : 32;
};

// Odd leading dimension: conflict-free row-per-thread access to the staging area.
template <int N>
struct Ld {
    static constexpr int value = N | 1;
};

template <typename T> struct Vec;
template <> struct Vec<double> { typedef double2 type; static constexpr int width = 2; };
template <> struct Vec<float>  { typedef float4  type; static constexpr int width = 4; };

// Broadcast buffer length per matrix: n rounded up to the vector width.
template <typename T, int N>
struct Bcast {
    static constexpr int value = ((N + Vec<T>::width - 1) / Vec<T>::width) * Vec<T>::width;
};

template <typename T> __device__ __forceinline__ T sfmin();
template <> __device__ __forceinline__ double sfmin<double>() { return 2.2250738585072014e-308; }
template <> __device__ __forceinline__ float sfmin<float>() { return 1.17549435e-38f; }

template <typename T> __device__ __forceinline__ bool finite(T x) { return isfinite(x); }

// Lanes [base, base + SEG) of the warp as a mask.
template <int SEG>
__device__ __forceinline__ unsigned seg_mask(int lane) {
    if (SEG == 32) return 0xffffffffu;
    unsigned m = (1u << SEG) - 1u;
    return m << (lane & ~(SEG - 1));
}

// Order-preserving 64-bit key of |x| (x finite or not): the bit pattern of a
// non-negative IEEE number grows with its value.
__device__ __forceinline__ void abs_key(double x, unsigned &hi, unsigned &lo) {
    unsigned long long b = (unsigned long long)__double_as_longlong(fabs(x));
    hi = (unsigned)(b >> 32);
    lo = (unsigned)(b & 0xffffffffull);
}
__device__ __forceinline__ void abs_key(float x, unsigned &hi, unsigned &lo) {
    hi = (unsigned)__float_as_int(fabsf(x));
    lo = 0u;
}

// Segment-wide choice of the pivot: the largest key among candidates, ties
// going to the smallest current position `pos` (LAPACK i?amax takes the
// first). Non-candidates pass cand = false. Returns the winning position
// (or 255 when no lane is a candidate).
template <int SEG>
__device__ __forceinline__ int pivot_pos(unsigned mask, bool cand, unsigned hi,
                                         unsigned lo, int pos) {
    unsigned h = cand ? hi : 0u;
    unsigned mh = __reduce_max_sync(mask, h);
    bool c1 = cand && hi == mh;
    unsigned ml = __reduce_max_sync(mask, c1 ? lo : 0u);
    bool c2 = c1 && lo == ml;
    return (int)__reduce_min_sync(mask, c2 ? (unsigned)pos : 255u);
}

// Load nmat matrices (contiguous, starting at src) into the padded staging area.
template <typename T, int N>
__device__ __forceinline__ void stage_in(T *sm, const T *__restrict__ src, int nmat) {
    constexpr int LD = Ld<N>::value;
    const int total = nmat * N * N;
    // STAGE_UNROLL independent loads in flight per thread (one at a time
    // leaves the copy latency-bound at a fraction of the bandwidth)
    int e = threadIdx.x;
    for (; e + (STAGE_UNROLL - 1) * (int)blockDim.x < total; e += STAGE_UNROLL * blockDim.x) {
        T v[STAGE_UNROLL];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) v[u] = src[e + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < STAGE_UNROLL; ++u) {
            int f = e + u * blockDim.x;
            int m = f / (N * N);
            int r = f - m * (N * N);
            int i = r / N;
            int j = r - i * N;
            sm[(m * N + i) * LD + j] = v[u];
        }
    }
    for (; e < total; e += blockDim.x) {
        int m = e / (N * N);
        int r = e - m * (N * N);
        int i = r / N;
        int j = r - i * N;
        sm[(m * N + i) * LD + j] = src[e];
    }
}

template <typename T, int N>
__device__ __forceinline__ void stage_out(T *__restrict__ dst, const T *sm, int nmat) {
    constexpr int LD = Ld<N>::value;
    const int total = nmat * N * N;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int m = e / (N * N);
        int r = e - m * (N * N);
        int i = r / N;
        int j = r - i * N;
        dst[e] = sm[(m * N + i) * LD + j];
    }
}

// Runtime-size variants (n <= N): rows and columns >= n are not stored.
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

// The pivot lane writes row[from..N) into the broadcast buffer (vector stores).
template <typename T, int N>
__device__ __forceinline__ void bcast_store(T *buf, const T (&row)[N], int from) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
    constexpr int NB = Bcast<T, N>::value;
#pragma unroll
    for (int q = 0; q < NB / VW; ++q) {
        if ((q + 1) * VW > from) {
            union { V v; T s[VW]; } u;
#pragma unroll
            for (int t = 0; t < VW; ++t) u.s[t] = (q * VW + t < N) ? row[(q * VW + t < N) ? q * VW + t : 0] : T(0);
            reinterpret_cast<V *>(buf)[q] = u.v;
        }
    }
}

}  // namespace gpuqr_batched
