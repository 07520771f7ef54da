// vbatched.cu: gathering the matrices (or right-hand sides, pivots) of one
// size class of a variable-size batch into a padded stack, and scattering a
// stack's results back (scipy_gpuqr/batched/_vbatched.py). A thread per
// element of the stack; per item k its layout in the flat buffer is
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
