// solve.cu: triangular solves with batched LU (getrs_batched) and Cholesky
// (potrs_batched) factors, one thread per (matrix, right-hand side column),
// any n. The drivers use them for n <= 32 and n > 64 (32 < n <= 64:
// solve_smem of rows.cu, the factor in shared memory).
#include "common.cuh"

// ---------------------------------------------------------------------------
// Solves with LU factors: one thread per (matrix, right-hand side column).
// input:  lu (batch, n, n), piv (batch, n) 0-based
// in/out: x (batch, n, nrhs): b on input, the solution on output
// trans 0: A x = b; 1: A^T x = b
// ---------------------------------------------------------------------------
template <typename T>
__global__ void getrs_batched(const T *__restrict__ lu, const int *__restrict__ piv,
                              T *__restrict__ x, int n, int nrhs, long long batch,
                              int trans)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * nrhs) return;
    const long long mat = t / nrhs;
    const int c = (int)(t - mat * nrhs);
    const T *L = lu + mat * (long long)n * n;
    const int *pv = piv + mat * n;
    T *X = x + mat * (long long)n * nrhs + c;
    if (trans == 0) {
        for (int k = 0; k < n; ++k) {
            int p = pv[k];
            if (p != k) { T tmp = X[k * nrhs]; X[k * nrhs] = X[p * nrhs]; X[p * nrhs] = tmp; }
        }
        for (int i = 1; i < n; ++i) {
            T s = X[i * nrhs];
            for (int j = 0; j < i; ++j) s -= L[i * n + j] * X[j * nrhs];
            X[i * nrhs] = s;
        }
        for (int i = n - 1; i >= 0; --i) {
            T s = X[i * nrhs];
            for (int j = i + 1; j < n; ++j) s -= L[i * n + j] * X[j * nrhs];
            X[i * nrhs] = s / L[i * n + i];
        }
    } else {
        // U^T z = b (forward), L^T w = z (backward, unit), x = P^T w
        for (int i = 0; i < n; ++i) {
            T s = X[i * nrhs];
            for (int j = 0; j < i; ++j) s -= L[j * n + i] * X[j * nrhs];
            X[i * nrhs] = s / L[i * n + i];
        }
        for (int i = n - 2; i >= 0; --i) {
            T s = X[i * nrhs];
            for (int j = i + 1; j < n; ++j) s -= L[j * n + i] * X[j * nrhs];
            X[i * nrhs] = s;
        }
        for (int k = n - 1; k >= 0; --k) {
            int p = pv[k];
            if (p != k) { T tmp = X[k * nrhs]; X[k * nrhs] = X[p * nrhs]; X[p * nrhs] = tmp; }
        }
    }
}

// ---------------------------------------------------------------------------
// Solves with a Cholesky factor c (lower: L in the lower triangle, A = L L^T;
// else U in the upper triangle, A = U^T U). One thread per (matrix, column).
// ---------------------------------------------------------------------------
template <typename T>
__global__ void potrs_batched(const T *__restrict__ cf, T *__restrict__ x, int n,
                              int nrhs, long long batch, int lower)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * nrhs) return;
    const long long mat = t / nrhs;
    const int c = (int)(t - mat * nrhs);
    const T *C = cf + mat * (long long)n * n;
    T *X = x + mat * (long long)n * nrhs + c;
    // G = lower ? L : U^T (lower triangular); solve G y = b, then G^T x = y
    for (int i = 0; i < n; ++i) {
        T s = X[i * nrhs];
        for (int j = 0; j < i; ++j) s -= (lower ? C[i * n + j] : C[j * n + i]) * X[j * nrhs];
        X[i * nrhs] = s / C[i * n + i];
    }
    for (int i = n - 1; i >= 0; --i) {
        T s = X[i * nrhs];
        for (int j = i + 1; j < n; ++j) s -= (lower ? C[j * n + i] : C[i * n + j]) * X[j * nrhs];
        X[i * nrhs] = s / C[i * n + i];
    }
}
