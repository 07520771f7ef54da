// Q^T X and Q X from the Householder data a GPU factorization keeps on the device.
//
// One thread block applies one kept block reflector H = I - V T V^T (one Factorize
// part of a Factorize or Apply+Factorize record of the factorization) to a chunk of
// columns of the right-hand sides X, at the front's global row slots:
//
//     Q^T (TRANS = true):  X[s, :] <- X[s, :] - V T^T V^T X[s, :]
//     Q   (TRANS = false): X[s, :] <- X[s, :] - V T   V^T X[s, :]
//
// s = rowmap[aux + r] for the stacked front rows r < fm. The host
// (scipy_gpuqr/_engine/gpu/solve.py) turns each kept reflector into a normalized
// record of type TASK_APPLY_QT (the factorization's struct, task.cuh):
//
//     F       front base in the stage's front pool (V of the non-top tiles)
//     vt      VT tile (T on/above the diagonal, the top tile's V1 below it)
//     aux     offset of the front's row map in `rowmap` (global row of each front row)
//     fm, fn  front rows and leading dimension; col: first column of the V tile
//     nref    reflectors (columns of V)
//     napply  row tiles in the stack; rows[0:napply] their first front rows, top first
//
// and groups them into levels whose records touch disjoint global rows: one launch
// per level, levels in order for Q^T and in reverse order for Q. Conventions (V unit
// lower in the top tile, rows >= fm zero, T forward columnwise) are those of
// factorize.cuh and scipy_gpuqr/_engine/host/simulate.py.
//
// V and T are of the factorization's type T (double or float); X and all arithmetic
// are double. Grid: (records of the level, ceil(k / W)); blockIdx.y picks W columns.
#include "task.cuh"

namespace gpuqr {

// Shared-memory layout (doubles); mirrored by applyq_smem_bytes in
// scipy_gpuqr/_engine/gpu/solve_kernels.py.
template <int TILE, int BUNDLE>
struct ApplyQSmem {
    static constexpr int LD = TILE + 1;
    static constexpr int W = 32;          // right-hand-side columns per block
    static constexpr int LDW = W + 1;
    static constexpr int V = BUNDLE * TILE * LD;
    static constexpr int T = TILE * LD;
    static constexpr int X = BUNDLE * TILE * LDW;
    static constexpr int C = TILE * LDW;
    static constexpr int TOTAL = V + T + X + C;
};

template <typename T, int TILE, int BUNDLE, int NT, bool TRANS>
__global__ void __launch_bounds__(NT)
applyq(const Task* __restrict__ recs, const T* __restrict__ F, const T* __restrict__ VT,
       const long long* __restrict__ rowmap, double* __restrict__ X, int k, long long ldx) {
    using S = ApplyQSmem<TILE, BUNDLE>;
    constexpr int LD = S::LD, W = S::W, LDW = S::LDW, NWARP = NT / 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    double* V = reinterpret_cast<double*>(smem_raw);
    double* Tm = V + S::V;
    double* Xs = Tm + S::T;
    double* C = Xs + S::X;
    __shared__ Task t;
    const int tid = threadIdx.x;
    if (tid == 0) t = recs[blockIdx.x];
    __syncthreads();
    const int j0 = blockIdx.y * W;
    const int nc = (k - j0) < W ? (k - j0) : W;
    const int nt = t.napply < BUNDLE ? t.napply : BUNDLE;
    if (nc <= 0 || nt <= 0 || t.nref <= 0) return;          // uniform over the block
    const int fm = t.fm, fn = t.fn, col = t.col, nref = t.nref, M = nt * TILE;
    const long long F0 = t.F, vt = t.vt;
    const long long* map = rowmap + t.aux;

    // V (unit lower top tile from the VT tile, the other tiles from the front) and T
    for (int idx = tid; idx < M * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        double v = 0.0;
        if (j < nref) {
            if (i < TILE) {
                v = (i > j) ? (double)VT[vt + i * TILE + j] : (i == j ? 1.0 : 0.0);
            } else {
                const int r = t.rows[i / TILE] + (i % TILE), c = col + j;
                if (r < fm && c < fn) v = (double)F[F0 + (long long)r * fn + c];
            }
        }
        V[i * LD + j] = v;
    }
    for (int idx = tid; idx < TILE * TILE; idx += NT) {
        const int i = idx / TILE, j = idx - i * TILE;
        Tm[i * LD + j] = (i <= j && j < nref) ? (double)VT[vt + idx] : 0.0;
    }
    // the right-hand sides at the front's global rows (rows >= fm are zeros)
    for (int idx = tid; idx < M * nc; idx += NT) {
        const int i = idx / nc, j = idx - i * nc;
        const int r = t.rows[i / TILE] + (i % TILE);
        Xs[i * LDW + j] = (r < fm) ? X[map[r] * ldx + j0 + j] : 0.0;
    }
    __syncthreads();

    // C = V^T Xs (V[r][i] = 0 for r < i)
    if (nref * nc >= NT) {                       // one thread per entry
        for (int idx = tid; idx < nref * nc; idx += NT) {
            const int i = idx / nc, j = idx - i * nc;
            double s = 0.0;
            for (int r = i; r < M; ++r) s += V[r * LD + i] * Xs[r * LDW + j];
            C[i * LDW + j] = s;
        }
    } else {                                     // few columns: one warp per entry
        const int lane = tid & 31, warp = tid >> 5;
        for (int idx = warp; idx < nref * nc; idx += NWARP) {
            const int i = idx / nc, j = idx - i * nc;
            double s = 0.0;
            for (int r = i + lane; r < M; r += 32) s += V[r * LD + i] * Xs[r * LDW + j];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
            if (lane == 0) C[i * LDW + j] = s;
        }
    }
    __syncthreads();

    // C = T^T C (Q^T) or T C (Q), T upper triangular
    constexpr int PER = (TILE * W + NT - 1) / NT;
    double acc[PER];
#pragma unroll
    for (int q = 0; q < PER; ++q) {
        const int idx = tid + q * NT;
        acc[q] = 0.0;
        if (idx < nref * nc) {
            const int i = idx / nc, j = idx - i * nc;
            if (TRANS) {
                for (int l = 0; l <= i; ++l) acc[q] += Tm[l * LD + i] * C[l * LDW + j];
            } else {
                for (int l = i; l < nref; ++l) acc[q] += Tm[i * LD + l] * C[l * LDW + j];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < PER; ++q) {
        const int idx = tid + q * NT;
        if (idx < nref * nc) C[(idx / nc) * LDW + (idx % nc)] = acc[q];
    }
    __syncthreads();

    // Xs -= V C, written back at the global rows
    for (int idx = tid; idx < M * nc; idx += NT) {
        const int i = idx / nc, j = idx - i * nc;
        const int r = t.rows[i / TILE] + (i % TILE);
        if (r < fm) {
            double s = Xs[i * LDW + j];
            const int lmax = (i < TILE ? (i + 1 < nref ? i + 1 : nref) : nref);
            for (int l = 0; l < lmax; ++l) s -= V[i * LD + l] * C[l * LDW + j];
            X[map[r] * ldx + j0 + j] = s;
        }
    }
}

// Shared memory (bytes) of a variant, for the host's opt-in limit (checked by the tests
// against scipy_gpuqr/_engine/gpu/solve_kernels.py).
template <int TILE, int BUNDLE>
__global__ void applyq_smem_bytes(long long* out) {
    out[0] = (long long)sizeof(double) * ApplyQSmem<TILE, BUNDLE>::TOTAL;
}

}  // namespace gpuqr
