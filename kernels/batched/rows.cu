// rows.cu: LU and Cholesky of a column panel with one row per thread
// (the panel's rows in registers), for 32 < n <= 512, and solves with the
// factors of n <= 64 held in shared memory.
//
// getrf_rows<T, NB, MAXT>: one thread block per matrix, one thread per row
// of the panel A[k0:n, k0:k0+nb] (nb = min(NB, n - k0)). Per column:
//   * every warp finds its best candidate row with shuffles (|a_ij|, ties to
//     the smaller *logical* row, as LAPACK's i?amax in the swapped order),
//     and that row writes itself into a per-warp slot of shared memory;
//   * one __syncthreads; every thread reduces the per-warp candidates and
//     reads the pivot row from the winning warp's slot (double-buffered by
//     column parity, so one barrier per column is enough);
//   * each remaining row scales its multiplier and updates its registers.
// Row swaps are lazy: rows stay in their threads; each thread tracks the
// logical position of its row (the swap of LAPACK's step j exchanges the
// positions j and p) and writes the row to its final place at the end. With
// NB = n - k0 (k0 = 0) this is the whole LU in one kernel (n <= NB).
// Otherwise the kernel then moves the rows that changed place in the columns
// outside the panel (at most 2 nb rows, staged in shared memory: a parallel
// swap) and solves U12 = L11^{-1} A12 (one thread per column, all loads
// issued before the arithmetic); the trailing update A22 -= L21 U12 is a
// cuBLAS strided-batched GEMM issued by the driver.
//
// potrf_rows<T, NB, MAXT>: the same layout for Cholesky on the lower
// triangle: per column the rows of the diagonal block publish their entry,
// one barrier, every row below the diagonal updates itself. L21 comes out of
// the same loop (no separate triangular solve).
//
// trsm_lunit<T, NB>: U12 = L11^{-1} A12 for the right half of a 64-wide
// panel (one thread per column).
//
// solve_smem<T, NMAX>: solves with LU or Cholesky factors (and the inverse,
// the identity generated in the kernel) for n <= NMAX: one block per matrix,
// the n x n factor in shared memory stored so that the forward solve reads
// its lower and the backward solve its upper triangle, one thread per
// right-hand side column.
//
// info: 0, or k + 1 for the first exactly zero pivot (getrf_rows) or the
// first leading minor of order k + 1 that is not positive definite
// (potrf_rows); getrf_rows and trsm_lunit set -1 for a non-finite entry among
// the L/U entries they finalize (every entry of L and U is finalized by
// exactly one step; the Cholesky driver checks its input itself).
#include "common.cuh"

namespace gpuqr_rows {

//: logical position of a row that can no longer be a pivot
constexpr int kNone = 1 << 20;

//: columns of the staging buffer of the parallel swap
constexpr int kStageCols = 64;

// two consecutive entries, for 8- or 16-byte shared-memory accesses
template <typename T> struct Pair;
template <> struct Pair<double> { typedef double2 type; };
template <> struct Pair<float> { typedef float2 type; };

// 1 / x correctly rounded (the value of T(1) / x, with a shorter sequence)
__device__ __forceinline__ double recip(double x) { return __drcp_rn(x); }
__device__ __forceinline__ float recip(float x) { return __frcp_rn(x); }

// (value, position) with the larger value first, then the smaller position
template <typename T>
__device__ __forceinline__ void better(T &v, int &p, T ov, int op)
{
    if (ov > v || (ov == v && op < p)) { v = ov; p = op; }
}

}  // namespace gpuqr_rows

using namespace gpuqr_rows;

// ---------------------------------------------------------------------------
// input:  src (batch, n, n) row-major (the panel is read from here)
// output: dst (batch, n, n): panel, moved rows, U12 in the columns
//         k0+nb .. trsm_end-1 (may equal src)
//         piv (batch, n) entries k0..k0+nb-1 (0-based, LAPACK order)
//         info (batch): read when k0 > 0, written
// block:  ceil((n - k0) / 32) * 32 threads <= MAXT
// dynamic shared memory (only when columns lie outside the panel):
//         (NB * NB + 2 * NB * kStageCols) * sizeof(T)
// ---------------------------------------------------------------------------
template <typename T, int NB, int MAXT>
__global__ void __launch_bounds__(MAXT)
getrf_rows(const T *src, T *dst, int *__restrict__ piv, int *__restrict__ info,
           int n, int k0, int trsm_end)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int MW = MAXT / 32;
    __shared__ __align__(16) T rowbuf[2][MW][NB];
    __shared__ T cval[2][MW];
    __shared__ int cpos[2][MW];
    __shared__ int spiv[NB];
    __shared__ int msrc[2 * NB], mdst[2 * NB];
    __shared__ int mcount;

    const long long mat = blockIdx.x;
    const T *S = src + mat * (long long)n * n;
    T *A = dst + mat * (long long)n * n;
    const int m = n - k0;
    const int nb = min(NB, m);
    const int tid = threadIdx.x, nth = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nw = nth >> 5;
    const int i = tid;                                  // panel-local row
    if (tid == 0) mcount = 0;

    T x[NB];
    const T *srow = S + (long long)(k0 + i) * n + k0;
#pragma unroll
    for (int c = 0; c < NB; ++c) x[c] = (i < m && c < nb) ? srow[c] : T(0);

    int lpos = i;                                       // logical position
    bool done = i >= m;
    int zinfo = 0;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j >= nb) break;
        const int buf = j & 1;
        // candidate of this row; NaN counts as 0 so that a row is always found
        T key = T(-1);
        int kp = kNone;
        if (!done) {
            const T av = fabs(x[j]);
            key = av >= T(0) ? av : T(0);
            kp = lpos;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            better(key, kp, __shfl_xor_sync(0xffffffffu, key, off),
                   __shfl_xor_sync(0xffffffffu, kp, off));
        if (!done && kp == lpos) {                      // the warp's best row
            typename Pair<T>::type *slot =
                reinterpret_cast<typename Pair<T>::type *>(rowbuf[buf][warp]);
#pragma unroll
            for (int cc = j / 2; cc < NB / 2; ++cc) {
                typename Pair<T>::type v;
                v.x = x[2 * cc];
                v.y = x[2 * cc + 1];
                slot[cc] = v;
            }
        }
        if (lane == 0) { cval[buf][warp] = key; cpos[buf][warp] = kp; }
        __syncthreads();
        // block winner: reduce the per-warp candidates (position * 32 + warp)
        T bv = T(-1);
        int bk = kNone * 32;
        if (lane < nw) { bv = cval[buf][lane]; bk = cpos[buf][lane] * 32 + lane; }
        for (int off = 1; off < nw; off <<= 1)
            better(bv, bk, __shfl_xor_sync(0xffffffffu, bv, off),
                   __shfl_xor_sync(0xffffffffu, bk, off));
        bk = __shfl_sync(0xffffffffu, bk, 0);
        const int bw = bk & 31, p = bk >> 5;
        const T *urow = rowbuf[buf][bw];
        const T pv = urow[j];
        if (tid == 0) spiv[j] = p;
        if (pv == T(0) && zinfo == 0) zinfo = k0 + j + 1;
        if (!done && lpos == p) {                       // the pivot row
            done = true;
            lpos = j;
        } else {
            if (lpos == j) lpos = p;                    // swapped into p's place
            if (!done) {
                T l = x[j];
                if (pv != T(0)) l = fabs(pv) >= gpuqr_sfmin<T>() ? l * recip(pv) : l / pv;
                x[j] = l;
                const typename Pair<T>::type *up =
                    reinterpret_cast<const typename Pair<T>::type *>(urow);
#pragma unroll
                for (int cc = (j + 1) / 2; cc < NB / 2; ++cc) {
                    const typename Pair<T>::type v = up[cc];
                    if (2 * cc > j) x[2 * cc] = fma(-l, v.x, x[2 * cc]);
                    x[2 * cc + 1] = fma(-l, v.y, x[2 * cc + 1]);
                }
            }
        }
    }

    // the panel to its final rows; the diagonal block for the solve of U12
    T *L11 = reinterpret_cast<T *>(smem_raw);           // NB x NB
    T *stage = L11 + NB * NB;                            // 2 NB x kStageCols
    // columns left or right of the panel (never for the one-kernel LU: NB > 32)
    const bool outside = NB <= 32 && nb < n;
    bool bad = false;
    if (i < m) {
        T *drow = A + (long long)(k0 + lpos) * n + k0;
#pragma unroll
        for (int c = 0; c < NB; ++c) {
            if (c < nb) {
                drow[c] = x[c];
                bad = bad || !isfinite(x[c]);
            }
        }
        if (outside) {
            if (lpos < nb) {
#pragma unroll
                for (int c = 0; c < NB; ++c) if (c < nb) L11[lpos * NB + c] = x[c];
            }
            if (lpos != i) {
                const int s = atomicAdd(&mcount, 1);
                msrc[s] = i;
                mdst[s] = lpos;
            }
        }
    }
    __syncthreads();
    if (tid < nb) piv[mat * n + k0 + tid] = k0 + spiv[tid];

    if constexpr (NB <= 32) if (outside) {
        // parallel swap: the moved rows, in the columns outside the panel
        const int cnt = mcount;
        const int oc = n - nb;
        for (int t0 = 0; t0 < oc && cnt > 0; t0 += kStageCols) {
            for (int e = tid; e < cnt * kStageCols; e += nth) {
                const int k = e / kStageCols, t = t0 + e % kStageCols;
                if (t < oc) {
                    const int c = t < k0 ? t : t + nb;
                    stage[e] = A[(long long)(k0 + msrc[k]) * n + c];
                }
            }
            __syncthreads();
            for (int e = tid; e < cnt * kStageCols; e += nth) {
                const int k = e / kStageCols, t = t0 + e % kStageCols;
                if (t < oc) {
                    const int c = t < k0 ? t : t + nb;
                    A[(long long)(k0 + mdst[k]) * n + c] = stage[e];
                }
            }
            __syncthreads();
        }
        // U12 = L11^{-1} A12: one thread per column (there are fewer columns
        // than threads), loads first; no loop, so that the L11 loads are not
        // hoisted out of one (they would not fit in registers)
        const int c = k0 + nb + tid;
        if (c < trsm_end) {
            T y[NB];
#pragma unroll
            for (int j = 0; j < NB; ++j)
                y[j] = j < nb ? A[(long long)(k0 + j) * n + c] : T(0);
#pragma unroll
            for (int t = 0; t < NB; ++t) {
#pragma unroll
                for (int j = t + 1; j < NB; ++j) y[j] = fma(-L11[j * NB + t], y[t], y[j]);
            }
#pragma unroll
            for (int j = 0; j < NB; ++j) {
                if (j < nb) {
                    A[(long long)(k0 + j) * n + c] = y[j];
                    bad = bad || !isfinite(y[j]);
                }
            }
        }
    }
    bad = __syncthreads_or(bad);
    if (tid == 0) {
        const int prev = k0 > 0 ? info[mat] : 0;
        info[mat] = (prev < 0 || bad) ? -1 : (prev > 0 ? prev : zinfo);
    }
}

// ---------------------------------------------------------------------------
// U12 = L11^{-1} A12 for the rows r0..r0+nb-1 and the columns c0..n-1, L11 the
// unit lower triangle of A[r0:r0+nb, r0:r0+nb] (the second half of a 64-wide
// panel, whose first half updated these rows first). One thread per column.
// info (batch): set to -1 when a result is not finite.
// block: ceil((n - c0) / 32) * 32 threads <= 512
// ---------------------------------------------------------------------------
template <typename T, int NB>
__global__ void __launch_bounds__(512)
trsm_lunit(T *__restrict__ a, int *__restrict__ info, int n, int r0, int nb, int c0)
{
    __shared__ T L[NB * NB];
    const long long mat = blockIdx.x;
    T *A = a + mat * (long long)n * n;
    const int tid = threadIdx.x;
    for (int e = tid; e < nb * nb; e += blockDim.x) {
        const int r = e / nb, c = e - r * nb;
        L[r * NB + c] = A[(long long)(r0 + r) * n + r0 + c];
    }
    __syncthreads();
    bool bad = false;
    const int c = c0 + tid;
    if (c < n) {
        T y[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j)
            y[j] = j < nb ? A[(long long)(r0 + j) * n + c] : T(0);
#pragma unroll
        for (int t = 0; t < NB; ++t) {
#pragma unroll
            for (int j = t + 1; j < NB; ++j) y[j] = fma(-L[j * NB + t], y[t], y[j]);
        }
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if (j < nb) {
                A[(long long)(r0 + j) * n + c] = y[j];
                bad = bad || !isfinite(y[j]);
            }
        }
    }
    bad = __syncthreads_or(bad);
    if (tid == 0 && bad) info[mat] = -1;
}

// ---------------------------------------------------------------------------
// One step of the blocked Cholesky on the lower triangle of w (batch, n, n),
// in place: rows k0..n-1 of the columns k0..k0+nb-1, one thread per row.
// info (batch): read (a matrix that failed earlier is left alone), written.
// block: ceil((n - k0) / 32) * 32 threads <= MAXT; no dynamic shared memory.
// ---------------------------------------------------------------------------
template <typename T, int NB, int MAXT>
__global__ void __launch_bounds__(MAXT)
potrf_rows(T *__restrict__ w, int *__restrict__ info, int n, int k0)
{
    __shared__ T colbuf[2][NB];
    const long long mat = blockIdx.x;
    T *A = w + mat * (long long)n * n;
    const int m = n - k0;
    const int nb = min(NB, m);
    const int i = threadIdx.x;
    const int prev = k0 > 0 ? info[mat] : 0;
    if (prev != 0) return;                               // whole block: uniform

    T x[NB];
    T *row = A + (long long)(k0 + i) * n + k0;
#pragma unroll
    for (int c = 0; c < NB; ++c) x[c] = (i < m && c < nb) ? row[c] : T(0);

    int fail = 0;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (j >= nb) break;
        const int buf = j & 1;
        if (i < nb) colbuf[buf][i] = x[j];
        __syncthreads();
        const T d = colbuf[buf][j];
        if (!(d > T(0))) { fail = j + 1; break; }        // uniform
        const T ljj = sqrt(d);
        const T rl = recip(ljj);                         // scaled as LAPACK's potf2
        if (i == j) {
            x[j] = ljj;
        } else if (i > j && i < m) {
            const T l = x[j] * rl;
            x[j] = l;
            const T s = l * rl;                          // l_ij / l_jj
#pragma unroll
            for (int c = j + 1; c < NB; ++c) x[c] = fma(-s, colbuf[buf][c], x[c]);
        }
    }
    if (fail) {
        if (i == 0) info[mat] = k0 + fail;
        return;
    }
    if (i < m) {
#pragma unroll
        for (int c = 0; c < NB; ++c)
            if (c < nb && (i >= nb || c <= i)) row[c] = x[c];
    }
    if (i == 0) info[mat] = 0;
}

// ---------------------------------------------------------------------------
// The end of a blocked Cholesky: c (batch, n, n) holds the factor in one
// triangle and the input in the other, except within `band` of the diagonal,
// where the trailing GEMMs of the diagonal blocks also wrote the other
// triangle: those entries are copied back from a (upper != 0: 0 < j - i <
// band, else 0 < i - j < band). info[mat] = -1 when a holds an inf or NaN
// anywhere (what SciPy's check_finite reads). Grid: one block per 32 rows of
// each matrix (batch * ceil(n / 32) blocks, matrix-major); 256 threads.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
chol_finish(const T *__restrict__ a, T *__restrict__ c, int *__restrict__ info,
            int n, int upper, int band)
{
    const int chunks = (n + 31) >> 5;
    const long long mat = blockIdx.x / chunks;
    const int r0 = (int)(blockIdx.x - mat * chunks) * 32;
    const int rows = min(32, n - r0);
    const T *A = a + mat * (long long)n * n;
    T *C = c + mat * (long long)n * n;
    const int tid = threadIdx.x;
    bool bad = false;
    const T *Ar = A + (long long)r0 * n;
    const int cnt = rows * n;
#pragma unroll 8
    for (int e = tid; e < cnt; e += 256) bad = bad | !isfinite(Ar[e]);
    const int bw = band - 1;
    if (bw > 0) {
#pragma unroll 4
        for (int e = tid; e < rows * bw; e += 256) {
            const int q = e / bw;
            const int i = r0 + q, d = 1 + e - q * bw;
            const int j = upper ? i + d : i - d;
            if (j >= 0 && j < n) C[(long long)i * n + j] = A[(long long)i * n + j];
        }
    }
    bad = __syncthreads_or(bad);
    if (tid == 0 && bad) info[mat] = -1;
}

// ---------------------------------------------------------------------------
// dst = the transpose of each matrix of src (batch, n, n), by tiles of 32 x 32
// through shared memory (rows of 32 entries read and written on both sides):
// the blocked Cholesky of the upper triangle factorizes the transpose's lower
// one, and its factor goes back transposed. Grid: batch * ceil(n / 32)^2
// blocks (matrix-major); block (32, 8).
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
transpose_batched(const T *__restrict__ src, T *__restrict__ dst, int n)
{
    __shared__ T tile[32][33];
    const int tiles = (n + 31) >> 5;
    const long long mat = blockIdx.x / (tiles * tiles);
    const int t = (int)(blockIdx.x - mat * tiles * tiles);
    const int r0 = (t / tiles) * 32, c0 = (t - (t / tiles) * tiles) * 32;
    const long long off = mat * (long long)n * n;
    const int tx = threadIdx.x;
#pragma unroll
    for (int j = threadIdx.y; j < 32; j += 8)
        if (r0 + j < n && c0 + tx < n) tile[j][tx] = src[off + (long long)(r0 + j) * n + c0 + tx];
    __syncthreads();
#pragma unroll
    for (int j = threadIdx.y; j < 32; j += 8)
        if (c0 + j < n && r0 + tx < n) dst[off + (long long)(c0 + j) * n + r0 + tx] = tile[tx][j];
}

// ---------------------------------------------------------------------------
// Solves for n <= NMAX with the factor in shared memory (one block per matrix,
// NMAX threads, one right-hand side column per thread, chunks of NMAX).
// S holds the factor arranged so that the forward solve uses S's lower and
// the backward solve S's upper triangle; entries beyond n are the identity.
// Each thread keeps its column in shared memory (Y[row][thread]) and works on
// blocks of kSolveBlock rows in registers: small unrolled cores, so the
// kernel compiles quickly for NMAX = 64.
// ---------------------------------------------------------------------------
namespace gpuqr_rows {

constexpr int kSolveBlock = 16;

// mode 0: A x = b with LU; 1: A^T x = b with LU;
// 2: Cholesky, L in the lower triangle; 3: Cholesky, U in the upper triangle
template <typename T, int NMAX>
__device__ __forceinline__ void load_factor(T *Ss, const T *F, int n, int mode)
{
    for (int e = threadIdx.x; e < NMAX * NMAX; e += blockDim.x) {
        const int r = e / NMAX, c = e % NMAX;
        T v;
        if (r >= n || c >= n) {
            v = r == c ? T(1) : T(0);
        } else {
            const int lo = r > c ? r : c, hi = r > c ? c : r;   // lo >= hi
            int sr = r, sc = c;
            if (mode == 1) { sr = c; sc = r; }
            else if (mode == 2) { sr = lo; sc = hi; }
            else if (mode == 3) { sr = hi; sc = lo; }
            v = F[sr * n + sc];
        }
        Ss[e] = v;
    }
}

// y (column tid of Y) <- L^{-1} y then U^{-1} y, L/U the lower/upper
// triangles of S (unit diagonal when funit/bunit), nblk blocks of rows
template <typename T, int NMAX>
__device__ void solve_columns(const T *Ss, const T *dinv, T *Y, int nblk,
                              bool funit, bool bunit)
{
    constexpr int BS = kSolveBlock;
    const int tid = threadIdx.x;
    for (int tb = 0; tb < nblk; ++tb) {
        T yb[BS];
#pragma unroll
        for (int r = 0; r < BS; ++r) yb[r] = Y[(tb * BS + r) * NMAX + tid];
        const T *D = Ss + tb * BS * NMAX + tb * BS;
#pragma unroll
        for (int t = 0; t < BS; ++t) {
            if (!funit) yb[t] *= dinv[tb * BS + t];
#pragma unroll
            for (int i = t + 1; i < BS; ++i) yb[i] = fma(-D[i * NMAX + t], yb[t], yb[i]);
        }
#pragma unroll
        for (int r = 0; r < BS; ++r) Y[(tb * BS + r) * NMAX + tid] = yb[r];
        for (int rb = tb + 1; rb < nblk; ++rb) {
            const T *O = Ss + rb * BS * NMAX + tb * BS;
#pragma unroll
            for (int i = 0; i < BS; ++i) {
                T v = Y[(rb * BS + i) * NMAX + tid];
#pragma unroll
                for (int t = 0; t < BS; ++t) v = fma(-O[i * NMAX + t], yb[t], v);
                Y[(rb * BS + i) * NMAX + tid] = v;
            }
        }
    }
    for (int tb = nblk - 1; tb >= 0; --tb) {
        T yb[BS];
#pragma unroll
        for (int r = 0; r < BS; ++r) yb[r] = Y[(tb * BS + r) * NMAX + tid];
        const T *D = Ss + tb * BS * NMAX + tb * BS;
#pragma unroll
        for (int t = BS - 1; t >= 0; --t) {
            if (!bunit) yb[t] *= dinv[tb * BS + t];
#pragma unroll
            for (int i = 0; i < t; ++i) yb[i] = fma(-D[i * NMAX + t], yb[t], yb[i]);
        }
#pragma unroll
        for (int r = 0; r < BS; ++r) Y[(tb * BS + r) * NMAX + tid] = yb[r];
        for (int rb = 0; rb < tb; ++rb) {
            const T *O = Ss + rb * BS * NMAX + tb * BS;
#pragma unroll
            for (int i = 0; i < BS; ++i) {
                T v = Y[(rb * BS + i) * NMAX + tid];
#pragma unroll
                for (int t = 0; t < BS; ++t) v = fma(-O[i * NMAX + t], yb[t], v);
                Y[(rb * BS + i) * NMAX + tid] = v;
            }
        }
    }
}

}  // namespace gpuqr_rows

// input:  f (batch, n, n) factors; piv (batch, n) (LU modes); b (batch, n, nrhs)
//         unless identity (then b = I, nrhs = n, b unused)
// output: x (batch, n, nrhs)
// block:  NMAX threads; dynamic shared memory 2 * NMAX * NMAX * sizeof(T)
template <typename T, int NMAX>
__global__ void __launch_bounds__(NMAX)
solve_smem(const T *__restrict__ f, const int *__restrict__ piv,
           const T *__restrict__ b, T *__restrict__ x, int n, int nrhs,
           int mode, int identity)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *Ss = reinterpret_cast<T *>(smem_raw);             // NMAX x NMAX factor
    T *Y = Ss + NMAX * NMAX;                              // NMAX rows x NMAX columns
    __shared__ T dinv[NMAX];
    __shared__ int perm[NMAX];
    const long long mat = blockIdx.x;
    const int tid = threadIdx.x;
    load_factor<T, NMAX>(Ss, f + mat * (long long)n * n, n, mode);
    if (tid == 0) {
        for (int k = 0; k < NMAX; ++k) perm[k] = k;
        if (mode <= 1) {
            const int *pv = piv + mat * n;
            for (int k = 0; k < n; ++k) {
                const int p = pv[k];
                const int t = perm[k]; perm[k] = perm[p]; perm[p] = t;
            }
        }
    }
    __syncthreads();
    // reciprocals of the diagonal (LAPACK's trsm divides: <= 1 ulp apart)
    for (int t = tid; t < NMAX; t += blockDim.x) dinv[t] = recip(Ss[t * NMAX + t]);
    __syncthreads();
    const int nblk = (n + kSolveBlock - 1) / kSolveBlock;
    const int rows = nblk * kSolveBlock;
    const T *B = b + mat * (long long)n * nrhs;
    T *X = x + mat * (long long)n * nrhs;
    for (int c0 = 0; c0 < nrhs; c0 += NMAX) {
        const int c = c0 + tid;
        if (c >= nrhs) break;
        for (int i = 0; i < rows; ++i) {
            const int r = mode == 0 ? perm[i] : i;
            Y[i * NMAX + tid] = i >= n ? T(0)
                : identity ? T(r == c ? 1 : 0) : B[(long long)r * nrhs + c];
        }
        solve_columns<T, NMAX>(Ss, dinv, Y, nblk, mode == 0, mode == 1);
        for (int i = 0; i < n; ++i) {
            const int r = mode == 1 ? perm[i] : i;
            X[(long long)r * nrhs + c] = Y[i * NMAX + tid];
        }
    }
}
