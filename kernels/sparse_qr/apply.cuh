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

// Offset of element (r, c) in a shared array of 32 columns stored without
// padding: row r's groups of 4 columns permuted by r mod 4 (c XOR 4 (r mod 4)),
// so that the tensor-core fragments (4 consecutive rows by 8 columns aligned to
// 8, or 8 rows aligned to 8 by 4 columns aligned to 4) hit 16 distinct 8-byte
// banks in each half warp without padding bytes.
__device__ __forceinline__ int apply_swz(int r, int c) { return r * 32 + (c ^ ((r & 3) << 2)); }

// Start copying the 32 columns [cc, cc + 32) of the bundle's M rows into A
// (apply_swz layout) without registers (cp.async, 8 bytes a thread at a time);
// rows >= fm and columns >= cend are zero-filled. Visible after
// apply_async_wait() and a barrier.
template <int NT>
__device__ __forceinline__ void apply_async_load(const Task& t, const double* __restrict__ F,
                                                 double* A, int M, int cc, int cend) {
    const int fm = t.fm, fn = t.fn;
    const long long F0 = t.F;
    for (int idx = threadIdx.x; idx < M * 32; idx += NT) {
        const int i = idx >> 5, j = idx & 31;
        const int r = t.rows[i >> 5] + (i & 31), c = cc + j;
        const bool in = r < fm && c < cend;
        const double* src = F + (in ? F0 + (long long)r * fn + c : 0);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(A + apply_swz(i, j));
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                     :: "r"(dst), "l"(src), "r"(in ? 8 : 0) : "memory");
    }
}

__device__ __forceinline__ void apply_async_wait() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// One 32-column chunk of the Apply on the tensor cores, 8 warps, each holding a
// block of output tiles so that an operand fragment read from shared memory
// feeds two or more mma: C = V^T A (warp w: rows 8 (w/2) .. +8, columns
// 16 (w%2) .. +16), C = -T^T C (the same tiles), A -= V C (rows of na 8-row
// blocks, the same 16 columns; A's tiles held in registers from the start).
// V, A and C are 32-column arrays in the apply_swz layout; V's top tile is the
// VT tile itself (T on and above the diagonal, V1 below it, columns >= nref
// zero), each fragment masked to what it stands for: V unit lower (its
// diagonal 1 in columns < nref), T upper. Products skip what is zero by
// structure: V^T's rows above the diagonal of the top tile, T^T's above its
// diagonal, every k at or past nref (rounded to the k-step of 4; V and T are
// zero there). The result goes to F for rows < fm and columns < cend. A's
// buffer is free once the first product is done: the chunk at ncc (if < cend)
// starts loading into it then (apply_async_load), while this chunk's last two
// products run.
__device__ __forceinline__ void apply_chunk_mma_blocked(const Task& t, double* __restrict__ F,
                                                        const double* V, double* A, double* C,
                                                        int M, int nref, int cc, int cend,
                                                        int ncc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int I = warp >> 1, j0 = (warp & 1) * 16;
    const int na = M >> 5;
    const int kr = (nref + 3) & ~3;
    // this lane's column offsets within a row (apply_swz): rows 8 n + g at columns
    // j0 + 2q (+1; ^ 8: +8, +9); rows 4 n + q at columns j0 + g (^ 8: j0 + 8 + g)
    // and I * 8 + g
    const int sg = (g & 3) << 2, sq = q << 2;
    const int pa = (j0 + 2 * q) ^ sg, pb = (j0 + g) ^ sq, i = I * 8 + g;
    double acc[3][4];
#pragma unroll
    for (int u = 0; u < 3; ++u) {
        if (u < na) {
            const double* a = A + ((I * na + u) * 8 + g) * 32;
            acc[u][0] = a[pa];
            acc[u][1] = a[pa + 1];
            acc[u][2] = a[pa ^ 8];
            acc[u][3] = a[(pa ^ 8) + 1];
        }
    }
    // V^T's and T^T's fragments: V[k][i] (k = k0 + q) and T[k][i] share an address
    const double* vt = V + q * 32 + (i ^ sq);
    // C = V^T A: A-operand V^T[i][k] = V[k][i], B-operand A[k][j]
    double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
    if (I * 8 < nref) {
        const double* b = A + q * 32 + pb;
        const double* b8 = A + q * 32 + (pb ^ 8);
        const double one = i < nref ? 1.0 : 0.0;
        int k0 = I * 8;
        for (; k0 < 32; k0 += 4) {          // the top tile: V unit lower
            const int k = k0 + q;
            const double x = vt[k0 * 32];
            const double a = k > i ? x : (k == i ? one : 0.0);
            apply_dmma(c0, c1, a, b[k0 * 32]);
            apply_dmma(c2, c3, a, b8[k0 * 32]);
        }
#pragma unroll 4
        for (; k0 < M; k0 += 4) {
            const double a = vt[k0 * 32];
            apply_dmma(c0, c1, a, b[k0 * 32]);
            apply_dmma(c2, c3, a, b8[k0 * 32]);
        }
    }
    double* crow = C + i * 32;
    crow[pa] = c0;
    crow[pa + 1] = c1;
    crow[pa ^ 8] = c2;
    crow[(pa ^ 8) + 1] = c3;
    __syncthreads();
    if (ncc < cend) apply_async_load<256>(t, F, A, M, ncc, cend);
    const double* cb = C + q * 32 + pb;
    const double* cb8 = C + q * 32 + (pb ^ 8);
    // C = -T^T C: A-operand T^T[i][k] = T[k][i], zero for k > i
    c0 = c1 = c2 = c3 = 0.0;
    {
        const int kt = (I + 1) * 8 < kr ? (I + 1) * 8 : kr;
#pragma unroll 2
        for (int k0 = 0; k0 < kt; k0 += 4) {
            const double a = -(k0 + q <= i ? vt[k0 * 32] : 0.0);
            apply_dmma(c0, c1, a, cb[k0 * 32]);
            apply_dmma(c2, c3, a, cb8[k0 * 32]);
        }
    }
    __syncthreads();
    crow[pa] = c0;
    crow[pa + 1] = c1;
    crow[pa ^ 8] = c2;
    crow[(pa ^ 8) + 1] = c3;
    __syncthreads();
    // A += V C (C holds -T^T V^T A): A-operand V[r][k], B-operand C[k][j]; row
    // r = (I na + u) 8 + g, r mod 4 = g mod 4, so V[r][k0 + q] is at r * 32 +
    // (k0 ^ sg) + q
    {
        const double* v = V + (I * na * 8 + g) * 32 + q;
#pragma unroll 2
        for (int k0 = 0; k0 < kr; k0 += 4) {
            const double b0 = cb[k0 * 32], b1 = cb8[k0 * 32];
            const int kx = k0 ^ sg, k = k0 + q;
#pragma unroll
            for (int u = 0; u < 3; ++u) {
                if (u < na) {
                    const int r = (I * na + u) * 8 + g;
                    double a = v[u * 8 * 32 + kx];
                    if (r < 32)             // the top tile: V unit lower
                        a = k < r ? a : (k == r && k < nref ? 1.0 : 0.0);
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

// Shared memory (elements) of the Apply. The tensor-core Apply (APPLY 4, double,
// TILE 32): V (its top tile the VT tile, holding T too), A and C as unpadded
// 32-column arrays (apply_swz); the scalar loops: V, T, A and C with rows padded
// by one.
template <typename Tv, int TILE, int BUNDLE, int APPLY>
struct ApplySmem {
    static constexpr bool SWIZZLED = APPLY == 4 && ApplyIsDouble<Tv>::value && TILE == 32;
    static constexpr int LD = SWIZZLED ? TILE : TILE + 1;
    static constexpr int W = TILE >= 64 ? 32 : TILE;   // columns per chunk
    static constexpr int LDW = SWIZZLED ? W : W + 1;
    static constexpr int V = BUNDLE * TILE * LD;
    static constexpr int T = SWIZZLED ? 0 : TILE * LD;
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
    static_assert(S::SWIZZLED == (KIND == 3), "apply_bundle: layout and Apply kind disagree");
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
    if constexpr (KIND == 3) {
        // the first chunk's copy runs while V loads; V's top tile is the VT tile
        // as stored (apply_chunk_mma_blocked masks it), its columns >= nref zero
        if (c0 < cend) apply_async_load<NT>(t, F, A, M, c0, cend);
        for (int idx = tid; idx < M * TILE; idx += NT) {
            const int i = idx / TILE, j = idx - i * TILE;
            T v = 0.0;
            if (j < nref) {
                if (i < TILE) {
                    v = VTpool[vt + idx];
                } else {
                    const int r = t.rows[i / TILE] + (i % TILE), c = col + j;
                    if (r < fm && c < fn) v = F[F0 + (long long)r * fn + c];
                }
            }
            V[apply_swz(i, j)] = v;
        }
        for (int cc = c0; cc < cend; cc += W) {
            apply_async_wait();
            __syncthreads();
            apply_chunk_mma_blocked(t, F, V, A, C, M, nref, cc, cend, cc + W);
        }
        return;
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
