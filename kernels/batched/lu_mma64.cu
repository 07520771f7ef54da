// lu_mma64.cu: LU with partial pivoting of many float64 matrices of order
// 32 < n <= 64, a warp per matrix, the matrix in shared memory, blocked by
// panels of 8 columns with the trailing updates on the FP64 tensor cores
// (mma.m8n8k4.f64, sm_80+) (getrf_mma64); and the same scheme as the panel
// step of the blocked LU of 64 < n <= 512 (getrf_mma_rows, at the end).
//
// Why: the one-kernel LU with a row per thread (getrf_rows<T, 64, 64> of
// rows.cu) needs two warps and a block-wide barrier per column, 176
// registers per thread (five matrices per SM) and a fully unrolled 64-column
// body (instruction fetch). Here a warp owns a matrix: no block barrier, the
// pivot search is warp reductions, a lane receives only the 7 other entries
// of the pivot row inside the panel, and the rest of the matrix is updated
// once per panel by DMMA. Same scheme as getrf_mma of lu_mma.cu (n <= 32,
// see its header for the E = -L L11^{-1} bookkeeping), with two rows per
// lane and a plain padded row layout.
//
// The 64 x 64 tile (the matrix padded with the identity when n < 64: the
// padding rows never win a pivot search before step n, their entries in
// the first n columns being zero and their positions larger) stays in
// shared memory; lane l holds rows l and l + 32. Per panel p (columns 8p ..
// 8p + 7):
//   1. each lane reads its two rows' 8 panel entries into registers (P);
//   2. 8 pivot steps: the lane's better candidate of its two rows, warp
//      max-reduction of the high key of |x|, ballot, exact tie breaks (low
//      key, then the smaller LAPACK position, as LAPACK's idamax on the
//      swapped column); the pivot lane publishes the pivot row's 8 entries
//      and the pivot's reciprocal through shared memory (one __syncwarp per
//      step). A candidate row takes nl = -x / pivot (x * (1 / pivot) when
//      |pivot| >= sfmin, else the division, as LAPACK), P[j] += nl * prow[j]
//      for j != s and P[s] = nl: slots left of the diagonal then hold the
//      coefficients E of the original (start-of-panel) trailing rows of the
//      panel's pivots. Lazy row swaps: rows never move; each keeps its
//      LAPACK position (the swap of step k exchanges positions k and piv[k]);
//   3. trailing columns, all rows: C += E * B, B the pivot rows' trailing
//      parts at the start of the panel (2 DMMA per 8 x 8 tile). A pivot row
//      of step t has E = its slots left of t, which turns it into U's row
//      t; rows pivoted in earlier panels have E = 0;
//   4. the panel's final entries (L left of the row's pivot step, U from
//      it) go back to the tile.
// At the end row r is copied to its LAPACK position (coalesced stores).
// piv and info as LAPACK's getrf (0-based pivots; info = k + 1 for the
// first exactly zero pivot, -1 for an inf or NaN in the input, checked on
// the values as they are first read).
//
// Launch: one warp (32 threads) per block, a block per matrix; dynamic
// shared memory kSmemBytes (below; under 48 KiB). vec != 0: n == 64 and
// both pointers 16-byte aligned (16-byte copies).
#include "warp.cuh"

namespace gpuqr_mma64 {

using namespace gpuqr_warp;

constexpr int N = 64;                 // tile order
constexpr int LD = 66;                // doubles per stored row (odd 16-byte units)
constexpr int NP = N / 8;             // panels of 8 columns
constexpr int TILE = N * LD;          // doubles of the tile
constexpr int BC = 10;                // pivot row broadcast: 8 entries, 1 / pivot, pad
// tile, two broadcast buffers, steps[64] and perm[64] (ints)
constexpr int kSmemBytes = (TILE + 2 * BC) * 8 + 2 * N * 4;

__device__ __forceinline__ void dmma(double &d0, double &d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d0), "+d"(d1) : "d"(a), "d"(b));
}

// Panel kernel (getrf_mma_rows): width, stored row, sub-panels, warps.
constexpr int PW = 32;                // panel width (ROWS_PANEL of the driver)
constexpr int PLD = 34;               // doubles per stored panel row (odd 16-byte units)
constexpr int PNP = PW / 8;           // sub-panels of 8 columns
constexpr int MAXW = 8;               // warps of 64 rows: panels of up to 512 rows
constexpr int SLOT = 10;              // a warp's candidate row: 8 entries, 1 / pivot, pad
constexpr int kMoveStride = 1 + 4 * PW;  // ints per matrix of a panel's row moves
constexpr int kSwapCols = 64;         // columns per block of rows_swap
constexpr int kSwapThreads = 256;

__device__ __forceinline__ unsigned long long key64(double x) {
    return (unsigned long long)__double_as_longlong(x) & 0x7fffffffffffffffull;
}

// Row r's 8 entries of panel p <-> registers (four 16-byte accesses).
__device__ __forceinline__ void panel_read(double (&v)[8], const double *t, int r, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        const double2 w = *reinterpret_cast<const double2 *>(t + r * LD + 8 * p + 2 * h);
        v[2 * h] = w.x;
        v[2 * h + 1] = w.y;
    }
}
__device__ __forceinline__ void panel_write(double *t, const double (&v)[8], int r, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h)
        *reinterpret_cast<double2 *>(t + r * LD + 8 * p + 2 * h) =
            make_double2(v[2 * h], v[2 * h + 1]);
}

// The same with a row stride of LDX doubles.
template <int LDX>
__device__ __forceinline__ void panel_read_ld(double (&v)[8], const double *t, int r, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
        const double2 w = *reinterpret_cast<const double2 *>(t + r * LDX + 8 * p + 2 * h);
        v[2 * h] = w.x;
        v[2 * h + 1] = w.y;
    }
}
template <int LDX>
__device__ __forceinline__ void panel_write_ld(double *t, const double (&v)[8], int r, int p) {
#pragma unroll
    for (int h = 0; h < 4; ++h)
        *reinterpret_cast<double2 *>(t + r * LDX + 8 * p + 2 * h) =
            make_double2(v[2 * h], v[2 * h + 1]);
}

}  // namespace gpuqr_mma64

// ---------------------------------------------------------------------------
// input, not modified:  a (batch, n, n) float64, 32 < n <= 64
// output:               lu (batch, n, n), piv (batch, n), info (batch)
// block: 32 threads; grid: batch; dynamic shared memory kSmemBytes
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(32)
getrf_mma64(const T *__restrict__ a, T *__restrict__ lu, int *__restrict__ piv,
            int *__restrict__ info, int n, int vec)
{
    static_assert(sizeof(T) == 8, "float64 only (FP64 tensor cores)");
    using namespace gpuqr_mma64;
    static_assert(kSmemBytes <= 48 * 1024, "no opt-in to more shared memory");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    double *t = reinterpret_cast<double *>(smem_raw);
    double *bcast = t + TILE;
    int *steps = reinterpret_cast<int *>(bcast + 2 * BC);
    int *perm = steps + N;
    const int lane = threadIdx.x & 31;
    const long long mat = blockIdx.x;
    const long long nn = (long long)n * n;
    const double *src = a + mat * nn;

    // ---- copy in (the identity beyond n)
    if (vec) {
#pragma unroll 4
        for (int c = lane; c < N * N / 2; c += 32) {
            const int i = c >> 5, u = c & 31;
            cp_async16(t + i * LD + 2 * u, src + 2 * c);
        }
        cp_async_commit();
        cp_async_wait<0>();
    } else {
#pragma unroll 4
        for (int e = lane; e < N * N; e += 32) {
            const int i = e >> 6, j = e & 63;
            t[i * LD + j] = (i < n && j < n) ? src[i * n + j] : (i == j ? 1.0 : 0.0);
        }
    }
    __syncwarp();

    double P[2][8], L[2][8];
    bool cand[2] = {true, true};
    int pos[2] = {lane, lane + 32};
    bool fin = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        panel_read(P[h], t, lane + 32 * h, 0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            fin = fin && finite_bits(P[h][j]);
            L[h][j] = 0.0;
        }
    }
    const int fg = lane >> 2, fq = lane & 3;           // mma fragment coordinates

#pragma unroll 1
    for (int p = 0; p < NP; ++p) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const int k = 8 * p + s;
            // the lane's better candidate (larger |x|, then smaller position)
            int bh = -1;
            unsigned long long best = 0ull;
            int bpos = 0x7fffffff;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned long long key = key64(P[h][s]);
                if (cand[h] && (bh < 0 || key > best || (key == best && pos[h] < bpos))) {
                    bh = h;
                    best = key;
                    bpos = pos[h];
                }
            }
            const bool valid = bh >= 0;
            const double x = bh == 0 ? P[0][s] : (bh == 1 ? P[1][s] : 1.0);
            const double rinv = __drcp_rn(x);          // speculative: the pivot lane's is used
            const unsigned hi = valid ? (unsigned)(best >> 32) : 0u;
            const unsigned mh = __reduce_max_sync(0xffffffffu, hi);
            const bool c1 = valid && hi == mh;
            unsigned b = __ballot_sync(0xffffffffu, c1);
            if (__popc(b) != 1) {                      // warp-uniform: ties in the high key
                const unsigned lo = (unsigned)best;
                const unsigned ml = __reduce_max_sync(0xffffffffu, c1 ? lo : 0u);
                const bool c2 = c1 && lo == ml;
                const unsigned mp = __reduce_min_sync(0xffffffffu,
                                                      c2 ? (unsigned)bpos : 0xffffffffu);
                b = __ballot_sync(0xffffffffu, c2 && (unsigned)bpos == mp);
            }
            const int pl = __ffs(b) - 1;
            double *w = bcast + BC * (s & 1);
            if (lane == pl) {
                // the pivot row's 8 entries (the pivot itself in slot s) and 1 / pivot
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (h == bh) {
#pragma unroll
                        for (int q = 0; q < 4; ++q)
                            *reinterpret_cast<double2 *>(w + 2 * q) =
                                make_double2(P[h][2 * q], P[h][2 * q + 1]);
                        cand[h] = false;
                    }
                }
                w[8] = rinv;
                steps[k] = (lane + 32 * bh) | (bpos << 8);
            }
            __syncwarp();
            double bv[8];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const double2 v = *reinterpret_cast<const double2 *>(w + 2 * q);
                bv[2 * q] = v.x;
                bv[2 * q + 1] = v.y;
            }
            const double ri = w[8];
            const int st = steps[k];
            const int prow = st & 255, pp = st >> 8;
            const double pv = bv[s];
            const bool zero = pv == 0.0;               // warp-uniform
            const bool small = fabs(pv) < gpuqr_sfmin<double>();
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (cand[h]) {
                    const double xr = P[h][s];
                    double nl;
                    if (!small) nl = -(xr * ri);          // warp-uniform branches
                    else if (!zero) nl = -(xr / pv);
                    else nl = 0.0;
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        if (j != s) P[h][j] = fma(nl, bv[j], P[h][j]);
                    P[h][s] = nl;
                    L[h][s] = nl;
                }
                if (pos[h] == k) pos[h] = pp;
                else if (lane + 32 * h == prow) pos[h] = k;
            }
        }

        // E (the A operand) and the panel's final entries O
        double O[2][8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int st = min(max(pos[h] - 8 * p, -1), 8);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                O[h][j] = (j < st) ? -L[h][j] : P[h][j];
                P[h][j] = (j < st) ? P[h][j] : 0.0;       // E
            }
        }
        if (p + 1 < NP) {
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write(t, P[h], lane + 32 * h, p);
            __syncwarp();
            double af[NP][2];
#pragma unroll
            for (int I = 0; I < NP; ++I)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                    af[I][hh] = t[(8 * I + fg) * LD + 8 * p + 4 * hh + fq];
            const int pr0 = steps[8 * p + fq] & 255;       // rows pivoting steps fq, 4 + fq
            const int pr1 = steps[8 * p + 4 + fq] & 255;
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write(t, O[h], lane + 32 * h, p);
#pragma unroll 1
            for (int J = p + 1; J < NP; ++J) {
                const double b0 = t[pr0 * LD + 8 * J + fg];
                const double b1 = t[pr1 * LD + 8 * J + fg];
                __syncwarp();
#pragma unroll
                for (int I = 0; I < NP; ++I) {
                    double2 *c = reinterpret_cast<double2 *>(t + (8 * I + fg) * LD + 8 * J + 2 * fq);
                    double2 v = *c;
                    if (p == 0) fin = fin && finite_bits(v.x) && finite_bits(v.y);
                    dmma(v.x, v.y, af[I][0], b0);
                    dmma(v.x, v.y, af[I][1], b1);
                    *c = v;
                }
            }
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_read(P[h], t, lane + 32 * h, p + 1);
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write(t, O[h], lane + 32 * h, p);
        }
    }
    __syncwarp();

    // info: the first exactly zero pivot (row r is U's row pos[r])
    unsigned zmin = 0xffffu;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = lane + 32 * h;
        if (t[r * LD + pos[h]] == 0.0) zmin = min(zmin, (unsigned)pos[h]);
        perm[pos[h]] = r;
    }
    const unsigned z = __reduce_min_sync(0xffffffffu, zmin);
    const bool bad = __ballot_sync(0xffffffffu, !fin) != 0u;
    __syncwarp();
    int *pv_out = piv + mat * n;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int k = lane + 32 * h;
        if (k < n) pv_out[k] = steps[k] >> 8;
    }
    if (lane == 0) info[mat] = bad ? -1 : ((int)z < n ? (int)z + 1 : 0);

    // ---- copy out: row perm[i] of the tile is row i of the factor
    double *dst = lu + mat * nn;
    if (vec) {
#pragma unroll 4
        for (int c = lane; c < N * N / 2; c += 32) {
            const int i = c >> 5, u = c & 31;
            reinterpret_cast<double2 *>(dst)[c] =
                *reinterpret_cast<const double2 *>(t + perm[i] * LD + 2 * u);
        }
    } else {
#pragma unroll 4
        for (int e = lane; e < n * n; e += 32) {
            const int i = e / n, j = e - i * n;
            dst[e] = t[perm[i] * LD + j];
        }
    }
}

// GPUQR_ROWS_CLOCK (a measurement build, bench/batched_lu_rows.py --clock):
// thread 0 of every block of getrf_mma_rows adds its clock64 ticks per phase
// (0 copy in of the first sub-panel, 1 pivot steps, 2 DMMA updates and the
// wait for the other columns' copy, 3 copy out, 4 the moves' list) to
// gpuqr_rows_clock, and the blocks' count to slot 7.
#ifdef GPUQR_ROWS_CLOCK
__device__ unsigned long long gpuqr_rows_clock[8];
#define GPUQR_ROWS_TICK(i)                                                      \
    if (threadIdx.x == 0) {                                                     \
        const long long c_ = clock64();                                         \
        atomicAdd(&gpuqr_rows_clock[i], (unsigned long long)(c_ - tick_));      \
        tick_ = c_;                                                             \
    }
#else
#define GPUQR_ROWS_TICK(i)
#endif

// ---------------------------------------------------------------------------
// One panel step of the blocked LU for 64 < n <= 512 (the driver's 'rows_mma'
// method): getrf_rows<double, 32, 512> of rows.cu without its solve of U12
// (the driver's trsm_lunit does it: in this kernel it would need more than
// 255 registers), with the scheme above inside: the panel
// A[k0:n, k0:k0+nb] (nb = min(32, n - k0)) in shared memory, W = ceil((n -
// k0) / 64) warps, lane l of warp w holding rows 64w + l and 64w + l + 32
// (rows beyond n - k0 are zero and never candidates); sub-panels of 8
// columns; per pivot step each warp's best candidate publishes its 8 entries,
// 1 / pivot, key and position in the warp's slot, one __syncthreads, every
// thread picks the block's winner from the W slots (larger |x|, then the
// smaller LAPACK position); per sub-panel the other sub-panels' columns of
// every warp's rows by DMMA (C += E * B, B read by all warps before a
// barrier, then written). Then the panel goes to its final rows, and the
// rows that changed place are listed in moves for rows_swap (below), which
// moves them in the columns outside the panel: here the block's few warps
// spent most of their time on those moves, and the shared memory to stage
// them kept blocks off the SM.
// input:  src (batch, n, n) (the panel is read from here, may equal dst)
// output: dst (the panel's columns), piv (batch, n) entries k0 .. k0 + nb - 1
//         (0-based, LAPACK order), info (batch): read when k0 > 0, written;
//         moves (batch, kMoveStride): the count, then (source, destination)
//         row pairs relative to k0
// block:  W = ceil((n - k0) / 64) warps (<= 8); dynamic shared memory
//         (2 * MAXW * SLOT + 64 W * PLD) * 8 bytes (the candidate slots, then
//         the panel; mma_rows_smem in scipy_gpuqr/batched/_kernel_registry.py)
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
getrf_mma_rows(const T *src, T *dst, int *__restrict__ piv, int *__restrict__ info,
               int n, int k0, int *__restrict__ moves)
{
    static_assert(sizeof(T) == 8, "float64 only (FP64 tensor cores)");
    using namespace gpuqr_mma64;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned long long skey[2][MAXW];
    __shared__ int smeta[2][MAXW];                     // row | pos << 16
    __shared__ int spiv[PW];
    // row numbers < 512 as shorts: with 64 W * PLD doubles of panel, six
    // blocks of two warps fit an SM's 228 KiB (ints: five)
    __shared__ short perm[64 * MAXW];
    __shared__ short msrc[2 * PW], mdst[2 * PW];
    __shared__ int mcount;

    const int tid = threadIdx.x, nth = blockDim.x, nw = nth >> 5;
    const int lane = tid & 31, warp = tid >> 5;
    const long long mat = blockIdx.x;
    const T *S = src + mat * (long long)n * n;
    T *A = dst + mat * (long long)n * n;
    const int m = n - k0;
    const int nb = min(PW, m);
    const int MR = 64 * nw;
    double *slots = reinterpret_cast<double *>(smem_raw);  // [2][MAXW][SLOT]
    double *t = slots + 2 * MAXW * SLOT;                // MR x PLD
    if (tid == 0) mcount = 0;
#ifdef GPUQR_ROWS_CLOCK
    long long tick_ = clock64();
    if (tid == 0) atomicAdd(&gpuqr_rows_clock[7], 1ull);
#endif

    // copy in (cp.async, zero beyond the panel) as two groups: the first
    // sub-panel's columns, waited for before the pivot steps, then the other
    // columns, waited for only before the first DMMA update, so that their
    // loads arrive behind the first sub-panel's pivot steps (at n = 512 the
    // first panels are one block per SM: nothing else of the SM hides them).
    // 16-byte copies where the panel is full and its rows 16-byte aligned.
    const bool vin = nb == PW && (n & 1) == 0 && (reinterpret_cast<size_t>(S) & 15) == 0;
    if (vin) {
        for (int e = tid; e < MR * 4; e += nth) {           // columns 0 .. 7
            const int i = e >> 2, j = 2 * (e & 3);
            if (i < m) cp_async16(t + i * PLD + j, S + (long long)(k0 + i) * n + k0 + j);
            else *reinterpret_cast<double2 *>(t + i * PLD + j) = make_double2(0.0, 0.0);
        }
        cp_async_commit();
        for (int e = tid; e < MR * 12; e += nth) {          // columns 8 .. 31
            const int i = e / 12, j = 8 + 2 * (e - 12 * i);
            if (i < m) cp_async16(t + i * PLD + j, S + (long long)(k0 + i) * n + k0 + j);
            else *reinterpret_cast<double2 *>(t + i * PLD + j) = make_double2(0.0, 0.0);
        }
    } else {
        for (int e = tid; e < MR * 8; e += nth) {
            const int i = e >> 3, j = e & 7;
            if (i < m && j < nb) cp_async_elem(t + i * PLD + j, S + (long long)(k0 + i) * n + k0 + j);
            else t[i * PLD + j] = 0.0;
        }
        cp_async_commit();
        for (int e = tid; e < MR * 24; e += nth) {
            const int i = e / 24, j = 8 + e - 24 * i;
            if (i < m && j < nb) cp_async_elem(t + i * PLD + j, S + (long long)(k0 + i) * n + k0 + j);
            else t[i * PLD + j] = 0.0;
        }
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    GPUQR_ROWS_TICK(0)

    const int rb = 64 * warp + lane;                    // row of h = 0
    double P[2][8], L[2][8];
    bool cand[2];
    int pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        cand[h] = rb + 32 * h < m;
        pos[h] = rb + 32 * h;
        panel_read_ld<PLD>(P[h], t, rb + 32 * h, 0);
#pragma unroll
        for (int j = 0; j < 8; ++j) L[h][j] = 0.0;
    }
    const int fg = lane >> 2, fq = lane & 3;
    int zk = 0;                                         // first zero pivot + 1 (panel)

#pragma unroll 1
    for (int p = 0; p < PNP; ++p) {
        if (8 * p >= nb) break;
        int pr0 = 0, pr1 = 0;                           // rows pivoting steps fq, 4 + fq
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const int k = 8 * p + s;
            if (k >= nb) break;                         // block-uniform
            int bh = -1;
            unsigned long long best = 0ull;
            int bpos = 0x7fff;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned long long key = key64(P[h][s]);
                if (cand[h] && (bh < 0 || key > best || (key == best && pos[h] < bpos))) {
                    bh = h;
                    best = key;
                    bpos = pos[h];
                }
            }
            const bool valid = bh >= 0;
            const unsigned hi = valid ? (unsigned)(best >> 32) : 0u;
            const unsigned mh = __reduce_max_sync(0xffffffffu, hi);
            const bool c1 = valid && hi == mh;
            unsigned b = __ballot_sync(0xffffffffu, c1);
            if (__popc(b) != 1) {
                const unsigned lo = (unsigned)best;
                const unsigned ml = __reduce_max_sync(0xffffffffu, c1 ? lo : 0u);
                const bool c2 = c1 && lo == ml;
                const unsigned mp = __reduce_min_sync(0xffffffffu,
                                                      c2 ? (unsigned)bpos : 0xffffffffu);
                b = __ballot_sync(0xffffffffu, c2 && (unsigned)bpos == mp);
            }
            const int pl = __ffs(b) - 1;                // -1: no candidate in this warp
            const int buf = s & 1;
            double *w = slots + (buf * MAXW + warp) * SLOT;
            if (lane == pl) {
                // 1 / pivot by the warp's candidate lane only (not on every lane)
                w[8] = __drcp_rn(bh == 0 ? P[0][s] : P[1][s]);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (h == bh) {
#pragma unroll
                        for (int q = 0; q < 4; ++q)
                            *reinterpret_cast<double2 *>(w + 2 * q) =
                                make_double2(P[h][2 * q], P[h][2 * q + 1]);
                    }
                }
                skey[buf][warp] = best;
                smeta[buf][warp] = (rb + 32 * bh) | (bpos << 16);
            }
            if (pl < 0 && lane == 0) {
                skey[buf][warp] = 0ull;
                smeta[buf][warp] = 0x7fff << 16;
            }
            __syncthreads();
            // the block's winner: larger key, then smaller position (only
            // the block's nw slots read)
            unsigned long long bk = skey[buf][0];
            int bm = smeta[buf][0], bw = 0;
#pragma unroll
            for (int v = 1; v < MAXW; ++v) {
                if (v >= nw) break;                     // block-uniform
                const unsigned long long kv = skey[buf][v];
                const int mv = smeta[buf][v];
                if (kv > bk || (kv == bk && (mv >> 16) < (bm >> 16))) {
                    bk = kv;
                    bm = mv;
                    bw = v;
                }
            }
            const int prow = bm & 0xffff, pp = bm >> 16;
            const double *wb = slots + (buf * MAXW + bw) * SLOT;
            double bv[8];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const double2 v = *reinterpret_cast<const double2 *>(wb + 2 * q);
                bv[2 * q] = v.x;
                bv[2 * q + 1] = v.y;
            }
            const double ri = wb[8];
            const double pv = bv[s];
            const bool zero = pv == 0.0;                // block-uniform
            const bool small = fabs(pv) < gpuqr_sfmin<double>();
            if (zero && zk == 0) zk = k + 1;
            if (tid == 0) spiv[k] = pp;
            if (fq == s) pr0 = prow;
            if (fq + 4 == s) pr1 = prow;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (rb + 32 * h == prow) cand[h] = false;
                if (cand[h]) {
                    const double xr = P[h][s];
                    double nl;
                    if (!small) nl = -(xr * ri);
                    else if (!zero) nl = -(xr / pv);
                    else nl = 0.0;
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        if (j != s) P[h][j] = fma(nl, bv[j], P[h][j]);
                    P[h][s] = nl;
                    L[h][s] = nl;
                }
                if (pos[h] == k) pos[h] = pp;
                else if (rb + 32 * h == prow) pos[h] = k;
            }
        }

        GPUQR_ROWS_TICK(1)
        if (p == 0) {                                   // the second copy group
            cp_async_wait<0>();
            __syncthreads();
        }
        double O[2][8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int st = min(max(pos[h] - 8 * p, -1), 8);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                O[h][j] = (j < st) ? -L[h][j] : P[h][j];
                P[h][j] = (j < st) ? P[h][j] : 0.0;       // E
            }
        }
        if (8 * (p + 1) < nb) {                            // block-uniform
            // B: the pivot rows' entries of the later sub-panels, read by
            // every warp before any warp writes them
            double bf[PNP - 1][2];
#pragma unroll
            for (int jj = 0; jj < PNP - 1; ++jj) {
                const int J = p + 1 + jj;
                const bool use = J < PNP && 8 * J < nb;
                bf[jj][0] = use ? t[pr0 * PLD + 8 * J + fg] : 0.0;
                bf[jj][1] = use ? t[pr1 * PLD + 8 * J + fg] : 0.0;
            }
            __syncthreads();
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write_ld<PLD>(t, P[h], rb + 32 * h, p);
            __syncwarp();
            double af[8][2];
#pragma unroll
            for (int I = 0; I < 8; ++I)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                    af[I][hh] = t[(64 * warp + 8 * I + fg) * PLD + 8 * p + 4 * hh + fq];
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write_ld<PLD>(t, O[h], rb + 32 * h, p);
#pragma unroll
            for (int jj = 0; jj < PNP - 1; ++jj) {
                const int J = p + 1 + jj;
                if (J < PNP && 8 * J < nb) {
#pragma unroll
                    for (int I = 0; I < 8; ++I) {
                        double2 *c = reinterpret_cast<double2 *>(
                            t + (64 * warp + 8 * I + fg) * PLD + 8 * J + 2 * fq);
                        double2 v = *c;
                        dmma(v.x, v.y, af[I][0], bf[jj][0]);
                        dmma(v.x, v.y, af[I][1], bf[jj][1]);
                        *c = v;
                    }
                }
            }
            __syncwarp();
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_read_ld<PLD>(P[h], t, rb + 32 * h, p + 1);
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) panel_write_ld<PLD>(t, O[h], rb + 32 * h, p);
        }
        GPUQR_ROWS_TICK(2)
    }

    // the panel to its final rows; the rows that changed place
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = rb + 32 * h;
        if (r < m) {
            perm[pos[h]] = (short)r;
            if (pos[h] != r) {
                const int sidx = atomicAdd(&mcount, 1);
                msrc[sidx] = (short)r;
                mdst[sidx] = (short)pos[h];
            }
        }
    }
    __syncthreads();
    bool bad = false;
    if (nb == PW && (n & 1) == 0 && (reinterpret_cast<size_t>(A) & 15) == 0) {
        // 16-byte units, a row's 16 units on 16 consecutive threads
        for (int e = tid; e < m * (PW / 2); e += nth) {
            const int i = e >> 4, j = 2 * (e & 15);
            const double2 v = *reinterpret_cast<const double2 *>(t + perm[i] * PLD + j);
            bad = bad || !isfinite(v.x) || !isfinite(v.y);
            *reinterpret_cast<double2 *>(A + (long long)(k0 + i) * n + k0 + j) = v;
        }
    } else {
        for (int e = tid; e < m * nb; e += nth) {
            const int i = e / nb, j = e - i * nb;
            const double v = t[perm[i] * PLD + j];
            bad = bad || !isfinite(v);
            A[(long long)(k0 + i) * n + k0 + j] = v;
        }
    }
    if (tid < nb) piv[mat * n + k0 + tid] = k0 + spiv[tid];
    GPUQR_ROWS_TICK(3)

    {
        // the moves for rows_swap (mdst[i] takes row msrc[i], relative to k0)
        int *mv = moves + mat * kMoveStride;
        const int cnt = mcount;
        if (tid == 0) mv[0] = cnt;
        for (int e = tid; e < cnt; e += nth) {
            mv[1 + 2 * e] = msrc[e];
            mv[2 + 2 * e] = mdst[e];
        }
    }
    bad = __syncthreads_or(bad);
    GPUQR_ROWS_TICK(4)
    if (tid == 0) {
        const int prev = k0 > 0 ? info[mat] : 0;
        const int zinfo = zk ? k0 + zk : 0;
        info[mat] = (prev < 0 || bad) ? -1 : (prev > 0 ? prev : zinfo);
    }
}

// ---------------------------------------------------------------------------
// The row moves of one getrf_mma_rows panel in the columns outside it
// ([c_lo, k0) and [k0 + nb, n)), out of the panel kernel, whose block of
// ceil((n - k0) / 64) warps (one for the last panels) would move up to 64
// rows of n - nb entries each: here a block of 256 threads per 64 of those
// columns of a matrix, every moved entry of its columns loaded (16 per
// thread at most, all in flight; 8 16-byte units where n is even and the
// stack 16-byte aligned) before any is stored, so the moves, a
// permutation of the moved rows, need no staging. c_lo > 0 leaves the L
// columns left of c_lo (earlier column blocks, which no later step reads)
// for rows_swap_left at the end.
// input:  moves (batch, kMoveStride): count, then (source, destination)
//         row pairs relative to k0, written by getrf_mma_rows
// in/out: a (batch, n, n)
// grid:   (batch, ceil((n - nb - c_lo) / kSwapCols)); block kSwapThreads
// ---------------------------------------------------------------------------
namespace gpuqr_mma64 {

// Offset in its matrix of unit e (U entries) of rows_swap's block (row pair
// e / (kSwapCols / U), columns from U (e % (kSwapCols / U)) of the block's
// columns starting at t0 of the w outside the panel, counted from c_lo), in
// the pair's source (side 1) or destination (side 2) row; -1 beyond the cnt
// pairs or the w columns.
template <int U>
__device__ __forceinline__ int swap_offset(const int *mv, int e, int side, int cnt, int w,
                                           int t0, int c_lo, int k0, int nb, int n) {
    constexpr int UPR = kSwapCols / U;
    const int kk = e / UPR, tt = U * (e - kk * UPR);
    if (kk >= cnt || tt >= w) return -1;
    const int t = c_lo + t0 + tt;
    return (k0 + mv[side + 2 * kk]) * n + (t < k0 ? t : t + nb);
}

// rows_swap's moves by units of V (U entries of T): every unit loaded before
// any is stored.
template <typename T, typename V>
__device__ __forceinline__ void swap_units(T *A, const int *mv, int cnt, int w, int t0,
                                           int c_lo, int k0, int nb, int n) {
    constexpr int U = sizeof(V) / sizeof(T);
    constexpr int PER = 2 * PW * kSwapCols / U / kSwapThreads;
    const int tid = threadIdx.x;
    V v[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int o = swap_offset<U>(mv, tid + kSwapThreads * i, 1, cnt, w, t0, c_lo, k0, nb, n);
        if (o >= 0) v[i] = *reinterpret_cast<const V *>(A + o);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int o = swap_offset<U>(mv, tid + kSwapThreads * i, 2, cnt, w, t0, c_lo, k0, nb, n);
        if (o >= 0) *reinterpret_cast<V *>(A + o) = v[i];
    }
}

}  // namespace gpuqr_mma64

template <typename T>
__global__ void __launch_bounds__(256)
rows_swap(T *a, const int *__restrict__ moves, int n, int k0, int nb, int c_lo)
{
    using namespace gpuqr_mma64;
    const long long mat = blockIdx.x;
    const int *mv = moves + mat * kMoveStride;
    const int cnt = mv[0];
    const int t0 = blockIdx.y * kSwapCols;
    const int w = min(kSwapCols, n - nb - c_lo - t0);
    if (cnt <= 0 || w <= 0) return;                    // block-uniform
    T *A = a + mat * (long long)n * n;
    // 16-byte units: every offset even (n, nb, k0, c_lo even; t0 and the
    // units' columns even) and the stack 16-byte aligned
    if (sizeof(T) == 8 && ((n | nb | k0 | c_lo) & 1) == 0 &&
        (reinterpret_cast<size_t>(a) & 15) == 0)
        swap_units<T, double2>(A, mv, cnt, w, t0, c_lo, k0, nb, n);
    else
        swap_units<T, T>(A, mv, cnt, w, t0, c_lo, k0, nb, n);
}

// ---------------------------------------------------------------------------
// The first panel's row moves as a copy: the blocked LU's first panel
// (k0 = 0) read from the input src and written to dst, this kernel writes
// the rest of dst (columns [nb, n)) as src's rows in the panel's order, in
// place of a copy of the whole input and a rows_swap after the panel (one
// pass over the matrix instead of two). A block per kCopyRows rows of a
// matrix, a warp per row at a time, its lanes along the row.
// input:  src (batch, n, n); moves as for rows_swap (k0 = 0)
// output: dst (batch, n, n) columns [nb, n), every row
// grid:   (batch, ceil(n / kCopyRows)); block kSwapThreads
// ---------------------------------------------------------------------------
namespace gpuqr_mma64 {
constexpr int kCopyRows = 64;
}  // namespace gpuqr_mma64

template <typename T>
__global__ void __launch_bounds__(256)
rows_copy_perm(const T *__restrict__ src, T *__restrict__ dst,
               const int *__restrict__ moves, int n, int nb)
{
    using namespace gpuqr_mma64;
    __shared__ short from[64 * MAXW];                   // dst row i is src row from[i]
    const long long mat = blockIdx.x;
    const int *mv = moves + mat * kMoveStride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < n; i += kSwapThreads) from[i] = (short)i;
    __syncthreads();
    const int cnt = mv[0];
    for (int e = tid; e < cnt; e += kSwapThreads) from[mv[2 + 2 * e]] = (short)mv[1 + 2 * e];
    __syncthreads();
    const T *S = src + mat * (long long)n * n;
    T *D = dst + mat * (long long)n * n;
    const int r1 = min(n, (int)(blockIdx.y + 1) * kCopyRows);
    for (int i = blockIdx.y * kCopyRows + warp; i < r1; i += kSwapThreads / 32) {
        const T *s = S + from[i] * n;
        T *d = D + i * n;
#pragma unroll 4
        for (int j = nb + lane; j < n; j += 32) d[j] = s[j];
    }
}

// ---------------------------------------------------------------------------
// The deferred row swaps of the L columns of the blocked LU's earlier column
// blocks: block b (columns [kb, kb + outer)) saw the swaps of its own panels
// (rows_swap with c_lo = kb), its rows [kb + outer, n) get here every later
// pivot at once, LAPACK's order (rows k and piv[k] exchanged for k = kb +
// outer .. n - 1), by chunks of columns staged in shared memory (a thread's
// few registers: several blocks per SM): 2^lc columns, the widest power of 2
// dividing outer whose moved rows fit the stage (its rows read and written
// as 2^lc-wide segments). A chunk's rows come in by cp.async, all of them in
// flight at once (16-byte units where n is even and the stack 16-byte
// aligned), not a few loads a thread at a time. The composed permutation:
// each thread follows one or two rows back through the exchanges (row i
// takes row t_r0(t_r0+1(... t_n-1(i))), t_k the exchange of k and piv[k]),
// in place of one thread composing them in turn while the block waits.
// input:  piv (batch, n), 0-based LAPACK pivots
// in/out: a (batch, n, n)
// grid:   (batch, ceil(n / outer) - 1); block kSwapThreads; outer a multiple
//         of 8; dynamic shared memory stage * sizeof(T), stage >= 8 (n - outer)
//         (left_stage in scipy_gpuqr/batched/_kernel_registry.py)
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
rows_swap_left(T *a, const int *__restrict__ piv, int n, int outer, int stage_elems)
{
    using namespace gpuqr_mma64;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *stage = reinterpret_cast<T *>(smem_raw);
    __shared__ short from[64 * MAXW];                   // row i takes row from[i]
    __shared__ short sp[64 * MAXW];                     // the pivots
    const long long mat = blockIdx.x;
    const int kb = blockIdx.y * outer, r0 = kb + outer;
    const int tid = threadIdx.x;
    for (int i = r0 + tid; i < n; i += kSwapThreads) sp[i] = (short)piv[mat * n + i];
    __syncthreads();
    for (int i = r0 + tid; i < n; i += 2 * kSwapThreads) {
        // rows i and i + kSwapThreads (-1: none) back through the exchanges
        int x = i, y = i + kSwapThreads < n ? i + kSwapThreads : -1;
#pragma unroll 4
        for (int k = n - 1; k >= r0; --k) {
            const int q = sp[k];
            x = x == k ? q : (x == q ? k : x);
            y = y == k ? q : (y == q ? k : y);
        }
        from[i] = (short)x;
        if (y >= 0) from[i + kSwapThreads] = (short)y;
    }
    __syncthreads();
    T *A = a + mat * (long long)n * n;
    const bool vec = sizeof(T) == 8 && (n & 1) == 0 && (reinterpret_cast<size_t>(a) & 15) == 0;
    int lc = 3;
    while (outer % (2 << lc) == 0 && (n - r0) * (2 << lc) <= stage_elems) ++lc;
    const int m = (n - r0) << lc, cm = (1 << lc) - 1;
    for (int c0 = kb; c0 < r0; c0 += 1 << lc) {
        if (vec) {
#pragma unroll 4
            for (int e = 2 * tid; e < m; e += 2 * kSwapThreads) {
                const int r = r0 + (e >> lc);
                if (from[r] != r) cp_async16(stage + e, A + from[r] * n + c0 + (e & cm));
            }
        } else {
#pragma unroll 4
            for (int e = tid; e < m; e += kSwapThreads) {
                const int r = r0 + (e >> lc);
                if (from[r] != r) cp_async_elem(stage + e, A + from[r] * n + c0 + (e & cm));
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        if (vec) {
#pragma unroll 4
            for (int e = 2 * tid; e < m; e += 2 * kSwapThreads) {
                const int r = r0 + (e >> lc);
                if (from[r] != r)
                    *reinterpret_cast<double2 *>(A + r * n + c0 + (e & cm)) =
                        *reinterpret_cast<const double2 *>(stage + e);
            }
        } else {
#pragma unroll 4
            for (int e = tid; e < m; e += kSwapThreads) {
                const int r = r0 + (e >> lc);
                if (from[r] != r) A[r * n + c0 + (e & cm)] = stage[e];
            }
        }
        __syncthreads();
    }
}
