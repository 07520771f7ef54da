// Apply task: block Householder update A <- A - V (T^T (V^T A)) of the bundle's
// column tiles [c0, c1), V and T from the VT tile (top slot) and the front.
// The template argument APPLY picks how a double-precision TILE-32 Apply with
// 256 threads does its three products: 4 on the FP64 tensor cores
// (apply_chunk_mma_blocked, the next column chunk copied in by cp.async
// meanwhile; 4 also picks the lean Factorize, factorize.cuh), 0 scalar loops.
// Any other type, tile or thread count runs the scalar loops. The host side
// names the variant (scipy_gpuqr/_engine/gpu/factorize_kernels.py).
#pragma once

#include "task.cuh"

namespace gpuqr {

template <typename T> struct ApplyIsDouble { static constexpr bool value = false; };
template <> struct ApplyIsDouble<double> { static constexpr bool value = true; };

// D += A B on an 8x8x4 tile (FP64 tensor cores). Lane l = 4 g + q holds
// A[g][q], B[q][g] and D[g][2q], D[g][2q + 1].
__device__ __forceinline__ void apply_dmma(double& d0, double& d1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d0), "+d"(d1) : "d"(a), "d"(b));
}

// The Apply a kernel runs: kind 3 (tensor cores) for APPLY 4 with double,
// TILE 32 and 256 threads, else 0 (scalar loops).
template <typename T, int TILE, int NT, int APPLY>
struct ApplyKind {
    static constexpr int value =
        (ApplyIsDouble<T>::value && TILE == 32 && NT == 256 && APPLY == 4) ? 3 : 0;
};

// Start copying the W = 32 columns [cc, cc + 32) of the bundle's M rows into
// A (row stride LDW) without registers (cp.async, 8 bytes a thread at a time);
// rows >= fm and columns >= cend are zero-filled. Visible after
// apply_async_wait() and a barrier.
template <int NT, int LDW>
__device__ __forceinline__ void apply_async_load(const Task& t, const double* __restrict__ F,
                                                 double* A, int M, int cc, int cend) {
    const int fm = t.fm, fn = t.fn;
    const long long F0 = t.F;
    for (int idx = threadIdx.x; idx < M * 32; idx += NT) {
        const int i = idx >> 5, j = idx & 31;
        const int r = t.rows[i >> 5] + (i & 31), c = cc + j;
        const bool in = r < fm && c < cend;
        const double* src = F + (in ? F0 + (long long)r * fn + c : 0);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(A + i * LDW + j);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                     :: "r"(dst), "l"(src), "r"(in ? 8 : 0) : "memory");
    }
}

__device__ __forceinline__ void apply_async_wait() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// One W-column chunk of the Apply on the tensor cores, 8 warps, each holding a
// block of output tiles so that an operand fragment read from shared memory
// feeds two or more mma: C = V^T A (warp w: rows 8 (w/2) .. +8, columns
// 16 (w%2) .. +16), C = -T^T C (the same tiles), A -= V C (rows of na 8-row
// blocks, the same 16 columns; A's tiles held in registers from the start).
// Row strides LD, LDW = 4 (mod 16) make every fragment load conflict-free.
// Products skip what is zero by structure: V^T's rows above the diagonal of
// the top tile, T^T's above its diagonal, every k at or past nref (rounded to
// the k-step of 4; V and T are zero there). The result goes to F for rows < fm
// and columns < cend. A's buffer is free once the first product is done: the
// chunk at ncc (if < cend) starts loading into it then (apply_async_load),
// while this chunk's last two products run.
template <int LD, int LDW>
__device__ __forceinline__ void apply_chunk_mma_blocked(const Task& t, double* __restrict__ F,
                                                        const double* V, const double* Tm,
                                                        double* A, double* C, int M,
                                                        int nref, int cc, int cend, int ncc) {
    static_assert(LD % 16 == 4 && LDW % 16 == 4, "apply_chunk_mma_blocked: padding");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int I = warp >> 1, j0 = (warp & 1) * 16;
    const int na = M >> 5;
    const int kr = (nref + 3) & ~3;
    double acc[3][4];
#pragma unroll
    for (int u = 0; u < 3; ++u) {
        if (u < na) {
            const double* a = A + ((I * na + u) * 8 + g) * LDW + j0 + 2 * q;
            acc[u][0] = a[0];
            acc[u][1] = a[1];
            acc[u][2] = a[8];
            acc[u][3] = a[9];
        }
    }
    // C = V^T A: A-operand V^T[i][k] = V[k][i], B-operand A[k][j]
    double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
    if (I * 8 < nref) {
        const double* v = V + q * LD + I * 8 + g;
        const double* b = A + q * LDW + j0 + g;
#pragma unroll 4
        for (int k0 = I * 8; k0 < M; k0 += 4) {
            const double a = v[k0 * LD];
            apply_dmma(c0, c1, a, b[k0 * LDW]);
            apply_dmma(c2, c3, a, b[k0 * LDW + 8]);
        }
    }
    double* crow = C + (I * 8 + g) * LDW + j0 + 2 * q;
    crow[0] = c0;
    crow[1] = c1;
    crow[8] = c2;
    crow[9] = c3;
    __syncthreads();
    if (ncc < cend) apply_async_load<256, LDW>(t, F, A, M, ncc, cend);
    // C = -T^T C: A-operand T^T[i][k] = Tm[k][i], zero for k > i
    c0 = c1 = c2 = c3 = 0.0;
    {
        const int kt = (I + 1) * 8 < kr ? (I + 1) * 8 : kr;
        const double* tm = Tm + q * LD + I * 8 + g;
        const double* b = C + q * LDW + j0 + g;
#pragma unroll 2
        for (int k0 = 0; k0 < kt; k0 += 4) {
            const double a = -tm[k0 * LD];
            apply_dmma(c0, c1, a, b[k0 * LDW]);
            apply_dmma(c2, c3, a, b[k0 * LDW + 8]);
        }
    }
    __syncthreads();
    crow[0] = c0;
    crow[1] = c1;
    crow[8] = c2;
    crow[9] = c3;
    __syncthreads();
    // A += V C (C holds -T^T V^T A): A-operand V[i][k], B-operand C[k][j]
    {
        const double* b = C + q * LDW + j0 + g;
        const double* v = V + (I * na * 8 + g) * LD + q;
#pragma unroll 2
        for (int k0 = 0; k0 < kr; k0 += 4) {
            const double b0 = b[k0 * LDW], b1 = b[k0 * LDW + 8];
#pragma unroll
            for (int u = 0; u < 3; ++u) {
                if (u < na) {
                    const double a = v[u * 8 * LD + k0];
                    apply_dmma(acc[u][0], acc[u][1], a, b0);
                    apply_dmma(acc[u][2], acc[u][3], a, b1);
                }
            }
        }
    }
    const int fm = t.fm, fn = t.fn;
    const long long F0 = t.F;
    const int c = cc + j0 + 2 * q;
#pragma unroll
    for (int u = 0; u < 3; ++u) {
        if (u < na) {
            const int i = (I * na + u) * 8 + g;
            const int r = t.rows[i >> 5] + (i & 31);
            if (r < fm) {
                double* f = F + F0 + (long long)r * fn + c;
                if (c < cend) f[0] = acc[u][0];
                if (c + 1 < cend) f[1] = acc[u][1];
                if (c + 8 < cend) f[8] = acc[u][2];
                if (c + 9 < cend) f[9] = acc[u][3];
            }
        }
    }
}

template <typename Tv, int TILE, int BUNDLE, int APPLY>
struct ApplySmem {
    static constexpr int LD = APPLY == 4 && ApplyIsDouble<Tv>::value && TILE == 32
                                  ? TILE + 4 : TILE + 1;
    static constexpr int W = TILE >= 64 ? 32 : TILE;   // columns per chunk
    static constexpr int LDW = LD == TILE + 4 ? W + 4 : W + 1;
    static constexpr int V = BUNDLE * TILE * LD;
    static constexpr int T = TILE * LD;
    static constexpr int A = BUNDLE * TILE * LDW;
    static constexpr int C = TILE * LDW;
    static constexpr int TOTAL = V + T + A + C;
};

// The columns [c0, c1) of the column range [a, b) that piece `piece` of `pieces`
// updates: the range's column tiles (TILE wide from a, the last one clipped at b)
// cut into `pieces` runs of near-equal length, so that every column is updated by
// one piece with exactly the arithmetic of the whole range (chunks stay aligned
// to a). An empty run (c0 >= c1) when the range has fewer tiles than pieces.
// Mirror: scipy_gpuqr/_schedule/tasks.py, apply_piece_columns.
template <int TILE>
__device__ __forceinline__ void piece_columns(int a, int b, int piece, int pieces,
                                              int& c0, int& c1) {
    const int w = b - a;
    const int nt = w > 0 ? (w + TILE - 1) / TILE : 0;
    const int t0 = (int)(((long long)piece * nt) / pieces);
    const int t1 = (int)(((long long)(piece + 1) * nt) / pieces);
    c0 = a + t0 * TILE;
    c1 = a + t1 * TILE < b ? a + t1 * TILE : b;
}

// The columns [c0, c1) of an Apply record that piece `piece` of `pieces` updates
// (piece_columns of the record's [t.c0, t.c1)).
template <int TILE>
__device__ __forceinline__ void apply_piece_columns(const Task& t, int piece, int pieces,
                                                    int& c0, int& c1) {
    piece_columns<TILE>(t.c0, t.c1, piece, pieces, c0, c1);
}

// The columns [c0, c1) of an Apply+Factorize record's Apply that piece `piece` of
// `pieces` (>= 2) updates: piece 0 the column tile its Factorize takes (the first,
// [t.c0, t.c0 + TILE) clipped at t.c1), pieces 1 .. pieces - 1 the record's other
// column tiles (piece_columns of [t.c0 + TILE, t.c1) into pieces - 1 runs). The
// Factorize reads only its own tile, so the others need not wait for it. Mirror:
// _pieces_of in tests/test_gpu_tiles.py.
template <int TILE>
__device__ __forceinline__ void apply_factorize_piece_columns(const Task& t, int piece,
                                                              int pieces, int& c0, int& c1) {
    if (piece == 0) {
        c0 = t.c0;
        c1 = t.c0 + TILE < t.c1 ? t.c0 + TILE : t.c1;
    } else {
        piece_columns<TILE>(t.c0 + TILE, t.c1, piece - 1, pieces - 1, c0, c1);
    }
}

// The Apply of the record's columns [c0, c1) (the whole record: t.c0, t.c1; a
// piece of it: apply_piece_columns).
template <typename T, int TILE, int BUNDLE, int NT, int APPLY>
__device__ void apply_bundle(const Task& t, T* __restrict__ F,
                             const T* __restrict__ VTpool, T* smem, int c0, int c1) {
    constexpr int KIND = ApplyKind<T, TILE, NT, APPLY>::value;
    static_assert(KIND != 3 || BUNDLE <= 3, "apply_chunk_mma_blocked: at most 3 row tiles");
    using S = ApplySmem<T, TILE, BUNDLE, APPLY>;
    constexpr int LD = S::LD, W = S::W, LDW = S::LDW;
    T* V = smem;
    T* Tm = V + S::V;
    T* A = Tm + S::T;
    T* C = A + S::A;
    const int tid = threadIdx.x;
    const int fm = t.fm, fn = t.fn, col = t.col, nref = t.nref, na = t.napply;
    const long long F0 = t.F, vt = t.vt;
    const int M = na * TILE;
    const int cend = c1 < fn ? c1 : fn;
    if constexpr (KIND == 3) {      // the first chunk's copy runs while V and T load
        if (c0 < cend) apply_async_load<NT, LDW>(t, F, A, M, c0, cend);
    }
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
    if constexpr (KIND == 3) {
        for (int cc = c0; cc < cend; cc += W) {
            apply_async_wait();
            __syncthreads();
            apply_chunk_mma_blocked<LD, LDW>(t, F, V, Tm, A, C, M, nref, cc, cend, cc + W);
        }
        return;
    }
    __syncthreads();
    for (int cc = c0; cc < cend; cc += W) {
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
