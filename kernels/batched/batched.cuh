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

}  // namespace gpuqr_batched
