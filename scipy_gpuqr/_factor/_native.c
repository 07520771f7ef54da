/* Sparse triangular solves with many right-hand sides, in C.
 *
 * The host's rank decision (sparse_subspace.py) solves with a sparse upper
 * triangular R and with its transpose on blocks of a few dozen to a few
 * hundred columns, several steps in a row. R is in CSC form; the block X is
 * row-major (a row's k values side by side), so each entry of R updates one
 * contiguous row of X (an axpy of length k) and R is read once per block.
 *
 * sgf_upper_solve: X <- R^{-1} X (trans 0: back substitution, column by
 *   column of R from the last, scatter into the rows above the diagonal) or
 *   X <- R^{-T} X (trans 1: forward substitution, row j of X gathers the rows
 *   of column j's entries above the diagonal). Entries on or below the
 *   diagonal in the CSC arrays are skipped; the diagonal comes from diag.
 *   Non-finite values propagate (the caller checks the result).
 */
#include <stdint.h>

#define SGF_ABI 1

/* The axpy loops run 4 doubles wide where the CPU has AVX2: GCC builds both
 * versions and picks one when the library is loaded (an ifunc: glibc only).
 * Elementwise products and differences without contraction (-ffp-contract=off)
 * round alike in both. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) \
    && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define SGF_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef SGF_CLONES
#define SGF_CLONES
#endif

int sgf_abi(void) { return SGF_ABI; }

SGF_CLONES
void sgf_upper_solve(int64_t q, const int64_t *indptr, const int64_t *indices,
                     const double *data, const double *diag, double *X, int64_t k,
                     int64_t ld, int32_t trans)
{
    if (k == 1) {
        /* one column (the Lanczos runs' vectors): the same operations in the same
         * order as below, the column's value kept in a register */
        if (!trans) {
            for (int64_t j = q - 1; j >= 0; j--) {
                const double xj = X[j * ld] / diag[j];
                X[j * ld] = xj;
                for (int64_t p = indptr[j]; p < indptr[j + 1]; p++) {
                    const int64_t i = indices[p];
                    if (i >= j) continue;
                    X[i * ld] -= data[p] * xj;
                }
            }
        } else {
            for (int64_t j = 0; j < q; j++) {
                double xj = X[j * ld];
                for (int64_t p = indptr[j]; p < indptr[j + 1]; p++) {
                    const int64_t i = indices[p];
                    if (i >= j) continue;
                    xj -= data[p] * X[i * ld];
                }
                X[j * ld] = xj / diag[j];
            }
        }
        return;
    }
    if (!trans) {
        for (int64_t j = q - 1; j >= 0; j--) {
            double *restrict xj = X + j * ld;
            const double d = diag[j];
            for (int64_t c = 0; c < k; c++) xj[c] /= d;
            for (int64_t p = indptr[j]; p < indptr[j + 1]; p++) {
                const int64_t i = indices[p];
                if (i >= j) continue;
                const double r = data[p];
                double *restrict xi = X + i * ld;
                for (int64_t c = 0; c < k; c++) xi[c] -= r * xj[c];
            }
        }
    } else {
        for (int64_t j = 0; j < q; j++) {
            double *restrict xj = X + j * ld;
            for (int64_t p = indptr[j]; p < indptr[j + 1]; p++) {
                const int64_t i = indices[p];
                if (i >= j) continue;
                const double r = data[p];
                const double *restrict xi = X + i * ld;
                for (int64_t c = 0; c < k; c++) xj[c] -= r * xi[c];
            }
            const double d = diag[j];
            for (int64_t c = 0; c < k; c++) xj[c] /= d;
        }
    }
}
