// batched.cuh: helpers shared by the n <= 32 register kernels of
// kernels/batched/ (small.cuh: cholesky.cu; warp.cuh: lu_warp.cu, lu_mma.cu).
// Helpers of every batched kernel (gpuqr_sfmin) are in common.cuh.
#pragma once

#include "common.cuh"
#include "status.cuh"

namespace gpuqr_batched {

// Lanes per matrix of the row-per-lane layouts: the next power of two >= N,
// so that a matrix's rows never straddle two warps.
template <int N>
struct Seg {
    static constexpr int value = N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 :
                                 N <= 8 ? 8 : N <= 16 ? 16 : 32;
};

// 16-byte vector of T (shared-memory broadcasts and coalesced copies).
template <typename T> struct Vec;
template <> struct Vec<double> { typedef double2 type; static constexpr int width = 2; };
template <> struct Vec<float>  { typedef float4  type; static constexpr int width = 4; };

// Lanes [base, base + SEG) of the warp as a mask (SEG a power of two <= 32).
template <int SEG>
__device__ __forceinline__ unsigned seg_mask(int lane) {
    if constexpr (SEG == 32) return 0xffffffffu;
    else return ((1u << SEG) - 1u) << (lane & ~(SEG - 1));
}

// Per-matrix orders of a padded stack (the *_vbatched calls): matrix m of a
// stack of order n is its leading sizes[m] x sizes[m] block, the rest read as
// the identity. sizes: int64 (szw == 8) or int32 entries, null for "every
// matrix fills the stack".
//
// The load and the range check are two steps: order_raw only issues the
// load (nothing uses the register yet), order_check tests it where the order
// is needed. A check right after the load would stall the warp there for a
// global load's whole latency (the compiler must place the compare and its
// branch at the load), wherever the load is issued.
__device__ __forceinline__ long long order_raw(const void *sizes, int szw, long long m) {
    return szw == 8 ? __ldg(reinterpret_cast<const long long *>(sizes) + m)
                    : (long long)__ldg(reinterpret_cast<const int *>(sizes) + m);
}

// The order of a matrix whose size entry is k: k in [0, n], or -1 for a size
// outside [0, n] (slot 4 of the status word marked: the matrix is then read
// as all NaN, so its info is -1 and its results NaN).
__device__ __forceinline__ int order_check(long long k, int n, unsigned long long *status,
                                           unsigned long long ctl) {
    if (k < 0 || k > n) {
        gpuqr_status::mark(status, ctl, gpuqr_status::SLOT_SIZES);
        return -1;
    }
    return (int)k;
}

// order_check(order_raw(...)) of matrix m (n without sizes), for the kernels
// that use the order right where it is loaded.
__device__ __forceinline__ int matrix_order(const void *sizes, int szw, long long m, int n,
                                            unsigned long long *status, unsigned long long ctl) {
    if (sizes == nullptr) return n;
    return order_check(order_raw(sizes, szw, m), n, status, ctl);
}

// Entry (i, j) of a matrix of order nk (matrix_order) inside its stack: the
// loaded value v, the identity outside nk x nk, NaN when nk < 0.
template <typename T>
__device__ __forceinline__ T order_masked(T v, int i, int j, int nk) {
    return nk < 0 ? gpuqr_status::quiet_nan<T>() : (i < nk && j < nk) ? v : T(i == j);
}

}  // namespace gpuqr_batched
