// Apply task: block Householder update A <- A - V (T^T (V^T A)) of the bundle's
// column tiles [c0, c1), V and T from the VT tile (top slot) and the front.
#pragma once

#include "task.cuh"

namespace gpuqr {

template <int TILE, int BUNDLE>
struct ApplySmem {
    static constexpr int LD = TILE + 1;
    static constexpr int W = TILE >= 64 ? 32 : TILE;   // columns per chunk
    static constexpr int LDW = W + 1;
    static constexpr int V = BUNDLE * TILE * LD;
    static constexpr int T = TILE * LD;
    static constexpr int A = BUNDLE * TILE * LDW;
    static constexpr int C = TILE * LDW;
    static constexpr int TOTAL = V + T + A + C;
};

template <typename T, int TILE, int BUNDLE, int NT>
__device__ void apply_bundle(const Task& t, T* __restrict__ F,
                             const T* __restrict__ VTpool, T* smem) {
    using S = ApplySmem<TILE, BUNDLE>;
    constexpr int LD = S::LD, W = S::W, LDW = S::LDW;
    T* V = smem;
    T* Tm = V + S::V;
    T* A = Tm + S::T;
    T* C = A + S::A;
    const int tid = threadIdx.x;
    const int fm = t.fm, fn = t.fn, col = t.col, nref = t.nref, na = t.napply;
    const long long F0 = t.F, vt = t.vt;
    const int M = na * TILE;
    for (int idx = tid; idx < M * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        T v = 0.0;
        if (j < nref) {
            if (i < TILE) {
                v = (i > j) ? VTpool[vt + idx] : (i == j ? T(1) : T(0));
            } else {
                const int r = t.rows[i / TILE] + (i % TILE), c = col + j;
                if (r < fm && c < fn) v = F[F0 + (long long)r * fn + c];
            }
        }
        V[i * LD + j] = v;
    }
    for (int idx = tid; idx < TILE * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        Tm[i * LD + j] = (i <= j && j < nref) ? VTpool[vt + idx] : 0.0;
    }
    __syncthreads();
    const int cend = t.c1 < fn ? t.c1 : fn;
    for (int cc = t.c0; cc < cend; cc += W) {
        for (int idx = tid; idx < M * W; idx += NT) {
            const int i = idx / W, j = idx - i * W;
            const int r = t.rows[i / TILE] + (i % TILE), c = cc + j;
            A[i * LDW + j] = (r < fm && c < cend) ? F[F0 + (long long)r * fn + c] : 0.0;
        }
        __syncthreads();
        for (int idx = tid; idx < nref * W; idx += NT) {          // C = V^T A
            const int i = idx / W, j = idx - i * W;
            T s = 0.0;
            for (int r = i; r < M; ++r) s += V[r * LD + i] * A[r * LDW + j];
            C[i * LDW + j] = s;
        }
        __syncthreads();
        constexpr int PER = (TILE * W + NT - 1) / NT;                // C = T^T C
        T acc[PER];
#pragma unroll
        for (int q = 0; q < PER; ++q) {
            const int idx = tid + q * NT;
            acc[q] = 0.0;
            if (idx < nref * W) {
                const int i = idx / W, j = idx - i * W;
                for (int l = 0; l <= i; ++l) acc[q] += Tm[l * LD + i] * C[l * LDW + j];
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER; ++q) {
            const int idx = tid + q * NT;
            if (idx < nref * W) C[(idx / W) * LDW + (idx % W)] = acc[q];
        }
        __syncthreads();
        for (int idx = tid; idx < M * W; idx += NT) {              // A -= V C
            const int i = idx / W, j = idx - i * W;
            const int r = t.rows[i / TILE] + (i % TILE), c = cc + j;
            if (r < fm && c < cend) {
                T s = A[i * LDW + j];
                const int lmax = (i < TILE ? (i + 1 < nref ? i + 1 : nref) : nref);
                for (int l = 0; l < lmax; ++l) s -= V[i * LD + l] * C[l * LDW + j];
                F[F0 + (long long)r * fn + c] = s;
            }
        }
        __syncthreads();
    }
}

}  // namespace gpuqr
