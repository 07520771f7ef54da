// status.cuh: how the batched kernels report to a public call's status word
// (scipy_gpuqr/batched/_gpu_common.py), so that the call needs no pass over
// info of its own and no per-matrix array is copied to the host.
//
// The status word is five unsigned 64-bit slots per host thread and device,
// never cleared: each public call takes a new generation number g (> 0) and
// a kernel that sees a condition writes g into its slot (a plain store: every
// writer stores the same value, no atomics). After the call's kernels the
// host looks at the five slots once; slot s "is set" when it holds g. A kernel
// that ran for an earlier call left an older generation, never mistaken for
// this one.
//
// slots (STATUS_* in _gpu_common.py)
//   0: some matrix has info > 0 (singular / not positive definite)
//   1: some matrix has info < 0 (an inf or NaN in its input)
//   2: an inf or NaN was seen in a factor (solves)
//   3: an inf or NaN was seen in a right-hand side (solves)
//   4: a per-matrix size outside [0, n] (the *_vbatched calls: batched.cuh)
//
// The host reads the word without a copy: the word is followed in device
// memory by the address of its host mirror (SLOT_HOST: five slots in mapped
// pinned memory, or 0), and the kernel that first writes g into a device slot
// also writes it into the mirror's slot. The device slots gate the mirror's
// stores: however many matrices report, the mirror sees a few stores over the
// bus, and after the call's kernels the host finds the slots in its own
// memory once it has waited for the stream.
//
// ctl, the kernels' last argument: g << 2 | flags (g = 0: report nothing).
//   CTL_CLEAR_NEG: info < 0 is stored as 0 (check_finite=False);
//   CTL_NAN_FILL:  a matrix whose info is > 0 gets an all-NaN result (the
//                  inverse of return_info=True).
#pragma once

namespace gpuqr_status {

constexpr unsigned long long CTL_CLEAR_NEG = 1ull;
constexpr unsigned long long CTL_NAN_FILL = 2ull;
constexpr int SLOT_SIZES = 4;
constexpr int SLOT_HOST = 5;

template <typename T> __device__ __forceinline__ T quiet_nan();
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}
template <> __device__ __forceinline__ float quiet_nan<float>() {
    return __int_as_float(0x7fc00000);
}

// Mark slot `slot` of `status` and of its host mirror for the call of `ctl`
// (null status or g = 0: nothing).
__device__ __forceinline__ void mark(unsigned long long *status, unsigned long long ctl,
                                     int slot) {
    const unsigned long long g = ctl >> 2;
    if (status != nullptr && g != 0ull) {
        volatile unsigned long long *s = status + slot;
        if (*s != g) {
            *s = g;
            volatile unsigned long long *host =
                reinterpret_cast<volatile unsigned long long *>(status[SLOT_HOST]);
            if (host != nullptr) {
                host[slot] = g;
                __threadfence_system();
            }
        }
    }
}

// The info to store for a matrix whose kernel found `v` (0, k + 1 for the
// first zero pivot / failing minor, -1 for an inf or NaN in the input), with
// the status slot it sets and check_finite=False's clearing applied.
__device__ __forceinline__ int report_info(int v, unsigned long long *status,
                                           unsigned long long ctl) {
    if (v < 0) {
        mark(status, ctl, 1);
        return (ctl & CTL_CLEAR_NEG) ? 0 : v;
    }
    if (v > 0) mark(status, ctl, 0);
    return v;
}

// The info report_info stores for `v`, without marking the status word.
__device__ __forceinline__ int stored_info(int v, unsigned long long ctl) {
    return (v < 0 && (ctl & CTL_CLEAR_NEG)) ? 0 : v;
}

// True when the result of a matrix with found info `v` is to be all NaN.
__device__ __forceinline__ bool nan_result(int v, unsigned long long ctl) {
    return (ctl & CTL_NAN_FILL) && v > 0;
}

}  // namespace gpuqr_status
