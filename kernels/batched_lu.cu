// batched_lu.cu: LU (getrf) and inverse (Gauss-Jordan) of many n x n
// matrices, n <= 32: a warp per tile of 32 / SEG matrices, a row per lane,
// the matrix in registers (layout and copies: batched_warp.cuh).
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
// info per matrix: 0; k+1 for the first exactly zero pivot; -1 when the input
// holds an inf or NaN (checked on the values loaded: no extra pass).
//
// Launch: blockDim.x a multiple of 32 (<= GPUQR_WARP_THREADS), any grid (the
// warps loop over tiles); stages 1 or 2 (tiles in flight per warp); vec != 0
// when both pointers are 16-byte aligned. Dynamic shared memory, from
// warp_smem_bytes(...) in scipy_gpuqr/_batched_gpu.py, per warp:
//   [ broadcast: 2 * MW * NBUF elements ] (all warps) then
//   [ tiles: stages * TILE elements ] (all warps).
#include "batched_warp.cuh"

#ifndef GPUQR_WARP_THREADS
#define GPUQR_WARP_THREADS 256
#endif

using namespace gpuqr_warp;

namespace gpuqr_warp {

// Blocks of GPUQR_WARP_THREADS that must fit on an SM (caps the registers):
// 2, i.e. at most 128 registers (unbounded, the Gauss-Jordan n = 32 kernel
// takes 250 and halves the warps in flight; capped it spills 160 bytes).
template <typename T, int N, bool GJ>
struct MinBlocks {
    static constexpr int value = 2;
};

// Multiplier scale for the pivot x: makes x * scale and its reciprocal normal.
template <typename T>
__device__ __forceinline__ T pivot_scale(T x) {
    const T ax = fabs(x);
    T s = (ax >= big_limit<T>()) ? T(1) / up_scale<T>() : T(1);
    return (ax < sfmin<T>()) ? up_scale<T>() : s;
}

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

}  // namespace gpuqr_warp

// ---------------------------------------------------------------------------
// LU with partial pivoting, LAPACK getrf pivot order (0-based piv).
// input, not modified:  a (batch, N, N)
// output:               lu (batch, N, N), piv (batch, N), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (MinBlocks<T, N, false>::value))
getrf_warp(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
           int *__restrict__ info, long long batch, int stages, int vec)
{
    typedef Layout<T, N> L;
    constexpr int SEG = L::SEG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int nwb = blockDim.x >> 5;
    T *bc = reinterpret_cast<T *>(smem_raw) + wib * 2 * L::MW * L::NBUF;
    T *tiles = reinterpret_cast<T *>(smem_raw) + nwb * 2 * L::MW * L::NBUF
               + wib * stages * L::TILE;
    const int r = lane & (SEG - 1);
    const int mloc = lane / SEG;

    run_tiles<T, N>(a, lu, batch, N, stages, vec != 0, tiles,
                    [&](T *t, long long first, int nv) {
        const bool active = mloc < nv && r < N;
        T row[N];
        if (active) {
            row_read<T, N>(row, t + (mloc * N + r) * L::LD);
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
            if (is_piv) {
                bcast_row<T, N>(buf, row, k);
                buf[N] = rinv;
                buf[N + 1] = sc;
            }
            __syncwarp();
            const T pv = buf[k];
            const T bri = buf[N];
            const T bsc = buf[N + 1];
            const bool upd = cand && !is_piv && pv != T(0);
            const T l = upd ? (x * bsc) * bri : T(0);
            if (upd) row[k] = l;
            if (k + 1 < N) row[k + 1 < N ? k + 1 : 0] = fma(-l, buf[k + 1], row[k + 1 < N ? k + 1 : 0]);
            cand = cand && !is_piv;
            if (pos == k) pos = p; else if (is_piv) pos = k;
            if (r == k) mypiv = p;
            if (pv == T(0) && zinfo == 0) zinfo = k + 1;
            if (k + 1 < N) {
                hi = key_hi(row[k + 1 < N ? k + 1 : 0]);
                bal = pivot_start<SEG>(cand, hi);
            }
            axpy_from<T, N>(row, buf, l, k + 2, -1, -1);
        }
        if (active) {
            row_write<T, N>(t + (mloc * N + pos) * L::LD, row);
            piv[(first + mloc) * N + r] = mypiv;
            if (r == 0) info[first + mloc] = bad ? -1 : zinfo;
        }
    });
}

// ---------------------------------------------------------------------------
// Inverse by in-place Gauss-Jordan with partial pivoting (same pivots as the
// LU up to rounding), n <= N: rows and columns n..N-1 are the identity.
// Lazy scaling: a pivot row keeps its unscaled values (its pivot entry set to
// 1) and is multiplied by 1/pivot once at the end. The registers then hold
// X = (P A)^{-1} by position; A^{-1}[pos(r)][pivot lane of step c] = X row r,
// column c, applied while writing the rows back.
// input, not modified:  a (batch, n, n)
// output:               ainv (batch, n, n), info (batch)
// ---------------------------------------------------------------------------
template <typename T, int N>
__global__ void __launch_bounds__(GPUQR_WARP_THREADS, (MinBlocks<T, N, true>::value))
getri_warp(const T *__restrict__ a, T *__restrict__ ainv, int *__restrict__ info,
           long long batch, int n, int stages, int vec)
{
    typedef Layout<T, N> L;
    constexpr int SEG = L::SEG;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const int nwb = blockDim.x >> 5;
    T *bc = reinterpret_cast<T *>(smem_raw) + wib * 2 * L::MW * L::NBUF;
    T *tiles = reinterpret_cast<T *>(smem_raw) + nwb * 2 * L::MW * L::NBUF
               + wib * stages * L::TILE;
    const int r = lane & (SEG - 1);
    const int mloc = lane / SEG;
    const int base = lane & ~(SEG - 1);

    run_tiles<T, N>(a, ainv, batch, n, stages, vec != 0, tiles,
                    [&](T *t, long long first, int nv) {
        const bool active = mloc < nv && r < N;
        T row[N];
        if (active) row_read<T, N>(row, t + (mloc * N + r) * L::LD);
        bool fin = true;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            row[j] = (active && r < n && j < n) ? row[j] : T(r == j);
            fin = fin && finite_bits(row[j]);
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
            if (is_piv) {
                bcast_row<T, N>(buf, row, 0);
                buf[N] = rinv;
                buf[N + 1] = sc;
            }
            __syncwarp();
            const T pv = buf[k];
            const T bri = buf[N];
            const T bsc = buf[N + 1];
            const bool upd = active && !is_piv && pv != T(0);
            const T l = upd ? (x * bsc) * bri : T(0);
            if (is_piv) f = bsc * bri;                 // 1 / pivot
            row[k] = is_piv ? T(1) : (upd ? -l : x);
            if (k + 1 < N) row[k + 1 < N ? k + 1 : 0] = fma(-l, buf[k + 1], row[k + 1 < N ? k + 1 : 0]);
            cand = cand && !is_piv;
            if (pos == k) pos = p; else if (is_piv) pos = k;
            if (r == k) mycol = pl - base;
            if (pv == T(0) && zinfo == 0) zinfo = k + 1;
            if (k + 1 < N) {
                hi = key_hi(row[k + 1 < N ? k + 1 : 0]);
                bal = pivot_start<SEG>(cand, hi);
            }
            axpy_from<T, N>(row, buf, l, 0, k, k + 1);   // columns k, k+1 done above
        }
        // A^{-1}[pos][col(c)] = f * row[c]; col(c) = lane (in the segment) pivoting step c
#pragma unroll
        for (int c = 0; c < N; ++c) {
            const int tc = __shfl_sync(0xffffffffu, mycol, base + c);
            if (active) t[(mloc * N + pos) * L::LD + tc] = f * row[c];
        }
        if (active && r == 0) info[first + mloc] = bad ? -1 : zinfo;
    });
}
