// solve_warp.cu: solves A x = b with batched LU factors (getrs_warp, no
// transpose) and with Cholesky factors (potrs_warp), n <= 32: a warp per tile of 32 / SEG matrices, SEG = next power
// of two >= N lanes per matrix, lane r holding row r of the factor in
// registers (N is a template parameter: every loop unrolls).
//
// Why: getrs_batched of solve.cu gives a thread to each (matrix, column)
// and walks the whole factor from global memory, a row at a time, through
// a solution vector that it also keeps in global memory. Here the factor is
// read once, a row per lane, and the triangular solves run by shuffles
// (lu_solve_rows of warp.cuh: one shuffle per step); the row swaps of piv
// are turned into the permutation first (three shuffles per pivot), so that
// lane r starts with b[perm[r]] = (P b)[r].
//
// input, not modified: lu (batch, N, N), piv (batch, N) 0-based, b (matrix
//   m's nrhs columns at b + m * bstride, row-major (N, nrhs); bstride 0: one
//   b for every matrix)
// output: x (batch, N, nrhs)
// status, ctl (status.cuh; null status: no marks): an inf or NaN in the
// factor marks slot 2, in b slot 3 (as getrs_batched). info (null: none):
// with CTL_NAN_FILL a matrix whose info is > 0 gets an all-NaN solution and
// its factor is not looked at. Pivots out of [0, N) are clamped (garbage
// results, no access outside the matrix's rows).
// Launch: blockDim.x a multiple of 32 (<= 256), any grid (grid-stride over
// tiles: warp_row_tasks of warp.cuh).
#include "warp.cuh"

using namespace gpuqr_warp;

template <typename T, int N>
__global__ void __launch_bounds__(256)
getrs_warp(const T *__restrict__ lu, const int *__restrict__ piv, const T *__restrict__ b,
           T *__restrict__ x, int nrhs, long long batch, long long bstride,
           unsigned long long *__restrict__ status, unsigned long long ctl,
           const int *__restrict__ info)
{
    bool bad_f = false, bad_b = false;
    warp_row_tasks<N>(batch, [&](long long m, bool active, int r, int base) {
        const bool nan = active && info != nullptr && gpuqr_status::nan_result(info[m], ctl);
        T row[N];
        int pv = r;
        bool rowbad = false;
        if (active) {
            const T *src = lu + (m * N + r) * N;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                row[j] = __ldg(src + j);
                rowbad |= !finite_bits(row[j]);
            }
            pv = __ldg(piv + m * N + r);
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) row[j] = T(j == r);
        }
        bad_f |= rowbad && !nan;
        // perm[r]: the original row at LAPACK position r after the swaps of piv
        int perm = r;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            int p = __shfl_sync(0xffffffffu, pv, base + k);
            p = (unsigned)p < (unsigned)N ? p : N - 1;
            const int pk = __shfl_sync(0xffffffffu, perm, base + k);
            const int pp = __shfl_sync(0xffffffffu, perm, base + p);
            if (r == k) perm = pp;
            else if (r == p) perm = pk;
        }
        T d = T(1);
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (j == r) d = row[j];
        const T rd = T(1) / d;
#pragma unroll 1
        for (int c = 0; c < nrhs; ++c) {
            T s = T(0);
            if (active) {
                s = __ldg(b + m * bstride + (long long)perm * nrhs + c);
                bad_b |= !finite_bits(s);
            }
            const T xv = lu_solve_rows<T, N>(s, r, d, rd, [&](int j) { return row[j]; },
                                             [&](int j) { return base + j; });
            if (active)
                x[(m * N + r) * (long long)nrhs + c] = nan ? gpuqr_status::quiet_nan<T>() : xv;
        }
    });
    if (bad_f) gpuqr_status::mark(status, ctl, 2);
    if (bad_b) gpuqr_status::mark(status, ctl, 3);
}

// ---------------------------------------------------------------------------
// Solves with a Cholesky factor c (lower: A = L L^T, L in the lower
// triangle; else A = U^T U, U in the upper one): G y = b, then G^T x = y,
// G = L or U^T. Lane r keeps g[j] = G[r][j] for j <= r (its row of G) and
// G[j][r] for j > r (its column of G): N registers, what both sweeps need
// (forward: row r left of the diagonal; backward: column r below it). Each
// lane also reads the rest of its row of c, so that the whole of c is
// checked for infs and NaNs (slot 2), as SciPy's cho_solve checks it, with
// no pass of its own; b marks slot 3.
// input, not modified: c (batch, N, N), b (as getrs_warp)
// output: x (batch, N, nrhs)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void __launch_bounds__(256)
potrs_warp(const T *__restrict__ c, const T *__restrict__ b, T *__restrict__ x, int nrhs,
           long long batch, int lower, long long bstride,
           unsigned long long *__restrict__ status, unsigned long long ctl)
{
    bool bad_f = false, bad_b = false;
    warp_row_tasks<N>(batch, [&](long long m, bool active, int r, int base) {
        T g[N];
        if (active) {
            const T *M = c + m * N * N;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const T v = __ldg(M + r * N + j);              // row r of c
                bad_f |= !finite_bits(v);
                // lower: G row r = c row r (j <= r); upper: G column r = c row r (j >= r)
                g[j] = v;
            }
#pragma unroll
            for (int j = 0; j < N; ++j) {
                // lower: G column r below the diagonal = c column r (j > r);
                // upper: G row r left of the diagonal = c column r (j < r)
                if (lower ? j > r : j < r) g[j] = __ldg(M + j * N + r);
            }
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) g[j] = T(j == r);
        }
        T d = T(1);
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (j == r) d = g[j];
        const T rd = T(1) / d;
#pragma unroll 1
        for (int col = 0; col < nrhs; ++col) {
            T s = T(0);
            if (active) {
                s = __ldg(b + m * bstride + (long long)r * nrhs + col);
                bad_b |= !finite_bits(s);
            }
#pragma unroll
            for (int j = 0; j < N; ++j) {                     // G y = b
                if (r == j) {
                    const T q = s * rd;
                    s = fma(fma(-q, d, s), rd, q);
                }
                const T yj = __shfl_sync(0xffffffffu, s, base + j);
                if (r > j) s = fma(-g[j], yj, s);
            }
#pragma unroll
            for (int j = N - 1; j >= 0; --j) {                // G^T x = y
                if (r == j) {
                    const T q = s * rd;
                    s = fma(fma(-q, d, s), rd, q);
                }
                const T xj = __shfl_sync(0xffffffffu, s, base + j);
                if (r < j) s = fma(-g[j], xj, s);
            }
            if (active) x[(m * N + r) * (long long)nrhs + col] = s;
        }
    });
    if (bad_f) gpuqr_status::mark(status, ctl, 2);
    if (bad_b) gpuqr_status::mark(status, ctl, 3);
}
