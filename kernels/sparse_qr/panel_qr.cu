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
                          + 8;                      // (spare)

__device__ __forceinline__ unsigned long long panel_clock_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Grid-wide exchange: every block posts a tag (launch epoch << 16 | sync count)
// in its own flag word after writing its partials; a block continues once all
// flags carry the tag (thread q polls block q's flag), so the barrier and the
// wait for the data are one step. A wait longer than 20 s (blocks not
// co-resident) traps instead of hanging.
__device__ __forceinline__ unsigned long long panel_ld_acquire64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void panel_st_release64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void panel_grid_sync(unsigned long long* flags,
                                                unsigned long long tag) {
    __syncthreads();                            // this block's partials are written
    if (gridDim.x > 1) {
        if (threadIdx.x == 0) {
            __threadfence();
            panel_st_release64(&flags[blockIdx.x], tag);
        }
        if (threadIdx.x < gridDim.x) {
            const unsigned long long t0 = panel_clock_ns();
            while (panel_ld_acquire64(&flags[threadIdx.x]) < tag) {
                if (panel_clock_ns() - t0 > 20000000000ull) __trap();
            }
        }
        __syncthreads();
    }
}

// Sum the blocks' partials P[nbk][PANEL_PART] in a fixed order: S[0..31] dots,
// S[32] max; rowc[0..31] = rb. Every block gets bitwise the same numbers.
template <typename T>
__device__ __forceinline__ void panel_reduce(const T* P, int nbk, T* red, T* S,
                                             const T* rb, T* rowc) {
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
    if (rb != nullptr && warp == 1) rowc[lane] = __ldcg(&rb[lane]);
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

// This block's partial sums of x_i * A[i][lane] (x = column c, divided by xs when
// SCALED; lane c sums x_i^2) over its rows below the diagonal, and max |x_i|, to
// P[blockIdx.x].
template <typename T, bool SCALED>
__device__ __forceinline__ void panel_partials(const T* A, int lo, int nr, int c, T xs,
                                               T* red, T* P) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T acc = 0, mx = 0;
#pragma unroll 4
    for (int r = lo + warp; r < nr; r += PANEL_NW) {
        const T x = SCALED ? A[r * PANEL_LD + c] / xs : A[r * PANEL_LD + c];
        const T a = A[r * PANEL_LD + lane];
        acc += x * (lane == c ? x : a);        // the column's own sum: of x^2
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
// rescaled pass, [2][32] the diagonal row; flags: one zeroed word per block of the
// largest grid, shared by the launches of one stream, each with a larger epoch.
template <typename T>
__device__ void panel_qr(T* __restrict__ F, long long ldf, int m, int w,
                         T* __restrict__ V, long long ldv, T* __restrict__ tau,
                         T* __restrict__ Tout, T* __restrict__ work,
                         unsigned long long* __restrict__ flags, unsigned long long epoch,
                         int R) {
    extern __shared__ double panel_smem_raw[];
    T* A = reinterpret_cast<T*>(panel_smem_raw);
    T* red = A + R * PANEL_LD;
    T* S = red + PANEL_NW * PANEL_PART;
    T* Tm = S + PANEL_PART;
    T* y = Tm + 32 * 33;
    T* rowc = y + 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = blockIdx.x, nbk = gridDim.x;
    const int r0 = b * R;
    const int nr = max(0, min(R, m - r0));
    T* Pmain = work;
    T* Pscaled = work + 2 * nbk * PANEL_PART;
    T* rowbuf = Pscaled + nbk * PANEL_PART;
    unsigned long long tag = epoch << 16;

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
        panel_partials<T, false>(A, lo, nr, c, T(1), red, P);
        if (b == 0 && warp == 0) rb[lane] = A[c * PANEL_LD + lane];   // row c is block 0's
        panel_grid_sync(flags, ++tag);
        panel_reduce<T>(P, nbk, red, S, rb, rowc);
        const T M = S[32], ss = S[c];
        const bool plain = M == T(0) || (ss >= NormRange<T>::LO && ss <= NormRange<T>::HI);
        T xnorm, dfac;                              // dfac: S holds dots of x / dfac
        if (plain) {
            xnorm = M == T(0) ? T(0) : sqrt(ss);
            dfac = T(1);
        } else {                                    // uniform over the grid
            panel_partials<T, true>(A, lo, nr, c, M, red, Pscaled);
            panel_grid_sync(flags, ++tag);
            panel_reduce<T>(Pscaled, nbk, red, S, nullptr, rowc);
            xnorm = M * sqrt(S[c]);
            dfac = M;
        }
        // every thread forms the same reflector (no broadcast step)
        const T alpha = rowc[c];
        T tk = 0, scale = 0, beta = alpha;
        {
            const T nrm = xnorm > T(0) ? hypot(alpha, xnorm) : T(0);
            // a column below NormRange::TINY is left alone (an identity reflector)
            if (nrm >= NormRange<T>::TINY) {
                beta = alpha >= T(0) ? -nrm : nrm;
                tk = (beta - alpha) / beta;
                scale = T(1) / (alpha - beta);
            }
        }
        const T ds = scale * dfac;
        if (b == 0 && tid == 0) tau[c] = tk;
        if (tk != T(0)) {
            const T vk = rowc[lane] + ds * S[lane];    // v_lane . v_c (lane < c), w/tau (lane > c)
            const T wl = (lane > c && lane < w) ? tk * vk : T(0);
            int r = lo + warp;
            for (; r + 3 * PANEL_NW < nr; r += 4 * PANEL_NW) {
                T v[4], a[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    v[u] = A[(r + u * PANEL_NW) * PANEL_LD + c] * scale;
                    a[u] = A[(r + u * PANEL_NW) * PANEL_LD + lane];
                }
                __syncwarp();
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    if (lane == c) A[(r + u * PANEL_NW) * PANEL_LD + lane] = v[u];
                    else if (lane > c) A[(r + u * PANEL_NW) * PANEL_LD + lane] = a[u] - v[u] * wl;
                }
            }
            for (; r < nr; r += PANEL_NW) {
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
             double* Tout, double* work, unsigned long long* flags, unsigned long long epoch,
             int R) {
    gpuqr::panel_qr<double>(F, ldf, m, w, V, ldv, tau, Tout, work, flags, epoch, R);
}

extern "C" __global__ void __launch_bounds__(gpuqr::PANEL_NT)
panel_qr_f32(float* F, long long ldf, int m, int w, float* V, long long ldv, float* tau,
             float* Tout, float* work, unsigned long long* flags, unsigned long long epoch,
             int R) {
    gpuqr::panel_qr<float>(F, ldf, m, w, V, ldv, tau, Tout, work, flags, epoch, R);
}
