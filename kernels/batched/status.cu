// status.cu: the device-side summaries behind the batched public functions'
// warnings and exceptions (scipy_gpuqr/batched/_gpu_common.py), so that no
// per-matrix array is copied to the host: a call zeroes a status word of four
// unsigned 64-bit counters (one memset), the kernels add to it, and the host
// reads those 32 bytes once.
//
// status slots (STATUS_* in _gpu_common.py); a slot is zero when nothing was seen
//   0: matrices with info > 0 (singular / not positive definite)
//   1: matrices with info < 0 (an inf or NaN in the input, flagged by the kernels)
//   2: non-finite entries seen in a factor (solves; nonzero, not an exact count)
//   3: non-finite entries seen in a right-hand side (idem)
#include "common.cuh"

namespace gpuqr_status {

template <typename T> __device__ __forceinline__ T quiet_nan();
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}
template <> __device__ __forceinline__ float quiet_nan<float>() {
    return __int_as_float(0x7fc00000);
}

// Sum of v over the 32 lanes of a warp (all lanes active), added to *slot by lane 0
// when nonzero: one atomic per warp, and none at all on the common path.
__device__ __forceinline__ void warp_add(unsigned long long *slot, unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0 && v != 0ull) atomicAdd(slot, v);
}

}  // namespace gpuqr_status

// ---------------------------------------------------------------------------
// One pass over info (batch,): counts info > 0 into status[0] and info < 0 into
// status[1] (status may be null: no counting); clear_neg: info < 0 becomes 0
// (check_finite=False); x not null: every matrix with info > 0 gets nn NaNs at
// x + m * nn (the NaN results of return_info=True), written by a whole warp.
// Block: a multiple of 32 threads; every warp walks whole groups of 32 matrices.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void info_scan(int *__restrict__ info, long long batch, T *__restrict__ x,
                          long long nn, unsigned long long *__restrict__ status,
                          int clear_neg)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    unsigned long long npos = 0, nneg = 0;
    for (long long base = warp * 32; base < batch; base += warps * 32) {
        const long long m = base + lane;
        const int v = m < batch ? info[m] : 0;
        if (v > 0) ++npos;
        if (v < 0) {
            ++nneg;
            if (clear_neg) info[m] = 0;
        }
        if (x != nullptr) {
            unsigned bad = __ballot_sync(0xffffffffu, v > 0);
            while (bad) {
                const int l = __ffs(bad) - 1;
                bad &= bad - 1;
                T *xm = x + (base + l) * nn;
                for (long long e = lane; e < nn; e += 32) xm[e] = gpuqr_status::quiet_nan<T>();
            }
        }
    }
    if (status != nullptr) {
        gpuqr_status::warp_add(status, npos);
        gpuqr_status::warp_add(status + 1, nneg);
    }
}

// ---------------------------------------------------------------------------
// status[slot] += the number of infs and NaNs among x[0 .. count) (contiguous).
// Used where a solve kernel does not check its inputs itself.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void nonfinite_scan(const T *__restrict__ x, long long count,
                               unsigned long long *__restrict__ status, int slot)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    // every thread of a warp runs the same number of iterations (warp_add needs all lanes)
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long first = start - (threadIdx.x & 31);
    for (long long i0 = first; i0 < count; i0 += stride) {
        const long long i = i0 + (threadIdx.x & 31);
        if (i < count && !isfinite(x[i])) ++bad;
    }
    gpuqr_status::warp_add(status + slot, bad);
}
