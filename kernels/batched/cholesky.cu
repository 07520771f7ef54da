// cholesky.cu: Cholesky (potrf) of many n x n matrices, n <= 32, one
// thread per row (n > 32: rows.cu and panel.cu; LU and inverse: lu_warp.cu
// and lu_mma.cu).
//
// Each thread keeps its row of the lower (Hermitian) matrix in registers (N
// is a template parameter, so every loop unrolls); per column the diagonal
// entry and then the column of L are published through a small
// double-buffered shared-memory buffer, which the rows below read with
// vector loads to update themselves. The input and output go through a
// shared-memory staging area (coalesced copies, small.cuh).
//
// info per matrix: 0; k + 1 when the leading minor of order k + 1 is not
// positive definite (LAPACK potrf); -1 when the input holds an inf or NaN
// (checked on the values loaded: no extra pass over memory). The kernel
// reports to the status word itself (status, ctl: status.cuh).
//
// Launch: blockDim.x a multiple of 32 (>= SEG); gridDim.x =
// ceil(batch / (blockDim.x / SEG)); dynamic shared memory from
// small_launch(...) in scipy_gpuqr/batched/_gpu.py (mirrors the layout below):
//   [ broadcast buffers: mpb * 2 * NB elements ][ staging: mpb * N * LD elements ]
#include "small.cuh"

using namespace gpuqr_batched;

// ---------------------------------------------------------------------------
// Cholesky (potrf). lower != 0: A = L L^T from the lower triangle, L written
// there; lower == 0: A = U^T U from the upper triangle, U written there. The
// other triangle keeps the input (as LAPACK leaves it).
// VB (potrf_small_vb): sizes, szw, per-matrix orders of a padded stack
// (matrix_order of batched.cuh): matrix m is read, and written, as the
// identity outside its leading sizes[m] x sizes[m] block (both triangles).
// input, not modified:  a (batch, n, n)
// output:               c (batch, n, n), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N, bool VB>
__device__ __forceinline__ void potrf_small_run(const T *__restrict__ a, T *__restrict__ c,
                                                int *__restrict__ info, long long batch, int n,
                                                int lower, unsigned long long *__restrict__ status,
                                                unsigned long long ctl, const void *sizes, int szw)
{
    constexpr int SEG = Seg<N>::value;
    constexpr int LD = Ld<N>::value;
    constexpr int NB = Bcast<T, N>::value;
    constexpr int VW = Vec<T>::width;
    typedef typename Vec<T>::type V;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int mpb = blockDim.x / SEG;
    T *bc = reinterpret_cast<T *>(smem_raw);
    T *sm = bc + mpb * 2 * NB;

    const long long first = (long long)blockIdx.x * mpb;
    const int nmat = (int)min((long long)mpb, batch - first);
    if (nmat <= 0) return;
    // VB: this matrix's order (sizes; -1: outside [0, n], read as NaN):
    // its entry loaded before the staging copy and checked after it
    // (order_raw / order_check: the load's latency under the copy's)
    long long raw = n;
    if constexpr (VB) {
        const int ml = threadIdx.x / SEG;
        if (sizes != nullptr && ml < nmat && threadIdx.x % SEG < N)
            raw = order_raw(sizes, szw, first + ml);
    }
    stage_in_n<T, N>(sm, a + first * n * n, nmat, n);
    __syncthreads();
    const int order = VB ? order_check(raw, n, status, ctl) : n;

    const int lane = threadIdx.x & 31;
    const int r = threadIdx.x % SEG;
    const int mloc = threadIdx.x / SEG;
    const bool active = mloc < nmat && r < N;
    const unsigned mask = seg_mask<SEG>(lane);
    T *mybc = bc + (mloc < mpb ? mloc : 0) * 2 * NB;
    T *msm = sm + mloc * N * LD;

    const int nk = order;
    // row r of the lower (Hermitian) matrix: entries j <= r
    T row[N];
    bool fin = true;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        T v = T(0);
        if (active && j <= r) v = (r >= n) ? T(r == j) : lower ? msm[r * LD + j] : msm[j * LD + r];
        if (VB && N <= 16 && nk != n) v = order_masked(v, r, j, nk);
        row[j] = v;
        fin = fin && finite(v);
    }
    if constexpr (VB && N > 16) {
        // the identity outside the matrix's order: a branch around the whole
        // row (warp-uniform: a matrix per warp), not a select in every load
        // of it, so that a matrix filling the stack runs the fixed kernel's
        // instructions (N <= 16: the selects above, which keep the fixed
        // kernel's registers, where the branch would take more)
        if (nk != n) {
            fin = true;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                row[j] = order_masked(row[j], r, j, nk);
                fin = fin && finite(row[j]);
            }
        }
    }
    const bool bad = (__ballot_sync(0xffffffffu, !fin) & mask) != 0u;

    int inf = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        T *buf = mybc + (k & 1) * NB;
        // the diagonal owner publishes d = a_kk
        if (active && r == k) buf[k] = row[k];
        __syncwarp();
        const T d = buf[k];
        const bool fail = !(d > T(0));
        if (fail && inf == 0) inf = k + 1;
        const T ljj = fail ? T(1) : sqrt(d);
        __syncwarp();
        if (active && r >= k) row[k] = (r == k) ? ljj : row[k] / ljj;
        // publish column k of L (rows >= k) for the update
        if (active && r > k) buf[r] = row[k];
        __syncwarp();
        if (active && r > k) {
            const T lik = row[k];
#pragma unroll
            for (int q = (k + 1) / VW; q < NB / VW; ++q) {
                union { V v; T s[VW]; } u;
                u.v = reinterpret_cast<const V *>(buf)[q];
#pragma unroll
                for (int t = 0; t < VW; ++t) {
                    const int j = q * VW + t;
                    if (j > k && j < N && j <= r) row[j < N ? j : 0] -= lik * u.s[t];
                }
            }
        }
        __syncwarp();
    }
    __syncthreads();
    if (VB && active && r < n && nk != n) {
        // the identity outside the matrix's order, in both triangles (rows
        // and columns from nk on: disjoint from what the rows below nk write)
        for (int j = 0; j < n; ++j) {
            if (r >= nk || j >= nk) msm[r * LD + j] = nk < 0 ? gpuqr_status::quiet_nan<T>() : T(r == j);
        }
    }
    if (active && r < n) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (j <= r && (!VB || r < nk || nk == n)) {
                if (lower) msm[r * LD + j] = row[j];
                else msm[j * LD + r] = row[j];
            }
        }
        if (r == 0) info[first + mloc] = gpuqr_status::report_info(bad ? -1 : inf, status, ctl);
    }
    __syncthreads();
    stage_out_n<T, N>(c + first * n * n, sm, nmat, n);
}

template <typename T, int N>
__global__ void potrf_small(const T *__restrict__ a, T *__restrict__ c,
                            int *__restrict__ info, long long batch, int n, int lower,
                            unsigned long long *__restrict__ status, unsigned long long ctl)
{
    potrf_small_run<T, N, false>(a, c, info, batch, n, lower, status, ctl, nullptr, 0);
}

template <typename T, int N>
__global__ void potrf_small_vb(const T *__restrict__ a, T *__restrict__ c,
                               int *__restrict__ info, long long batch, int n, int lower,
                               unsigned long long *__restrict__ status, unsigned long long ctl,
                               const void *__restrict__ sizes, int szw)
{
    potrf_small_run<T, N, true>(a, c, info, batch, n, lower, status, ctl, sizes, szw);
}
