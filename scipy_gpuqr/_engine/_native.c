/* R's values of a staged GPU factorization gathered from a host pool, in C.
 *
 * A pool sent down to the host during its stage holds R's values of that
 * stage at scattered offsets; the gather thread puts them straight into R's
 * data array while the next stages' launch loop runs Python on the engine's
 * thread. One call per worker thread takes the whole of that thread's range
 * without the GIL (ctypes releases it for the call): a loop of NumPy calls
 * would take the GIL back between them, and each time the launch loop is
 * made to give it up.
 *
 * sge_gather: out[pos[i]] = src[idx[i]] for i in [i0, i1); 4- or 8-byte
 * items, 4- or 8-byte indices into src, 8-byte positions into out. Positions
 * are distinct (R's layout makes them so), so threads with disjoint ranges
 * write disjoint entries.
 */
#include <stdint.h>

#define SGE_ABI 1

int sge_abi(void) { return SGE_ABI; }

#define GATHER_LOOP(T, I)                                            \
    do {                                                             \
        const T *s = (const T *)src;                                 \
        const I *x = (const I *)idx;                                 \
        T *o = (T *)out;                                             \
        for (int64_t i = i0; i < i1; i++) o[pos[i]] = s[x[i]];       \
    } while (0)

void sge_gather(int64_t i0, int64_t i1, const int64_t *pos, const void *idx, int32_t idxsize,
                const void *src, void *out, int32_t itemsize)
{
    if (itemsize == 8) {
        if (idxsize == 8) GATHER_LOOP(uint64_t, int64_t);
        else GATHER_LOOP(uint64_t, int32_t);
    } else {
        if (idxsize == 8) GATHER_LOOP(uint32_t, int64_t);
        else GATHER_LOOP(uint32_t, int32_t);
    }
}
