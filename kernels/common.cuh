// Shared tunables and helpers for every kernel family.
// NVRTC is run without system headers: use builtin types only.
#pragma once

typedef long long gpuqr_int64;
typedef int gpuqr_int32;

#define GPUQR_WARP 32
