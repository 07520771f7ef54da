// Triangular solves with R's front blocks, read where the factorization left them.
//
// Front f's rows of R are the first rk rows of its factorized front (row-major,
// leading dimension fn, base `off` in the front pool): [U | S] over the front's
// columns cols[c0 .. c0+fn) (U upper triangular; the entries below its diagonal hold
// Householder data and are never read). One thread block solves one front for one
// right-hand-side column j (blockIdx.y) of Y (n x k, row-major, double):
//
//   UPPER (R y = c, fronts by depth from the root, ancestors first):
//       Y[piv] <- U^{-1} (Y[piv] - S Y[cols_o])          (pull, no conflicts)
//   TRANSPOSED (R^T y = c, fronts by height from the leaves, descendants first):
//       Y[piv] <- U^{-T} Y[piv];  Y[cols_o] -= S^T Y[piv] (push, atomicAdd: several
//                                                        fronts of a level may push
//                                                        into one ancestor column)
//
// piv = cols[c0 .. c0+rk), cols_o = cols[c0+rk .. c0+fn). The host
// (scipy_gpuqr/_engine/gpu/trsolve.py) groups the fronts into levels and launches one
// grid per level; `desc` holds 4 int64 per front: off, fn, rk, c0.
//
// rsolve_wide: the same solves for many right-hand-side columns (a rank decision's
// blocks, hundreds of columns), of fronts with at most RSOLVE_WIDE_ROWS rows of R:
// one thread per column j (blockIdx.y * NT + threadIdx.x), the front's Y[piv] in
// registers, R's values read once per block for all its columns (the same address
// across the threads) and Y's rows read and pushed across consecutive columns. Its
// transposed solve makes rsolve_transposed's operations per column in the same order;
// the upper solve sums S Y[cols_o] and the back substitution's terms in column order.
#include "factorize.cuh"

namespace gpuqr {

// Values of Y[cols_o] a block of rsolve_upper holds in shared memory at a time.
constexpr int RSOLVE_CHUNK = 1024;

template <typename T, int NT>
__device__ void rsolve_upper(const T* __restrict__ F, int fn, int rk,
                             const long long* __restrict__ cf, double* __restrict__ Y,
                             int k, int j, double* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Y[piv] -= S Y[cols_o], one warp per row; Y[cols_o] gathered once per block into
    // shared memory, RSOLVE_CHUNK values at a time (each row's warp would otherwise
    // gather all of them from global memory again: rk times the gathers)
    __shared__ double ys[RSOLVE_CHUNK];
    for (int t0 = rk; t0 < fn; t0 += RSOLVE_CHUNK) {
        const int tn = min(RSOLVE_CHUNK, fn - t0);
        for (int t = tid; t < tn; t += NT) ys[t] = Y[cf[t0 + t] * k + j];
        __syncthreads();
        for (int i = warp; i < rk; i += NT / 32) {
            const T* Fi = F + (long long)i * fn + t0;
            double s = 0.0;
            for (int t = lane; t < tn; t += 32) s += (double)Fi[t] * ys[t];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
            if (lane == 0) Y[cf[i] * k + j] -= s;
        }
        __syncthreads();                     // ys is read before the next chunk fills it
    }
    for (int i = rk - 1; i >= 0; --i) {      // back substitution, row i contiguous
        double p = 0.0;
        for (int t = i + 1 + tid; t < rk; t += NT)
            p += (double)F[(long long)i * fn + t] * Y[cf[t] * k + j];
        const double s = block_sum<double, NT>(p, red);
        if (tid == 0) {
            const long long y = cf[i] * k + j;
            Y[y] = (Y[y] - s) / (double)F[(long long)i * fn + i];
        }
        __syncthreads();
    }
}

template <typename T, int NT>
__device__ void rsolve_transposed(const T* __restrict__ F, int fn, int rk,
                                  const long long* __restrict__ cf, double* __restrict__ Y,
                                  int k, int j) {
    const int tid = threadIdx.x;
    for (int i = 0; i < rk; ++i) {           // forward substitution with U^T
        const double yi = Y[cf[i] * k + j] / (double)F[(long long)i * fn + i];
        __syncthreads();                     // every thread has read Y[piv_i]
        if (tid == 0) Y[cf[i] * k + j] = yi;
        for (int t = i + 1 + tid; t < rk; t += NT)
            Y[cf[t] * k + j] -= (double)F[(long long)i * fn + t] * yi;
        __syncthreads();
    }
    for (int t = rk + tid; t < fn; t += NT) {  // Y[cols_o] -= S^T Y[piv]
        double s = 0.0;
        for (int i = 0; i < rk; ++i) s += (double)F[(long long)i * fn + t] * Y[cf[i] * k + j];
        atomicAdd(&Y[cf[t] * k + j], -s);
    }
}

template <typename T, int NT, bool TRANS>
__global__ void __launch_bounds__(NT)
rsolve(const long long* __restrict__ desc, const T* __restrict__ pool,
       const long long* __restrict__ cols, double* __restrict__ Y, int k) {
    __shared__ double red[NT / 32];
    const long long* d = desc + 4 * (long long)blockIdx.x;
    const long long off = d[0];
    const int fn = (int)d[1], rk = (int)d[2];
    const long long* cf = cols + d[3];
    const int j = blockIdx.y;
    if (j >= k || rk <= 0) return;           // uniform over the block
    if (TRANS) {
        rsolve_transposed<T, NT>(pool + off, fn, rk, cf, Y, k, j);
    } else {
        rsolve_upper<T, NT>(pool + off, fn, rk, cf, Y, k, j, red);
    }
}

// Most rows of R of a front that rsolve_wide solves (its registers per thread).
constexpr int RSOLVE_WIDE_ROWS = 32;

// One column j of one front for rsolve_wide, its rk <= ROWS pivots in registers (the
// loops unrolled to ROWS, guarded by rk).
template <typename T, int ROWS, bool TRANS>
__device__ __forceinline__ void rsolve_wide_column(const T* __restrict__ F, int fn, int rk,
                                                   const long long* __restrict__ cf,
                                                   double* __restrict__ Y, long long k,
                                                   long long j) {
    double y[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) y[i] = i < rk ? Y[cf[i] * k + j] : 0.0;
    if (TRANS) {
        // forward substitution with U^T: rsolve_transposed's operations, per column
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            if (i < rk) {
                y[i] = y[i] / (double)F[(long long)i * fn + i];
#pragma unroll
                for (int t = i + 1; t < ROWS; ++t)
                    if (t < rk) y[t] -= (double)F[(long long)i * fn + t] * y[i];
            }
        }
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
            if (i < rk) Y[cf[i] * k + j] = y[i];
        for (int t = rk; t < fn; ++t) {       // Y[cols_o] -= S^T Y[piv]
            double s = 0.0;
#pragma unroll
            for (int i = 0; i < ROWS; ++i)
                if (i < rk) s += (double)F[(long long)i * fn + t] * y[i];
            atomicAdd(&Y[cf[t] * k + j], -s);
        }
    } else {
        // Y[piv] -= S Y[cols_o], then back substitution with U
        for (int t = rk; t < fn; ++t) {
            const double v = Y[cf[t] * k + j];
#pragma unroll
            for (int i = 0; i < ROWS; ++i)
                if (i < rk) y[i] -= (double)F[(long long)i * fn + t] * v;
        }
#pragma unroll
        for (int i = ROWS - 1; i >= 0; --i) {
            if (i < rk) {
                double s = 0.0;
#pragma unroll
                for (int t = i + 1; t < ROWS; ++t)
                    if (t < rk) s += (double)F[(long long)i * fn + t] * y[t];
                y[i] = (y[i] - s) / (double)F[(long long)i * fn + i];
            }
        }
#pragma unroll
        for (int i = 0; i < ROWS; ++i)
            if (i < rk) Y[cf[i] * k + j] = y[i];
    }
}

template <typename T, int NT, bool TRANS>
__global__ void __launch_bounds__(NT)
rsolve_wide(const long long* __restrict__ desc, const T* __restrict__ pool,
            const long long* __restrict__ cols, double* __restrict__ Y, int k) {
    const long long* d = desc + 4 * (long long)blockIdx.x;
    const T* F = pool + d[0];
    const int fn = (int)d[1], rk = (int)d[2];
    const long long* cf = cols + d[3];
    const long long j = (long long)blockIdx.y * NT + threadIdx.x;
    if (j >= k || rk <= 0 || rk > RSOLVE_WIDE_ROWS) return;
    // the unrolled loops sized to the front (uniform over the block)
    if (rk <= 8) {
        rsolve_wide_column<T, 8, TRANS>(F, fn, rk, cf, Y, k, j);
    } else if (rk <= 16) {
        rsolve_wide_column<T, 16, TRANS>(F, fn, rk, cf, Y, k, j);
    } else {
        rsolve_wide_column<T, RSOLVE_WIDE_ROWS, TRANS>(F, fn, rk, cf, Y, k, j);
    }
}

}  // namespace gpuqr
