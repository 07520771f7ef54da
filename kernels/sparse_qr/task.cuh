// The task record of the sparse-QR uberkernel and its tunables.
// Mirror of scipy_gpuqr/_schedule/tasks.py (TASK_DTYPE): the field meanings are
// documented there once; tests/test_tasks.py compiles static_asserts generated
// from the NumPy dtype against this struct, so the two cannot drift.
// Builtin types only: NVRTC has no system headers.
#pragma once

#include "common.cuh"

#define GPUQR_MAX_BUNDLE 5
#define GPUQR_MAX_SLOTS 6

#ifndef GPUQR_DEFAULT_TILE
#define GPUQR_DEFAULT_TILE 32
#endif
#ifndef GPUQR_DEFAULT_BUNDLE
#define GPUQR_DEFAULT_BUNDLE 3
#endif

namespace gpuqr {

enum TaskType : int {
    TASK_NONE = 0,
    TASK_FACTORIZE = 1,
    TASK_APPLY = 2,
    TASK_APPLY_FACTORIZE = 3,
    TASK_S_ASSEMBLE = 4,
    TASK_PACK_ASSEMBLE = 5,
    TASK_APPLY_QT = 6,
};

struct __align__(8) Task {
    long long F;     // front base (element offset in the front pool)
    long long vt;    // VT tile offset (Factorize writes, Apply reads)
    long long vt2;   // Apply+Factorize: VT tile of the factorize part
    long long aux;   // Pack: Rjmap offset; ApplyQt: rhs offset
    int type;
    int fm;
    int fn;          // leading dimension of the front
    int col;         // first column of the factorize / V column tile
    int c0;          // Apply: first updated column
    int c1;          // Apply: end of updated columns (exclusive)
    int nref;        // reflectors in the column tile (<= TILE)
    int front;       // front index (diagnostics)
    short napply;    // Apply: rows[0:napply]
    short nfrows;    // Factorize: rows[fstart:fstart+nfrows]
    short fstart;
    signed char flags;  // bit k: slot k upper triangular in the factorize column (hint)
    signed char ftop;   // slot of the factorize part's top tile (keeps R)
    int rows[GPUQR_MAX_SLOTS];  // first element row of each row tile, -1 = empty
};

}  // namespace gpuqr
