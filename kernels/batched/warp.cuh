// warp.cuh: helpers of the warp-per-tile batched kernels (n <= 32) of
// lu_warp.cu; lu_mma.cu uses its keys, reciprocals and cp.async copies.
//
// Layout conventions (every kernel of lu_warp.cu):
//   * matrices are row-major, contiguous, n*n elements each;
//   * a warp owns a "tile" of MW = 32 / SEG consecutive matrices, SEG = next
//     power of two >= N lanes per matrix, one row per lane; warps never wait
//     for each other (no __syncthreads), and loop over tiles (grid stride);
//   * a tile is copied global -> shared with cp.async (16-byte chunks when
//     rows are whole 16-byte units and the pointers are aligned, else one
//     element per copy), optionally one tile ahead (two stages), and copied
//     back shared -> global with coalesced (vector) stores;
//   * in shared memory a row takes LD elements: an odd number of 16-byte
//     units when rows are whole units (lane-per-row 16-byte accesses of 8
//     consecutive lanes then hit distinct banks), else an odd number of
//     elements (conflict-free scalar accesses).
#pragma once

#include "batched.cuh"
#include "csr_blocks.cuh"

namespace gpuqr_warp {

using namespace gpuqr_batched;   // Seg, Vec

// Row layout of the shared tile of N x N matrices.
template <typename T, int N>
struct Layout {
    static constexpr int VW = Vec<T>::width;
    static constexpr bool vec = (N % VW) == 0;          // rows are whole 16-byte units
    static constexpr int units = N / VW;
    static constexpr int LD = vec ? ((units % 2) ? units : units + 1) * VW : (N | 1);
    static constexpr int SEG = Seg<N>::value;
    static constexpr int MW = 32 / SEG;                 // matrices per warp tile
    static constexpr int TILE = MW * N * LD;            // elements per tile
    // broadcast buffer per matrix: the row and two scalars; one matrix per
    // warp (N > 16) leaves room for the padded groups of warp2d.cuh
    static constexpr int NBUF = ((N + 2 + VW - 1) / VW) * VW + (MW == 1 ? 6 * VW : 0);
};

// scale that makes a subnormal pivot normal / a huge pivot's reciprocal normal
template <typename T> __device__ __forceinline__ T up_scale();
template <> __device__ __forceinline__ double up_scale<double>() { return 18014398509481984.0; }  // 2^54
template <> __device__ __forceinline__ float up_scale<float>() { return 16777216.0f; }            // 2^24
template <typename T> __device__ __forceinline__ T big_limit();
template <> __device__ __forceinline__ double big_limit<double>() { return 4.49423283715579e+307; } // 2^1022
template <> __device__ __forceinline__ float big_limit<float>() { return 4.2535296e+37f; }          // 2^125

// Reciprocal of a normal x with |x| < big_limit, without branches: hardware
// approximation refined by Newton steps (within one ulp of 1/x).
__device__ __forceinline__ double fast_rcp(double x) {
    double y;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(y) : "d"(x));
    double e = fma(-x, y, 1.0);
    y = fma(y, e, y);
    e = fma(-x, y, 1.0);
    return fma(y, e, y);
}
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    float e = fmaf(-x, y, 1.0f);
    return fmaf(y, e, y);
}

// Multiplier scale for the pivot x: makes x * scale and its reciprocal normal.
template <typename T>
__device__ __forceinline__ T pivot_scale(T x) {
    const T ax = fabs(x);
    T s = (ax >= big_limit<T>()) ? T(1) / up_scale<T>() : T(1);
    return (ax < gpuqr_sfmin<T>()) ? up_scale<T>() : s;
}

// Order-preserving key of |x|: high and low 32 bits of its IEEE pattern.
// (integer pipe: the sign bit cleared, no floating-point fabs)
__device__ __forceinline__ unsigned key_hi(double x) { return (unsigned)__double2hiint(x) & 0x7fffffffu; }
__device__ __forceinline__ unsigned key_lo(double x) { return (unsigned)__double2loint(x); }
__device__ __forceinline__ unsigned key_hi(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ unsigned key_lo(float) { return 0u; }

// Finiteness on the integer pipe (exponent not all ones).
__device__ __forceinline__ bool finite_bits(double x) {
    return ((unsigned)__double2hiint(x) & 0x7ff00000u) != 0x7ff00000u;
}
__device__ __forceinline__ bool finite_bits(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

template <int SEG>
__device__ __forceinline__ unsigned seg_bits(unsigned ballot, int lane) {
    if constexpr (SEG == 32) return ballot;
    else return (ballot >> (lane & ~(SEG - 1))) & ((1u << SEG) - 1u);
}

// ---------------------------------------------------------------------------
// cp.async (sm_80+)
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}
// p, hidden from the optimizer: the copies' addresses are p plus
// compile-time offsets (immediates of the instructions) instead of each
// one's 64-bit address computed from the matrix and unit indices.
template <typename P>
__device__ __forceinline__ P *opaque_ptr(P *p) {
    asm volatile("" : "+l"(p));
    return p;
}

// cp_async16 to the shared-memory address saddr (smem_addr).
__device__ __forceinline__ void cp_async16_s(unsigned saddr, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(saddr), "l"(src) : "memory");
}
// cp_async16 of the first `bytes` (0 .. 16) of src, the rest of the 16 bytes
// of dst zero (cp.async's source size: nothing read past them).
__device__ __forceinline__ void cp_async16_zfill(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_elem(double *dst, const double *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_elem(float *dst, const float *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// A whole tile (MW matrices of order N, 16-byte rows) copied by 32 lanes in
// STEPS steps of 32 16-byte units: unit c = lane + 32 k is unit c % UNITS of
// tile row c / UNITS (the tile's rows are its matrices' rows one after the
// other, as in memory), so the lane's shared address is its first unit's
// plus k * SMEM_STEP and its global address its first unit's plus 512 k:
// compile-time offsets of the copies instead of each one's index arithmetic.
// Where UNITS divides 32 and 8 <= N <= 16 (ok); the other shapes take the
// loops (at N = 4 the addresses held cost a quarter of the vb kernel's warps).
template <typename T, int N>
struct Whole {
    typedef Layout<T, N> L;
    static constexpr bool ok = L::vec && N >= 8 && N <= 16 && 32 % L::units == 0
                               && (L::MW * N * L::units) % 32 == 0;
    static constexpr int UNITS = L::vec ? L::units : 1;
    static constexpr int STEPS = L::MW * N * UNITS / 32;
    static constexpr int SMEM_STEP = (32 / UNITS) * L::LD * (int)sizeof(T);   // bytes
    __device__ __forceinline__ static unsigned smem_off(int lane) {
        return (unsigned)(((lane / UNITS) * L::LD + (lane % UNITS) * L::VW) * (int)sizeof(T));
    }
};

// Issue the copy of nv matrices of size n (n <= N) from src (contiguous) into
// the tile t (row stride LD). vec: 16-byte chunks (n % VW == 0, aligned).
template <typename T, int N>
__device__ __forceinline__ void tile_load(T *t, const T *__restrict__ src, int nv, int n,
                                          bool vec, int lane) {
    typedef Layout<T, N> L;
    if constexpr (Whole<T, N>::ok) {
        if (vec && n == N && nv == L::MW) {             // a whole tile: Whole's addresses
            typedef Whole<T, N> W;
            asm volatile("" : "+r"(lane));              // recomputed per tile, not held
            const unsigned s0 = smem_addr(t) + W::smem_off(lane);
            const char *g = opaque_ptr(reinterpret_cast<const char *>(src) + 16 * lane);
#pragma unroll
            for (int k = 0; k < W::STEPS; ++k) cp_async16_s(s0 + k * W::SMEM_STEP, g + 512 * k);
            return;
        }
    }
    const int nn = n * n;
    const int total = nv * nn;
    if (L::vec && vec) {
        const int nch = total / L::VW;
#pragma unroll 1
        for (int c = lane; c < nch; c += 32) {
            const int e = c * L::VW;
            const int m = e / nn;
            const int rem = e - m * nn;
            const int i = rem / n;
            const int j = rem - i * n;
            cp_async16(t + (m * N + i) * L::LD + j, src + e);
        }
    } else {
#pragma unroll 1
        for (int e = lane; e < total; e += 32) {
            const int m = e / nn;
            const int rem = e - m * nn;
            const int i = rem / n;
            const int j = rem - i * n;
            cp_async_elem(t + (m * N + i) * L::LD + j, src + e);
        }
    }
}

// The tile t's nv matrices of size n read from CSR: blocks first ..
// first + nv - 1 of a (csr_blocks.cuh), a row per lane, written at once
// (the copy of tile_load, but synchronous: nothing is left in flight).
template <typename T, int N, typename I>
__device__ __forceinline__ void csr_tile_load(T *t, const gpuqr_csr::CsrBlocks<T, I> &a,
                                              long long first, int nv, int n, int lane) {
    typedef Layout<T, N> L;
    const int mm = lane / L::SEG;
    const int r = lane & (L::SEG - 1);
    if (mm < nv && r < n) {
        T *row = t + (mm * N + r) * L::LD;
        gpuqr_csr::block_row<T, N>(a, first + mm, n, r, [&](int j) -> T & { return row[j]; });
    }
}

// Coalesced copy of nv matrices of size n from the tile t to dst.
template <typename T, int N>
__device__ __forceinline__ void tile_store(T *__restrict__ dst, const T *t, int nv, int n,
                                           bool vec, int lane) {
    typedef Layout<T, N> L;
    typedef typename Vec<T>::type V;
    if constexpr (Whole<T, N>::ok) {
        if (vec && n == N && nv == L::MW) {             // a whole tile: Whole's addresses
            typedef Whole<T, N> W;
            asm volatile("" : "+r"(lane));              // recomputed per tile, not held
            const T *s0 = t + W::smem_off(lane) / sizeof(T);
            V *d = reinterpret_cast<V *>(dst) + lane;
#pragma unroll
            for (int k = 0; k < W::STEPS; ++k)
                d[32 * k] = *reinterpret_cast<const V *>(s0 + k * (W::SMEM_STEP / sizeof(T)));
            return;
        }
    }
    const int nn = n * n;
    const int total = nv * nn;
    if (L::vec && vec) {
        const int nch = total / L::VW;
#pragma unroll 1
        for (int c = lane; c < nch; c += 32) {
            const int e = c * L::VW;
            const int m = e / nn;
            const int rem = e - m * nn;
            const int i = rem / n;
            const int j = rem - i * n;
            reinterpret_cast<V *>(dst)[c] =
                *reinterpret_cast<const V *>(t + (m * N + i) * L::LD + j);
        }
    } else {
#pragma unroll 1
        for (int e = lane; e < total; e += 32) {
            const int m = e / nn;
            const int rem = e - m * nn;
            const int i = rem / n;
            const int j = rem - i * n;
            dst[e] = t[(m * N + i) * L::LD + j];
        }
    }
}

// Row `row` (N registers) <-> the tile row at element offset off.
template <typename T, int N>
__device__ __forceinline__ void row_read(T (&row)[N], const T *t) {
    typedef Layout<T, N> L;
    typedef typename Vec<T>::type V;
    if (L::vec) {
#pragma unroll
        for (int q = 0; q < N / L::VW; ++q) {
            union { V v; T s[L::VW]; } u;
            u.v = reinterpret_cast<const V *>(t)[q];
#pragma unroll
            for (int s = 0; s < L::VW; ++s) row[q * L::VW + s] = u.s[s];
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) row[j] = t[j];
    }
}
template <typename T, int N>
__device__ __forceinline__ void row_write(T *t, const T (&row)[N]) {
    typedef Layout<T, N> L;
    typedef typename Vec<T>::type V;
    if (L::vec) {
#pragma unroll
        for (int q = 0; q < N / L::VW; ++q) {
            union { V v; T s[L::VW]; } u;
#pragma unroll
            for (int s = 0; s < L::VW; ++s) u.s[s] = row[q * L::VW + s];
            reinterpret_cast<V *>(t)[q] = u.v;
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) t[j] = row[j];
    }
}

// The pivot lane writes row[from..N) (whole 16-byte chunks) to buf.
template <typename T, int N>
__device__ __forceinline__ void bcast_row(T *buf, const T (&row)[N], int from) {
    typedef typename Vec<T>::type V;
    constexpr int VW = Vec<T>::width;
#pragma unroll
    for (int q = 0; q < (N + VW - 1) / VW; ++q) {
        if ((q + 1) * VW > from) {
            union { V v; T s[VW]; } u;
#pragma unroll
            for (int s = 0; s < VW; ++s) u.s[s] = (q * VW + s < N) ? row[(q * VW + s < N) ? q * VW + s : 0] : T(0);
            reinterpret_cast<V *>(buf)[q] = u.v;
        }
    }
}

// Segment-wide maximum / minimum of a 32-bit value (every lane of the warp
// takes part: one REDUX for a whole-warp segment, else a butterfly of
// shuffles that stays inside the aligned segment).
template <int SEG>
__device__ __forceinline__ unsigned seg_max(unsigned v) {
    if constexpr (SEG == 32) {
        return __reduce_max_sync(0xffffffffu, v);
    } else {
#pragma unroll
        for (int o = SEG / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    }
}
template <int SEG>
__device__ __forceinline__ unsigned seg_min(unsigned v) {
    if constexpr (SEG == 32) {
        return __reduce_min_sync(0xffffffffu, v);
    } else {
#pragma unroll
        for (int o = SEG / 2; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
        return v;
    }
}

// Pivot choice of one column, in two halves so that the caller can overlap
// the first with independent work. Every lane of the warp must call both.
//   start: candidates publish the high key; returns the ballot of lanes whose
//          high key is their segment's maximum.
//   finish: when that ballot does not name exactly one lane in some segment
//          (ties in the high 32 bits, or no candidate), breaks ties by the
//          low key and then by the smallest current position (LAPACK i?amax
//          takes the first); returns the warp lane of the pivot of the
//          caller's segment (or a lane outside it when it has no candidate).
template <int SEG>
__device__ __forceinline__ unsigned pivot_start(bool cand, unsigned hi) {
    const unsigned mh = seg_max<SEG>(cand ? hi : 0u);
    return __ballot_sync(0xffffffffu, cand && hi == mh);
}

template <int SEG>
__device__ __forceinline__ int pivot_finish(unsigned ballot, bool cand, unsigned lo, int pos, int lane) {
    unsigned b = seg_bits<SEG>(ballot, lane);
    bool ties;
    if constexpr (SEG == 32) ties = __popc(b) != 1;          // uniform already
    else ties = __any_sync(0xffffffffu, __popc(b) != 1);
    if (ties) {
        const bool c1 = cand && ((ballot >> lane) & 1u);
        const unsigned ml = seg_max<SEG>(c1 ? lo : 0u);
        const bool c2 = c1 && lo == ml;
        const unsigned mp = seg_min<SEG>(c2 ? (unsigned)pos : 0xffffffffu);
        const bool c3 = c2 && (unsigned)pos == mp;
        b = seg_bits<SEG>(__ballot_sync(0xffffffffu, c3), lane);
    }
    return (lane & ~(SEG - 1)) + __ffs(b) - 1;
}

}  // namespace gpuqr_warp

namespace gpuqr_warp {

// The right-hand sides of a fused solve (gesv_warp, gesv_mma): matrix m's
// nrhs columns start at b + m * bstride (bstride 0: one b for every matrix),
// row-major (n, nrhs); its solution goes to x + m * n * nrhs. status, ctl:
// the solve's report (status.cuh): an inf or NaN in b marks slot 3; with
// CTL_NAN_FILL a matrix whose stored info is > 0 gets an all-NaN solution.
template <typename T>
struct GesvArgs {
    const T *b;
    T *x;
    int nrhs;
    long long bstride;
    unsigned long long *status;
    unsigned long long ctl;
};

// The triangular solves of one right-hand side column with LU factors held a
// row per lane: the lane of LAPACK row pos holds that row's L (columns < pos)
// and U (columns >= pos) entries in lu(j) (j a compile-time index), its
// diagonal's reciprocal rd and diagonal d, and starts with s = b[r], the
// entry of its original row r ((P b)[pos] = b[r]: lazy swaps). at(j): the
// warp lane holding LAPACK row j. Forward (unit L), then backward (U); each
// step's finished entry reaches the other rows by one shuffle. Returns x[pos].
// Every lane of the warp must call it (inactive lanes with any values).
template <typename T, int N, typename Lu, typename At>
__device__ __forceinline__ T lu_solve_rows(T s, int pos, T d, T rd, Lu lu, At at) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const T yj = __shfl_sync(0xffffffffu, s, at(j));
        if (pos > j) s = fma(-lu(j), yj, s);
    }
#pragma unroll
    for (int j = N - 1; j >= 0; --j) {
        if (pos == j) {                       // s / d: the reciprocal and one correction
            const T q = s * rd;
            s = fma(fma(-q, d, s), rd, q);
        }
        const T xj = __shfl_sync(0xffffffffu, s, at(j));
        if (pos < j) s = fma(-lu(j), xj, s);
    }
    return s;
}

// Grid-stride loop of a warp over tiles of MW = 32 / SEG matrices held a
// row per lane in registers (the solves of solve_warp.cu): per tile,
// body(m, active, r, base) with m the lane's matrix, active (m < batch and
// r < N), r its row and base its segment's first lane. Every lane of the
// warp calls body (shuffles inside it stay legal).
template <int N, typename Body>
__device__ __forceinline__ void warp_row_tasks(long long batch, Body body) {
    constexpr int SEG = Seg<N>::value;
    constexpr int MW = 32 / SEG;
    const int lane = threadIdx.x & 31;
    const int r = lane & (SEG - 1);
    const int base = lane & ~(SEG - 1);
    const int mloc = lane / SEG;
    const long long ntask = (batch + MW - 1) / MW;
    const long long stride = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long task = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
         task < ntask; task += stride) {
        const long long m = task * MW + mloc;
        body(m, m < batch && r < N, r, base);
    }
}

// The warp's order_copy slots (stages * MW 8-byte entries): after every
// warp's broadcast buffers and tiles in the block's dynamic shared memory,
// from the next 8-byte boundary (warp_smem_bytes(..., vb=True) in
// scipy_gpuqr/batched/_gpu.py adds them to the launch's shared memory).
template <typename T, int N>
__device__ __forceinline__ unsigned long long *order_slots(unsigned char *smem, int nwb,
                                                          int stages, int wib) {
    typedef Layout<T, N> L;
    const size_t off = (size_t)nwb * (2 * L::MW * L::NBUF + stages * L::TILE) * sizeof(T);
    return reinterpret_cast<unsigned long long *>(smem + ((off + 7) & ~(size_t)7))
           + wib * stages * L::MW;
}

// The size entries of a tile's matrices (padded stacks with per-matrix
// orders, order_raw of batched.cuh) into the warp's shared slots of that
// tile: lane l < nv copies matrix first + l's entry (szw bytes) into slot l
// (8 bytes each) by cp.async, in the copy group of the tile itself, so that
// the wait for the tile's copy covers them and no register waits on a
// global load through the tile's work.
__device__ __forceinline__ void order_copy(unsigned long long *slots, const void *sizes, int szw,
                                           long long first, int nv, int lane) {
    if (lane < nv) {
        const char *src = reinterpret_cast<const char *>(sizes) + (first + lane) * szw;
        if (szw == 8)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n"
                         :: "r"(smem_addr(slots + lane)), "l"(src) : "memory");
        else
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
                         :: "r"(smem_addr(slots + lane)), "l"(src) : "memory");
    }
}

// The order of matrix mm of a tile whose size entries order_copy put in
// slots (after the wait for the tile's copy and a __syncwarp), checked
// (order_check: -1 for a bad size).
__device__ __forceinline__ int slot_order(const unsigned long long *slots, int szw, int mm, int n,
                                          unsigned long long *status, unsigned long long ctl) {
    const long long k = szw == 8 ? reinterpret_cast<const long long *>(slots)[mm]
                                 : (long long)reinterpret_cast<const int *>(slots + mm)[0];
    return order_check(k, n, status, ctl);
}

// The tile's matrices (order n, row stride LD) with rows and columns from
// each one's order on set to the identity, all NaN for a bad size; k: the
// order of the lane's matrix (slot_order). A row per lane (the kernels whose
// proc reads the tile itself; the others mask in registers).
template <typename T, int N>
__device__ __forceinline__ void tile_mask(T *t, int k, int nv, int n, int lane) {
    typedef Layout<T, N> L;
    const int mm = lane / L::SEG;
    const int r = lane & (L::SEG - 1);
    if (mm < nv && r < n && k != n) {
        T *row = t + (mm * N + r) * L::LD;
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (j < n) row[j] = order_masked(row[j], r, j, k);
    }
    __syncwarp();
}

// Grid-stride loop of a warp over its tiles: copy in (one tile ahead when
// stages == 2), proc(tile, first matrix, number of matrices, the order of
// the lane's matrix; n without sizes), copy out (none when out is null: the
// fused solves keep only their solutions). VB: per-matrix orders (sizes,
// szw; without VB they are not looked at and proc gets n): each tile's size
// entries travel with its copy into `slots` (stages * MW 8-byte slots of the
// warp, order_copy) and are checked once the copy has landed (slot_order);
// MASK: tile_mask before proc (procs that read the tile rather than a row
// per lane in registers). Shared memory of the warp: stages tiles starting
// at `tiles`. csr: a CSR matrix's diagonal blocks (csr_blocks.cuh) read by
// csr_tile_load instead of the stack a (NoCsr: a).
template <typename T, int N, bool VB, bool MASK, typename Proc,
          typename Csr = gpuqr_csr::NoCsr>
__device__ __forceinline__ void run_tiles(const T *__restrict__ a, T *__restrict__ out,
                                          long long batch, int n, int stages, bool vec,
                                          T *tiles, unsigned long long *slots,
                                          const void *sizes, int szw,
                                          unsigned long long *status, unsigned long long ctl,
                                          Proc proc, const Csr &csr = Csr()) {
    constexpr bool CSR = gpuqr_csr::IsCsr<Csr>::value;
    typedef Layout<T, N> L;
    const int lane = threadIdx.x & 31;
    const long long ntask = (batch + L::MW - 1) / L::MW;
    const long long stride = (long long)gridDim.x * (blockDim.x >> 5);
    long long task = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long nn = (long long)n * n;
    const bool vb = VB && sizes != nullptr;
    int cur = 0;
    if (task < ntask && stages == 2) {
        const long long f = task * L::MW;
        if constexpr (CSR)
            csr_tile_load<T, N>(tiles, csr, f, (int)min((long long)L::MW, batch - f), n, lane);
        else
            tile_load<T, N>(tiles, a + f * nn, (int)min((long long)L::MW, batch - f), n, vec,
                            lane);
        if constexpr (VB) {
            if (vb) order_copy(slots, sizes, szw, f, (int)min((long long)L::MW, batch - f), lane);
        }
        cp_async_commit();
    }
    for (; task < ntask; task += stride) {
        const long long first = task * L::MW;
        const int nv = (int)min((long long)L::MW, batch - first);
        T *t = tiles + cur * L::TILE;
        if (stages == 2) {
            const long long next = task + stride;
            if (next < ntask) {
                const long long f = next * L::MW;
                if constexpr (CSR)
                    csr_tile_load<T, N>(tiles + (cur ^ 1) * L::TILE, csr, f,
                                        (int)min((long long)L::MW, batch - f), n, lane);
                else
                    tile_load<T, N>(tiles + (cur ^ 1) * L::TILE, a + f * nn,
                                    (int)min((long long)L::MW, batch - f), n, vec, lane);
                if constexpr (VB) {
                    if (vb) order_copy(slots + (cur ^ 1) * L::MW, sizes, szw, f,
                                       (int)min((long long)L::MW, batch - f), lane);
                }
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        } else {
            if constexpr (CSR) csr_tile_load<T, N>(t, csr, first, nv, n, lane);
            else tile_load<T, N>(t, a + first * nn, nv, n, vec, lane);
            if constexpr (VB) {
                if (vb) order_copy(slots, sizes, szw, first, nv, lane);
            }
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncwarp();
        if constexpr (VB) {
            const int mm = lane / L::SEG;
            const int nk = (vb && mm < nv)
                               ? slot_order(slots + cur * L::MW, szw, mm, n, status, ctl) : n;
            if constexpr (MASK) tile_mask<T, N>(t, nk, nv, n, lane);
            proc(t, first, nv, nk);
        } else {
            proc(t, first, nv, n);
        }
        __syncwarp();
        if (out != nullptr) tile_store<T, N>(out + first * nn, t, nv, n, vec, lane);
        __syncwarp();
        if (stages == 2) cur ^= 1;
    }
}

}  // namespace gpuqr_warp
