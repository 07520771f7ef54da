// panel.cu: one panel step of the blocked LU and of the blocked Cholesky
// with a thread block per matrix: the path for n > 512, where the
// row-per-thread panels of rows.cu (one thread per panel row, at most 512)
// stop. The trailing updates are cuBLAS strided-batched GEMMs issued by the
// driver (scipy_gpuqr/batched/_gpu_blocked.py) between the steps.
//
// getrf_panel: the panel A[k0:n, k0:k0+NB] is factorized in shared memory
//   (partial pivoting, LAPACK pivot order; block-wide barriers per column),
//   the row interchanges are applied to the columns left and right of the
//   panel (column-parallel swap), and U12 = L11^{-1} A12 is solved (one
//   thread per column).
// potrf_panel: on the lower triangle, the diagonal block is factorized in
//   shared memory and L21 = A21 L11^{-T} solved (one thread per row).
//
// info: 0, or k + 1 for the first exactly zero pivot (getrf_panel) or the
// first leading minor of order k + 1 that is not positive definite
// (potrf_panel); getrf_panel sets -1 for a non-finite entry among the
// entries it finalizes (every entry of L and U is finalized by exactly one
// panel step, and an inf/NaN in A always leaves a non-finite entry in L/U).
#include "common.cuh"

#ifndef GPUQR_PANEL_THREADS
#define GPUQR_PANEL_THREADS 256
#endif

// ---------------------------------------------------------------------------
// input/output: a (batch, n, n) row-major, overwritten step by step
// output:       piv (batch, n) entries k0..k0+nb-1; info (batch) (read too)
// dynamic shared memory: (n - k0) * NB * sizeof(T) + 32 * (sizeof(T) + 4)
// ---------------------------------------------------------------------------
template <typename T, int NB>
__global__ void __launch_bounds__(GPUQR_PANEL_THREADS)
getrf_panel(T *__restrict__ a, int *__restrict__ piv, int *__restrict__ info,
            int n, int k0)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const long long mat = blockIdx.x;
    T *A = a + mat * (long long)n * n;
    const int m = n - k0;
    const int nb = min(NB, m);
    T *P = reinterpret_cast<T *>(smem_raw);                 // m x NB panel
    T *rv = P + (long long)m * NB;                          // reduction values
    int *ri = reinterpret_cast<int *>(rv + 32);             // reduction rows
    __shared__ int spiv[NB];
    __shared__ int sinfo;
    __shared__ int sbad;
    const int tid = threadIdx.x;
    const int nth = blockDim.x;
    if (tid == 0) { sinfo = info[mat]; sbad = 0; }
#pragma unroll 8
    for (int e = tid; e < m * nb; e += nth) {
        int i = e / nb, j = e - i * nb;
        P[i * NB + j] = A[(long long)(k0 + i) * n + k0 + j];
    }
    __syncthreads();

    for (int j = 0; j < nb; ++j) {
        // block argmax of |P[i][j]|, i >= j, first index on ties
        T best = T(-1);
        int bi = 0x7fffffff;
        for (int i = j + tid; i < m; i += nth) {
            T v = fabs(P[i * NB + j]);
            if (v > best) { best = v; bi = i; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            T ov = __shfl_xor_sync(0xffffffffu, best, off);
            int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if ((tid & 31) == 0) { rv[tid >> 5] = best; ri[tid >> 5] = bi; }
        __syncthreads();
        if (tid == 0) {
            T b = rv[0];
            int p = ri[0];
            for (int w = 1; w < nth / 32; ++w)
                if (rv[w] > b || (rv[w] == b && ri[w] < p)) { b = rv[w]; p = ri[w]; }
            if (p >= m) p = j;
            spiv[j] = p;
            if (P[p * NB + j] == T(0) && sinfo == 0) sinfo = k0 + j + 1;
        }
        __syncthreads();
        const int p = spiv[j];
        const T pv = P[p * NB + j];
        if (p != j) {
            for (int c = tid; c < nb; c += nth) {
                T t = P[j * NB + c];
                P[j * NB + c] = P[p * NB + c];
                P[p * NB + c] = t;
            }
        }
        __syncthreads();
        if (pv != T(0)) {
            const T rinv = T(1) / pv;
            const bool big = fabs(pv) >= gpuqr_sfmin<T>();
            for (int i = j + 1 + tid; i < m; i += nth)
                P[i * NB + j] = big ? P[i * NB + j] * rinv : P[i * NB + j] / pv;
        }
        __syncthreads();
        const int w = nb - j - 1;
        if (w > 0) {
            for (int e = tid; e < (m - j - 1) * w; e += nth) {
                int i = j + 1 + e / w, c = j + 1 + e % w;
                P[i * NB + c] -= P[i * NB + j] * P[j * NB + c];
            }
        }
        __syncthreads();
    }
    // write the panel back (its entries are final) and check them
    bool bad = false;
    for (int e = tid; e < m * nb; e += nth) {
        int i = e / nb, j = e - i * nb;
        T v = P[i * NB + j];
        bad = bad || !isfinite(v);
        A[(long long)(k0 + i) * n + k0 + j] = v;
    }
    for (int j = tid; j < nb; j += nth) piv[mat * n + k0 + j] = k0 + spiv[j];
    // row interchanges on the columns outside the panel (column-parallel)
    for (int c = tid; c < n; c += nth) {
        if (c >= k0 && c < k0 + nb) continue;
        for (int j = 0; j < nb; ++j) {
            int p = spiv[j];
            if (p != j) {
                T t = A[(long long)(k0 + j) * n + c];
                A[(long long)(k0 + j) * n + c] = A[(long long)(k0 + p) * n + c];
                A[(long long)(k0 + p) * n + c] = t;
            }
        }
    }
    __syncthreads();
    // U12 = L11^{-1} A12, one thread per column of A12
    for (int c = k0 + nb + tid; c < n; c += nth) {
        T x[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if (j < nb) {
                T s = A[(long long)(k0 + j) * n + c];
#pragma unroll
                for (int t = 0; t < j; ++t) s -= P[j * NB + t] * x[t];
                x[j] = s;
                bad = bad || !isfinite(s);
                A[(long long)(k0 + j) * n + c] = s;
            }
        }
    }
    if (bad) atomicOr(&sbad, 1);
    __syncthreads();
    if (tid == 0) info[mat] = (sbad || sinfo < 0) ? -1 : sinfo;
}

// ---------------------------------------------------------------------------
// One step of the blocked Cholesky on the lower triangle of w (batch, n, n).
// dynamic shared memory: NB * NB * sizeof(T)
// ---------------------------------------------------------------------------
template <typename T, int NB>
__global__ void __launch_bounds__(GPUQR_PANEL_THREADS)
potrf_panel(T *__restrict__ w, int *__restrict__ info, int n, int k0)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const long long mat = blockIdx.x;
    T *A = w + mat * (long long)n * n;
    const int nb = min(NB, n - k0);
    T *D = reinterpret_cast<T *>(smem_raw);
    __shared__ int sinfo;
    const int tid = threadIdx.x;
    const int nth = blockDim.x;
    if (tid == 0) sinfo = info[mat];
    for (int e = tid; e < nb * nb; e += nth) {
        int i = e / nb, j = e - i * nb;
        D[i * NB + j] = A[(long long)(k0 + i) * n + k0 + j];
    }
    __syncthreads();
    if (sinfo != 0) return;            // failed earlier: leave it
    for (int j = 0; j < nb; ++j) {
        const T d = D[j * NB + j];
        if (!(d > T(0))) {
            __syncthreads();
            if (tid == 0) info[mat] = k0 + j + 1;
            return;
        }
        const T ljj = sqrt(d);
        __syncthreads();
        for (int i = j + tid; i < nb; i += nth) D[i * NB + j] = (i == j) ? ljj : D[i * NB + j] / ljj;
        __syncthreads();
        const int r = nb - j - 1;
        for (int e = tid; e < r * r; e += nth) {
            int i = j + 1 + e / r, c = j + 1 + e % r;
            if (c <= i) D[i * NB + c] -= D[i * NB + j] * D[c * NB + j];
        }
        __syncthreads();
    }
    for (int e = tid; e < nb * nb; e += nth) {
        int i = e / nb, j = e - i * nb;
        if (j <= i) A[(long long)(k0 + i) * n + k0 + j] = D[i * NB + j];
    }
    // L21 = A21 L11^{-T}: one thread per row below the block
    for (int i = k0 + nb + tid; i < n; i += nth) {
        T x[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if (j < nb) {
                T s = A[(long long)i * n + k0 + j];
#pragma unroll
                for (int t = 0; t < j; ++t) s -= x[t] * D[j * NB + t];
                s /= D[j * NB + j];
                x[j] = s;
                A[(long long)i * n + k0 + j] = s;
            }
        }
    }
}
