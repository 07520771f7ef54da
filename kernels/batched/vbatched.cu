// vbatched.cu: gathering the matrices (or right-hand sides, pivots) of one
// size class of a variable-size batch into a padded stack, and scattering a
// stack's results back (scipy_gpuqr/batched/_vbatched.py), and counting a
// padded stack's size classes. A thread per element of the stack; per item k its layout in the flat buffer is
// off[k] + r * stride[k] + c for r < rows[k], c < cols[k].
//
// pad: what lies outside an item's rows x cols: 0 zeros, 1 the identity
// (1 where r == c), 2 the row index r (pivots of the padded rows).
#include "common.cuh"

namespace gpuqr_vb {

template <typename T>
__device__ __forceinline__ T pad_value(int pad, long long r, long long c) {
    return pad == 1 ? T(r == c ? 1 : 0) : pad == 2 ? T(r) : T(0);
}

}  // namespace gpuqr_vb

// ---------------------------------------------------------------------------
// stack (count, nr, nc) <- items idx[0 .. count) of flat (idx null: 0 .. count),
// padded with `pad`.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void vb_gather(const T *__restrict__ flat, const long long *__restrict__ off,
                          const long long *__restrict__ rows, const long long *__restrict__ cols,
                          const long long *__restrict__ stride,
                          const long long *__restrict__ idx, long long count,
                          T *__restrict__ stack, int nr, int nc, int pad)
{
    const long long per = (long long)nr * nc;
    const long long total = count * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / per;
        const long long rc = e - i * per;
        const long long r = rc / nc, c = rc - r * nc;
        const long long k = idx != nullptr ? idx[i] : i;
        stack[e] = (r < rows[k] && c < cols[k]) ? flat[off[k] + r * stride[k] + c]
                                                : gpuqr_vb::pad_value<T>(pad, r, c);
    }
}

// ---------------------------------------------------------------------------
// Items idx[0 .. count) of out <- stack (count, nr, nc). Each item's whole
// region is written: rows x cols from the stack, and for a padded output form
// (prows, pcols > 0: every item's region is prows x pcols) the rest with `pad`.
// ---------------------------------------------------------------------------
template <typename T>
__global__ void vb_scatter(T *__restrict__ out, const long long *__restrict__ off,
                           const long long *__restrict__ rows, const long long *__restrict__ cols,
                           const long long *__restrict__ stride,
                           const long long *__restrict__ idx, long long count,
                           const T *__restrict__ stack, int nr, int nc, int prows, int pcols,
                           int pad)
{
    const int er = prows > 0 ? prows : nr;
    const int ec = pcols > 0 ? pcols : nc;
    const long long per = (long long)er * ec;
    const long long total = count * per;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / per;
        const long long rc = e - i * per;
        const long long r = rc / ec, c = rc - r * ec;
        const long long k = idx != nullptr ? idx[i] : i;
        const bool in = r < rows[k] && c < cols[k];
        if (in) {
            out[off[k] + r * stride[k] + c] = stack[(i * nr + r) * nc + c];
        } else if (prows > 0) {
            out[off[k] + r * stride[k] + c] = gpuqr_vb::pad_value<T>(pad, r, c);
        }
    }
}

// ---------------------------------------------------------------------------
// The size classes of a padded stack's orders (SIZE_CLASSES of _vbatched.py:
// 1..8, then multiples of 4 to 32, of 8 to 64, of 16 to 128, of 32 to 256,
// of 64 to 512, of 128 beyond). For each of the `batch` orders n in sizes:
// cls[k] = its class (0 when n lies outside [0, big_n]), counts[class] += 1,
// counts[lim] += 1 when n is outside [0, big_n], counts[lim + 1] += 1 when
// n == big_n. counts (lim + 2 entries, lim > the largest class) zeroed
// beforehand; one atomic per distinct value per warp.
// ---------------------------------------------------------------------------
__device__ __forceinline__ long long vb_size_class(long long n) {
    const long long q = n <= 8 ? 1 : n <= 32 ? 4 : n <= 64 ? 8 : n <= 128 ? 16 :
                        n <= 256 ? 32 : n <= 512 ? 64 : 128;
    return n <= 0 ? 1 : (n + q - 1) / q * q;
}

__global__ void vb_classes(const long long *__restrict__ sizes, long long batch,
                           long long big_n, int lim, int *__restrict__ cls,
                           unsigned long long *__restrict__ counts)
{
    const int lane = threadIdx.x & 31;
    for (long long k0 = (long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31u);
         k0 < batch; k0 += (long long)gridDim.x * blockDim.x) {
        // whole warps iterate together (k0: the warp's first index)
        const long long k = k0 + lane;
        const bool in = k < batch;
        const long long n = in ? sizes[k] : 0;
        const bool ok = n >= 0 && n <= big_n;
        const int c = !in ? -1 : ok ? (int)vb_size_class(n) : lim;
        if (in) cls[k] = ok ? c : 0;
        const unsigned peers = __match_any_sync(0xffffffffu, c);
        if (c >= 0 && lane == __ffs(peers) - 1) atomicAdd(counts + c, (unsigned long long)__popc(peers));
        const unsigned full = __ballot_sync(0xffffffffu, in && n == big_n);
        if (lane == 0 && full) atomicAdd(counts + lim + 1, (unsigned long long)__popc(full));
    }
}
