// Test uberkernel for the tile experiment: one block per task, a switch on the
// task type (Factorize, Apply, Apply+Factorize). The production uberkernel
// (issue 5) adds the assembly tasks; the task struct is kernels/gpuqr_task.cuh.
#include "gpuqr_task.cuh"
#include "gpuqr_factorize.cuh"
#include "gpuqr_apply.cuh"

namespace gpuqr {

template <int TILE, int BUNDLE, int NT>
__global__ void __launch_bounds__(NT)
tile_uberkernel(const Task* __restrict__ tasks, double* __restrict__ F,
                double* __restrict__ VT) {
    extern __shared__ double smem[];
    __shared__ Task task;
    if (threadIdx.x == 0) task = tasks[blockIdx.x];
    __syncthreads();
    switch (task.type) {
    case TASK_FACTORIZE:
        factorize_bundle<TILE, BUNDLE, NT>(task, F, VT, task.col, task.nref, task.vt, smem);
        break;
    case TASK_APPLY:
        apply_bundle<TILE, BUNDLE, NT>(task, F, VT, smem);
        break;
    case TASK_APPLY_FACTORIZE:
        apply_bundle<TILE, BUNDLE, NT>(task, F, VT, smem);
        __syncthreads();
        factorize_bundle<TILE, BUNDLE, NT>(task, F, VT, task.c0, (int)task.aux, task.vt2, smem);
        break;
    default:
        break;
    }
}

// Shared memory (bytes) a variant needs, for the host to set the opt-in limit.
template <int TILE, int BUNDLE>
__global__ void tile_smem_bytes(long long* out) {
    const int f = FactorizeSmem<TILE, BUNDLE>::TOTAL, a = ApplySmem<TILE, BUNDLE>::TOTAL;
    out[0] = 8LL * (f > a ? f : a);
}

}  // namespace gpuqr
