// jacobi.cu: the diagonal blocks of a CSR matrix gathered into dense stacks
// (block_jacobi, scipy_gpuqr/batched/_jacobi.py), in one pass over its rows.
//
// Row i of the n x n matrix belongs to diagonal block i / bs; its entries in
// that block's columns go to row i % bs of the block: blocks 0 .. nfull-1
// (split = nfull * bs rows) are the stack full (nfull, bs, bs), the rows from
// split on the ragged last block last (n - split, n - split). A thread per
// row: it adds its entries in the block's columns in storage order
// (duplicates are summed, as SciPy sums them) and writes its block row whole
// (the outputs need no fill beforehand). Blocks of up to REG_BS columns sum
// in registers and store the row once; wider ones write zeros first and add
// in place. Entries outside the diagonal blocks are not read beyond their
// column index.
//
// Launch: any 1-D grid and block (grid-stride over rows).
#include "common.cuh"

// Widest block row summed in registers (a select per register and entry).
constexpr int REG_BS = 16;

template <typename T, typename I>
__global__ void jacobi_gather(const I *__restrict__ indptr, const I *__restrict__ indices,
                              const T *__restrict__ data, long long n, int bs,
                              long long split, T *__restrict__ full, T *__restrict__ last)
{
    const int rest = (int)(n - split);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long lo;
        int w;
        T *dst;
        if (i < split) {
            lo = i / bs * bs;
            w = bs;
            dst = full + i * bs;                 // block i / bs, row i % bs
        } else {
            lo = split;
            w = rest;
            dst = last + (i - split) * rest;
        }
        const long long beg = (long long)indptr[i];
        const long long end = (long long)indptr[i + 1];
        if (bs <= REG_BS) {
            T acc[REG_BS];
#pragma unroll
            for (int j = 0; j < REG_BS; ++j) acc[j] = T(0);
            for (long long p = beg; p < end; ++p) {
                const long long c = (long long)indices[p] - lo;
                const T v = data[p];
#pragma unroll
                for (int j = 0; j < REG_BS; ++j)
                    if (c == j) acc[j] += v;          // c >= w: a slot not stored
            }
#pragma unroll
            for (int j = 0; j < REG_BS; ++j)
                if (j < w) dst[j] = acc[j];
            continue;
        }
        for (int j = 0; j < w; ++j) dst[j] = T(0);
        for (long long p = beg; p < end; ++p) {
            const long long c = (long long)indices[p] - lo;
            if (c >= 0 && c < w) dst[c] += data[p];
        }
    }
}
