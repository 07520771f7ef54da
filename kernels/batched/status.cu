// status.cu: the device-side passes behind the batched public functions'
// warnings and exceptions where the kernels do not report themselves
// (scipy_gpuqr/batched/_gpu_common.py): n > 32, the variable-size batches
// and the Cholesky solve's unused triangle. The status word, its slots and
// ctl (a generation and flags) are described in status.cuh; the factorization
// kernels of n <= 32 report through the same helpers without these passes.
#include "common.cuh"
#include "status.cuh"

// ---------------------------------------------------------------------------
// One pass over info (batch,): marks status slot 0 when some info > 0 and
// slot 1 when some info < 0 (status may be null: no marks); with
// CTL_CLEAR_NEG info < 0 becomes 0; x not null and CTL_NAN_FILL: every
// matrix with info > 0 gets nn NaNs at x + m * nn, written by a whole warp.
// Block: a multiple of 32 threads; every warp walks whole groups of 32 matrices.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void info_scan(int *__restrict__ info, long long batch, T *__restrict__ x,
                          long long nn, unsigned long long *__restrict__ status,
                          unsigned long long ctl)
{
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    bool pos = false, neg = false;
    const bool fill = x != nullptr && (ctl & gpuqr_status::CTL_NAN_FILL);
    for (long long base = warp * 32; base < batch; base += warps * 32) {
        const long long m = base + lane;
        const int v = m < batch ? info[m] : 0;
        pos = pos || v > 0;
        if (v < 0) {
            neg = true;
            if (ctl & gpuqr_status::CTL_CLEAR_NEG) info[m] = 0;
        }
        if (fill) {
            unsigned bad = __ballot_sync(0xffffffffu, v > 0);
            while (bad) {
                const int l = __ffs(bad) - 1;
                bad &= bad - 1;
                T *xm = x + (base + l) * nn;
                for (long long e = lane; e < nn; e += 32) xm[e] = gpuqr_status::quiet_nan<T>();
            }
        }
    }
    if (__any_sync(0xffffffffu, pos) && lane == 0) gpuqr_status::mark(status, ctl, 0);
    if (__any_sync(0xffffffffu, neg) && lane == 0) gpuqr_status::mark(status, ctl, 1);
}

// ---------------------------------------------------------------------------
// Marks status[slot] when x[0 .. count) (contiguous) holds an inf or NaN.
// Used where a solve kernel does not check its inputs itself.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void nonfinite_scan(const T *__restrict__ x, long long count,
                               unsigned long long *__restrict__ status,
                               unsigned long long ctl, int slot)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    bool bad = false;
    // every thread of a warp runs the same number of iterations (__any_sync needs all lanes)
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long first = start - (threadIdx.x & 31);
    for (long long i0 = first; i0 < count; i0 += stride) {
        const long long i = i0 + (threadIdx.x & 31);
        if (i < count && !isfinite(x[i])) bad = true;
    }
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0)
        gpuqr_status::mark(status, ctl, slot);
}
