// Whether a front pool holds a value that is not finite (NaN or +-Inf), in one launch.
//
// The factorization checks every stage's pool before its R is used; done with
// generic array operations that check takes a boolean temporary per chunk, a
// reduction per chunk and one over the chunks, and compiles three or four kernels
// on a process's first call. Here a grid-stride loop reads the pool once, each
// block combines its threads' findings (__syncthreads_or) and one thread of a
// block that found one sets *flag to 1; the caller zeroes *flag before the launch
// (stream order) and reads it after. Blocks never write anything else, so the
// launch is idempotent and needs no temporary. Host side:
// scipy_gpuqr/_engine/gpu/finite_check.py.

namespace gpuqr {

template <typename T>
__global__ void __launch_bounds__(256)
nonfinite_flag(const T* __restrict__ x, long long n, int* __restrict__ flag) {
    int bad = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n && !bad;
         i += stride) {
        const T v = x[i];
        bad = !isfinite(v);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace gpuqr
