// solve.cu: triangular solves with batched LU (getrs_batched) and Cholesky
// (potrs_batched) factors, one thread per (matrix, right-hand side column),
// any n. The drivers use them for n <= 32 and n > 64 (32 < n <= 64:
// solve_smem of rows.cu, the factor in shared memory; LU solves without
// transpose of n <= 32: getrs_warp of solve_warp.cu).
//
// Both read the right-hand sides from b and write the solutions to x (b is
// not modified; x needs no copy of b beforehand): matrix m's right-hand
// sides start at b + m * bstride (bstride 0: the same b for every matrix).
// status, ctl (status.cuh; null status: no checks): the kernels look at
// every entry of the factor and of b they load, with no extra memory
// traffic, and mark status slot 2 (the factor holds an inf or NaN) and slot 3
// (b does) for the public functions' check_finite.
#include "common.cuh"
#include "status.cuh"

namespace gpuqr_solve {

__device__ __forceinline__ void report(unsigned long long *status, unsigned long long ctl,
                                       int bad_f, int bad_b) {
    if (bad_f) gpuqr_status::mark(status, ctl, 2);
    if (bad_b) gpuqr_status::mark(status, ctl, 3);
}

}  // namespace gpuqr_solve

// ---------------------------------------------------------------------------
// Solves with LU factors: one thread per (matrix, right-hand side column).
// input:  lu (batch, n, n), piv (batch, n) 0-based, b (see above)
// output: x (batch, n, nrhs)
// trans 0: A x = b; 1: A^T x = b
// info (null: none): the factorization's info; with CTL_NAN_FILL in ctl a
// matrix whose info is > 0 gets an all-NaN solution (solve_batched's
// return_info=True) and is not solved.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void getrs_batched(const T *__restrict__ lu, const int *__restrict__ piv,
                              const T *__restrict__ b, T *__restrict__ x, int n, int nrhs,
                              long long batch, int trans, long long bstride,
                              unsigned long long *__restrict__ status, unsigned long long ctl,
                              const int *__restrict__ info)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * nrhs) return;
    const long long mat = t / nrhs;
    const int c = (int)(t - mat * nrhs);
    const T *L = lu + mat * (long long)n * n;
    const int *pv = piv + mat * n;
    const T *B = b + mat * bstride + c;
    T *X = x + mat * (long long)n * nrhs + c;
    if (info != nullptr && gpuqr_status::nan_result(info[mat], ctl)) {
        bool bad = false;                                  // b is still checked
        for (int k = 0; k < n; ++k) {
            bad |= !isfinite(B[k * nrhs]);
            X[k * nrhs] = gpuqr_status::quiet_nan<T>();
        }
        gpuqr_solve::report(status, ctl, false, bad);
        return;
    }
    bool bad_f = false, bad_b = false;
    for (int k = 0; k < n; ++k) {
        const T v = B[k * nrhs];
        bad_b |= !isfinite(v);
        X[k * nrhs] = v;
    }
    if (trans == 0) {
        for (int k = 0; k < n; ++k) {
            int p = pv[k];
            if (p != k) { T tmp = X[k * nrhs]; X[k * nrhs] = X[p * nrhs]; X[p * nrhs] = tmp; }
        }
        for (int i = 1; i < n; ++i) {
            T s = X[i * nrhs];
            for (int j = 0; j < i; ++j) {
                const T l = L[i * n + j];
                bad_f |= !isfinite(l);
                s -= l * X[j * nrhs];
            }
            X[i * nrhs] = s;
        }
        for (int i = n - 1; i >= 0; --i) {
            T s = X[i * nrhs];
            for (int j = i + 1; j < n; ++j) {
                const T u = L[i * n + j];
                bad_f |= !isfinite(u);
                s -= u * X[j * nrhs];
            }
            const T d = L[i * n + i];
            bad_f |= !isfinite(d);
            X[i * nrhs] = s / d;
        }
    } else {
        // U^T z = b (forward), L^T w = z (backward, unit), x = P^T w
        for (int i = 0; i < n; ++i) {
            T s = X[i * nrhs];
            for (int j = 0; j < i; ++j) {
                const T u = L[j * n + i];
                bad_f |= !isfinite(u);
                s -= u * X[j * nrhs];
            }
            const T d = L[i * n + i];
            bad_f |= !isfinite(d);
            X[i * nrhs] = s / d;
        }
        for (int i = n - 2; i >= 0; --i) {
            T s = X[i * nrhs];
            for (int j = i + 1; j < n; ++j) {
                const T l = L[j * n + i];
                bad_f |= !isfinite(l);
                s -= l * X[j * nrhs];
            }
            X[i * nrhs] = s;
        }
        for (int k = n - 1; k >= 0; --k) {
            int p = pv[k];
            if (p != k) { T tmp = X[k * nrhs]; X[k * nrhs] = X[p * nrhs]; X[p * nrhs] = tmp; }
        }
    }
    gpuqr_solve::report(status, ctl, bad_f, bad_b);
}

// ---------------------------------------------------------------------------
// Solves with a Cholesky factor c (lower: L in the lower triangle, A = L L^T;
// else U in the upper triangle, A = U^T U). One thread per (matrix, column).
// status: the triangle it uses and b are checked here; the other triangle
// (SciPy's cho_solve checks all of c) by a coalesced pass of the driver
// (nonfinite_scan of status.cu): read here, a thread per matrix, it cost
// 25-43 % of the solve on an H200.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void potrs_batched(const T *__restrict__ cf, const T *__restrict__ b,
                              T *__restrict__ x, int n, int nrhs, long long batch,
                              int lower, long long bstride,
                              unsigned long long *__restrict__ status, unsigned long long ctl)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * nrhs) return;
    const long long mat = t / nrhs;
    const int c = (int)(t - mat * nrhs);
    const T *C = cf + mat * (long long)n * n;
    const T *B = b + mat * bstride + c;
    T *X = x + mat * (long long)n * nrhs + c;
    bool bad_f = false, bad_b = false;
    // G = lower ? L : U^T (lower triangular); solve G y = b, then G^T x = y
    for (int i = 0; i < n; ++i) {
        T s = B[i * nrhs];
        bad_b |= !isfinite(s);
        for (int j = 0; j < i; ++j) {
            const T g = lower ? C[i * n + j] : C[j * n + i];
            bad_f |= !isfinite(g);
            s -= g * X[j * nrhs];
        }
        const T d = C[i * n + i];
        bad_f |= !isfinite(d);
        X[i * nrhs] = s / d;
    }
    for (int i = n - 1; i >= 0; --i) {
        T s = X[i * nrhs];
        for (int j = i + 1; j < n; ++j) s -= (lower ? C[j * n + i] : C[i * n + j]) * X[j * nrhs];
        X[i * nrhs] = s / C[i * n + i];
    }
    gpuqr_solve::report(status, ctl, bad_f, bad_b);
}
