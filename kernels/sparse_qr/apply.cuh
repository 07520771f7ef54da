// Apply task: block Householder update A <- A - V (T^T (V^T A)) of the bundle's
// column tiles [c0, c1), V and T from the VT tile (top slot) and the front.
#pragma once

#include "task.cuh"

// GPUQR_APPLY_MMA=1 runs the three products of a double-precision TILE-32 Apply
// on the FP64 tensor cores (apply_chunk_mma below); 0 keeps the scalar loops.
#ifndef GPUQR_APPLY_MMA
#define GPUQR_APPLY_MMA 0
#endif

namespace gpuqr {

template <typename T> struct ApplyIsDouble { static constexpr bool value = false; };
template <> struct ApplyIsDouble<double> { static constexpr bool value = true; };

// D += A B on an 8x8x4 tile (FP64 tensor cores). Lane l = 4 g + q holds
// A[g][q], B[q][g] and D[g][2q], D[g][2q + 1].
__device__ __forceinline__ void apply_dmma(double& d0, double& d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d0), "+d"(d1) : "d"(a), "d"(b));
}

// One W-column chunk of the Apply on the tensor cores (TILE = W = 32, a warp per
// 8x8 output tile at a time), the same three products as the scalar loops:
//   C = V^T A (32 x 32, k = M), C = T^T C (k = 32), A -= V C (M x 32, k = 32),
// V zero above its diagonal and right of nref, T zero outside its upper triangle
// of nref columns, so the rows of C past nref come out zero and nothing needs
// masking. The result goes to F for rows < fm and columns < cend.
template <int TILE, int NT, int LD, int LDW>
__device__ __forceinline__ void apply_chunk_mma(const Task& t, double* __restrict__ F,
                                                const double* V, const double* Tm,
                                                const double* A, double* C, int M,
                                                int cc, int cend) {
    static_assert(TILE == 32 && NT % 32 == 0 && 16 % (NT / 32) == 0, "apply_chunk_mma: TILE 32");
    constexpr int NW = NT / 32, TPW = 16 / NW;      // warps, C tiles per warp
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int fm = t.fm, fn = t.fn;
    const long long F0 = t.F;
    double d[TPW][2];
    // C = V^T A: tile (I, J) of C, A-operand V^T[i][k] = V[k][i], B-operand A[k][j]
#pragma unroll
    for (int u = 0; u < TPW; ++u) {
        const int tile = warp + u * NW;
        const int i = (tile >> 2) * 8 + g, j = (tile & 3) * 8;
        double d0 = 0.0, d1 = 0.0;
        for (int k0 = 0; k0 < M; k0 += 4)
            apply_dmma(d0, d1, V[(k0 + q) * LD + i], A[(k0 + q) * LDW + j + g]);
        d[u][0] = d0;
        d[u][1] = d1;
    }
#pragma unroll
    for (int u = 0; u < TPW; ++u) {
        const int tile = warp + u * NW;
        const int i = (tile >> 2) * 8 + g, j = (tile & 3) * 8 + 2 * q;
        C[i * LDW + j] = d[u][0];
        C[i * LDW + j + 1] = d[u][1];
    }
    __syncthreads();
    // C = T^T C: A-operand T^T[i][k] = Tm[k][i], B-operand C[k][j]
#pragma unroll
    for (int u = 0; u < TPW; ++u) {
        const int tile = warp + u * NW;
        const int i = (tile >> 2) * 8 + g, j = (tile & 3) * 8;
        double d0 = 0.0, d1 = 0.0;
#pragma unroll
        for (int k0 = 0; k0 < TILE; k0 += 4)
            apply_dmma(d0, d1, Tm[(k0 + q) * LD + i], C[(k0 + q) * LDW + j + g]);
        d[u][0] = d0;
        d[u][1] = d1;
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < TPW; ++u) {
        const int tile = warp + u * NW;
        const int i = (tile >> 2) * 8 + g, j = (tile & 3) * 8 + 2 * q;
        C[i * LDW + j] = d[u][0];
        C[i * LDW + j + 1] = d[u][1];
    }
    __syncthreads();
    // A -= V C: D starts as A's tile, A-operand -V[i][k], B-operand C[k][j]
    const int ntiles = (M / 8) * 4;
    for (int tile = warp; tile < ntiles; tile += NW) {
        const int i = (tile >> 2) * 8 + g, j = (tile & 3) * 8;
        double d0 = A[i * LDW + j + 2 * q], d1 = A[i * LDW + j + 2 * q + 1];
#pragma unroll
        for (int k0 = 0; k0 < TILE; k0 += 4)
            apply_dmma(d0, d1, -V[i * LD + k0 + q], C[(k0 + q) * LDW + j + g]);
        const int r = t.rows[i / TILE] + (i % TILE), c = cc + j + 2 * q;
        if (r < fm) {
            if (c < cend) F[F0 + (long long)r * fn + c] = d0;
            if (c + 1 < cend) F[F0 + (long long)r * fn + c + 1] = d1;
        }
    }
}

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
        if constexpr (GPUQR_APPLY_MMA && ApplyIsDouble<T>::value && TILE == 32 && W == 32) {
            apply_chunk_mma<TILE, NT, LD, LDW>(t, F, V, Tm, A, C, M, cc, cend);
        } else {
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
        }
        __syncthreads();
    }
}

}  // namespace gpuqr
