// Small array operations of a GPU call's host-side glue, as plain kernels.
//
// The dense fronts' compact-WY factors, their Q application, R's triangular
// solves through cuBLAS for large fronts, R's copy to the host, the full-rank
// probe and the null-space rank decision need a handful of array operations
// (strided copies, triangles, row gathers and scatters, column norms and maxima).
// Done with CuPy's generic array functions, each compiles one or more kernels the
// first time a process uses it, on the call's own thread; here they are one module, compiled with the engine's other
// modules on a worker thread before the call needs it. Every operation computes
// element by element what the generic functions did (the same IEEE operation per
// element: copies, one multiply and one add, one subtract, one divide), except the
// column norms (a sum of squares in another order; the maxima are exact). Host side:
// scipy_gpuqr/_engine/gpu/array_ops.py. Kernels are extern "C" (no templates to
// name): suffix _f64 / _f32 for double / float values, _i64 / _i32 for the index type.

namespace gpuqr_ops {

typedef long long ll;

__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }

// dst[r, c] = src[r, c] (mode 0) or dst[r, c] -= src[r, c] (mode 1), element strides.
template <typename D, typename S>
__device__ void ew2d(D* __restrict__ dst, ll drs, ll dcs, const S* __restrict__ src, ll srs,
                     ll scs, ll rows, ll cols, int mode) {
    const ll n = rows * cols;
    const ll stride = (ll)gridDim.x * blockDim.x;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const ll r = e / cols, c = e - r * cols;
        const D v = (D)src[r * srs + c * scs];
        D* d = dst + r * drs + c * dcs;
        *d = mode ? sub_rn(*d, v) : v;
    }
}

// dst = a triangle of src. mode bit 0: lower (else upper); bit 1: src's own diagonal
// (tril(src) / triu(src)), else a unit diagonal (tril(src, -1) / triu(src, 1) with
// ones on it); zeros on the other side.
template <typename T>
__device__ void unit_tri(T* __restrict__ dst, ll drs, ll dcs, const T* __restrict__ src,
                         ll srs, ll scs, ll rows, ll cols, int mode) {
    const ll n = rows * cols;
    const ll stride = (ll)gridDim.x * blockDim.x;
    const bool lower = mode & 1, own_diag = mode & 2;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const ll r = e / cols, c = e - r * cols;
        const bool keep = (lower ? (r > c) : (c > r)) || (own_diag && r == c);
        dst[r * drs + c * dcs] = keep ? src[r * srs + c * scs] : (r == c ? T(1) : T(0));
    }
}

// The compact-WY system of b reflectors from G = V^T V (b x b, row-major) and tau:
// M = triu(G, 1) * tau[None, :] + I (row-major b x b, the product and the sum rounded
// as two operations) and D = diag(tau) (b x b).
template <typename T>
__device__ void wy_system(const T* __restrict__ G, const T* __restrict__ tau, ll b,
                          T* __restrict__ M, T* __restrict__ D) {
    const ll n = b * b;
    const ll stride = (ll)gridDim.x * blockDim.x;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const ll i = e / b, j = e - i * b;
        const T g = j > i ? G[e] : T(0);
        M[e] = add_rn(mul_rn(g, tau[j]), i == j ? T(1) : T(0));
        D[e] = i == j ? tau[i] : T(0);
    }
}

// out[r, c] = src[idx[r] * k + c] (rows of a row-major n x k array), out with strides.
template <typename T, typename I>
__device__ void gather_rows(T* __restrict__ out, ll ors, ll ocs, const T* __restrict__ src,
                            ll k, const I* __restrict__ idx, ll nrows) {
    const ll n = nrows * k;
    const ll stride = (ll)gridDim.x * blockDim.x;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const ll r = e / k, c = e - r * k;
        out[r * ors + c * ocs] = src[(ll)idx[r] * k + c];
    }
}

// dst[idx[r] * k + c] = src[r, c] (mode 0) or -= src[r, c] (mode 1); idx distinct.
template <typename T, typename I>
__device__ void scatter_rows(T* __restrict__ dst, ll k, const I* __restrict__ idx,
                             const T* __restrict__ src, ll srs, ll scs, ll nrows, int mode) {
    const ll n = nrows * k;
    const ll stride = (ll)gridDim.x * blockDim.x;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const ll r = e / k, c = e - r * k;
        const T v = src[r * srs + c * scs];
        T* d = dst + (ll)idx[r] * k + c;
        *d = mode ? sub_rn(*d, v) : v;
    }
}

// One block per column c of Y (q x p, row-major): norms[c] = sqrt(sum of squares),
// bad[c] = 1 when the column holds a NaN or an infinity, else 0. 256 threads.
template <typename T>
__device__ void column_norms(const T* __restrict__ Y, ll q, ll p, T* __restrict__ norms,
                             int* __restrict__ bad) {
    __shared__ T part[8];
    const ll c = blockIdx.x;
    T s = T(0);
    int nf = 0;
    for (ll i = threadIdx.x; i < q; i += blockDim.x) {
        const T v = Y[i * p + c];
        nf |= !isfinite(v);
        s += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = s;
    nf = __syncthreads_or(nf);
    if (threadIdx.x == 0) {
        T t = T(0);
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += part[w];
        norms[c] = sqrt(t);
        bad[c] = nf;
    }
}

__device__ __forceinline__ double abs_max(double a, double b) { return fmax(a, fabs(b)); }
__device__ __forceinline__ float abs_max(float a, float b) { return fmaxf(a, fabsf(b)); }

// One block per column c of Y (q x p, row-major): amax[c] = the largest |Y[i, c]| of
// its finite values (0 for none), bad[c] = 1 when the column holds a NaN or an
// infinity, else 0. 256 threads. (A maximum is exact: any order gives the same.)
template <typename T>
__device__ void column_absmax(const T* __restrict__ Y, ll q, ll p, T* __restrict__ amax,
                              int* __restrict__ bad) {
    __shared__ T part[8];
    const ll c = blockIdx.x;
    T s = T(0);
    int nf = 0;
    for (ll i = threadIdx.x; i < q; i += blockDim.x) {
        const T v = Y[i * p + c];
        const bool fin = isfinite(v);
        nf |= !fin;
        if (fin) s = abs_max(s, v);
    }
    for (int o = 16; o > 0; o >>= 1) s = abs_max(s, __shfl_down_sync(0xffffffffu, s, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = s;
    nf = __syncthreads_or(nf);
    if (threadIdx.x == 0) {
        T t = T(0);
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t = abs_max(t, part[w]);
        amax[c] = t;
        bad[c] = nf;
    }
}

// out[i, c] = Y[i, c] / d[c] (Y, out row-major q x p; out may be Y).
template <typename T>
__device__ void divide_columns(T* out, const T* Y, ll q, ll p, const T* __restrict__ d) {
    const ll n = q * p;
    const ll stride = (ll)gridDim.x * blockDim.x;
    for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        out[e] = Y[e] / d[e % p];
}

// Philox-4x32-10 (counter-based: the numbers of pair k depend on k and the key
// alone, whatever the launch shape).
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int r = 0; r < 10; ++r) {
        const unsigned hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}

// out[0 .. n) = standard normal numbers: pair k = (out[2k], out[2k+1]) by Box-Muller
// from the two 53-bit uniforms of Philox-4x32-10 at counter (k, 0) under the key
// `seed`, u1 in (0, 1] (the radius), u2 in [0, 1) (the angle).
__device__ void normal_block(double* __restrict__ out, ll n, unsigned long long seed) {
    const ll pairs = (n + 1) / 2;
    const ll stride = (ll)gridDim.x * blockDim.x;
    const uint2 key = make_uint2((unsigned)seed, (unsigned)(seed >> 32));
    for (ll k = (ll)blockIdx.x * blockDim.x + threadIdx.x; k < pairs; k += stride) {
        const uint4 x = philox4x32_10(
            make_uint4((unsigned)k, (unsigned)((unsigned long long)k >> 32), 0u, 0u), key);
        const double two53 = 9007199254740992.0;
        const double u1 = 1.0 - ((double)(x.x >> 5) * 67108864.0 + (double)(x.y >> 6)) / two53;
        const double u2 = ((double)(x.z >> 5) * 67108864.0 + (double)(x.w >> 6)) / two53;
        const double r = sqrt(-2.0 * log(u1));
        double s, c;
        sincospi(2.0 * u2, &s, &c);
        out[2 * k] = r * c;
        if (2 * k + 1 < n) out[2 * k + 1] = r * s;
    }
}

// R's product with a block from R's front blocks (the rows the triangular solves
// read: front f's rows are the first rk rows of its factorized front, row-major with
// leading dimension fn at `off`, [U | S] over the front's columns cf = cols[c0 ..);
// entries below U's diagonal hold Householder data and are never read). `desc` holds
// 5 int64 per chunk of at most RMUL_ROWS rows of one front: off, fn, rk, c0, row0.
// X and Y are n x k row-major; blockIdx.y is the column j.
constexpr int RMUL_ROWS = 64;

// This thread block's chunk (blockIdx.x) and column (blockIdx.y).
template <typename T>
struct RmulChunk {
    const T* F;
    const ll* cf;
    ll fn, row0, row1, j;
    __device__ RmulChunk(const ll* desc, const T* pool, const ll* cols) {
        const ll* d = desc + 5 * (ll)blockIdx.x;
        F = pool + d[0];
        fn = d[1];
        cf = cols + d[3];
        row0 = d[4];
        row1 = min(d[2], row0 + RMUL_ROWS);
        j = blockIdx.y;
    }
};

// Y[cf[i], j] = sum_{t >= i} F[i, t] X[cf[t], j] for the chunk's rows i: a warp per
// row (rows of R are distinct pivot columns: plain stores).
template <typename T>
__device__ void rmul_upper(const ll* __restrict__ desc, const T* __restrict__ pool,
                           const ll* __restrict__ cols, const double* __restrict__ X,
                           double* __restrict__ Y, ll k) {
    const RmulChunk<T> c(desc, pool, cols);
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (ll i = c.row0 + (threadIdx.x >> 5); i < c.row1; i += warps) {
        double s = 0.0;
        for (ll t = i + lane; t < c.fn; t += 32)
            s += (double)c.F[i * c.fn + t] * X[c.cf[t] * k + c.j];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) Y[c.cf[i] * k + c.j] = s;
    }
}

// Y[cf[t], j] += sum_{i <= t, i in chunk} F[i, t] X[cf[i], j]: a thread per column t
// (several fronts' chunks add into one column: atomic adds into a zeroed Y).
template <typename T>
__device__ void rmul_trans(const ll* __restrict__ desc, const T* __restrict__ pool,
                           const ll* __restrict__ cols, const double* __restrict__ X,
                           double* __restrict__ Y, ll k) {
    const RmulChunk<T> c(desc, pool, cols);
    for (ll t = c.row0 + threadIdx.x; t < c.fn; t += blockDim.x) {
        const ll last = min(c.row1 - 1, t);
        double s = 0.0;
        for (ll i = c.row0; i <= last; ++i)
            s += (double)c.F[i * c.fn + t] * X[c.cf[i] * k + c.j];
        atomicAdd(&Y[c.cf[t] * k + c.j], s);
    }
}

}  // namespace gpuqr_ops

using gpuqr_ops::ll;

#define OPS_RMUL(SUF, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) rmul_upper_##SUF(                   \
        const ll* desc, const T* pool, const ll* cols, const double* X, double* Y, ll k) {  \
        gpuqr_ops::rmul_upper<T>(desc, pool, cols, X, Y, k);                              \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) rmul_trans_##SUF(                   \
        const ll* desc, const T* pool, const ll* cols, const double* X, double* Y, ll k) {  \
        gpuqr_ops::rmul_trans<T>(desc, pool, cols, X, Y, k);                              \
    }
OPS_RMUL(f64, double)
OPS_RMUL(f32, float)

extern "C" __global__ void __launch_bounds__(256) normal_block_f64(
    double* out, ll n, unsigned long long seed) {
    gpuqr_ops::normal_block(out, n, seed);
}

#define OPS_EW2D(SUF, D, S)                                                               \
    extern "C" __global__ void __launch_bounds__(256) ew2d_##SUF(                         \
        D* dst, ll drs, ll dcs, const S* src, ll srs, ll scs, ll rows, ll cols, int mode) { \
        gpuqr_ops::ew2d<D, S>(dst, drs, dcs, src, srs, scs, rows, cols, mode);            \
    }
OPS_EW2D(f64_f64, double, double)
OPS_EW2D(f32_f32, float, float)
OPS_EW2D(f64_f32, double, float)

#define OPS_VALUE(SUF, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) unit_tri_##SUF(                     \
        T* dst, ll drs, ll dcs, const T* src, ll srs, ll scs, ll rows, ll cols, int mode) { \
        gpuqr_ops::unit_tri<T>(dst, drs, dcs, src, srs, scs, rows, cols, mode);           \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) wy_system_##SUF(                    \
        const T* G, const T* tau, ll b, T* M, T* D) {                                     \
        gpuqr_ops::wy_system<T>(G, tau, b, M, D);                                         \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) column_norms_##SUF(                 \
        const T* Y, ll q, ll p, T* norms, int* bad) {                                     \
        gpuqr_ops::column_norms<T>(Y, q, p, norms, bad);                                  \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) column_absmax_##SUF(                \
        const T* Y, ll q, ll p, T* amax, int* bad) {                                      \
        gpuqr_ops::column_absmax<T>(Y, q, p, amax, bad);                                  \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) divide_columns_##SUF(               \
        T* out, const T* Y, ll q, ll p, const T* d) {                                     \
        gpuqr_ops::divide_columns<T>(out, Y, q, p, d);                                    \
    }
OPS_VALUE(f64, double)
OPS_VALUE(f32, float)

#define OPS_INDEX(SUF, T, I)                                                              \
    extern "C" __global__ void __launch_bounds__(256) gather_rows_##SUF(                  \
        T* out, ll ors, ll ocs, const T* src, ll k, const I* idx, ll nrows) {             \
        gpuqr_ops::gather_rows<T, I>(out, ors, ocs, src, k, idx, nrows);                  \
    }                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) scatter_rows_##SUF(                 \
        T* dst, ll k, const I* idx, const T* src, ll srs, ll scs, ll nrows, int mode) {   \
        gpuqr_ops::scatter_rows<T, I>(dst, k, idx, src, srs, scs, nrows, mode);           \
    }
OPS_INDEX(f64_i64, double, long long)
OPS_INDEX(f64_i32, double, int)
OPS_INDEX(f32_i64, float, long long)
OPS_INDEX(f32_i32, float, int)
