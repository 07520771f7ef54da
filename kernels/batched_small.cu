// batched_small.cu: LU (getrf), inverse (Gauss-Jordan on [A | I]) and
// Cholesky (potrf) of many n x n matrices, n <= 32, one thread per row.
//
// Each thread keeps its row in registers (n is a template parameter, so every
// loop unrolls), pivots are chosen with warp reductions, the pivot row is
// broadcast through a small double-buffered shared-memory buffer with vector
// loads, and rows are never moved while factorizing ("lazy swaps"): each
// thread tracks the position its row holds after the LAPACK-order
// interchanges and writes the row to that position at the end.
//
// info per matrix: 0; k+1 for the first exactly zero pivot (getrf, getri)
// or the first leading minor that is not positive definite (potrf);
// -1 when the input holds an inf or NaN (checked on the values loaded: no
// extra pass over memory).
//
// Launch: blockDim.x a multiple of 32 (>= SEG); gridDim.x =
// ceil(batch / (blockDim.x / SEG)); dynamic shared memory from
// smem_bytes(...) in scipy_gpuqr/_batched_gpu.py (mirrors the layout below):
//   [ broadcast buffers: mpb * 2 * NB elements ][ staging: mpb * N * LD elements ]
#include "batched_small.cuh"

using namespace gpuqr_batched;

// ---------------------------------------------------------------------------
// LU with partial pivoting, LAPACK getrf pivot order (0-based piv).
// input, not modified:  a (batch, N, N)
// output:               lu (batch, N, N), piv (batch, N), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void getrf_small(const T *__restrict__ a, T *__restrict__ lu,
                            int *__restrict__ piv, int *__restrict__ info,
                            long long batch)
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
    stage_in<T, N>(sm, a + first * N * N, nmat);
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int r = threadIdx.x % SEG;          // row of this thread
    const int mloc = threadIdx.x / SEG;       // matrix within the block
    const bool active = mloc < nmat && r < N;
    const unsigned mask = seg_mask<SEG>(lane);
    T *mybc = bc + (mloc < mpb ? mloc : 0) * 2 * NB;

    T row[N];
    bool fin = true;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        row[j] = active ? sm[(mloc * N + r) * LD + j] : T(0);
        fin = fin && finite(row[j]);
    }
    const bool bad = (__ballot_sync(0xffffffffu, !fin) & mask) != 0u;

    int pos = r;            // current (LAPACK) position of this thread's row
    int mypiv = r;
    int inf = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        unsigned hi, lo;
        abs_key(row[k], hi, lo);
        const bool cand = active && pos >= k;
        const int p = pivot_pos<SEG>(mask, cand, hi, lo, pos);
        const bool is_piv = active && pos == p;
        T *buf = mybc + (k & 1) * NB;
        if (is_piv) bcast_store<T, N>(buf, row, k);
        __syncwarp();
        // interchange positions k and p
        if (active) {
            if (pos == k) pos = p;
            else if (is_piv) pos = k;
        }
        if (r == k) mypiv = p;
        const T pv = buf[k];
        const bool zero = (pv == T(0));
        if (zero && inf == 0) inf = k + 1;
        if (active && pos > k && !zero) {
            T l = (fabs(pv) >= sfmin<T>()) ? row[k] * (T(1) / pv) : row[k] / pv;
            row[k] = l;
#pragma unroll
            for (int q = (k + 1) / VW; q < NB / VW; ++q) {
                union { V v; T s[VW]; } u;
                u.v = reinterpret_cast<const V *>(buf)[q];
#pragma unroll
                for (int t = 0; t < VW; ++t) {
                    const int j = q * VW + t;
                    if (j > k && j < N) row[j < N ? j : 0] -= l * u.s[t];
                }
            }
        }
    }
    __syncthreads();
    if (active) {
#pragma unroll
        for (int j = 0; j < N; ++j) sm[(mloc * N + pos) * LD + j] = row[j];
        piv[(first + mloc) * N + r] = mypiv;
        if (r == 0) info[first + mloc] = bad ? -1 : inf;
    }
    __syncthreads();
    stage_out<T, N>(lu + first * N * N, sm, nmat);
}

// ---------------------------------------------------------------------------
// Inverse by in-place Gauss-Jordan with partial pivoting (lazy swaps).
// The registers hold X = (P A)^{-1} row by row; A^{-1} = X P, i.e. column j
// of A^{-1} is column pos(j) of X, applied while writing out.
// input, not modified:  a (batch, N, N)
// output:               ainv (batch, N, N), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void getri_small(const T *__restrict__ a, T *__restrict__ ainv,
                            int *__restrict__ info, long long batch, int n)
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
    int *colmap = reinterpret_cast<int *>(sm + mpb * N * LD);

    const long long first = (long long)blockIdx.x * mpb;
    const int nmat = (int)min((long long)mpb, batch - first);
    if (nmat <= 0) return;
    stage_in_n<T, N>(sm, a + first * n * n, nmat, n);
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int r = threadIdx.x % SEG;
    const int mloc = threadIdx.x / SEG;
    const bool active = mloc < nmat && r < N;
    const unsigned mask = seg_mask<SEG>(lane);
    T *mybc = bc + (mloc < mpb ? mloc : 0) * 2 * NB;

    T row[N];
    bool fin = true;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        row[j] = (active && r < n && j < n) ? sm[(mloc * N + r) * LD + j] : T(r == j);
        fin = fin && finite(row[j]);
    }
    const bool bad = (__ballot_sync(0xffffffffu, !fin) & mask) != 0u;

    int pos = r;
    int inf = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        unsigned hi, lo;
        abs_key(row[k], hi, lo);
        const bool cand = active && pos >= k;
        const int p = pivot_pos<SEG>(mask, cand, hi, lo, pos);
        const bool is_piv = active && pos == p;
        T *buf = mybc + (k & 1) * NB;
        if (is_piv) {
            const T pv = row[k];
            const T rinv = (pv == T(0)) ? T(0) : T(1) / pv;
#pragma unroll
            for (int j = 0; j < N; ++j) row[j] = (j == k) ? rinv : row[j] * rinv;
            bcast_store<T, N>(buf, row, 0);
        }
        __syncwarp();
        if (active) {
            if (pos == k) pos = p;
            else if (is_piv) pos = k;
        }
        const T ukk = buf[k];
        if (ukk == T(0) && inf == 0) inf = k + 1;
        if (active && !is_piv) {
            const T l = row[k];
#pragma unroll
            for (int q = 0; q < NB / VW; ++q) {
                union { V v; T s[VW]; } u;
                u.v = reinterpret_cast<const V *>(buf)[q];
#pragma unroll
                for (int t = 0; t < VW; ++t) {
                    const int j = q * VW + t;
                    if (j < N) {
                        if (j == k) row[k] = -l * u.s[t];
                        else row[j < N ? j : 0] -= l * u.s[t];
                    }
                }
            }
        }
    }
    __syncthreads();
    if (active) {
#pragma unroll
        for (int j = 0; j < N; ++j) sm[(mloc * N + pos) * LD + j] = row[j];
        colmap[mloc * N + r] = pos;
        if (r == 0) info[first + mloc] = bad ? -1 : inf;
    }
    __syncthreads();
    T *dst = ainv + first * n * n;
    const int total = nmat * n * n;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int m = e / (n * n);
        int rr = e - m * (n * n);
        int i = rr / n;
        int j = rr - i * n;
        dst[e] = sm[(m * N + i) * LD + colmap[m * N + j]];
    }
}

// ---------------------------------------------------------------------------
// Cholesky (potrf). lower != 0: A = L L^T from the lower triangle, L written
// there; lower == 0: A = U^T U from the upper triangle, U written there. The
// other triangle keeps the input (as LAPACK leaves it).
// input, not modified:  a (batch, N, N)
// output:               c (batch, N, N), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void potrf_small(const T *__restrict__ a, T *__restrict__ c,
                            int *__restrict__ info, long long batch, int n, int lower)
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
    stage_in_n<T, N>(sm, a + first * n * n, nmat, n);
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int r = threadIdx.x % SEG;
    const int mloc = threadIdx.x / SEG;
    const bool active = mloc < nmat && r < N;
    const unsigned mask = seg_mask<SEG>(lane);
    T *mybc = bc + (mloc < mpb ? mloc : 0) * 2 * NB;
    T *msm = sm + mloc * N * LD;

    // row r of the lower (Hermitian) matrix: entries j <= r
    T row[N];
    bool fin = true;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        T v = T(0);
        if (active && j <= r) v = (r >= n) ? T(r == j) : lower ? msm[r * LD + j] : msm[j * LD + r];
        row[j] = v;
        fin = fin && finite(v);
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
    if (active && r < n) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (j <= r) {
                if (lower) msm[r * LD + j] = row[j];
                else msm[j * LD + r] = row[j];
            }
        }
        if (r == 0) info[first + mloc] = bad ? -1 : inf;
    }
    __syncthreads();
    stage_out_n<T, N>(c + first * n * n, sm, nmat, n);
}
