// lu_mma.cu: LU (getrf) and inverse (getri_mma, blocked Gauss-Jordan:
// see its comment at the end) of many N x N float64 matrices, N in {16, 24,
// 32}, a warp per matrix, blocked by panels of 8 columns with the trailing
// updates on the FP64 tensor cores (mma.m8n8k4.f64, sm_80+).
//
// Why: the row-per-lane kernels of lu_warp.cu broadcast the whole pivot
// row to every lane at every column (sum over k of (N - k) doubles per lane)
// and, at 128 registers, run 16 warps per SM that mostly wait on that chain.
// Here a lane receives only the 7 other entries of the pivot row inside the
// 8-column panel, the rest of the matrix is updated once per panel by DMMA,
// and 80 registers give 24 warps per SM.
// The pivot step itself is kept short (pivot_chain): the rare pivots (zero,
// subnormal, >= 2^1022) are a warp-uniform branch decided by the pivot
// search's key, the pivot row reaches the lanes through shared memory,
// per-step bookkeeping goes to shared memory instead of register selects,
// and the copies in and out address the tile by rowx(i) ^ j. Used for the
// sizes in MMA_SIZES (scipy_gpuqr/batched/_kernel_registry.py, N = 32): at
// 16 and 24 the row-per-lane kernels are faster.
//
// The matrix stays in shared memory (a swizzled tile, below) while it is
// factorized; per panel p (columns 8p .. 8p + 7):
//   1. lane r reads row r's 8 panel entries into registers (P);
//   2. 8 pivot steps, a row per lane (pivot_chain: warp max-reduction of the
//      high key, ballot, exact tie breaks; lazy row swaps: rows never move,
//      each lane tracks its row's LAPACK position). A candidate row r at
//      step t takes l = P[t] / pivot and
//      does P[j] -= l * prow[j] for every j != t, P[t] = -l: the slots left
//      of the diagonal then hold E[r], the coefficients that express row r's
//      updated trailing part in the *original* (start-of-panel) trailing
//      rows of the pivots: trailing[r] = A12[r] + sum_t E[r][t] A12[p_t]
//      (E = -L L11^{-1}, the tracker of Gauss-Jordan restricted to the
//      panel). The multipliers themselves are kept in L (the output);
//   3. the trailing columns, all rows at once: C += E * B with B (8 x ...)
//      the pivot rows' trailing parts read from the tile, on the tensor
//      cores (2 k-steps of 4 per 8 x 8 tile). A pivot row p_t of this panel
//      has E = its slots left of t (zero from t on), which turns its trailing
//      part into U12[t]; rows pivoted in earlier panels have E = 0;
//   4. the panel's final entries (L left of the row's pivot step, U from it)
//      go back to the row's (physical) place in the tile.
// At the end row r is written to its LAPACK position pos(r) by the copy out
// (through a per-warp permutation), piv and info as LAPACK's getrf (0-based
// pivots; info = k + 1 for the first exactly zero pivot, -1 for inf/NaN in
// the input, detected on the values as they are first read).
//
// Tile: N rows of LDU 16-byte units; unit u of row i is stored at unit
// u ^ swz(i) (swz = 3-bit reversal of i & 7), which makes the row-per-lane
// 16-byte accesses, the C-fragment accesses (rows g, g+1, 4 consecutive
// units) and the A-fragment 8-byte accesses free of bank conflicts.
//
// Launch: blockDim.x a multiple of 32, any grid (warps loop over matrices);
// stages 1 or 2 (matrices in flight per warp); vec != 0 when both pointers
// are 16-byte aligned. Dynamic shared memory per warp: stages * N * LDU * 16
// bytes + 48 doubles of scratch (LU; 80 for the inverse; mma_smem_bytes in
// scipy_gpuqr/batched/_gpu.py). Template argument V of both kernels (the
// pivot chain's SB): 1 (default, the faster) the pivot row through shared
// memory, 0 by shuffles.
#include "warp.cuh"

#ifndef GPUQR_MMA_THREADS
#define GPUQR_MMA_THREADS 256
#endif
#ifndef GPUQR_MMA_MINB
#define GPUQR_MMA_MINB 3
#endif
// 1: the LU's copy in (one matrix in flight, 16-byte path) in two cp.async
// groups, the first panel's columns first: the pivot chain of panel 0 starts
// while the other 24 columns are still arriving (mma_load_split). Measured
// 4 % slower than one group on an H200 (0, the default).
#ifndef GPUQR_MMA_SPLIT
#define GPUQR_MMA_SPLIT 0
#endif
// 1: the LU's copy out by streaming stores (st.global.cs: evict first from
// L2); 0: plain stores (no difference measured on an H200).
#ifndef GPUQR_MMA_STCS
#define GPUQR_MMA_STCS 0
#endif
// k > 0: the LU (getrf_mma, gesv_mma; one matrix in flight, 16-byte path)
// asks L2 for the warp's next matrix at the start of panel k - 1 of the
// current one, so that the next copy in finds it there instead of waiting
// for HBM (a second stage in shared memory would cost a third of the warps).
// Measured slower on an H200 at every k (the earlier, the slower: the grid
// streams more than L2 holds while a warp factors one matrix, and the
// address held through the panels adds spills), so 0, the default: no
// prefetch, the kernels' code is then that of the build without it.
#ifndef GPUQR_MMA_PREFETCH
#define GPUQR_MMA_PREFETCH 0
#endif

namespace gpuqr_mma {

using namespace gpuqr_warp;

template <int N>
struct MmaTile {
    static_assert(N % 8 == 0 && N >= 16 && N <= 32, "N in {16, 24, 32}");
    static constexpr int NP = N / 8;                   // panels = row tiles
    static constexpr int UNITS = N / 2;                // 16-byte units of a row
    static constexpr int LDU = (UNITS + 7) / 8 * 8;    // units per stored row
    static constexpr int TILE = N * LDU * 2;           // doubles per matrix
};

// 3-bit reversal of i & 7.
__device__ __forceinline__ int swz(int i) {
    return ((i & 1) << 2) | (i & 2) | ((i >> 2) & 1);
}

// Offset (in doubles) of element (i, j) of the tile.
template <int N>
__device__ __forceinline__ int at(int i, int j) {
    return i * (MmaTile<N>::LDU * 2) + (((j >> 1) ^ swz(i)) << 1) + (j & 1);
}

// x, hidden from the optimizer: the copy loops' addresses (functions of the
// lane only) are recomputed per matrix instead of being hoisted out of the
// matrix loop and kept alive (spilled) through the factorization.
__device__ __forceinline__ int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

__device__ __forceinline__ void dmma(double &d0, double &d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d0), "+d"(d1) : "d"(a), "d"(b));
}

// rowx(i) ^ j is the offset of element (i, j) of the tile, at<N>(i, j):
// the row stride is a power of two above j and the swizzle.
template <int N>
__device__ __forceinline__ int rowx(int i) {
    typedef MmaTile<N> M;
    static_assert(M::LDU * 2 >= N && (M::LDU & (M::LDU - 1)) == 0, "rowx");
    return i * (M::LDU * 2) + (swz(i) << 1);
}

// Copy matrix `src` (N x N, contiguous) into the tile (cp.async). lane: the
// caller's opaque(lane) (addresses recomputed per matrix), in [0, 32).
// 16-byte path where a row's units divide 32 (N = 16, 32): unit c = lane +
// 32 k is unit u = lane % UNITS of row h + R k (h = lane / UNITS, R = 32 /
// UNITS); swz(h + R k) = swz(h) ^ swz(R k & 7), so its slot is ub ^ swz(R k
// & 7) with ub = u ^ swz(h): the copies address the tile from one base per
// value of swz(R k & 7) and the matrix from one pointer, with compile-time
// offsets (the instructions' immediates) instead of each copy's index
// arithmetic. Other N (24): a loop over the units.
template <int N>
__device__ __forceinline__ void mma_load(double *t, const double *__restrict__ src, bool vec,
                                         int lane) {
    typedef MmaTile<N> M;
    lane &= 31;
    if constexpr (32 % M::UNITS == 0) {
        if (vec) {
            constexpr int R = 32 / M::UNITS;
            const int h = lane / M::UNITS;
            const int ub = (lane % M::UNITS) ^ swz(h);
            const unsigned row0 = smem_addr(t) + 16u * (unsigned)(h * M::LDU);
            const char *g = opaque_ptr(reinterpret_cast<const char *>(src) + 16 * lane);
#pragma unroll
            for (int k = 0; k < N / R; ++k)
                cp_async16_s(row0 + 16u * (unsigned)(R * k * M::LDU + (ub ^ swz((R * k) & 7))),
                             g + 512 * k);
            return;
        }
    }
    if (vec) {
#pragma unroll
        for (int c = lane; c < N * M::UNITS; c += 32) {
            const int i = c / M::UNITS;
            const int u = c - i * M::UNITS;
            cp_async16(t + (rowx<N>(i) ^ (2 * u)), src + 2 * c);
        }
    } else {
#pragma unroll 4
        for (int e = lane; e < N * N; e += 32) {
            const int i = e / N;
            cp_async_elem(t + at<N>(i, e - i * N), src + e);
        }
    }
}

// mma_load (16-byte path) in two cp.async groups, each committed: the first
// panel's 8 columns (units 0..3) of every row, then the other units. The
// caller waits for the first (cp_async_wait<1>), factor_mma for the second
// before its first trailing update (rest_pending).
template <int N>
__device__ __forceinline__ void mma_load_split(double *t, const double *__restrict__ src,
                                               int lane) {
    typedef MmaTile<N> M;
    constexpr int P0 = 4;
    constexpr int REST = M::UNITS - P0;
    lane &= 31;
#pragma unroll
    for (int c = lane; c < N * P0; c += 32) {
        const int i = c / P0;
        const int u = c - i * P0;
        cp_async16(t + (rowx<N>(i) ^ (2 * u)), src + i * N + 2 * u);
    }
    cp_async_commit();
#pragma unroll
    for (int c = lane; c < N * REST; c += 32) {
        const int i = c / REST;
        const int u = P0 + (c - i * REST);
        cp_async16(t + (rowx<N>(i) ^ (2 * u)), src + i * N + 2 * u);
    }
    cp_async_commit();
}

// Ask L2 for the N x N matrix at src (16-byte aligned): one bulk prefetch
// by lane 0 on sm_90, else a prefetch of every 32-byte sector spread over
// the lanes. Nothing waits for it.
template <int N>
__device__ __forceinline__ void l2_prefetch(const double *src, int lane) {
    constexpr int BYTES = N * N * 8;
#if __CUDA_ARCH__ >= 900
    if ((lane & 31) == 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n"
                     :: "l"(src), "n"(BYTES) : "memory");
#else
#pragma unroll
    for (int o = (lane & 31) * 32; o < BYTES; o += 32 * 32)
        asm volatile("prefetch.global.L2 [%0];\n"
                     :: "l"(reinterpret_cast<const char *>(src) + o) : "memory");
#endif
}

// Copy the tile to dst, tile row r_i to row i (coalesced); perm[i] =
// rowx(r_i). lane as for mma_load; N = 16, 32: unit c = lane + 32 k as in
// mma_load, perm read at compile-time offsets from the lane's first row and
// dst written at compile-time offsets from its unit `lane`.
template <int N>
__device__ __forceinline__ void mma_store(double *__restrict__ dst, const double *t,
                                          const int *perm, bool vec, int lane) {
    typedef MmaTile<N> M;
    lane &= 31;
    if constexpr (32 % M::UNITS == 0) {
        if (vec) {
            constexpr int R = 32 / M::UNITS;
            const int *pr = perm + lane / M::UNITS;
            const int u2 = 2 * (lane % M::UNITS);
            double2 *d = reinterpret_cast<double2 *>(dst) + lane;
#pragma unroll
            for (int k = 0; k < N / R; ++k) {
                const double2 w = *reinterpret_cast<const double2 *>(t + (pr[R * k] ^ u2));
                if (GPUQR_MMA_STCS) __stcs(d + 32 * k, w);
                else d[32 * k] = w;
            }
            return;
        }
    }
    if (vec) {
#pragma unroll
        for (int c = lane; c < N * M::UNITS; c += 32) {
            const int i = c / M::UNITS;
            const int u = c - i * M::UNITS;
            const double2 w = *reinterpret_cast<const double2 *>(t + (perm[i] ^ (2 * u)));
            if (GPUQR_MMA_STCS) __stcs(reinterpret_cast<double2 *>(dst) + c, w);
            else reinterpret_cast<double2 *>(dst)[c] = w;
        }
    } else {
#pragma unroll 4
        for (int e = lane; e < N * N; e += 32) {
            const int i = e / N;
            dst[e] = t[perm[i] ^ (e - i * N)];
        }
    }
}

// Row i's 8 entries of panel p <-> registers (four 16-byte accesses).
template <int N>
__device__ __forceinline__ void panel_read(double (&v)[8], const double *t, int i, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        const double2 w = *reinterpret_cast<const double2 *>(t + at<N>(i, 8 * p + 2 * h));
        v[2 * h] = w.x;
        v[2 * h + 1] = w.y;
    }
}
template <int N>
__device__ __forceinline__ void panel_write(double *t, const double (&v)[8], int i, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h)
        *reinterpret_cast<double2 *>(t + at<N>(i, 8 * p + 2 * h)) = make_double2(v[2 * h], v[2 * h + 1]);
}

// Copy matrix `src` (n x n, n <= N, contiguous) into the tile, padded with
// the identity (rows and columns n .. N-1); n == N: mma_load.
template <int N>
__device__ __forceinline__ void inv_load(double *t, const double *__restrict__ src, int n,
                                         bool vec, int lane) {
    if (n == N) {
        mma_load<N>(t, src, vec, lane);
        return;
    }
#pragma unroll 4
    for (int e = lane; e < N * N; e += 32) {
        const int i = e / N;
        const int j = e - i * N;
        double *d = t + at<N>(i, j);
        if (i < n && j < n) cp_async_elem(d, src + i * n + j);
        else *d = (i == j) ? 1.0 : 0.0;
    }
}

// inv_load of block m of order n of a CSR matrix (csr_blocks.cuh): lane i < N
// writes row i of the tile, the identity outside the block, and sums the
// block's row i into it (synchronous: nothing left in flight).
template <int N, typename I>
__device__ __forceinline__ void csr_inv_load(double *t, const gpuqr_csr::CsrBlocks<double, I> &a,
                                             long long m, int n, int lane) {
    lane &= 31;
    if (lane < N) {
        const int i = lane;
#pragma unroll
        for (int j = 0; j < N; ++j) t[at<N>(i, j)] = (i == j && (i >= n || j >= n)) ? 1.0 : 0.0;
        if (i < n)
            gpuqr_csr::block_row<double, N>(a, m, n, i,
                                            [&](int j) -> double & { return t[at<N>(i, j)]; });
    }
}

// A matrix of a padded stack of order n (<= N; rows and columns n .. N-1 of
// the tile already the identity) whose own order is nk != n (matrix_order
// of batched.cuh): its rows and columns from nk on set to the identity in
// the tile, all NaN for nk < 0. A row per lane, the 16-byte units that
// change only. Call after the tile's copy has landed.
template <int N>
__device__ __forceinline__ void mma_mask(double *t, int nk, int n, int lane) {
    lane &= 31;
    if (lane < n) {
        const int i = lane;
#pragma unroll
        for (int u = 0; u < N / 2; ++u) {
            const int j = 2 * u;
            if (j < n && (i >= nk || j + 1 >= nk)) {
                double2 *p = reinterpret_cast<double2 *>(t + (rowx<N>(i) ^ j));
                double2 v = *p;
                v.x = order_masked(v.x, i, j, nk);
                if (j + 1 < n) v.y = order_masked(v.y, i, j + 1, nk);
                *p = v;
            }
        }
    }
    __syncwarp();
}

// mma_load (16-byte path) of a matrix of a padded stack of order N whose own
// order is nk (matrix_order; 0 <= nk < N here): only its leading nk x nk
// block is read, every other entry of the tile zero-filled by the copy
// itself (cp.async's source size: the same one instruction per unit as
// mma_load, no divergent paths); order_ones then writes the diagonal ones
// from nk on once the copy has landed. Together: mma_load + mma_mask.
template <int N>
__device__ __forceinline__ void order_load(double *t, const double *__restrict__ src, int nk,
                                           int lane) {
    typedef MmaTile<N> M;
    lane &= 31;
#pragma unroll
    for (int c = lane; c < N * M::UNITS; c += 32) {
        const int i = c / M::UNITS;
        const int u = c - i * M::UNITS;
        const int keep = i < nk ? min(max(nk - 2 * u, 0), 2) : 0;      // entries inside
        cp_async16_zfill(t + (rowx<N>(i) ^ (2 * u)), src + 2 * c, 8 * keep);
    }
}

// The identity's ones on the diagonal from row nk on (after order_load's
// copy has landed; lane i: row i).
template <int N>
__device__ __forceinline__ void order_ones(double *t, int nk, int lane) {
    lane &= 31;
    if (lane >= nk && lane < N) t[at<N>(lane, lane)] = 1.0;
    __syncwarp();
}

// Inverse out of the tile: out[i][c] = fs[i] * t[r_i][pos(c)] for i, c < n,
// r_i the row pivoting step i (perm[i] = rowx(r_i)), lane c holding pos(c);
// a row of dst per iteration (coalesced).
template <int N>
__device__ __forceinline__ void inv_store(double *__restrict__ dst, const double *t,
                                          const int *perm, const double *fs, int mypos,
                                          int n, int lane) {
    if (n == N && (N == 32 || lane < N)) {
#pragma unroll 8
        for (int i = 0; i < N; ++i) dst[i * N + lane] = fs[i] * t[perm[i] ^ mypos];
        return;
    }
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
        const double v = fs[i] * t[perm[i] ^ mypos];
        if (lane < n) dst[i * n + lane] = v;
    }
}


// ---------------------------------------------------------------------------
// The pivot chain of one panel, shared by the LU (GJ = false) and the
// inverse (GJ = true). Per step s (column k = 8p + s of the matrix), lane r
// holding row r's 8 panel entries P:
//   * pivot search: REDUX max of the candidates' high keys (`mh`, from the
//     previous step), ballot, exact tie breaks only when the ballot names
//     more than one lane (chain_finish);
//   * the pivot's reciprocal is computed speculatively by every lane on its
//     own x (fast_rcp) and the pivot's taken. `mh` is the pivot's high key,
//     so the warp knows without a shuffle whether the pivot is normal and
//     below 2^1022 (then 1/pivot is representable, no scaling: the common
//     path) or zero/subnormal/huge/non-finite: a warp-uniform branch that
//     scales as pivot_scale does (rare);
//   * the pivot row's other 7 entries reach every lane by shuffles (SB = 0),
//     or through a per-warp buffer in shared memory (SB = 1: the pivot lane
//     stores its 8 entries, the reciprocal in place of the pivot, and every
//     lane reads them back with broadcast 16-byte loads; two buffers by step
//     parity, one __syncwarp per step; fewer instructions than 15 shuffles);
//   * nl = -(multiplier), zero for rows that are not eliminated (LU: rows
//     already pivoted; Gauss-Jordan: the pivot row only), and
//     P[j] += nl * prow[j] for j != s; slot s takes nl (LU: candidates only;
//     the multiplier is kept in L, negated);
//   * the step's pivot lane and the pivot's position go to steps[k]
//     (pl | pp << 8), and (GJ) 1/pivot to fs[k]: shared-memory stores of one
//     value by every lane, instead of per-step register selects.
// pos: the LAPACK position of row `lane` (lazy swaps); cand: not pivoted yet.
// Returns nothing; zk (GJ) is set to k + 1 at the first exactly zero pivot.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned chain_start(bool cand, unsigned hi, unsigned &mh) {
    mh = __reduce_max_sync(0xffffffffu, cand ? hi : 0u);
    return __ballot_sync(0xffffffffu, cand && hi == mh);
}

// The pivot lane of the ballot b (exactly one bit: the common case); ties in
// the high key broken by the low key, then by the smallest position (LAPACK
// takes the first). -1 when there is no candidate.
__device__ __forceinline__ int chain_finish(unsigned b, bool cand, unsigned lo, int pos, int lane) {
    if (__popc(b) != 1) {
        const bool c1 = cand && ((b >> lane) & 1u);
        const unsigned ml = __reduce_max_sync(0xffffffffu, c1 ? lo : 0u);
        const bool c2 = c1 && lo == ml;
        const unsigned mp = __reduce_min_sync(0xffffffffu, c2 ? (unsigned)pos : 0xffffffffu);
        b = __ballot_sync(0xffffffffu, c2 && (unsigned)pos == mp);
    }
    return 31 - __clz(b);
}

// mh: the high key of a normal pivot below 2^1022 (scale 1, 1/pivot normal).
__device__ __forceinline__ bool plain_pivot(unsigned mh) {
    return mh - 0x00100000u < 0x7fd00000u - 0x00100000u;
}

template <bool GJ, int SB>
__device__ __forceinline__ void pivot_chain(double (&P)[8], double (&L)[8], bool &cand,
                                            int &pos, unsigned &bal, unsigned &mh, int p,
                                            double *bc, int *steps, double *fs, int &zk,
                                            int lane) {
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const int k = 8 * p + s;
        const double x = P[s];
        const double rinv = fast_rcp(x);              // speculative: the pivot's is used
        const int pl = chain_finish(bal, cand, key_lo(x), pos, lane);
        const bool is_piv = lane == pl;
        double b[8];
        if (SB) {
            double *w = bc + 8 * (s & 1);
            if (is_piv) {
#pragma unroll
                for (int h = 0; h < 4; ++h)
                    *reinterpret_cast<double2 *>(w + 2 * h) =
                        make_double2(2 * h == s ? rinv : P[2 * h],
                                     2 * h + 1 == s ? rinv : P[2 * h + 1]);
            }
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const double2 v = *reinterpret_cast<const double2 *>(w + 2 * h);
                b[2 * h] = v.x;
                b[2 * h + 1] = v.y;
            }
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                b[j] = __shfl_sync(0xffffffffu, j == s ? rinv : P[j], pl);
        }
        const int pp = __shfl_sync(0xffffffffu, pos, pl);
        double nl = __dmul_rn(-x, b[s]);              // minus the multiplier
        double fk = b[s];
        if (!plain_pivot(mh)) {                       // warp-uniform, rare
            const double px = __shfl_sync(0xffffffffu, x, pl);
            const bool zero = px == 0.0;
            const double sc = pivot_scale(px);
            const double r = fast_rcp(zero ? 1.0 : px * sc);
            nl = zero ? 0.0 : -(x * sc) * r;
            fk = zero ? 0.0 : sc * r;
            if (GJ && zero && zk == 0) zk = k + 1;
        }
        if (GJ) {
            if (is_piv) nl = 0.0;
        } else {
            cand = cand && !is_piv;
            if (!cand) nl = 0.0;
        }
        if (s + 1 < 8) {
            // the next column first: its key starts the next pivot search
            const int j1 = s + 1 < 8 ? s + 1 : 0;
            P[j1] = fma(nl, b[j1], P[j1]);
        }
        // slot s: -l (E); the LU keeps -l in L too
        if (GJ) {
            P[s] = nl;
        } else {
            L[s] = nl;
            if (cand) P[s] = nl;
        }
        if (pos == k) pos = pp; else if (is_piv) pos = k;
        steps[k] = pl | (pp << 8);
        if (GJ) {
            fs[k] = fk;
            cand = cand && !is_piv;
        }
        if (s + 1 < 8) bal = chain_start(cand, key_hi(P[s + 1 < 8 ? s + 1 : 0]), mh);
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j != s && j != s + 1) P[j] = fma(nl, b[j], P[j]);
    }
}

// Tile offsets of the tensor-core fragments of lane (fg, fq) = (lane / 4,
// lane % 4), at<N> with the swizzle split into the bits that the row and
// column parts of the unit index do not share (the compiler cannot see that
// they are disjoint), so that a panel needs two A addresses and a column
// tile one C address (the row tiles I are immediate offsets 8 I LD):
//   A (8I + fg, 8p + 4h + fq): a(p, h) = a0 + ((4p ^ (sw & 4)) << 1) + ((2h ^ (sw & 2)) << 1)
//   C (8I + fg, 8J + 2fq):     c(J)    = c0 + ((8J) ^ ((sw & 4) << 1))
//   B (r, 8J + fg):            b(r, J) = br + ((8J) ^ ((swz(r) & 4) << 1))
// with sw = swz(fg). Recomputed per panel (the lane goes through opaque):
// shared across panels, the offsets would stay alive (spilled).
template <int N>
struct Frag {
    static constexpr int LD = MmaTile<N>::LDU * 2;       // doubles per stored row
    int fg, fq, sw, a0, c0;
    __device__ __forceinline__ explicit Frag(int lane) {
        const int l = opaque(lane);
        fg = (l >> 2) & 7;
        fq = l & 3;
        sw = swz(fg);
        a0 = fg * LD + (((fq >> 1) ^ (sw & 1)) << 1) + (fq & 1);
        c0 = fg * LD + ((fq ^ (sw & 3)) << 1);
    }
    __device__ __forceinline__ int a(int p, int h) const {
        return a0 + (((4 * p) ^ (sw & 4)) << 1) + (((2 * h) ^ (sw & 2)) << 1);
    }
    __device__ __forceinline__ int c(int J) const { return c0 + ((8 * J) ^ ((sw & 4) << 1)); }
    __device__ __forceinline__ int brow(int r) const {
        return r * LD + (((fg >> 1) ^ (swz(r) & 3)) << 1) + (fg & 1);
    }
    __device__ __forceinline__ static int b(int br, int r, int J) {
        return br + ((8 * J) ^ ((swz(r) & 4) << 1));
    }
};

// The step of this panel where row `lane` pivoted: -1 before the panel, 8
// not yet (its position pos is final once it pivoted).
__device__ __forceinline__ int panel_step(int pos, int p) {
    return min(max(pos - 8 * p, -1), 8);
}

// LU of the tile with the shared pivot chain (see the header). Per-warp
// scratch: perm (32 ints), steps (32 ints), bc (16 doubles). Returns getrf's
// info (before the non-finite check); writes perm (rowx of the row of the
// tile that goes to LAPACK row i), piv[lane] for lane < N (piv not null)
// and mypos (the LAPACK row of tile row `lane`; steps[j] & 255 is the tile
// row of LAPACK row j). prefetch(): called at the start of panel
// GPUQR_MMA_PREFETCH - 1 (the caller asks L2 for its next matrix there; an
// address computed at the call, not held through the panels in registers).
template <int N, int SB, typename Prefetch>
__device__ __forceinline__ int factor_mma(double *t, int *perm, int *steps, double *bc,
                                          int *__restrict__ piv, bool &bad, int &mypos,
                                          bool rest_pending, int lane, Prefetch prefetch) {
    typedef MmaTile<N> M;
    constexpr int NP = M::NP;
    static_assert(NP > 1, "the wait for the rest of the tile is in the first update");
    const bool active = lane < N;
    const int row = active ? lane : 0;

    double P[8], L[8];
    if (active) {
        panel_read<N>(P, t, row, 0);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) P[j] = 0.0;
    }
    bool fin = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) { fin = fin && finite_bits(P[j]); L[j] = 0.0; }

    bool cand = active;
    int pos = lane;
    int zk = 0;
    unsigned mh;
    unsigned bal = chain_start(cand, key_hi(P[0]), mh);

#pragma unroll 1
    for (int p = 0; p < NP; ++p) {
        if (GPUQR_MMA_PREFETCH > 0 && p == GPUQR_MMA_PREFETCH - 1) prefetch();
        pivot_chain<false, SB>(P, L, cand, pos, bal, mh, p, bc, steps, nullptr, zk, lane);
        const int st = panel_step(pos, p);
        // the panel's final entries: L left of the pivot step, U from it
        double O[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) O[j] = (j < st) ? -L[j] : P[j];
        if (p + 1 < NP) {
            // E (the A operand): slots left of the row's pivot step; it goes
            // through the panel's columns of the tile, which then take O
            double E[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) E[j] = (j < st) ? P[j] : 0.0;
            if (active) panel_write<N>(t, E, row, p);
            __syncwarp();
            const Frag<N> f(lane);
            const int pr0 = steps[8 * p + f.fq] & 255;      // rows pivoting steps fq, 4 + fq
            const int pr1 = steps[8 * p + 4 + f.fq] & 255;
            const int br0 = f.brow(pr0), br1 = f.brow(pr1);
            double a[NP][2];
#pragma unroll
            for (int I = 0; I < NP; ++I)
#pragma unroll
                for (int h = 0; h < 2; ++h) a[I][h] = t[f.a(p, h) + 8 * I * Frag<N>::LD];
            __syncwarp();
            if (active) panel_write<N>(t, O, row, p);
            if (p == 0 && rest_pending) {       // the columns right of panel 0 (mma_load_split)
                cp_async_wait<0>();
                __syncwarp();
            }
#pragma unroll 1
            for (int J = p + 1; J < NP; ++J) {
                const double b0 = t[Frag<N>::b(br0, pr0, J)];
                const double b1 = t[Frag<N>::b(br1, pr1, J)];
                __syncwarp();
#pragma unroll
                for (int I = 0; I < NP; ++I) {
                    double2 *c = reinterpret_cast<double2 *>(t + f.c(J) + 8 * I * Frag<N>::LD);
                    double2 v = *c;
                    if (p == 0) fin = fin && finite_bits(v.x) && finite_bits(v.y);
                    dmma(v.x, v.y, a[I][0], b0);
                    dmma(v.x, v.y, a[I][1], b1);
                    *c = v;
                }
            }
            __syncwarp();
            if (active) panel_read<N>(P, t, row, p + 1);
            bal = chain_start(cand, key_hi(P[0]), mh);
        } else if (active) {
            panel_write<N>(t, O, row, p);
        }
    }
    // info: the first exactly zero pivot (U's diagonal, row `lane` is U row pos)
    const bool zd = active && t[at<N>(lane, pos)] == 0.0;
    const unsigned z = __reduce_min_sync(0xffffffffu, zd ? (unsigned)pos : 0xffffu);
    if (active) perm[pos] = rowx<N>(lane);
    bad = __ballot_sync(0xffffffffu, !fin) != 0u;
    mypos = pos;
    __syncwarp();
    if (active && piv != nullptr) piv[lane] = steps[lane] >> 8;
    return z == 0xffffu ? 0 : (int)z + 1;
}

// Inverse by blocked Gauss-Jordan on the tile with the shared pivot chain
// (see getri_mma). Per-warp scratch: fs (32 doubles: 1 / the pivot of step
// i), perm (32 ints), steps (32 ints), bc (16 doubles). Returns the first
// exactly zero pivot's step + 1 (0: none); writes perm[i] = rowx(r) for the
// row r of the tile pivoting step i, fs, mypos (the step where row `lane`
// pivoted) and bad (inf/NaN in the input).
template <int N, int SB>
__device__ __forceinline__ int invert_mma(double *t, int *perm, int *steps, double *bc,
                                          double *fs, int &mypos, bool &bad, int lane) {
    typedef MmaTile<N> M;
    static_assert(M::LDU * 2 >= N && (M::LDU & (M::LDU - 1)) == 0, "rowx");
    constexpr int NP = M::NP;
    const bool active = lane < N;
    const int row = active ? lane : 0;

    double P[8], L[8];
    if (active) {
        panel_read<N>(P, t, row, 0);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) P[j] = 0.0;
    }
    bool fin = true;
#pragma unroll
    for (int j = 0; j < 8; ++j) fin = fin && finite_bits(P[j]);

    bool cand = active;
    int pos = lane;
    int zk = 0;                            // first zero pivot step + 1 (warp-uniform)
    unsigned mh;
    unsigned bal = chain_start(cand, key_hi(P[0]), mh);

#pragma unroll 1
    for (int p = 0; p < NP; ++p) {
        pivot_chain<true, SB>(P, L, cand, pos, bal, mh, p, bc, steps, fs, zk, lane);
        const int st = panel_step(pos, p);
        // E (the A operand) = P through the panel's columns of the tile; the
        // pivot rows then add their one back (the panel's final entries)
        if (active) panel_write<N>(t, P, row, p);
        __syncwarp();
        const Frag<N> f(lane);
        const int pr0 = steps[8 * p + f.fq] & 255;          // rows pivoting steps fq, 4 + fq
        const int pr1 = steps[8 * p + 4 + f.fq] & 255;
        const int br0 = f.brow(pr0), br1 = f.brow(pr1);
        double a[NP][2];
#pragma unroll
        for (int I = 0; I < NP; ++I)
#pragma unroll
            for (int h = 0; h < 2; ++h) a[I][h] = t[f.a(p, h) + 8 * I * Frag<N>::LD];
        __syncwarp();
        if (active && st >= 0 && st < 8) t[at<N>(row, 8 * p + st)] += 1.0;
        // every other column tile, all rows: C += E * B, B the pivot rows'
        // entries at the start of the panel
#pragma unroll 1
        for (int jj = 1; jj < NP; ++jj) {
            const int J = p + jj < NP ? p + jj : p + jj - NP;
            const double b0 = t[Frag<N>::b(br0, pr0, J)];
            const double b1 = t[Frag<N>::b(br1, pr1, J)];
            __syncwarp();
#pragma unroll
            for (int I = 0; I < NP; ++I) {
                double2 *c = reinterpret_cast<double2 *>(t + f.c(J) + 8 * I * Frag<N>::LD);
                double2 v = *c;
                if (p == 0) fin = fin && finite_bits(v.x) && finite_bits(v.y);
                dmma(v.x, v.y, a[I][0], b0);
                dmma(v.x, v.y, a[I][1], b1);
                *c = v;
            }
        }
        __syncwarp();
        if (p + 1 < NP) {
            if (active) panel_read<N>(P, t, row, p + 1);
            bal = chain_start(cand, key_hi(P[0]), mh);
        }
    }
    if (active) perm[pos] = rowx<N>(lane);
    bad = __ballot_sync(0xffffffffu, !fin) != 0u;
    mypos = pos;
    __syncwarp();
    return zk;
}

}  // namespace gpuqr_mma

// ---------------------------------------------------------------------------
// LU with partial pivoting, LAPACK getrf pivot order (0-based piv).
// input, not modified:  a (batch, N, N) float64
// output:               lu (batch, N, N), piv (batch, N), info (batch)
// ---------------------------------------------------------------------------
// SOLVE: gesv_mma (lu and piv null; the solves of sv after each matrix's LU,
// lu_solve_rows with the factors read from the tile).
template <typename T, int N, int V, bool SOLVE, bool VB>
__device__ __forceinline__ void lu_mma_run(const T *__restrict__ a, T *__restrict__ lu,
                                           int *__restrict__ piv, int *__restrict__ info,
                                           long long batch, int stages, int vec,
                                           unsigned long long *__restrict__ status,
                                           unsigned long long ctl,
                                           const gpuqr_warp::GesvArgs<T> &sv,
                                           const void *sizes, int szw)
{
    static_assert(sizeof(T) == 8, "float64 only (FP64 tensor cores)");
    using namespace gpuqr_mma;
    typedef MmaTile<N> M;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    double *tiles = reinterpret_cast<double *>(smem_raw) + wib * (stages * M::TILE + 48);
    int *perm = reinterpret_cast<int *>(tiles + stages * M::TILE);
    int *steps = perm + 32;
    double *bc = tiles + stages * M::TILE + 32;
    const bool v = vec != 0;
    const long long stride = (long long)gridDim.x * (blockDim.x >> 5);
    long long m = (long long)blockIdx.x * (blockDim.x >> 5) + wib;
    int cur = 0;
    if (m < batch && stages == 2) {
        mma_load<N>(tiles, a + m * (N * N), v, opaque(lane));
        cp_async_commit();
    }
    // VB, one stage, 16-byte path: the order of the warp's next matrix, loaded
    // one matrix ahead, so that its copy reads only the matrix (order_load)
    const bool ahead = VB && stages != 2 && v;
    int order_ahead = N;
    if (ahead && m < batch) order_ahead = matrix_order(sizes, szw, m, N, status, ctl);
    for (; m < batch; m += stride) {
        double *t = tiles + cur * M::TILE;
        // the matrix's order (sizes; N without): read before the wait for its copy
        int order = N;
        if (ahead) {
            order = order_ahead;
            if (order == N) mma_load<N>(t, a + m * (N * N), true, opaque(lane));
            else if (order > 0) order_load<N>(t, a + m * (N * N), order, opaque(lane));
            cp_async_commit();
            if (m + stride < batch) order_ahead = matrix_order(sizes, szw, m + stride, N, status, ctl);
            cp_async_wait<0>();
        } else if (stages == 2) {
            const long long next = m + stride;
            if (next < batch) {
                mma_load<N>(tiles + (cur ^ 1) * M::TILE, a + next * (N * N), v, opaque(lane));
                cp_async_commit();
                if constexpr (VB) order = matrix_order(sizes, szw, m, N, status, ctl);
                cp_async_wait<1>();
            } else {
                if constexpr (VB) order = matrix_order(sizes, szw, m, N, status, ctl);
                cp_async_wait<0>();
            }
        } else if (GPUQR_MMA_SPLIT && v && !VB) {
            mma_load_split<N>(t, a + m * (N * N), opaque(lane));
            cp_async_wait<1>();
        } else {
            mma_load<N>(t, a + m * (N * N), v, opaque(lane));
            cp_async_commit();
            if constexpr (VB) order = matrix_order(sizes, szw, m, N, status, ctl);
            cp_async_wait<0>();
        }
        __syncwarp();
        if (VB && ahead && order >= 0 && order != N) {
            if (order > 0) order_ones<N>(t, order, opaque(lane));
            else mma_mask<N>(t, 0, N, opaque(lane));         // the whole identity
        } else if (VB && order != N) {
            mma_mask<N>(t, order, N, opaque(lane));
        }
        bool bad;
        int mypos;
        const int z = factor_mma<N, V>(t, perm, steps, bc, SOLVE ? nullptr : piv + m * N, bad,
                                       mypos, GPUQR_MMA_SPLIT && v && stages != 2 && !VB, lane,
                                       [&]() {
            if (v && stages != 2 && m + stride < batch)
                l2_prefetch<N>(a + (m + stride) * (N * N), lane);
        });
        const int got = bad ? -1 : z;
        if (lane == 0) info[m] = gpuqr_status::report_info(got, status, ctl);
        if constexpr (SOLVE) {
            const int rx = rowx<N>(lane);                  // N = 32: every lane a row
            const double d = t[rx ^ mypos];
            const double rd = 1.0 / d;
            const bool nan = gpuqr_status::nan_result(gpuqr_status::stored_info(got, ctl),
                                                      sv.ctl);
            // the matrix's order (sizes): b's rows from it on read as zero, zero solution rows
            const int nk = order < 0 ? N : order;
            bool badb = false;
#pragma unroll 1
            for (int c = 0; c < sv.nrhs; ++c) {
                const double s0 = (!VB || lane < nk)
                                      ? sv.b[m * sv.bstride + (long long)lane * sv.nrhs + c] : 0.0;
                badb |= !finite_bits(s0);
                const double xv = lu_solve_rows<double, N>(
                    s0, mypos, d, rd, [&](int j) { return t[rx ^ j]; },
                    [&](int j) { return steps[j] & 255; });
                sv.x[(m * N + mypos) * sv.nrhs + c] =
                    (VB && mypos >= nk) ? 0.0 : nan ? gpuqr_status::quiet_nan<double>() : xv;
            }
            if (badb) gpuqr_status::mark(sv.status, sv.ctl, 3);
        } else {
            mma_store<N>(lu + m * (N * N), t, perm, v, opaque(lane));
        }
        __syncwarp();
        if (stages == 2) cur ^= 1;
    }
}

template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
getrf_mma(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
          int *__restrict__ info, long long batch, int stages, int vec,
          unsigned long long *__restrict__ status, unsigned long long ctl)
{
    lu_mma_run<T, N, V, false, false>(a, lu, piv, info, batch, stages, vec, status, ctl,
                                      gpuqr_warp::GesvArgs<T>{nullptr, nullptr, 0, 0, nullptr, 0},
                                      nullptr, 0);
}

// getrf_mma of a padded stack with per-matrix orders (getrf_warp_vb of
// lu_warp.cu: sizes, szw; the identity outside each matrix's order).
template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
getrf_mma_vb(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
             int *__restrict__ info, long long batch, int stages, int vec,
             unsigned long long *__restrict__ status, unsigned long long ctl,
             const void *__restrict__ sizes, int szw)
{
    lu_mma_run<T, N, V, false, true>(a, lu, piv, info, batch, stages, vec, status, ctl,
                                     gpuqr_warp::GesvArgs<T>{nullptr, nullptr, 0, 0, nullptr, 0},
                                     sizes, szw);
}

// ---------------------------------------------------------------------------
// LU and solve (solve_batched) of float64 N x N matrices: getrf_mma's
// factorization, then the solves of each matrix's right-hand sides with the
// factors still in the tile (a row per lane, lu_solve_rows of warp.cuh); lu
// and piv are not written.
// input, not modified:  a (batch, N, N), b (GesvArgs of warp.cuh)
// output:               info (batch), x (batch, N, nrhs)
// status, ctl: the factorization's report; sstatus, sctl: the solve's.
// ---------------------------------------------------------------------------
template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
gesv_mma(const T *__restrict__ a, int *__restrict__ info, long long batch, int stages,
         int vec, unsigned long long *__restrict__ status, unsigned long long ctl,
         const T *__restrict__ b, T *__restrict__ x, int nrhs, long long bstride,
         unsigned long long *__restrict__ sstatus, unsigned long long sctl)
{
    lu_mma_run<T, N, V, true, false>(a, nullptr, nullptr, info, batch, stages, vec, status, ctl,
                                     gpuqr_warp::GesvArgs<T>{b, x, nrhs, bstride, sstatus, sctl},
                                     nullptr, 0);
}

// gesv_mma with per-matrix orders (gesv_warp_vb of lu_warp.cu).
template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
gesv_mma_vb(const T *__restrict__ a, int *__restrict__ info, long long batch, int stages,
            int vec, unsigned long long *__restrict__ status, unsigned long long ctl,
            const T *__restrict__ b, T *__restrict__ x, int nrhs, long long bstride,
            unsigned long long *__restrict__ sstatus, unsigned long long sctl,
            const void *__restrict__ sizes, int szw)
{
    lu_mma_run<T, N, V, true, true>(a, nullptr, nullptr, info, batch, stages, vec, status, ctl,
                                    gpuqr_warp::GesvArgs<T>{b, x, nrhs, bstride, sstatus, sctl},
                                    sizes, szw);
}

// ---------------------------------------------------------------------------
// Inverse by blocked Gauss-Jordan with partial pivoting (the LU's pivots),
// n <= N: rows and columns n .. N-1 are the identity.
// Per panel of 8 columns the pivot chain of the LU (pivot_chain), but every
// row is eliminated (Gauss-Jordan on [A | I] in place: the panel's columns
// end up holding the coefficients of the pivot rows' identity columns). Slot t of
// row r holds the coefficient of pivot row p_t's start-of-panel values in
// row r, minus one for r = p_t: E, the A operand of the update of every
// other column tile, all rows, on the tensor cores (C += E * B, B the pivot
// rows' entries at the start of the panel; 3 column tiles x 4 row tiles x 2
// DMMA per panel). Lazy scaling: a pivot row is not divided by its pivot
// (its coefficient of itself stays one); row r is scaled by fs = 1 / pivot
// while copying out. Lazy swaps: row r pivoted at step pos(r), column c of
// the final tile belongs to the row r_c pivoting step c, so
// A^{-1}[pos(r)][r_c] = fs * t[r][c] and the copy out gathers the columns
// (lane c reads t[r_i][pos(c)] for output row i).
// info: k + 1 for the first exactly zero pivot (the output is then
// meaningless), -1 for inf/NaN in the input (getri_warp's rules).
// input, not modified:  a (batch, n, n) float64, or csr: the diagonal blocks
//                       of order n of a CSR matrix (csr_blocks.cuh; a unused)
// output:               ainv (batch, n, n), info (batch)
// Dynamic shared memory per warp: stages * N * LDU * 16 bytes + 80 doubles
// (mma_smem_bytes(..., inverse=True) in scipy_gpuqr/batched/_gpu.py).
// ---------------------------------------------------------------------------
template <typename T, int N, int V, bool VB, typename Csr = gpuqr_csr::NoCsr>
__device__ __forceinline__ void getri_mma_run(const T *__restrict__ a, T *__restrict__ ainv,
                                              int *__restrict__ info, long long batch, int n,
                                              int stages, int vec,
                                              unsigned long long *__restrict__ status,
                                              unsigned long long ctl, const void *sizes, int szw,
                                              const Csr &csr = Csr())
{
    constexpr bool CSR = gpuqr_csr::IsCsr<Csr>::value;
    static_assert(sizeof(T) == 8, "float64 only (FP64 tensor cores)");
    using namespace gpuqr_mma;
    typedef MmaTile<N> M;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    double *tiles = reinterpret_cast<double *>(smem_raw) + wib * (stages * M::TILE + 80);
    double *fs = tiles + stages * M::TILE;
    int *perm = reinterpret_cast<int *>(fs + 32);
    int *steps = perm + 32;
    double *bc = fs + 64;
    const bool v = vec != 0;
    const long long nn = (long long)n * n;
    const long long stride = (long long)gridDim.x * (blockDim.x >> 5);
    long long m = (long long)blockIdx.x * (blockDim.x >> 5) + wib;
    int cur = 0;
    if (m < batch && stages == 2) {
        if constexpr (CSR) csr_inv_load<N>(tiles, csr, m, n, opaque(lane));
        else inv_load<N>(tiles, a + m * nn, n, v, opaque(lane));
        cp_async_commit();
    }
    // VB, one stage, 16-byte path of a stack of order N: the next matrix's
    // order one matrix ahead, its copy only the matrix (lu_mma_run)
    const bool ahead = VB && stages != 2 && v && n == N;
    int order_ahead = n;
    if (ahead && m < batch) order_ahead = matrix_order(sizes, szw, m, n, status, ctl);
    for (; m < batch; m += stride) {
        double *t = tiles + cur * M::TILE;
        // the matrix's order (sizes; n without): read before the wait for its copy
        int order = n;
        if (ahead) {
            order = order_ahead;
            if (order == N) mma_load<N>(t, a + m * nn, true, opaque(lane));
            else if (order > 0) order_load<N>(t, a + m * nn, order, opaque(lane));
            cp_async_commit();
            if (m + stride < batch) order_ahead = matrix_order(sizes, szw, m + stride, n, status, ctl);
            cp_async_wait<0>();
        } else if (stages == 2) {
            const long long next = m + stride;
            if (next < batch) {
                if constexpr (CSR)
                    csr_inv_load<N>(tiles + (cur ^ 1) * M::TILE, csr, next, n, opaque(lane));
                else
                    inv_load<N>(tiles + (cur ^ 1) * M::TILE, a + next * nn, n, v, opaque(lane));
                cp_async_commit();
                if constexpr (VB) order = matrix_order(sizes, szw, m, n, status, ctl);
                cp_async_wait<1>();
            } else {
                if constexpr (VB) order = matrix_order(sizes, szw, m, n, status, ctl);
                cp_async_wait<0>();
            }
        } else {
            if constexpr (CSR) csr_inv_load<N>(t, csr, m, n, opaque(lane));
            else inv_load<N>(t, a + m * nn, n, v, opaque(lane));
            cp_async_commit();
            if constexpr (VB) order = matrix_order(sizes, szw, m, n, status, ctl);
            cp_async_wait<0>();
        }
        __syncwarp();
        if (VB && ahead && order >= 0 && order != n) {
            if (order > 0) order_ones<N>(t, order, opaque(lane));
            else mma_mask<N>(t, 0, n, opaque(lane));          // the whole identity
        } else if (VB && order != n) {
            mma_mask<N>(t, order, n, opaque(lane));
        }
        bool bad;
        int mypos;
        const int z = invert_mma<N, V>(t, perm, steps, bc, fs, mypos, bad, lane);
        if (gpuqr_status::nan_result(bad ? -1 : z, ctl)) {    // warp-uniform: all-NaN rows
            __syncwarp();
            fs[lane] = gpuqr_status::quiet_nan<double>();
            __syncwarp();
        }
        if (lane == 0) info[m] = gpuqr_status::report_info(bad ? -1 : z, status, ctl);
        inv_store<N>(ainv + m * nn, t, perm, fs, mypos, n, opaque(lane));
        __syncwarp();
        if (stages == 2) cur ^= 1;
    }
}

template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
getri_mma(const T *__restrict__ a, T *__restrict__ ainv, int *__restrict__ info,
          long long batch, int n, int stages, int vec,
          unsigned long long *__restrict__ status, unsigned long long ctl)
{
    getri_mma_run<T, N, V, false>(a, ainv, info, batch, n, stages, vec, status, ctl, nullptr, 0);
}

// getri_mma of the diagonal blocks of order n of a CSR matrix (block_jacobi),
// read straight from it (jacobi_getri_warp of lu_warp.cu: the same blocks,
// the same sums); one matrix at a time per warp (stages 1).
template <typename T, typename I, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
jacobi_getri_mma(const I *__restrict__ indptr, const I *__restrict__ indices,
                 const T *__restrict__ data, long long row0, T *__restrict__ ainv,
                 int *__restrict__ info, long long batch, int n, int stages, int vec,
                 unsigned long long *__restrict__ status, unsigned long long ctl)
{
    getri_mma_run<T, N, V, false>(nullptr, ainv, info, batch, n, stages, vec, status, ctl,
                                  nullptr, 0,
                                  gpuqr_csr::CsrBlocks<T, I>{indptr, indices, data, row0});
}

// getri_mma of a padded stack (order n) with per-matrix orders (getrf_mma_vb).
template <typename T, int N, int V = 1>
__global__ void __launch_bounds__(GPUQR_MMA_THREADS, GPUQR_MMA_MINB)
getri_mma_vb(const T *__restrict__ a, T *__restrict__ ainv, int *__restrict__ info,
             long long batch, int n, int stages, int vec,
             unsigned long long *__restrict__ status, unsigned long long ctl,
             const void *__restrict__ sizes, int szw)
{
    getri_mma_run<T, N, V, true>(a, ainv, info, batch, n, stages, vec, status, ctl, sizes, szw);
}
