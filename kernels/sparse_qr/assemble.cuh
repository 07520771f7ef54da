// Assembly task families of the sparse-QR uberkernel (conventions identical to
// scipy_gpuqr/_engine/host/simulate.py, fields documented in scipy_gpuqr/_schedule/tasks.py):
//
// * S-Assemble: F[t.F + s_index[s]] = s_value[s] for s in [t.vt, t.vt2) (stage-relative
//   entries; the front pool is zeroed before the stage, duplicates were summed on the host).
// * Pack-Assemble: the child contribution block rows [rows[0], rows[1]) x columns [c0, c1)
//   (base t.vt, leading dimension t.col) scattered into the parent (base t.F, leading
//   dimension t.fn) through Rimap (maps[t.vt2 + i]) and Rjmap (maps[t.aux + j]); with
//   nfrows == 1 only the upper trapezoid (j >= i) is copied.
//
// All offsets are 64-bit; a task touches at most S_CHUNK / PACK_CHUNK entries, so the
// loop counters stay 32-bit.
#pragma once

#include "task.cuh"

namespace gpuqr {

template <typename T, int NT>
__device__ void s_assemble(const Task& t, T* __restrict__ F,
                           const long long* __restrict__ s_index,
                           const T* __restrict__ s_value) {
    const long long F0 = t.F, s0 = t.vt, s1 = t.vt2;
    for (long long s = s0 + threadIdx.x; s < s1; s += NT) F[F0 + s_index[s]] = s_value[s];
}

template <typename T, int NT>
__device__ void pack_assemble(const Task& t, T* __restrict__ F,
                              const long long* __restrict__ maps) {
    const long long P = t.F, C = t.vt, ri = t.vt2, rj = t.aux;
    const long long pld = t.fn, cld = t.col;
    const int r0 = t.rows[0], r1 = t.rows[1], c0 = t.c0, c1 = t.c1;
    const int nr = r1 - r0, nc = c1 - c0;
    if (nr <= 0 || nc <= 0) return;
    const bool upper = t.nfrows == 1;
    const int n = nr * nc;
    for (int idx = threadIdx.x; idx < n; idx += NT) {
        const int a = idx / nc;
        const int ci = r0 + a, cj = c0 + (idx - a * nc);
        if (upper && cj < ci) continue;
        F[P + maps[ri + ci] * pld + maps[rj + cj]] = F[C + (long long)ci * cld + cj];
    }
}

}  // namespace gpuqr
