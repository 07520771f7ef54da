// Vector operations of the device LSQR/LSMR (scipy_gpuqr/_iterative/_common.py,
// CupyOps): fused updates and sums of squares over contiguous float64 vectors
// of length n, compiled with the package's other kernels (one module, in the
// kernel cache that build_kernels.py fills) instead of as CuPy elementwise
// and reduction kernels compiled at a first call.
//
// The sum of squares is deterministic: every block sums a fixed grid-stride
// share of x in a fixed order and writes its partial; the last block to finish
// (a ticket counter, reset by it for the next call) adds the partials in block
// order. The grid size is the caller's and fixed for a given n.

#include "common.cuh"

#define VO_THREADS 256

// out[0] = x·x; partial holds gridDim.x doubles, ticket one zeroed unsigned int.
extern "C" __global__ void __launch_bounds__(VO_THREADS)
gpuqr_sumsq(const double* __restrict__ x, long long n, double* __restrict__ partial,
            unsigned int* ticket, double* __restrict__ out) {
    __shared__ double red[VO_THREADS / 32];
    __shared__ bool last;
    double s = 0;
    for (long long i = (long long)blockIdx.x * VO_THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * VO_THREADS)
        s += x[i] * x[i];
    s = gpuqr::block_sum<double, VO_THREADS>(s, red);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = s;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double t = 0;
    for (unsigned int b = threadIdx.x; b < gridDim.x; b += VO_THREADS)
        t += ((volatile double*)partial)[b];
    t = gpuqr::block_sum<double, VO_THREADS>(t, red);
    if (threadIdx.x == 0) {
        out[0] = t;
        *ticket = 0u;
    }
}

#define VO_LOOP(n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

// t -= alpha u
extern "C" __global__ void gpuqr_axmy(const double* __restrict__ u, double alpha,
                                      double* __restrict__ t, long long n) {
    VO_LOOP(n) t[i] = t[i] - alpha * u[i];
}

// t *= 1/sqrt(s[0]) where s[0] > 0
extern "C" __global__ void gpuqr_scale_inv_root(const double* __restrict__ s,
                                                double* __restrict__ t, long long n) {
    const double ss = s[0];
    if (!(ss > 0)) return;
    const double k = 1.0 / sqrt(ss);
    VO_LOOP(n) t[i] = t[i] * k;
}

// c -= sqrt(s[0]) v
extern "C" __global__ void gpuqr_sub_root_scaled(const double* __restrict__ v,
                                                 const double* __restrict__ s,
                                                 double* __restrict__ c, long long n) {
    const double r = sqrt(s[0]);
    VO_LOOP(n) c[i] = c[i] - r * v[i];
}

// LSQR: x += t1 w; w = v + t2 w
extern "C" __global__ void gpuqr_lsqr_update(const double* __restrict__ v, double t1, double t2,
                                             double* __restrict__ x, double* __restrict__ w,
                                             long long n) {
    VO_LOOP(n) {
        const double wk = w[i];
        x[i] = x[i] + t1 * wk;
        w[i] = v[i] + t2 * wk;
    }
}

// LSQR with var: var += (k w)^2 too
extern "C" __global__ void gpuqr_lsqr_update_var(const double* __restrict__ v, double t1,
                                                 double t2, double k, double* __restrict__ x,
                                                 double* __restrict__ w,
                                                 double* __restrict__ var, long long n) {
    VO_LOOP(n) {
        const double wk = w[i];
        const double d = wk * k;
        var[i] = var[i] + d * d;
        x[i] = x[i] + t1 * wk;
        w[i] = v[i] + t2 * wk;
    }
}

// LSMR: hbar = h + c_hbar hbar; x += c_x hbar; h = v + c_h h
extern "C" __global__ void gpuqr_lsmr_update(const double* __restrict__ v, double c_hbar,
                                             double c_x, double c_h, double* __restrict__ x,
                                             double* __restrict__ h, double* __restrict__ hbar,
                                             long long n) {
    VO_LOOP(n) {
        const double hb = h[i] + c_hbar * hbar[i];
        hbar[i] = hb;
        x[i] = x[i] + c_x * hb;
        h[i] = v[i] + c_h * h[i];
    }
}
