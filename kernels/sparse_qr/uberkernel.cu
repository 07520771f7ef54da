// The sparse-QR uberkernel: one thread block per task record, a switch on the
// task type, one header per task family. The record is task.cuh (mirror of
// scipy_gpuqr/_schedule/tasks.py); the variants compiled (dtype, TILE, BUNDLE,
// threads, Apply variant: apply.cuh) are listed in
// scipy_gpuqr/_engine/gpu/factorize_kernels.py.
#include "task.cuh"
#include "factorize.cuh"
#include "apply.cuh"
#include "assemble.cuh"

namespace gpuqr {

// tasks: the launch's records; F: front pool; VT: VT tile pool; s_index/s_value:
// the stage's S entries; maps: Rimap entries then Rjmap entries (int64).
// Grid: blockIdx.x is the record; a grid of gridDim.y > 1 cuts every Apply
// record's columns into gridDim.y pieces, one block each (apply_piece_columns;
// the same arithmetic per column as one block doing all), so that a launch of
// few wide Apply records fills the device; an Apply+Factorize record's Apply
// likewise, block 0 taking the column tile it factorizes and then its Factorize
// (apply_factorize_piece_columns); the other records run in the blocks of
// blockIdx.y == 0 only.
template <typename T, int TILE, int BUNDLE, int NT, int APPLY>
__global__ void __launch_bounds__(NT)
uberkernel(const Task* __restrict__ tasks, T* __restrict__ F, T* __restrict__ VT,
           const long long* __restrict__ s_index, const T* __restrict__ s_value,
           const long long* __restrict__ maps) {
    // the Factorize's column loop (factorize.cuh): 1 lean, 0 the first one
    constexpr bool Mma = ApplyIsDouble<T>::value && TILE == 32 && NT == 256;
    constexpr int FK = Mma && APPLY == 4 ? 1 : 0;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);
    __shared__ Task task;
    if (threadIdx.x == 0) task = tasks[blockIdx.x];
    __syncthreads();
    if (blockIdx.y != 0 && task.type != TASK_APPLY && task.type != TASK_APPLY_FACTORIZE) return;
    switch (task.type) {
    case TASK_FACTORIZE:
        factorize_bundle<T, TILE, BUNDLE, NT, FK>(task, F, VT, task.col, task.nref, task.vt,
                                                  smem);
        break;
    case TASK_APPLY: {
        int c0 = task.c0, c1 = task.c1;
        if (gridDim.y > 1) apply_piece_columns<TILE>(task, blockIdx.y, gridDim.y, c0, c1);
        if (c0 < c1) apply_bundle<T, TILE, BUNDLE, NT, APPLY>(task, F, VT, smem, c0, c1);
        break;
    }
    case TASK_APPLY_FACTORIZE: {
        int c0 = task.c0, c1 = task.c1;
        if (gridDim.y > 1)
            apply_factorize_piece_columns<TILE>(task, blockIdx.y, gridDim.y, c0, c1);
        if (c0 < c1) apply_bundle<T, TILE, BUNDLE, NT, APPLY>(task, F, VT, smem, c0, c1);
        if (blockIdx.y == 0) {          // uniform in the block
            __syncthreads();
            factorize_bundle<T, TILE, BUNDLE, NT, FK>(task, F, VT, task.c0, (int)task.aux,
                                                      task.vt2, smem);
        }
        break;
    }
    case TASK_S_ASSEMBLE:
        s_assemble<T, NT>(task, F, s_index, s_value);
        break;
    case TASK_PACK_ASSEMBLE:
        pack_assemble<T, NT>(task, F, maps);
        break;
    default:
        break;
    }
}

// Shared memory (bytes) a variant needs, for the host to set the opt-in limit.
template <typename T, int TILE, int BUNDLE, int APPLY>
__global__ void uberkernel_smem_bytes(long long* out) {
    const int f = FactorizeSmem<TILE, BUNDLE>::TOTAL, a = ApplySmem<T, TILE, BUNDLE, APPLY>::TOTAL;
    out[0] = (long long)sizeof(T) * (f > a ? f : a);
}

}  // namespace gpuqr
