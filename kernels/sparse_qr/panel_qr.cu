// Householder QR of a tall panel (m x w, w <= 32) in ONE cooperative launch.
//
// The dense fronts' blocked QR (scipy_gpuqr/_engine/dense_front.py) factors its
// panels with this kernel instead of a chain of launches per column. Each block
// keeps a slice of R consecutive panel rows in shared memory (row-major, one lane
// per column) for the whole panel; per column a single grid-wide reduction gives
// every block the same 33 numbers: the dot products of the column below its
// diagonal with all 32 columns, and the largest magnitude below the diagonal.
// From them every block derives the reflector (LAPACK dlarfg convention, the same
// norm-range and tiny-column rules as factorize.cuh) and updates its own rows:
//
//   x = A[c+1:, c], alpha = A[c, c], S_k = x . A[c+1:, k] (k = 0..31)
//   beta = -sign(alpha) hypot(alpha, |x|), tau = (beta - alpha) / beta,
//   v = x / (alpha - beta),   w_k = tau (A[c, k] + S_k / (alpha - beta))  (k > c)
//   A[c, k] -= w_k, A[i, k] -= v_i w_k (i > c), A[c, c] = beta, A[i, c] = v_i
//   T[:c, c] = -tau T[:c, :c] y, y_k = v_k . v_c = A[c, k] + S_k / (alpha - beta)
//
// (the S_k of earlier columns k < c are their reflectors' dot products with x,
// which forms the compact-WY T of the panel as it goes). When the sum of squares
// leaves NormRange a second reduction repeats the dots with x / max|x|. The
// reductions are summed in a fixed order, so every block takes the same decisions
// and the result does not depend on timing. The NumPy model of this arithmetic is
// scipy_gpuqr/_engine/gpu/dense_panel.py (panel_qr_numpy).
//
// Outputs: the panel in place (R on and above the diagonal, V strictly below it),
// V again as a clean column-major copy (unit diagonal, rows >= c of column c only;
// the caller zeroes the rest), tau[0..w) and T (32 x 32 row-major, zero padded).
// The grid barrier needs all blocks resident: launch with cuLaunchCooperativeKernel
// and at most one block per SM's worth of shared memory (dense_panel.py sizes it).
#include "factorize.cuh"

namespace gpuqr {

constexpr int PANEL_NT = 512;                 // threads per block
constexpr int PANEL_NW = PANEL_NT / 32;       // warps per block
constexpr int PANEL_LD = 33;                  // shared row stride (conflict-free columns)
constexpr int PANEL_PART = 40;                // per-block partials: 32 dots, max, padding

// Shared memory after the R x PANEL_LD rows (elements); mirrored by
// PANEL_SMEM_EXTRA in scipy_gpuqr/_engine/gpu/dense_panel.py.
constexpr int PANEL_EXTRA = PANEL_NW * PANEL_PART   // red: cross-warp partials
                          + PANEL_PART              // S: reduced dots and max
                          + 32 * 33                 // Tm: T of the panel (block 0)
                          + 32                      // y: v_k . v_c (block 0)
                          + 32                      // rowc: row c of the panel
                          + 8;                      // scalars

__device__ __forceinline__ unsigned panel_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long panel_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Grid-wide barrier: bar[0] counts arrivals, bar[1] is the generation. The last
// block to arrive resets the count and advances the generation. A wait longer
// than 20 s (blocks not co-resident) traps instead of hanging.
__device__ __forceinline__ void panel_grid_sync(unsigned* bar, unsigned& gen) {
    __syncthreads();
    if (threadIdx.x == 0 && gridDim.x > 1) {
        __threadfence();
        if (atomicAdd(&bar[0], 1u) == gridDim.x - 1) {
            atomicExch(&bar[0], 0u);
            __threadfence();
            atomicAdd(&bar[1], 1u);
        } else {
            const unsigned long long t0 = panel_clock_ns();
            while (panel_ld_acquire(&bar[1]) == gen) {
                if (panel_clock_ns() - t0 > 20000000000ull) __trap();
            }
        }
        __threadfence();
        ++gen;
    }
    __syncthreads();
}

// Sum the blocks' partials P[nbk][PANEL_PART] in a fixed order: S[0..31] dots,
// S[32] max. Every block gets bitwise the same numbers.
template <typename T>
__device__ __forceinline__ void panel_reduce(const T* P, int nbk, T* red, T* S) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int U = 8;                        // loads in flight per lane
    T s = 0, mm = 0;
    for (int q0 = warp; q0 < nbk; q0 += U * PANEL_NW) {
        T v[U], x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int q = q0 + u * PANEL_NW;
            v[u] = q < nbk ? __ldcg(&P[q * PANEL_PART + lane]) : T(0);
            x[u] = q < nbk ? __ldcg(&P[q * PANEL_PART + 32]) : T(0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            s += v[u];
            mm = fmax(mm, x[u]);
        }
    }
    red[warp * PANEL_PART + lane] = s;
    if (lane == 0) red[warp * PANEL_PART + 32] = mm;
    __syncthreads();
    if (warp == 0) {
        T t = 0, m2 = 0;
        for (int q = 0; q < PANEL_NW; ++q) {
            t += red[q * PANEL_PART + lane];
            m2 = fmax(m2, red[q * PANEL_PART + 32]);
        }
        S[lane] = t;
        if (lane == 0) S[32] = m2;
    }
    __syncthreads();
}

// This block's partial sums of x_i * A[i][lane] (x = column c scaled by 1/xs; lane
// c sums x_i^2) over its rows below the diagonal, and max |x_i|, to P[blockIdx.x].
template <typename T>
__device__ __forceinline__ void panel_partials(const T* A, int lo, int nr, int c, T xs,
                                               T* red, T* P) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T acc = 0, mx = 0;
#pragma unroll 4
    for (int r = lo + warp; r < nr; r += PANEL_NW) {
        const T x = A[r * PANEL_LD + c] / xs;
        const T a = A[r * PANEL_LD + lane];
        acc += x * (lane == c ? x : a);        // the column's own sum: of (x/xs)^2
        mx = fmax(mx, fabs(x));
    }
    red[warp * PANEL_PART + lane] = acc;
    if (lane == 0) red[warp * PANEL_PART + 32] = mx;
    __syncthreads();
    if (warp == 0) {
        T s = 0, m2 = 0;
        for (int q = 0; q < PANEL_NW; ++q) {
            s += red[q * PANEL_PART + lane];
            m2 = fmax(m2, red[q * PANEL_PART + 32]);
        }
        P[blockIdx.x * PANEL_PART + lane] = s;
        if (lane == 0) P[blockIdx.x * PANEL_PART + 32] = m2;
    }
}

// work: [2][nbk][PANEL_PART] partials (by column parity), [nbk][PANEL_PART] for the
// rescaled pass, [2][32] the diagonal row; bar: 2 zeroed words per concurrent launch.
template <typename T>
__device__ void panel_qr(T* __restrict__ F, long long ldf, int m, int w,
                         T* __restrict__ V, long long ldv, T* __restrict__ tau,
                         T* __restrict__ Tout, T* __restrict__ work,
                         unsigned* __restrict__ bar, int R) {
    extern __shared__ double panel_smem_raw[];
    T* A = reinterpret_cast<T*>(panel_smem_raw);
    T* red = A + R * PANEL_LD;
    T* S = red + PANEL_NW * PANEL_PART;
    T* Tm = S + PANEL_PART;
    T* y = Tm + 32 * 33;
    T* rowc = y + 32;
    T* sc = rowc + 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = blockIdx.x, nbk = gridDim.x;
    const int r0 = b * R;
    const int nr = max(0, min(R, m - r0));
    T* Pmain = work;
    T* Pscaled = work + 2 * nbk * PANEL_PART;
    T* rowbuf = Pscaled + nbk * PANEL_PART;
    unsigned gen = 0;
    if (tid == 0) gen = panel_ld_acquire(&bar[1]);

    for (int idx = tid; idx < nr * 32; idx += PANEL_NT) {
        const int i = idx >> 5, c = idx & 31;
        A[i * PANEL_LD + c] = c < w ? F[(long long)(r0 + i) * ldf + c] : T(0);
    }
    if (b == 0)
        for (int idx = tid; idx < 32 * 33; idx += PANEL_NT) Tm[idx] = T(0);
    __syncthreads();

    for (int c = 0; c < w; ++c) {
        const int par = c & 1;
        T* P = Pmain + par * nbk * PANEL_PART;
        T* rb = rowbuf + par * 32;
        const int lo = max(0, c + 1 - r0);          // local rows below the diagonal
        panel_partials<T>(A, lo, nr, c, T(1), red, P);
        if (b == 0 && warp == 0) rb[lane] = A[c * PANEL_LD + lane];   // row c is block 0's
        panel_grid_sync(bar, gen);
        panel_reduce<T>(P, nbk, red, S);
        if (warp == 0) rowc[lane] = __ldcg(&rb[lane]);
        const T M = S[32], ss = S[c];
        const bool plain = M == T(0) || (ss >= NormRange<T>::LO && ss <= NormRange<T>::HI);
        T xnorm, dfac;                              // dfac: S holds dots of x / dfac
        if (plain) {
            xnorm = M == T(0) ? T(0) : sqrt(ss);
            dfac = T(1);
        } else {                                    // uniform over the grid
            __syncthreads();
            panel_partials<T>(A, lo, nr, c, M, red, Pscaled);
            panel_grid_sync(bar, gen);
            panel_reduce<T>(Pscaled, nbk, red, S);
            xnorm = M * sqrt(S[c]);
            dfac = M;
        }
        __syncthreads();                            // rowc visible
        if (tid == 0) {
            const T alpha = rowc[c];
            T tk = 0, scale = 0, beta = alpha;
            const T nrm = xnorm > T(0) ? hypot(alpha, xnorm) : T(0);
            // a column below NormRange::TINY is left alone (an identity reflector)
            if (nrm >= NormRange<T>::TINY) {
                beta = alpha >= T(0) ? -nrm : nrm;
                tk = (beta - alpha) / beta;
                scale = T(1) / (alpha - beta);
            }
            sc[0] = tk;
            sc[1] = scale;
            sc[2] = beta;
            sc[3] = scale * dfac;
            if (b == 0) tau[c] = tk;
        }
        __syncthreads();
        const T tk = sc[0], scale = sc[1], beta = sc[2], ds = sc[3];
        if (tk != T(0)) {
            const T vk = rowc[lane] + ds * S[lane];    // v_lane . v_c (lane < c), w/tau (lane > c)
            const T wl = (lane > c && lane < w) ? tk * vk : T(0);
#pragma unroll 2
            for (int r = lo + warp; r < nr; r += PANEL_NW) {
                const T v = A[r * PANEL_LD + c] * scale;
                const T a = A[r * PANEL_LD + lane];
                __syncwarp();
                if (lane == c) A[r * PANEL_LD + lane] = v;
                else if (lane > c) A[r * PANEL_LD + lane] = a - v * wl;
            }
            if (b == 0 && warp == 0) {
                if (lane == c) A[c * PANEL_LD + c] = beta;
                else if (lane > c) A[c * PANEL_LD + lane] -= wl;
                y[lane] = lane < c ? vk : T(0);
                __syncwarp();
                if (lane < c) {
                    T t = 0;
                    for (int q = lane; q < c; ++q) t += Tm[lane * 33 + q] * y[q];
                    Tm[lane * 33 + c] = -tk * t;
                }
                if (lane == c) Tm[c * 33 + c] = tk;
            }
        }
        __syncthreads();
    }

    for (int idx = tid; idx < nr * 32; idx += PANEL_NT) {
        const int i = idx >> 5, c = idx & 31;
        if (c < w) F[(long long)(r0 + i) * ldf + c] = A[i * PANEL_LD + c];
    }
    for (int idx = tid; idx < nr * w; idx += PANEL_NT) {
        const int c = idx / nr, r = idx - c * nr, i = r0 + r;
        if (i >= c) V[(long long)c * ldv + i] = i == c ? T(1) : A[r * PANEL_LD + c];
    }
    if (b == 0)
        for (int idx = tid; idx < 32 * 32; idx += PANEL_NT)
            Tout[idx] = Tm[(idx >> 5) * 33 + (idx & 31)];
}

}  // namespace gpuqr

extern "C" __global__ void __launch_bounds__(gpuqr::PANEL_NT)
panel_qr_f64(double* F, long long ldf, int m, int w, double* V, long long ldv, double* tau,
             double* Tout, double* work, unsigned* bar, int R) {
    gpuqr::panel_qr<double>(F, ldf, m, w, V, ldv, tau, Tout, work, bar, R);
}

extern "C" __global__ void __launch_bounds__(gpuqr::PANEL_NT)
panel_qr_f32(float* F, long long ldf, int m, int w, float* V, long long ldv, float* tau,
             float* Tout, float* work, unsigned* bar, int R) {
    gpuqr::panel_qr<float>(F, ldf, m, w, V, ldv, tau, Tout, work, bar, R);
}
