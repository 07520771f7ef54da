// lu_warp.cu: LU (getrf) and inverse (Gauss-Jordan) of many n x n
// matrices, n <= 32: a warp per tile of 32 / SEG matrices, a row per lane,
// the matrix in registers (layout and copies: warp.cuh).
//
// Per column k the only communication is: one warp max-reduction of the
// candidates' high key (ties broken exactly, rarely taken), a ballot, and the
// pivot row broadcast through a small double-buffered per-warp shared buffer
// (one 16-byte broadcast load gives every lane two doubles, where shuffles
// would need two per double). The pivot's reciprocal is computed by every
// candidate speculatively while the reduction is in flight. Rows never move
// ("lazy swaps"): each lane tracks the LAPACK position of its row and writes
// it there at the end.
//
// Two other shapes behind the same kernel names (chosen at compile time):
//   * N <= GPUQR_TINY_MAX: a thread per matrix, no shared memory;
//   * N > 16 with WarpCfg::G > 1: each row split over G lanes, R = G rows per
//     lane (warp2d.cuh): fewer broadcast loads per update.
//
// info per matrix: 0; k+1 for the first exactly zero pivot; -1 when the input
// holds an inf or NaN (checked on the values loaded: no extra pass). The
// kernels report to the status word themselves (status, ctl: status.cuh):
// no pass over info follows them.
//
// gesv_warp: the LU of getrf_warp and the solves with it in the same launch
// (solve_batched): the factors stay on chip, only info and the solutions are
// written (see lu_solve_rows).
//
// Launch: blockDim.x a multiple of 32 (<= GPUQR_WARP_THREADS), any grid (the
// warps loop over tiles); stages 1 or 2 (tiles in flight per warp); vec != 0
// when both pointers are 16-byte aligned. Dynamic shared memory, from
// warp_smem_bytes(...) in scipy_gpuqr/batched/_gpu.py, per warp:
//   [ broadcast: 2 * MW * NBUF elements ] (all warps) then
//   [ tiles: stages * TILE elements ] (all warps).
#include "warp.cuh"
#include "warp2d.cuh"

#ifndef GPUQR_WARP_THREADS
#define GPUQR_WARP_THREADS 256
#endif

// n <= GPUQR_TINY_MAX: a thread per matrix (must match TINY_MAX in
// scipy_gpuqr/batched/_kernel_registry.py, which sizes the launch).
#ifndef GPUQR_TINY_MAX
#define GPUQR_TINY_MAX 2
#endif

using namespace gpuqr_warp;

namespace gpuqr_warp {

// Per-variant shape of the warp kernels (GJ: the inverse).
//   G: lanes per row (1: a row per lane; 2 or 4: warp2d.cuh).
//   MINB: blocks of GPUQR_WARP_THREADS that must fit on an SM (caps the
//   registers: 2 -> 128).
// GPUQR_G_LU / GPUQR_G_GJ / GPUQR_MINB_LU / GPUQR_MINB_GJ override them for
// benchmarks (bench/batched_variants.py); the defaults are the measured
// fastest.
template <typename T, int N, bool GJ>
struct WarpCfg {
#if defined(GPUQR_G_LU) && defined(GPUQR_G_GJ)
    static constexpr int G_req = GJ ? GPUQR_G_GJ : GPUQR_G_LU;
#else
    // the 2-D layout is slower for every LU and every inverse but the
    // inverse at N = 32 in double
    static constexpr int G_req = (GJ && N == 32 && sizeof(T) == 8) ? 2 : 1;
#endif
    static constexpr int G = (N > 16 && N % G_req == 0) ? G_req : 1;
#if defined(GPUQR_MINB_LU) && defined(GPUQR_MINB_GJ)
    static constexpr int MINB = GJ ? GPUQR_MINB_GJ : GPUQR_MINB_LU;
#else
    static constexpr int MINB = 2;
#endif
    // G = 1: the pivot, its reciprocal and scale and the pivot row's next
    // entry reach the lanes by shuffles (off the shared-memory round trip of
    // the rest of the pivot row) instead of through the broadcast buffer:
    // faster but for the inverse at N = 24 in double.
#ifdef GPUQR_SHFL_PIVOT
    static constexpr bool SHFL = GPUQR_SHFL_PIVOT != 0;
#else
    static constexpr bool SHFL = !(GJ && N == 24 && sizeof(T) == 8);
#endif
};

// Rest of a rank-1 update: row[j] -= l * buf[j] for lo <= j < N, j not in
// {skip_a, skip_b} (vector loads; the indices are compile-time constants).
template <typename T, int N>
__device__ __forceinline__ void axpy_from(T (&row)[N], const T *buf, T l, int lo,
                                          int skip_a, int skip_b) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
#pragma unroll
    for (int q = 0; q < (N + VW - 1) / VW; ++q) {
        if ((q + 1) * VW > lo) {
            union { V v; T s[VW]; } u;
            u.v = reinterpret_cast<const V *>(buf)[q];
#pragma unroll
            for (int s = 0; s < VW; ++s) {
                const int j = q * VW + s;
                if (j >= lo && j < N && j != skip_a && j != skip_b) row[j < N ? j : 0] = fma(-l, u.s[s], row[j < N ? j : 0]);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// n <= GPUQR_TINY_MAX: a thread per matrix, the matrix in registers, rows
// swapped eagerly (selects on compile-time indices), 16-byte loads and
// stores when the matrices are whole 16-byte units and the pointers aligned.
// ---------------------------------------------------------------------------
template <typename T, int N>
__device__ __forceinline__ void tiny_load(T (&v)[N][N], const T *__restrict__ src, int n, bool vec) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
    if constexpr ((N * N) % VW == 0) {
        if (vec) {
#pragma unroll
            for (int q = 0; q < N * N / VW; ++q) {
                union { V v; T e[VW]; } u;
                u.v = __ldg(reinterpret_cast<const V *>(src) + q);
#pragma unroll
                for (int e = 0; e < VW; ++e) v[(q * VW + e) / N][(q * VW + e) % N] = u.e[e];
            }
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j)
            v[i][j] = (i < n && j < n) ? __ldg(src + i * n + j) : T(i == j);
}

template <typename T, int N>
__device__ __forceinline__ void tiny_store(T *__restrict__ dst, const T (&v)[N][N], int n, bool vec) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
    if constexpr ((N * N) % VW == 0) {
        if (vec) {
#pragma unroll
            for (int q = 0; q < N * N / VW; ++q) {
                union { V v; T e[VW]; } u;
#pragma unroll
                for (int e = 0; e < VW; ++e) u.e[e] = v[(q * VW + e) / N][(q * VW + e) % N];
                reinterpret_cast<V *>(dst)[q] = u.v;
            }
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (i < n && j < n) dst[i * n + j] = v[i][j];
}

template <typename T, int N>
__device__ __forceinline__ bool tiny_finite(const T (&v)[N][N]) {
    bool fin = true;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) fin = fin && finite_bits(v[i][j]);
    return fin;
}

// Pivot of column k (LAPACK i?amax: the first largest |v[i][k]|, i >= k),
// then rows k and p of v (and of e, when E) exchanged.
template <typename T, int N, bool E>
__device__ __forceinline__ int tiny_pivot(T (&v)[N][N], T (&e)[N][N], int k) {
    int p = k;
    unsigned long long best = key64(v[k][k]);
#pragma unroll
    for (int i = k + 1; i < N; ++i) {
        const unsigned long long key = key64(v[i][k]);
        if (key > best) { best = key; p = i; }
    }
#pragma unroll
    for (int i = k + 1; i < N; ++i) {
        if (p == i) {
#pragma unroll
            for (int j = 0; j < N; ++j) { const T w = v[k][j]; v[k][j] = v[i][j]; v[i][j] = w; }
            if constexpr (E) {
#pragma unroll
                for (int j = 0; j < N; ++j) { const T w = e[k][j]; e[k][j] = e[i][j]; e[i][j] = w; }
            }
        }
    }
    return p;
}

// LU like LAPACK getrf2 (reciprocal when |pivot| >= sfmin, else division).
template <typename T, int N>
__device__ __forceinline__ int tiny_lu(T (&v)[N][N], int (&pv)[N]) {
    int z = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        pv[k] = tiny_pivot<T, N, false>(v, v, k);
        const T d = v[k][k];
        if (d == T(0)) {
            if (z == 0) z = k + 1;
        } else {
            const bool big = fabs(d) >= gpuqr_sfmin<T>();
            const T r = T(1) / d;
#pragma unroll
            for (int i = k + 1; i < N; ++i) v[i][k] = big ? v[i][k] * r : v[i][k] / d;
        }
#pragma unroll
        for (int i = k + 1; i < N; ++i)
#pragma unroll
            for (int j = k + 1; j < N; ++j) v[i][j] = fma(-v[i][k], v[k][j], v[i][j]);
    }
    return z;
}

// Inverse by Gauss-Jordan on [v | e], e = I, rows swapped eagerly: e ends as
// v^{-1}. Returns the getrf info of v.
template <typename T, int N>
__device__ __forceinline__ int tiny_inv(T (&v)[N][N], T (&e)[N][N]) {
    int z = 0;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) e[i][j] = T(i == j);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        tiny_pivot<T, N, true>(v, e, k);
        const T d = v[k][k];
        if (d == T(0) && z == 0) z = k + 1;
        const T r = T(1) / d;
#pragma unroll
        for (int j = k + 1; j < N; ++j) v[k][j] *= r;
#pragma unroll
        for (int j = 0; j < N; ++j) e[k][j] *= r;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            if (i != k) {
                const T l = v[i][k];
#pragma unroll
                for (int j = k + 1; j < N; ++j) v[i][j] = fma(-l, v[k][j], v[i][j]);
#pragma unroll
                for (int j = 0; j < N; ++j) e[i][j] = fma(-l, e[k][j], e[i][j]);
            }
        }
    }
    return z;
}

__device__ __forceinline__ bool aligned16(const void *p) {
    return (reinterpret_cast<size_t>(p) & 15u) == 0;
}

// Rows and columns of v from the matrix's order on (matrix_order of
// batched.cuh: sizes null, every matrix fills the stack) set to the
// identity, all NaN for a size outside [0, n]; returns the order (-1: bad).
template <typename T, int N>
__device__ __forceinline__ int tiny_mask(T (&v)[N][N], const void *sizes, int szw,
                                         long long m, int n, unsigned long long *status,
                                         unsigned long long ctl) {
    const int nk = matrix_order(sizes, szw, m, n, status, ctl);
    if (nk != n) {
#pragma unroll
        for (int i = 0; i < N; ++i)
#pragma unroll
            for (int j = 0; j < N; ++j) v[i][j] = order_masked(v[i][j], i, j, nk);
    }
    return nk;
}

// Grid-stride loop of the tiny LU kernels (a thread per matrix, any grid):
// matrix m loaded (tiny_mask: its order), its LU in registers, then
// body(m, v, pv, the info found (-1: an inf or NaN), the order (-1: bad)).
template <typename T, int N, typename Body>
__device__ __forceinline__ void tiny_lu_each(const T *__restrict__ a, long long batch, bool vec,
                                             const void *sizes, int szw,
                                             unsigned long long *status, unsigned long long ctl,
                                             Body body) {
    for (long long m = (long long)blockIdx.x * blockDim.x + threadIdx.x; m < batch;
         m += (long long)gridDim.x * blockDim.x) {
        T v[N][N];
        tiny_load<T, N>(v, a + m * (N * N), N, vec);
        const int nk = tiny_mask<T, N>(v, sizes, szw, m, N, status, ctl);
        const bool fin = tiny_finite<T, N>(v);
        int pv[N];
        const int z = tiny_lu<T, N>(v, pv);
        body(m, v, pv, fin ? z : -1, nk);
    }
}

template <typename T, int N>
__device__ __forceinline__ void tiny_getrf(const T *__restrict__ a, T *__restrict__ lu,
                                           int *__restrict__ piv, int *__restrict__ info,
                                           long long batch, unsigned long long *status,
                                           unsigned long long ctl, const void *sizes, int szw) {
    const bool vec = aligned16(a) && aligned16(lu);
    tiny_lu_each<T, N>(a, batch, vec, sizes, szw, status, ctl,
                       [&](long long m, const T (&v)[N][N], const int (&pv)[N], int got, int) {
        tiny_store<T, N>(lu + m * (N * N), v, N, vec);
        if constexpr (N == 2) {
            reinterpret_cast<int2 *>(piv)[m] = make_int2(pv[0], pv[1]);
        } else {
#pragma unroll
            for (int k = 0; k < N; ++k) piv[m * N + k] = pv[k];
        }
        info[m] = gpuqr_status::report_info(got, status, ctl);
    });
}

// csr: the diagonal blocks of a CSR matrix (csr_blocks.cuh) instead of a.
template <typename T, int N, typename Csr = gpuqr_csr::NoCsr>
__device__ __forceinline__ void tiny_getri(const T *__restrict__ a, T *__restrict__ ainv,
                                           int *__restrict__ info, long long batch, int n,
                                           unsigned long long *status, unsigned long long ctl,
                                           const void *sizes, int szw, const Csr &csr = Csr()) {
    const bool vec = aligned16(a) && aligned16(ainv) && n == N;
    const long long nn = (long long)n * n;
    for (long long m = (long long)blockIdx.x * blockDim.x + threadIdx.x; m < batch;
         m += (long long)gridDim.x * blockDim.x) {
        T v[N][N], e[N][N];
        if constexpr (gpuqr_csr::IsCsr<Csr>::value) {
#pragma unroll
            for (int i = 0; i < N; ++i) {
#pragma unroll
                for (int j = 0; j < N; ++j) v[i][j] = T(i == j);
                if (i < n)
                    gpuqr_csr::block_row<T, N>(csr, m, n, i, [&](int j) -> T & { return v[i][j]; });
            }
        } else {
            tiny_load<T, N>(v, a + m * nn, n, vec);
        }
        tiny_mask<T, N>(v, sizes, szw, m, n, status, ctl);
        const bool fin = tiny_finite<T, N>(v);
        const int z = tiny_inv<T, N>(v, e);
        if (gpuqr_status::nan_result(fin ? z : -1, ctl)) {
#pragma unroll
            for (int i = 0; i < N; ++i)
#pragma unroll
                for (int j = 0; j < N; ++j) e[i][j] = gpuqr_status::quiet_nan<T>();
        }
        tiny_store<T, N>(ainv + m * nn, e, n, vec);
        info[m] = gpuqr_status::report_info(fin ? z : -1, status, ctl);
    }
}

// A thread per matrix (N <= GPUQR_TINY_MAX): LU as tiny_getrf, then the
// solves in registers (the row swaps as selects on compile-time indices).
// A matrix of order nk < N (sizes) reads b's rows from nk on as zero and
// gets zero solution rows there.
template <typename T, int N>
__device__ __forceinline__ void tiny_gesv(const T *__restrict__ a, int *__restrict__ info,
                                          long long batch, unsigned long long *status,
                                          unsigned long long ctl, const GesvArgs<T> &sv,
                                          const void *sizes, int szw) {
    tiny_lu_each<T, N>(a, batch, aligned16(a), sizes, szw, status, ctl,
                       [&](long long m, const T (&v)[N][N], const int (&pv)[N], int got,
                           int order) {
        const int nk = order < 0 ? N : order;
        info[m] = gpuqr_status::report_info(got, status, ctl);
        const bool nan = gpuqr_status::nan_result(gpuqr_status::stored_info(got, ctl), sv.ctl);
        bool badb = false;
        for (int c = 0; c < sv.nrhs; ++c) {
            T y[N];
#pragma unroll
            for (int i = 0; i < N; ++i) {
                y[i] = i < nk ? sv.b[m * sv.bstride + (long long)i * sv.nrhs + c] : T(0);
                badb |= !finite_bits(y[i]);
            }
#pragma unroll
            for (int k = 0; k < N; ++k) {             // y = P b
#pragma unroll
                for (int i = k + 1; i < N; ++i) {
                    if (pv[k] == i) { const T w = y[k]; y[k] = y[i]; y[i] = w; }
                }
            }
#pragma unroll
            for (int i = 1; i < N; ++i)
#pragma unroll
                for (int j = 0; j < i; ++j) y[i] = fma(-v[i][j], y[j], y[i]);
#pragma unroll
            for (int i = N - 1; i >= 0; --i) {
#pragma unroll
                for (int j = i + 1; j < N; ++j) y[i] = fma(-v[i][j], y[j], y[i]);
                y[i] = y[i] / v[i][i];
            }
#pragma unroll
            for (int i = 0; i < N; ++i)
                sv.x[(m * N + i) * sv.nrhs + c] =
                    i >= nk ? T(0) : nan ? gpuqr_status::quiet_nan<T>() : y[i];
        }
        if (badb) gpuqr_status::mark(sv.status, sv.ctl, 3);
    });
}

}  // namespace gpuqr_warp

// ---------------------------------------------------------------------------
// LU with partial pivoting, LAPACK getrf pivot order (0-based piv).
// input, not modified:  a (batch, N, N)
// output:               lu (batch, N, N), piv (batch, N), info (batch)
// ---------------------------------------------------------------------------
// SOLVE: gesv_warp (lu and piv null; the solves of sv after each tile's LU).
// VB: per-matrix orders (sizes, szw: getrf_warp_vb, gesv_warp_vb); without
// it sizes is not looked at.
template <typename T, int N, bool SOLVE, bool VB>
__device__ __forceinline__ void lu_warp_run(const T *__restrict__ a, T *__restrict__ lu,
                                            int *__restrict__ piv, int *__restrict__ info,
                                            long long batch, int stages, int vec,
                                            unsigned long long *__restrict__ status,
                                            unsigned long long ctl, const GesvArgs<T> &sv,
                                            const void *sizes, int szw)
{
    typedef Layout<T, N> L;
    constexpr int SEG = L::SEG;
    constexpr int G = WarpCfg<T, N, false>::G;
    constexpr bool SH = WarpCfg<T, N, false>::SHFL;
    static_assert(!(SOLVE && G > 1), "the fused solve needs a row per lane");
    if constexpr (N <= GPUQR_TINY_MAX) {
        if constexpr (SOLVE) tiny_gesv<T, N>(a, info, batch, status, ctl, sv, VB ? sizes : nullptr, szw);
        else tiny_getrf<T, N>(a, lu, piv, info, batch, status, ctl, VB ? sizes : nullptr, szw);
        return;
    }
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int nwb = blockDim.x >> 5;
    T *bc = reinterpret_cast<T *>(smem_raw) + wib * 2 * L::MW * L::NBUF;
    T *tiles = reinterpret_cast<T *>(smem_raw) + nwb * 2 * L::MW * L::NBUF
               + wib * stages * L::TILE;
    unsigned long long *slots = VB ? order_slots<T, N>(smem_raw, nwb, stages, wib) : nullptr;
    const int r = lane & (SEG - 1);
    const int mloc = lane / SEG;

    if constexpr (G > 1 && !SOLVE) {
        run_tiles<T, N, VB, true>(a, lu, batch, N, stages, vec != 0, tiles, slots, sizes, szw, status,
                                  ctl, [&](T *t, long long first, int, int) {
            const int z = factor2d<T, N, G, false>(t, bc, piv + first * N, N, lane);
            if (lane == 0) info[first] = gpuqr_status::report_info(z, status, ctl);
        });
        return;
    }
    run_tiles<T, N, VB, false>(a, lu, batch, N, stages, vec != 0, tiles, slots, sizes, szw, status,
                               ctl, [&](T *t, long long first, int nv, int order) {
        const bool active = mloc < nv && r < N;
        T row[N];
        if (active) {
            row_read<T, N>(row, t + (mloc * N + r) * L::LD);
            if (VB && order != N) {             // per-matrix orders: the identity outside
#pragma unroll
                for (int j = 0; j < N; ++j) row[j] = order_masked(row[j], r, j, order);
            }
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) row[j] = T(0);
        }
        bool fin = true;
#pragma unroll
        for (int j = 0; j < N; ++j) fin = fin && finite_bits(row[j]);
        const bool bad = seg_bits<SEG>(__ballot_sync(0xffffffffu, !fin), lane) != 0u;

        bool cand = active;
        int pos = r, mypiv = r, zinfo = 0;
        T diag = T(1);                                          // SOLVE: U[pos][pos]
        unsigned hi = key_hi(row[0]);
        unsigned bal = pivot_start<SEG>(cand, hi);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const T x = row[k];
            const T sc = pivot_scale(x);
            const T rinv = fast_rcp(cand ? x * sc : T(1));     // speculative
            const int pl = pivot_finish<SEG>(bal, cand, key_lo(x), pos, lane);
            const bool is_piv = lane == pl;
            const int p = __shfl_sync(0xffffffffu, pos, pl & 31);
            T *buf = bc + (k & 1) * L::MW * L::NBUF + mloc * L::NBUF;
            T pv, bri, bsc, b1;
            if constexpr (SH) {
                pv = __shfl_sync(0xffffffffu, x, pl & 31);
                bri = __shfl_sync(0xffffffffu, rinv, pl & 31);
                bsc = __shfl_sync(0xffffffffu, sc, pl & 31);
                b1 = __shfl_sync(0xffffffffu, row[k + 1 < N ? k + 1 : 0], pl & 31);
                if (is_piv) bcast_row<T, N>(buf, row, k + 2);
            } else {
                if (is_piv) {
                    bcast_row<T, N>(buf, row, k);
                    buf[N] = rinv;
                    buf[N + 1] = sc;
                }
                __syncwarp();
                pv = buf[k];
                bri = buf[N];
                bsc = buf[N + 1];
                b1 = buf[k + 1];
            }
            const bool upd = cand && !is_piv && pv != T(0);
            const T l = upd ? (x * bsc) * bri : T(0);
            if (upd) row[k] = l;
            if (k + 1 < N) row[k + 1 < N ? k + 1 : 0] = fma(-l, b1, row[k + 1 < N ? k + 1 : 0]);
            cand = cand && !is_piv;
            if (SOLVE && is_piv) diag = x;
            if (pos == k) pos = p; else if (is_piv) pos = k;
            if (r == k) mypiv = p;
            if (pv == T(0) && zinfo == 0) zinfo = k + 1;
            if (k + 1 < N) {
                hi = key_hi(row[k + 1 < N ? k + 1 : 0]);
                bal = pivot_start<SEG>(cand, hi);
            }
            if constexpr (SH) __syncwarp();
            axpy_from<T, N>(row, buf, l, k + 2, -1, -1);
        }
        if constexpr (SOLVE) {
            const int got = bad ? -1 : zinfo;
            if (active && r == 0) info[first + mloc] = gpuqr_status::report_info(got, status, ctl);
            // the lane of each LAPACK row, in the matrix's part of the (free) broadcast buffer
            __syncwarp();
            int *at = reinterpret_cast<int *>(bc + mloc * L::NBUF);
            if (active) at[pos] = r;
            __syncwarp();
            const int base = lane & ~(SEG - 1);
            const long long m = first + mloc;
            const bool nan = gpuqr_status::nan_result(gpuqr_status::stored_info(got, ctl), sv.ctl);
            const T rd = T(1) / diag;
            // the matrix's order (sizes): b's rows from it on read as zero, zero solution rows
            const int nk = order < 0 ? N : order;
            bool badb = false;
#pragma unroll 1
            for (int c = 0; c < sv.nrhs; ++c) {
                T s0 = T(0);
                if (active && (!VB || r < nk)) {
                    s0 = sv.b[m * sv.bstride + (long long)r * sv.nrhs + c];
                    badb |= !finite_bits(s0);
                }
                const T xv = lu_solve_rows<T, N>(s0, pos, diag, rd,
                                                 [&](int j) { return row[j]; },
                                                 [&](int j) { return base + (at[j] & (SEG - 1)); });
                if (active)
                    sv.x[(m * N + pos) * sv.nrhs + c] =
                        (VB && pos >= nk) ? T(0) : nan ? gpuqr_status::quiet_nan<T>() : xv;
            }
            if (badb) gpuqr_status::mark(sv.status, sv.ctl, 3);
        } else if (active) {
            row_write<T, N>(t + (mloc * N + pos) * L::LD, row);
            piv[(first + mloc) * N + r] = mypiv;
            if (r == 0) info[first + mloc] = gpuqr_status::report_info(bad ? -1 : zinfo,
                                                                       status, ctl);
        }
    });
}

template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, false>::MINB))
getrf_warp(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
           int *__restrict__ info, long long batch, int stages, int vec,
           unsigned long long *__restrict__ status, unsigned long long ctl)
{
    lu_warp_run<T, N, false, false>(a, lu, piv, info, batch, stages, vec, status, ctl,
                                    GesvArgs<T>{nullptr, nullptr, 0, 0, nullptr, 0}, nullptr, 0);
}

// getrf_warp of a padded stack with per-matrix orders: matrix m is the
// leading sizes[m] x sizes[m] block of its N x N slot, the rest read (and
// written) as the identity (matrix_order of batched.cuh; szw: 4 or 8, the
// entries' width). The *_vb kernels below take the same two extra arguments.
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, false>::MINB))
getrf_warp_vb(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
              int *__restrict__ info, long long batch, int stages, int vec,
              unsigned long long *__restrict__ status, unsigned long long ctl,
              const void *__restrict__ sizes, int szw)
{
    lu_warp_run<T, N, false, true>(a, lu, piv, info, batch, stages, vec, status, ctl,
                                   GesvArgs<T>{nullptr, nullptr, 0, 0, nullptr, 0}, sizes, szw);
}

// ---------------------------------------------------------------------------
// LU and solve (solve_batched): getrf_warp's factorization, then per matrix
// the solves of its right-hand sides with the factors still in registers
// (lu_solve_rows); lu and piv are not written.
// input, not modified:  a (batch, N, N), b (see GesvArgs)
// output:               info (batch), x (batch, N, nrhs)
// status, ctl: the factorization's report; sstatus, sctl: the solve's.
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, false>::MINB))
gesv_warp(const T *__restrict__ a, int *__restrict__ info, long long batch, int stages,
          int vec, unsigned long long *__restrict__ status, unsigned long long ctl,
          const T *__restrict__ b, T *__restrict__ x, int nrhs, long long bstride,
          unsigned long long *__restrict__ sstatus, unsigned long long sctl)
{
    lu_warp_run<T, N, true, false>(a, nullptr, nullptr, info, batch, stages, vec, status, ctl,
                                   GesvArgs<T>{b, x, nrhs, bstride, sstatus, sctl}, nullptr, 0);
}

// gesv_warp with per-matrix orders (getrf_warp_vb): b's rows from a
// matrix's order on are read as zero, its solution's rows there are zero.
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, false>::MINB))
gesv_warp_vb(const T *__restrict__ a, int *__restrict__ info, long long batch, int stages,
             int vec, unsigned long long *__restrict__ status, unsigned long long ctl,
             const T *__restrict__ b, T *__restrict__ x, int nrhs, long long bstride,
             unsigned long long *__restrict__ sstatus, unsigned long long sctl,
             const void *__restrict__ sizes, int szw)
{
    lu_warp_run<T, N, true, true>(a, nullptr, nullptr, info, batch, stages, vec, status, ctl,
                                  GesvArgs<T>{b, x, nrhs, bstride, sstatus, sctl}, sizes, szw);
}

// ---------------------------------------------------------------------------
// Inverse by in-place Gauss-Jordan with partial pivoting (same pivots as the
// LU up to rounding), n <= N: rows and columns n..N-1 are the identity.
// Lazy scaling: a pivot row keeps its unscaled values (its pivot entry set to
// 1) and is multiplied by 1/pivot once at the end. The registers then hold
// X = (P A)^{-1} by position; A^{-1}[pos(r)][pivot lane of step c] = X row r,
// column c, applied while writing the rows back.
// input, not modified:  a (batch, n, n), or csr: the diagonal blocks of
//                       order n of a CSR matrix (csr_blocks.cuh; a unused)
// output:               ainv (batch, n, n), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N, bool VB, typename Csr = gpuqr_csr::NoCsr>
__device__ __forceinline__ void getri_warp_run(const T *__restrict__ a, T *__restrict__ ainv,
                                               int *__restrict__ info, long long batch, int n,
                                               int stages, int vec,
                                               unsigned long long *__restrict__ status,
                                               unsigned long long ctl, const void *sizes, int szw,
                                               const Csr &csr = Csr())
{
    typedef Layout<T, N> L;
    constexpr int SEG = L::SEG;
    constexpr int G = WarpCfg<T, N, true>::G;
    constexpr bool SH = WarpCfg<T, N, true>::SHFL;
    if constexpr (N <= GPUQR_TINY_MAX) {
        tiny_getri<T, N>(a, ainv, info, batch, n, status, ctl, VB ? sizes : nullptr, szw, csr);
        return;
    }
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int nwb = blockDim.x >> 5;
    T *bc = reinterpret_cast<T *>(smem_raw) + wib * 2 * L::MW * L::NBUF;
    T *tiles = reinterpret_cast<T *>(smem_raw) + nwb * 2 * L::MW * L::NBUF
               + wib * stages * L::TILE;
    unsigned long long *slots = VB ? order_slots<T, N>(smem_raw, nwb, stages, wib) : nullptr;
    const int r = lane & (SEG - 1);
    const int mloc = lane / SEG;
    const int base = lane & ~(SEG - 1);

    if constexpr (G > 1) {
        run_tiles<T, N, VB, true>(a, ainv, batch, n, stages, vec != 0, tiles, slots, sizes, szw, status,
                                  ctl, [&](T *t, long long first, int, int) {
            const int z = factor2d<T, N, G, true>(t, bc, nullptr, n, lane);
            if (gpuqr_status::nan_result(z, ctl)) {         // warp-uniform; MW == 1 here
                __syncwarp();
                for (int e = lane; e < L::TILE; e += 32) t[e] = gpuqr_status::quiet_nan<T>();
            }
            if (lane == 0) info[first] = gpuqr_status::report_info(z, status, ctl);
        }, csr);
        return;
    }
    run_tiles<T, N, VB, false>(a, ainv, batch, n, stages, vec != 0, tiles, slots, sizes, szw, status,
                               ctl, [&](T *t, long long first, int nv, int order) {
        const bool active = mloc < nv && r < N;
        T row[N];
        if (active) row_read<T, N>(row, t + (mloc * N + r) * L::LD);
        bool fin = true;
        if constexpr (VB && N <= 8) {
            // the identity outside the matrix's own order (<= n) by the fixed
            // kernel's one select per entry, all NaN for a bad size behind a
            // branch; at N > 8 the selects below take fewer registers
            const int nk = order < 0 ? n : order;
#pragma unroll
            for (int j = 0; j < N; ++j) row[j] = (active && r < nk && j < nk) ? row[j] : T(r == j);
            if (active && order < 0) {
#pragma unroll
                for (int j = 0; j < N; ++j) row[j] = gpuqr_status::quiet_nan<T>();
            }
#pragma unroll
            for (int j = 0; j < N; ++j) fin = fin && finite_bits(row[j]);
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                // the identity outside the matrix's order (n, or its size; NaN: a bad size)
                if constexpr (VB) row[j] = active ? order_masked(row[j], r, j, order) : T(r == j);
                else row[j] = (active && r < n && j < n) ? row[j] : T(r == j);
                fin = fin && finite_bits(row[j]);
            }
        }
        const bool bad = seg_bits<SEG>(__ballot_sync(0xffffffffu, !fin), lane) != 0u;

        bool cand = active;
        int pos = r, zinfo = 0, mycol = r;
        T f = T(1);
        unsigned hi = key_hi(row[0]);
        unsigned bal = pivot_start<SEG>(cand, hi);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const T x = row[k];
            const T sc = pivot_scale(x);
            const T rinv = fast_rcp(cand ? x * sc : T(1));     // speculative
            const int pl = pivot_finish<SEG>(bal, cand, key_lo(x), pos, lane);
            const bool is_piv = lane == pl;
            const int p = __shfl_sync(0xffffffffu, pos, pl & 31);
            T *buf = bc + (k & 1) * L::MW * L::NBUF + mloc * L::NBUF;
            T pv, bri, bsc, b1;
            if constexpr (SH) {
                pv = __shfl_sync(0xffffffffu, x, pl & 31);
                bri = __shfl_sync(0xffffffffu, rinv, pl & 31);
                bsc = __shfl_sync(0xffffffffu, sc, pl & 31);
                b1 = __shfl_sync(0xffffffffu, row[k + 1 < N ? k + 1 : 0], pl & 31);
                if (is_piv) bcast_row<T, N>(buf, row, 0);
            } else {
                if (is_piv) {
                    bcast_row<T, N>(buf, row, 0);
                    buf[N] = rinv;
                    buf[N + 1] = sc;
                }
                __syncwarp();
                pv = buf[k];
                bri = buf[N];
                bsc = buf[N + 1];
                b1 = buf[k + 1];
            }
            const bool upd = active && !is_piv && pv != T(0);
            const T l = upd ? (x * bsc) * bri : T(0);
            if (is_piv) f = bsc * bri;                 // 1 / pivot
            row[k] = is_piv ? T(1) : (upd ? -l : x);
            if (k + 1 < N) row[k + 1 < N ? k + 1 : 0] = fma(-l, b1, row[k + 1 < N ? k + 1 : 0]);
            cand = cand && !is_piv;
            if (pos == k) pos = p; else if (is_piv) pos = k;
            if (r == k) mycol = pl - base;
            if (pv == T(0) && zinfo == 0) zinfo = k + 1;
            if (k + 1 < N) {
                hi = key_hi(row[k + 1 < N ? k + 1 : 0]);
                bal = pivot_start<SEG>(cand, hi);
            }
            if constexpr (SH) __syncwarp();
            axpy_from<T, N>(row, buf, l, 0, k, k + 1);   // columns k, k+1 done above
        }
        // A^{-1}[pos][col(c)] = f * row[c]; col(c) = lane (in the segment) pivoting step c
        if (gpuqr_status::nan_result(bad ? -1 : zinfo, ctl)) f = gpuqr_status::quiet_nan<T>();
#pragma unroll
        for (int c = 0; c < N; ++c) {
            const int tc = __shfl_sync(0xffffffffu, mycol, base + c);
            if (active) t[(mloc * N + pos) * L::LD + tc] = f * row[c];
        }
        if (active && r == 0)
            info[first + mloc] = gpuqr_status::report_info(bad ? -1 : zinfo, status, ctl);
    }, csr);
}

template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, true>::MINB))
getri_warp(const T *__restrict__ a, T *__restrict__ ainv, int *__restrict__ info,
           long long batch, int n, int stages, int vec,
           unsigned long long *__restrict__ status, unsigned long long ctl)
{
    getri_warp_run<T, N, false>(a, ainv, info, batch, n, stages, vec, status, ctl, nullptr, 0);
}

// getri_warp of the diagonal blocks of order n of a CSR matrix (block_jacobi),
// read straight from it: blocks row0 / n .. row0 / n + batch - 1 of the rows
// and columns from row0 (csr_blocks.cuh; a row0 that n does not divide: the
// ragged last block, batch 1), summed as jacobi_gather sums them, so the
// inverses are those of getri_warp on the gathered stack, to the bit. Tiles
// are read one at a time (stages 1: no copy to overlap).
template <typename T, typename I, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, true>::MINB))
jacobi_getri_warp(const I *__restrict__ indptr, const I *__restrict__ indices,
                  const T *__restrict__ data, long long row0, T *__restrict__ ainv,
                  int *__restrict__ info, long long batch, int n, int stages, int vec,
                  unsigned long long *__restrict__ status, unsigned long long ctl)
{
    getri_warp_run<T, N, false>(nullptr, ainv, info, batch, n, stages, vec, status, ctl, nullptr,
                                0, gpuqr_csr::CsrBlocks<T, I>{indptr, indices, data, row0});
}

// getri_warp of a padded stack (order n) with per-matrix orders (getrf_warp_vb).
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (WarpCfg<T, N, true>::MINB))
getri_warp_vb(const T *__restrict__ a, T *__restrict__ ainv, int *__restrict__ info,
              long long batch, int n, int stages, int vec,
              unsigned long long *__restrict__ status, unsigned long long ctl,
              const void *__restrict__ sizes, int szw)
{
    getri_warp_run<T, N, true>(a, ainv, info, batch, n, stages, vec, status, ctl, sizes, szw);
}
