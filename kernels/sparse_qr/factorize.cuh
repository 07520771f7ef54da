// Factorize task: Householder QR of one column tile over a bundle of row tiles.
// Conventions (identical to scipy_gpuqr/_engine/host/simulate.py): LAPACK dlarfg
// reflectors (v[0] = 1, beta = -sign(alpha)*norm), forward columnwise compact
// WY T; the bundle is stacked top tile first, then the other slots in slot order;
// rows >= fm and columns >= fn are zeros and never stored. The VT tile is
// TILE x TILE row-major: T on/above the diagonal, the top tile's V1 below it.
#pragma once

#include "task.cuh"

namespace gpuqr {

// Shared-memory layout sizes (elements of T); mirrored by tile_smem_bytes in
// scipy_gpuqr/_engine/gpu/factorize_kernels.py.
template <int TILE, int BUNDLE>
struct FactorizeSmem {
    static constexpr int LD = TILE + 1;
    static constexpr int A = BUNDLE * TILE * LD;
    static constexpr int T = TILE * LD;
    static constexpr int Y = TILE * LD;
    static constexpr int SCRATCH = 64 + TILE;
    static constexpr int TOTAL = A + T + Y + SCRATCH;
};

// Sum-of-squares range in which sqrt(sum) is accurate: outside it some squares
// leave the normal range (under- or overflow), so the norm is recomputed with
// scaling (LAPACK's dnrm2 rule). Contribution blocks of structurally
// rank-deficient fronts hold columns as small as 1e-160, whose squares lose all
// precision: without the rescaling their reflectors are not orthogonal.
template <typename T> struct NormRange;
template <> struct NormRange<double> {
    static constexpr double LO = 1e-280, HI = 1e280, TINY = 1e-290;
};
template <> struct NormRange<float> {
    static constexpr float LO = 1e-30f, HI = 1e30f, TINY = 1e-36f;
};

// Column k's Householder reflector from its head alpha and the norm xnorm of the
// entries below it: tau, scale = 1/(alpha - beta) and beta; false (tau = scale = 0)
// for a column below NormRange::TINY, which is left alone (1/(alpha - beta) would
// overflow; its entries stay as V with tau = 0, an identity reflector).
template <typename T>
__device__ __forceinline__ bool householder_of(T alpha, T xnorm, T& tk, T& scale, T& beta) {
    tk = T(0);
    scale = T(0);
    const T nrm = xnorm > T(0) ? hypot(alpha, xnorm) : T(0);
    if (!(nrm >= NormRange<T>::TINY)) return false;
    beta = alpha >= 0.0 ? -nrm : nrm;
    tk = (beta - alpha) / beta;
    scale = T(1) / (alpha - beta);
    return true;
}

// ||A[k+1:M, k]||_2 of the smem column k, valid in thread 0: one pass for the sum
// of squares and the largest magnitude, a second scaled pass only where the sum
// lies outside NormRange. scr[0..31] and scr[36..63] hold the warp partials.
template <typename T, int NT>
__device__ T column_norm_below(const T* A, int LD, int k, int M, T* scr) {
    static_assert(NT / 32 <= 28, "column_norm_below: too many warps for the scratch");
    T p = 0.0, mx = 0.0;
    for (int i = k + 1 + threadIdx.x; i < M; i += NT) {
        const T x = A[i * LD + k];
        p += x * x;
        mx = fmax(mx, fabs(x));
    }
    for (int o = 16; o > 0; o >>= 1) {
        p += __shfl_down_sync(0xffffffffu, p, o);
        mx = fmax(mx, __shfl_down_sync(0xffffffffu, mx, o));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { scr[warp] = p; scr[36 + warp] = mx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        T s = 0.0, m = 0.0;
        for (int w = 0; w < NT / 32; ++w) { s += scr[w]; m = fmax(m, scr[36 + w]); }
        const bool plain = m == T(0) || (s >= NormRange<T>::LO && s <= NormRange<T>::HI);
        scr[34] = plain ? T(0) : m;          // the scale of the second pass, 0: none
        scr[35] = m == T(0) ? T(0) : sqrt(s);
    }
    __syncthreads();
    const T scale = scr[34];
    if (scale == T(0)) return scr[35];      // uniform branch
    T q = 0.0;
    for (int i = k + 1 + threadIdx.x; i < M; i += NT) {
        const T x = A[i * LD + k] / scale;
        q += x * x;
    }
    const T sq = block_sum<T, NT>(q, scr);
    return scale * sqrt(sq);                // thread 0
}

// The column loop of factorize_bundle<..., LEAN = true> on the stacked tile A
// (M rows, stride TILE + 1): reflectors into A (V below the diagonal, beta on
// it), tau; Y's row 0 and scr as scratch. Three barriers per column.
template <typename T, int TILE, int NT>
__device__ void factorize_columns_lean(T* A, T* Y, T* scr, T* tau, int M, int nref) {
    constexpr int LD = TILE + 1, NW = NT / 32;
    static_assert(NW <= 16, "factorize_columns_lean: too many warps for the scratch");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    T prev = T(0);                  // scale of column k - 1 (0: not scaled)
    for (int k = 0; k < nref; ++k) {
        if (prev != T(0))           // column k - 1 becomes V (no one reads it in column k)
            for (int i = k + tid; i < M; i += NT) A[i * LD + k - 1] *= prev;
        const T alpha = A[k * LD + k];
        T p = 0.0, mx = 0.0;
        for (int i = k + 1 + tid; i < M; i += NT) {
            const T x = A[i * LD + k];
            p += x * x;
            mx = fmax(mx, fabs(x));
        }
        for (int o = 16; o > 0; o >>= 1) {
            p += __shfl_down_sync(0xffffffffu, p, o);
            mx = fmax(mx, __shfl_down_sync(0xffffffffu, mx, o));
        }
        if (lane == 0) { scr[warp] = p; scr[36 + warp] = mx; }
        __syncthreads();
        T ss = 0.0, m = 0.0;
        for (int w = 0; w < NW; ++w) { ss += scr[w]; m = fmax(m, scr[36 + w]); }
        T xnorm = m == T(0) ? T(0) : sqrt(ss);
        if (!(m == T(0) || (ss >= NormRange<T>::LO && ss <= NormRange<T>::HI))) {
            // squares out of range: the scaled second pass (uniform branch)
            T q = 0.0;
            for (int i = k + 1 + tid; i < M; i += NT) {
                const T x = A[i * LD + k] / m;
                q += x * x;
            }
            for (int o = 16; o > 0; o >>= 1) q += __shfl_down_sync(0xffffffffu, q, o);
            if (lane == 0) scr[16 + warp] = q;
            __syncthreads();
            T sq = 0.0;
            for (int w = 0; w < NW; ++w) sq += scr[16 + w];
            xnorm = m * sqrt(sq);
        }
        T tk, scale, beta;
        if (householder_of(alpha, xnorm, tk, scale, beta) && tid == 0) A[k * LD + k] = beta;
        if (tid == 0) tau[k] = tk;
        prev = tk != 0.0 ? scale : T(0);
        if (tk != 0.0) {
            // w_j = A[k][j] + sum_{i>k} v_i A[i][j], v_i = scale A[i][k] (the column
            // scaled on the fly: unscaled products of 1e160 columns would overflow)
            for (int j = k + 1 + warp; j < TILE; j += NW) {
                T w = 0.0;
                for (int i = k + 1 + lane; i < M; i += 32)
                    w += (scale * A[i * LD + k]) * A[i * LD + j];
                for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
                if (lane == 0) Y[j] = tk * (w + A[k * LD + j]);
            }
            __syncthreads();
            const int ncol = TILE - k - 1;
            for (int idx = tid; idx < (M - k) * ncol; idx += NT) {
                const int ii = idx / ncol, j = k + 1 + idx - ii * ncol, i = k + ii;
                const T v = (i == k) ? T(1) : scale * A[i * LD + k];
                A[i * LD + j] -= v * Y[j];
            }
        }
        __syncthreads();
    }
    if (prev != T(0)) {
        for (int i = nref + tid; i < M; i += NT) A[i * LD + nref - 1] *= prev;
        __syncthreads();
    }
}

// Factorize the column tile starting at column `col` (nref reflectors) of the row
// tiles rows[fs .. fs+nf), the slot `ftop` being the top tile; VT written at vtoff.
// KIND 1 (lean): the same reflectors, T and stores with fewer barriers: per column one
// after the partial sums, one after w, one after the update (every thread
// forms the reflector from the partials itself; column k is scaled into V at
// the start of column k + 1, w and the update using scale * A[i][k]), and
// T built a row per thread (row l needs only its own earlier entries), no
// barrier per column.
template <typename T, int TILE, int BUNDLE, int NT, int KIND = 0>
__device__ void factorize_bundle(const Task& t, T* __restrict__ F,
                                 T* __restrict__ VTpool, int col, int nref,
                                 long long vtoff, T* smem) {
    using S = FactorizeSmem<TILE, BUNDLE>;
    constexpr int LD = S::LD;
    T* A = smem;
    T* Tm = A + S::A;
    T* Y = Tm + S::T;
    T* scr = Y + S::Y;          // [0..31] reduction, [32..35] scalars, [64..] tau
    T* tau = scr + 64;
    const int tid = threadIdx.x;
    const int fm = t.fm, fn = t.fn;
    const long long F0 = t.F;
    const int nf = t.nfrows, fs = t.fstart, ftop = t.ftop;
    int stack[BUNDLE];
    {
        int p = 1;
        stack[0] = t.rows[ftop];
        for (int s = fs; s < fs + nf; ++s)
            if (s != ftop && p < BUNDLE) stack[p++] = t.rows[s];
    }
    const int M = nf * TILE;
    for (int idx = tid; idx < M * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        const int r = stack[i / TILE] + (i % TILE), c = col + j;
        A[i * LD + j] = (r < fm && c < fn) ? F[F0 + (long long)r * fn + c] : 0.0;
    }
    for (int idx = tid; idx < TILE * LD; idx += NT) Tm[idx] = 0.0;
    __syncthreads();
    if constexpr (KIND == 1) {
        factorize_columns_lean<T, TILE, NT>(A, Y, scr, tau, M, nref);
    } else {
    for (int k = 0; k < nref; ++k) {
        const T xnorm = column_norm_below<T, NT>(A, LD, k, M, scr);
        if (tid == 0) {
            const T alpha = A[k * LD + k];
            T tk = 0.0, scale = 0.0;
            const T nrm = xnorm > T(0) ? hypot(alpha, xnorm) : T(0);
            // a column below NormRange::TINY is left alone (1/(alpha - beta) would
            // overflow); its entries stay as V with tau = 0, an identity reflector
            if (nrm >= NormRange<T>::TINY) {
                const T beta = alpha >= 0.0 ? -nrm : nrm;
                tk = (beta - alpha) / beta;
                scale = T(1) / (alpha - beta);
                A[k * LD + k] = beta;
            }
            scr[32] = tk;
            scr[33] = scale;
            tau[k] = tk;
        }
        __syncthreads();
        const T tk = scr[32], scale = scr[33];
        if (tk != 0.0) {
            for (int i = k + 1 + tid; i < M; i += NT) A[i * LD + k] *= scale;
            __syncthreads();
            // w_j = A[k][j] + sum_{i>k} v_i A[i][j], one warp per column
            const int lane = tid & 31, warp = tid >> 5;
            for (int j = k + 1 + warp; j < TILE; j += NT / 32) {
                T w = 0.0;
                for (int i = k + 1 + lane; i < M; i += 32) w += A[i * LD + k] * A[i * LD + j];
                for (int o = 16; o > 0; o >>= 1) w += __shfl_down_sync(0xffffffffu, w, o);
                if (lane == 0) Y[j] = tk * (w + A[k * LD + j]);   // Y row 0 as scratch
            }
            __syncthreads();
            const int ncol = TILE - k - 1;
            for (int idx = tid; idx < (M - k) * ncol; idx += NT) {
                const int ii = idx / ncol, j = k + 1 + idx - ii * ncol, i = k + ii;
                const T v = (i == k) ? T(1) : A[i * LD + k];
                A[i * LD + j] -= v * Y[j];
            }
        }
        __syncthreads();
    }
    }
    // Y[a][b] = V[:,a]^T V[:,b] for a < b < nref (V unit lower in the top tile)
    for (int idx = tid; idx < nref * nref; idx += NT) {
        const int a = idx / nref, b = idx - a * nref;
        if (a < b) {
            T s = A[b * LD + a];               // row b: v_b = 1
            for (int i = b + 1; i < M; ++i) s += A[i * LD + a] * A[i * LD + b];
            Y[a * LD + b] = s;
        }
    }
    __syncthreads();
    if constexpr (KIND != 0) {
        // T[i][k] = -tau_k sum_{l=i}^{k-1} T[i][l] Y[l][k]: row i reads only its own
        // earlier entries, so a thread per row needs no barrier (same sums, same order)
        if (tid < nref) {
            Tm[tid * LD + tid] = tau[tid];
            for (int k = tid + 1; k < nref; ++k) {
                const T tk = tau[k];
                T s = 0.0;
                if (tk != 0.0)
                    for (int l = tid; l < k; ++l) s += Tm[tid * LD + l] * Y[l * LD + k];
                Tm[tid * LD + k] = -tk * s;
            }
        }
        __syncthreads();
    } else {
    for (int k = 0; k < nref; ++k) {
        const T tk = tau[k];
        // T[i][k] = -tk * sum_{l=i}^{k-1} T[i][l] Y[l][k]
        if (tid < k) {
            T s = 0.0;
            if (tk != 0.0)
                for (int l = tid; l < k; ++l) s += Tm[tid * LD + l] * Y[l * LD + k];
            Tm[tid * LD + k] = -tk * s;
        }
        if (tid == 0) Tm[k * LD + k] = tk;
        __syncthreads();
    }
    }
    // store: VT tile, top tile's R, other tiles' V (and updated columns >= nref)
    for (int idx = tid; idx < TILE * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        T v = 0.0;
        if (j < nref) v = (i <= j) ? Tm[i * LD + j] : A[i * LD + j];
        VTpool[vtoff + idx] = v;
    }
    for (int idx = tid; idx < M * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        const int r = stack[i / TILE] + (i % TILE), c = col + j;
        if (r < fm && c < fn) {
            T v = A[i * LD + j];
            if (i < TILE && j < nref && i > j) v = 0.0;
            F[F0 + (long long)r * fn + c] = v;
        }
    }
    __syncthreads();
}

}  // namespace gpuqr
