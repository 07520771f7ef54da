// warp2d.cuh: LU and Gauss-Jordan inverse of one N x N matrix per
// warp with each row split over G lanes (17 <= N <= 32, G in {2, 4}).
//
// Layout ("2-D cyclic"): lane = i + RL * g with RL = 32 / G row lanes and G
// column groups. Lane (i, g) holds rows i + RL * s (slots s < R) and columns
// g + G * j (j < C = N / G) of the matrix: R * C = 32 elements, as many as a
// row per lane, but every pivot-row element a lane loads from the broadcast
// buffer now serves R rows (R = 2 for G = 2): half (a quarter) of the shared-
// memory loads and pivot-row stores per column. Cyclic columns keep the work
// of the LU balanced: at column k every lane still has about (N - k) / G
// columns to update.
//
// Per column k (owner group gk = k % G, local column jk = k / G):
//   * the owner lanes choose their best candidate row (largest |x|, ties to
//     the smallest LAPACK position), one warp REDUX + ballot name the pivot
//     lane (ties broken exactly, rarely taken), one shuffle gives every lane
//     the pivot row's id and position;
//   * the G lanes holding the pivot row store their parts to the broadcast
//     buffer (group g at g * GS, GS = C + VW: the groups' 16-byte loads hit
//     distinct banks), the pivot lane adds its speculative reciprocal;
//   * every lane takes its rows' column-k values from the owner lane with a
//     shuffle issued before the pivot is known, and updates its columns.
// Rows never move (lazy swaps, as in the row-per-lane kernels of
// lu_warp.cu); the same pivots, the same arithmetic per element.
#pragma once

#include "warp.cuh"

namespace gpuqr_warp {

template <typename T, int N, int G>
struct Grid2d {
    static_assert(G == 2 || G == 4, "2-D layout: G = 2 or 4");
    static_assert(N > 16 && N <= 32 && N % G == 0, "2-D layout: 16 < N <= 32, G | N");
    static constexpr int VW = Vec<T>::width;
    static constexpr int RL = 32 / G;                  // row lanes
    static constexpr int R = (N + RL - 1) / RL;         // row slots per lane
    static constexpr int C = N / G;                     // columns per lane
    static constexpr bool vec = (C % VW) == 0;          // 16-byte buffer accesses
    static constexpr int GS = vec ? C + VW : C + 1;     // group stride in the buffer
    static constexpr int SC = ((G * GS + VW - 1) / VW) * VW;   // rinv, scale
    static_assert(SC + 2 <= Layout<T, N>::NBUF, "broadcast buffer too small");
};

// Order-preserving 64-bit key of |x| (integer pipe).
__device__ __forceinline__ unsigned long long key64(double x) {
    return (unsigned long long)__double_as_longlong(x) & 0x7fffffffffffffffull;
}
__device__ __forceinline__ unsigned long long key64(float x) {
    return (unsigned long long)(__float_as_uint(x) & 0x7fffffffu) << 32;
}

// The lane's best candidate among its slots (owner lanes only): largest key,
// ties to the smallest position. has = false when the lane has none.
template <typename T, int R>
struct LaneBest {
    unsigned long long key;
    int pos, slot;
    bool has;
    T x;
};

template <typename T, int R>
__device__ __forceinline__ LaneBest<T, R> lane_best(const T (&x)[R], unsigned cand,
                                                    const int (&pos)[R], bool owner) {
    LaneBest<T, R> b;
    b.key = 0ull; b.pos = 0x7fffffff; b.slot = 0; b.has = false; b.x = T(1);
#pragma unroll
    for (int s = 0; s < R; ++s) {
        const unsigned long long k = key64(x[s]);
        const bool c = owner && ((cand >> s) & 1u);
        const bool better = c && (!b.has || k > b.key || (k == b.key && pos[s] < b.pos));
        if (better) { b.key = k; b.pos = pos[s]; b.slot = s; b.has = true; b.x = x[s]; }
    }
    return b;
}

// Warp-wide pivot lane from the lanes' best candidates (every lane calls).
template <typename T, int R>
__device__ __forceinline__ unsigned pivot2d_start(const LaneBest<T, R> &b) {
    const unsigned hi = b.has ? (unsigned)(b.key >> 32) : 0u;
    const unsigned mh = __reduce_max_sync(0xffffffffu, hi);
    return __ballot_sync(0xffffffffu, b.has && hi == mh);
}

template <typename T, int R>
__device__ __forceinline__ int pivot2d_finish(unsigned bal, const LaneBest<T, R> &b, int lane) {
    if (__popc(bal) != 1) {     // uniform: ties in the high word (or exact ties)
        const bool c1 = (bal >> lane) & 1u;
        const unsigned lo = (unsigned)b.key;
        const unsigned ml = __reduce_max_sync(0xffffffffu, c1 ? lo : 0u);
        const bool c2 = c1 && lo == ml;
        const unsigned mp = __reduce_min_sync(0xffffffffu, c2 ? (unsigned)b.pos : 0xffffffffu);
        bal = __ballot_sync(0xffffffffu, c2 && (unsigned)b.pos == mp);
    }
    return __ffs(bal) - 1;
}

// The holder lane stores slot sp of its columns j >= jfrom (whole vectors).
template <typename T, int R, int C, bool VEC>
__device__ __forceinline__ void publish2d(T *dst, const T (&a)[R][C], int sp, int jfrom) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
#pragma unroll
    for (int s = 0; s < R; ++s) {
        if (sp == s) {
            if constexpr (VEC) {
#pragma unroll
                for (int q = 0; q < C / VW; ++q) {
                    if ((q + 1) * VW > jfrom) {
                        union { V v; T e[VW]; } u;
#pragma unroll
                        for (int e = 0; e < VW; ++e) u.e[e] = a[s][q * VW + e];
                        reinterpret_cast<V *>(dst)[q] = u.v;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < C; ++j)
                    if (j >= jfrom) dst[j] = a[s][j];
            }
        }
    }
}

// Factorize (GJ = false: LU, results in LAPACK getrf order) or invert
// (GJ = true: in-place Gauss-Jordan, rows/columns n..N-1 the identity) the
// matrix in tile t (row stride LD) in place. bc: this warp's two broadcast
// buffers. Returns info (0, k + 1 for the first zero pivot, -1 non-finite);
// LU: the pivots are written to piv[0..N).
template <typename T, int N, int G, bool GJ>
__device__ __forceinline__ int factor2d(T *t, T *bc, int *__restrict__ piv, int n, int lane) {
    typedef Grid2d<T, N, G> D;
    typedef Layout<T, N> L;
    typedef typename Vec<T>::type V;
    constexpr int RL = D::RL, R = D::R, C = D::C, VW = D::VW, GS = D::GS;
    const int g = lane / RL;
    const int i = lane - g * RL;

    T a[R][C];
    bool fin = true;
    unsigned cand = 0u;
    int pos[R], rec[R];
    T f[R];
#pragma unroll
    for (int s = 0; s < R; ++s) {
        const int r = i + RL * s;
        const bool valid = r < N;
#pragma unroll
        for (int j = 0; j < C; ++j) {
            const int c = g + G * j;
            T v = T(0);
            if (GJ) v = (r < n && c < n) ? t[r * L::LD + c] : T(r == c);
            else if (valid) v = t[r * L::LD + c];
            a[s][j] = v;
            fin = fin && finite_bits(v);
        }
        cand |= (valid ? 1u : 0u) << s;
        pos[s] = r;
        rec[s] = 0;
        f[s] = T(1);
    }
    const bool bad = __any_sync(0xffffffffu, !fin);
    int zinfo = 0;

    // pivot search of column 0
    T xo[R];
#pragma unroll
    for (int s = 0; s < R; ++s) xo[s] = a[s][0];
    LaneBest<T, R> best = lane_best<T, R>(xo, cand, pos, g == 0);
    unsigned bal = pivot2d_start<T, R>(best);

#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int gk = k % G, jk = k / G;
        // speculative reciprocal of the lane's best candidate
        const T sc = pivot_scale(best.x);
        const T rinv = fast_rcp(best.has ? best.x * sc : T(1));
        // column-k values of this lane's rows, from the owner lane
        T x[R];
#pragma unroll
        for (int s = 0; s < R; ++s) x[s] = __shfl_sync(0xffffffffu, a[s][jk], i + RL * gk);
        const int pl = pivot2d_finish<T, R>(bal, best, lane);
        const int pinfo = __shfl_sync(0xffffffffu, (best.pos << 8) | (i + RL * best.slot), pl);
        const int prow = pinfo & 255;
        const int p = pinfo >> 8;
        const int sp = prow / RL;
        const bool holder = i == prow - sp * RL;
        T *buf = bc + (k & 1) * L::NBUF;
        if (holder) publish2d<T, R, C, D::vec>(buf + g * GS, a, sp, GJ ? 0 : jk);
        if (lane == pl) {
            buf[D::SC] = rinv;
            buf[D::SC + 1] = sc;
        }
        __syncwarp();
        const T pv = buf[gk * GS + jk];
        const T bri = buf[D::SC];
        const T bsc = buf[D::SC + 1];
        const bool nz = pv != T(0);
        if (!nz && zinfo == 0) zinfo = k + 1;
        T l[R];
#pragma unroll
        for (int s = 0; s < R; ++s) {
            const bool valid = i + RL * s < N;
            const bool ispv = holder && sp == s;
            const bool upd = (GJ ? valid : ((cand >> s) & 1u) != 0u) && !ispv && nz;
            l[s] = upd ? (x[s] * bsc) * bri : T(0);
            if (g == gk) {
                if (GJ) a[s][jk] = ispv ? T(1) : (upd ? -l[s] : a[s][jk]);
                else if (upd) a[s][jk] = l[s];
            }
            if (GJ && ispv) f[s] = bsc * bri;
            if (ispv) cand &= ~(1u << s);
            if (pos[s] == k) pos[s] = p; else if (ispv) pos[s] = k;
        }
        if (i == k % RL) rec[k / RL] = GJ ? prow : p;

        const T *b = buf + g * GS;
        int j1 = -1;
        if (k + 1 < N) {
            // column k + 1 first: the next pivot search waits on it
            j1 = (k + 1) / G;
            const int c1 = g + G * j1;
            const bool need = GJ ? c1 != k : c1 > k;
            const T b1 = b[j1];
#pragma unroll
            for (int s = 0; s < R; ++s)
                if (need) a[s][j1] = fma(-l[s], b1, a[s][j1]);
#pragma unroll
            for (int s = 0; s < R; ++s) xo[s] = a[s][j1];
            best = lane_best<T, R>(xo, cand, pos, g == (k + 1) % G);
            bal = pivot2d_start<T, R>(best);
        }
        // the other columns (LU: global column > k; GJ: all but k)
        const int jlo = GJ ? 0 : jk;
        if constexpr (D::vec) {
#pragma unroll
            for (int q = 0; q < C / VW; ++q) {
                if ((q + 1) * VW > jlo) {
                    union { V v; T e[VW]; } u;
                    u.v = reinterpret_cast<const V *>(b)[q];
#pragma unroll
                    for (int e = 0; e < VW; ++e) {
                        const int j = q * VW + e;
                        if (j >= jlo && j != j1) {
                            const bool need = (j != jk) || (GJ ? g != gk : g > gk);
#pragma unroll
                            for (int s = 0; s < R; ++s)
                                if (need) a[s][j] = fma(-l[s], u.e[e], a[s][j]);
                        }
                    }
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < C; ++j) {
                if (j >= jlo && j != j1) {
                    const bool need = (j != jk) || (GJ ? g != gk : g > gk);
                    const T bj = b[j];
#pragma unroll
                    for (int s = 0; s < R; ++s)
                        if (need) a[s][j] = fma(-l[s], bj, a[s][j]);
                }
            }
        }
    }
    __syncwarp();
    if constexpr (GJ) {
        // A^{-1}[pos(r)][sigma(c)] = f_r * X[r][c], sigma(c) = pivot row of step c
        int *sig = reinterpret_cast<int *>(bc);
#pragma unroll
        for (int s = 0; s < R; ++s)
            if (g == 0 && i + RL * s < N) sig[i + RL * s] = rec[s];
        __syncwarp();
#pragma unroll
        for (int j = 0; j < C; ++j) {
            const int tc = sig[g + G * j];
#pragma unroll
            for (int s = 0; s < R; ++s)
                if (i + RL * s < N) t[pos[s] * L::LD + tc] = f[s] * a[s][j];
        }
    } else {
#pragma unroll
        for (int s = 0; s < R; ++s) {
            if (i + RL * s < N) {
#pragma unroll
                for (int j = 0; j < C; ++j) t[pos[s] * L::LD + g + G * j] = a[s][j];
                if (g == 0) piv[i + RL * s] = rec[s];
            }
        }
    }
    return bad ? -1 : zinfo;
}

}  // namespace gpuqr_warp
