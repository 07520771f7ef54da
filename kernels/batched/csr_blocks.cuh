// csr_blocks.cuh: the diagonal blocks of a CSR matrix read straight into the
// n <= 32 inverse kernels (block_jacobi's one launch per stack of blocks,
// scipy_gpuqr/batched/_jacobi.py): jacobi_getri_warp (lu_warp.cu) and
// jacobi_getri_mma (lu_mma.cu) are getri_warp and getri_mma whose tile loads
// sum CSR rows instead of copying a dense stack.
//
// Matrix m of a launch is the diagonal block of order n whose first row and
// column is row0 + m * n. Its row r is CSR row row0 + m * n + r: the entries
// in the block's columns added in storage order to zero (duplicates summed,
// as SciPy sums them), the others skipped after their column index is read.
// The sums are jacobi_gather's (jacobi.cu) to the bit -- the same additions
// in the same order --, so the fused kernels invert exactly the blocks that
// the gather and then the inverse kernel invert.
#pragma once

namespace gpuqr_csr {

// The diagonal blocks of a CSR matrix (indptr, indices: int or long long).
template <typename T, typename I>
struct CsrBlocks {
    const I *indptr;
    const I *indices;
    const T *data;
    long long row0;
};

// The source argument of the dense inverse kernels: no CSR matrix.
struct NoCsr {};

template <typename S> struct IsCsr { static constexpr bool value = false; };
template <typename T, typename I> struct IsCsr<CsrBlocks<T, I>> {
    static constexpr bool value = true;
};

// Row r < n of block m into dst(j), j < n (dst: a function of a column
// returning a T&). N <= 16 (jacobi_gather's REG_BS) sums in registers, a
// select per register and entry, and stores the row once (dst of
// compile-time columns); wider rows are zeroed and added to in place.
template <typename T, int N, typename I, typename Dst>
__device__ __forceinline__ void block_row(const CsrBlocks<T, I> &a, long long m, int n, int r,
                                          Dst dst) {
    const long long lo = a.row0 + m * n;
    const long long i = lo + r;
    const long long beg = (long long)__ldg(a.indptr + i);
    const long long end = (long long)__ldg(a.indptr + i + 1);
    if constexpr (N <= 16) {
        T acc[N];
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] = T(0);
#pragma unroll 4
        for (long long p = beg; p < end; ++p) {
            const long long c = (long long)__ldg(a.indices + p) - lo;
            const T v = __ldg(a.data + p);
#pragma unroll
            for (int j = 0; j < N; ++j)
                if (c == j) acc[j] += v;          // c >= n: a slot not stored
        }
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (j < n) dst(j) = acc[j];
    } else {
        for (int j = 0; j < n; ++j) dst(j) = T(0);
        for (long long p = beg; p < end; ++p) {
            const long long c = (long long)__ldg(a.indices + p) - lo;
            if (c >= 0 && c < n) dst((int)c) += __ldg(a.data + p);
        }
    }
}

}  // namespace gpuqr_csr
