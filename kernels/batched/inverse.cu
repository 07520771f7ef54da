// inverse.cu: the pieces of the blocked inverse of n > 64 that are not GEMMs
// (scipy_gpuqr/batched/_gpu_blocked.py, inverse_blocks).
//
// With P A = L U (the LU of getrf, LAPACK's pivots), A^{-1} = U^{-1} L^{-1} P.
// The driver forms P (pivot_identity), then Y = L^{-1} P and X = U^{-1} Y by
// block rows of NB: each block row is the block's right-hand side less the
// product of the rows already solved (a strided-batched GEMM), multiplied by
// the inverse of the diagonal block's triangle (a second GEMM). The inverses
// of the diagonal blocks' triangles come from tri_inv_blocks.
//
// tri_inv_blocks<T, NB>: one thread block per (matrix, diagonal block), 2 NB
// threads. The block A[r0:r0+m, r0:r0+m] of the LU (m = min(NB, n - r0); the
// rest of an NB x NB tile is the identity) goes to shared memory; thread j < NB
// computes column j of (unit lower L_bb)^{-1} by forward substitution, thread
// NB + j column j of (upper U_bb)^{-1} by back substitution, in registers
// (the loops are unrolled: the tile's rows are broadcast reads). Each writes
// its column into dl / du (batch, nblk, NB, NB), row by row (a warp writes
// consecutive entries). An exactly zero diagonal entry of U gives infs or
// NaNs in that matrix's U_bb^{-1} only (its info is > 0: the caller fills
// its result with NaN or raises).
//
// pivot_identity<T>: one thread block per matrix: the pivots (0-based swaps,
// LAPACK order) applied to 0 .. n-1 in shared memory by one thread, then
// P (row r has its one in column perm[r]) written by all threads, a warp per
// row at a time. A pivot outside [0, n) (a matrix holding an inf or NaN) is
// skipped.
#include "common.cuh"

// ---------------------------------------------------------------------------
// input:  lu (batch, n, n) row-major, L unit lower and U in one array
// output: dl, du (batch, nblk, NB, NB): (L_bb)^{-1}, (U_bb)^{-1}, nblk = ceil(n / NB)
// grid:   batch * nblk blocks; block: 2 * NB threads
// ---------------------------------------------------------------------------
template <typename T, int NB>
__global__ void __launch_bounds__(2 * NB)
tri_inv_blocks(const T *__restrict__ lu, T *__restrict__ dl, T *__restrict__ du, int n)
{
    __shared__ T s[NB][NB + 1];
    const int nblk = (n + NB - 1) / NB;
    const long long mat = blockIdx.x / nblk;
    const int blk = (int)(blockIdx.x - mat * nblk);
    const int r0 = blk * NB;
    const int m = min(NB, n - r0);
    const T *src = lu + mat * (long long)n * n + (long long)r0 * n + r0;
    for (int idx = threadIdx.x; idx < NB * NB; idx += 2 * NB) {
        const int i = idx / NB, j = idx - (idx / NB) * NB;
        s[i][j] = (i < m && j < m) ? src[(long long)i * n + j] : (i == j ? T(1) : T(0));
    }
    __syncthreads();
    const bool upper = threadIdx.x >= NB;
    const int j = upper ? threadIdx.x - NB : threadIdx.x;
    T x[NB];
    if (!upper) {
        // L x = e_j, L unit lower: x_k = [k == j] - sum_{q < k} L_kq x_q
#pragma unroll
        for (int k = 0; k < NB; ++k) {
            T acc = (k == j) ? T(1) : T(0);
#pragma unroll
            for (int q = 0; q < k; ++q) acc -= s[k][q] * x[q];
            x[k] = acc;
        }
    } else {
        // U x = e_j: x_k = ([k == j] - sum_{q > k} U_kq x_q) / U_kk
#pragma unroll
        for (int k = NB - 1; k >= 0; --k) {
            T acc = (k == j) ? T(1) : T(0);
#pragma unroll
            for (int q = k + 1; q < NB; ++q) acc -= s[k][q] * x[q];
            x[k] = acc / s[k][k];
        }
    }
    T *dst = (upper ? du : dl) + (mat * nblk + blk) * (long long)(NB * NB) + j;
#pragma unroll
    for (int k = 0; k < NB; ++k) dst[k * NB] = x[k];
}

// ---------------------------------------------------------------------------
// input:  piv (batch, n) int32, 0-based (LAPACK's swaps)
// output: p (batch, n, n) row-major: the permutation matrix P of P A = L U
// grid:   batch blocks; block: 256 threads; dynamic shared memory: 2 n ints
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
pivot_identity(const int *__restrict__ piv, T *__restrict__ p, int n)
{
    extern __shared__ int sh[];
    int *perm = sh, *pv = sh + n;
    const long long mat = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        perm[i] = i;
        pv[i] = piv[mat * n + i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 0; k < n; ++k) {
            const int q = pv[k];
            if (q != k && q >= 0 && q < n) {
                const int t = perm[k];
                perm[k] = perm[q];
                perm[q] = t;
            }
        }
    }
    __syncthreads();
    T *dst = p + mat * (long long)n * n;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < n; r += warps) {
        const int one = perm[r];
        T *row = dst + (long long)r * n;
        for (int c = lane; c < n; c += 32) row[c] = (c == one) ? T(1) : T(0);
    }
}
