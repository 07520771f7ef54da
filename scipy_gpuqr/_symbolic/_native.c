/* The symbolic analysis' tree loops in C (see native.py): the column
 * elimination tree (read off A's columns), its postorder, the column counts of R, the relaxed
 * amalgamation of the supernodes, the fronts' column lists with their maps and
 * their rows (staircases, row maps, the S-assembly map), the fronts' flops and
 * nnz(H); and the pattern by rows these read (A's columns permuted, rows
 * sorted by their leftmost column).
 *
 * Each function computes exactly what its NumPy twin in etree.py computes (a
 * test compares them on many matrices); the NumPy code stays the reference and
 * runs wherever this library cannot be built. Plain C99, no Python headers,
 * all indices int64. Built by native.py with the system C compiler into the
 * package cache folder and loaded with ctypes (the calls release the GIL).
 *
 * Patterns are given by rows (CSR, column indices sorted within each row;
 * leftmost[i] is the first column of row i, n for an empty row), except where
 * A itself is read by columns in the analysis' order (CSC, row indices sorted
 * within each column, and q the columns' order).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SGS_ABI 6

enum { SGS_OK = 0, SGS_NOMEM = 1, SGS_COUNTS = 2 };

int sgs_abi(void) { return SGS_ABI; }

/* S by rows (rows.sorted_rows): B = A[rows kept][:, q] (A in CSC ap, ai, rows
 * sorted in each column; rowmap[r]: row r's row of B, increasing on the rows
 * kept, -1 for the others; NULL: every row, in order) with its rows sorted
 * stably by their leftmost column, empty rows last. Read column by column in
 * q's order, a row's leftmost column is the column it is first met in, and
 * the rows first met in one column come in increasing order: that order is
 * S's. rowperm[t] is S's t-th row as a row of B, s_left[t] its leftmost
 * column (n2 when empty); each entry's column comes in increasing order, with
 * its position in A's data (s_pos). m2 rows of B; s_indptr has m2 + 1 places;
 * SGS_COUNTS when the rows kept are not m2.
 */
int sgs_sorted_rows(int64_t m, int64_t m2, int64_t n2, const int64_t *ap, const int64_t *ai,
                    const int64_t *q, const int64_t *rowmap, int64_t *rowperm,
                    int64_t *s_indptr, int64_t *s_indices, int64_t *s_pos, int64_t *s_left)
{
    int64_t *rank = malloc(((size_t)m + 1) * sizeof(int64_t));
    if (!rank)
        return SGS_NOMEM;
    for (int64_t r = 0; r < m; r++)
        rank[r] = -1;
    for (int64_t t = 0; t <= m2; t++)
        s_indptr[t] = 0;
    int64_t t = 0;
    for (int64_t k = 0; k < n2; k++) {       /* ranks in order of first meeting; counts */
        int64_t c = q[k];
        for (int64_t p = ap[c]; p < ap[c + 1]; p++) {
            int64_t r = ai[p];
            if (rowmap && rowmap[r] < 0)
                continue;
            if (rank[r] < 0) {
                if (t == m2) {
                    free(rank);
                    return SGS_COUNTS;
                }
                rank[r] = t;
                rowperm[t] = rowmap ? rowmap[r] : r;
                s_left[t] = k;
                t++;
            }
            s_indptr[rank[r] + 1]++;
        }
    }
    for (int64_t r = 0; r < m; r++)          /* the empty rows last, in order */
        if (rank[r] < 0 && !(rowmap && rowmap[r] < 0)) {
            if (t == m2) {
                free(rank);
                return SGS_COUNTS;
            }
            rank[r] = t;
            rowperm[t] = rowmap ? rowmap[r] : r;
            s_left[t] = n2;
            t++;
        }
    if (t != m2) {
        free(rank);
        return SGS_COUNTS;
    }
    for (int64_t u = 0; u < m2; u++)
        s_indptr[u + 1] += s_indptr[u];
    int64_t *next = rank;                     /* rank[r] becomes S row r's next place */
    for (int64_t r = 0; r < m; r++)
        if (rank[r] >= 0)
            next[r] = s_indptr[rank[r]];
    for (int64_t k = 0; k < n2; k++) {
        int64_t c = q[k];
        for (int64_t p = ap[c]; p < ap[c + 1]; p++) {
            int64_t r = ai[p];
            if (rowmap && rowmap[r] < 0)
                continue;
            int64_t e = next[r]++;
            s_indices[e] = k;
            s_pos[e] = p;
        }
    }
    free(rank);
    return SGS_OK;
}

/* Column elimination tree (the elimination tree of B'B) of B = A[rows
 * kept][:, q] (etree.column_etree_by_columns): column k of B is column q[k] of
 * A (CSC ap, ai) on the rows that rowmap keeps (>= 0; NULL: all m rows).
 * Row i makes its columns a clique of B'B; the path through them in
 * increasing order has the same filled graph (as has the star of
 * etree.column_etree_numpy), so Liu's algorithm with path compression
 * (virtual ancestors anc[]) runs on the edges (prev[i], k), prev[i] being
 * row i's previous column: the walk from prev[i] climbs to the root of its
 * current subtree, which becomes a child of k. parent[k] > k or -1.
 */
int sgs_column_etree_by_columns(int64_t m, int64_t n, const int64_t *ap, const int64_t *ai,
                                const int64_t *q, const int64_t *rowmap, int64_t *parent)
{
    int64_t *prev = malloc(((size_t)m + 1) * sizeof(int64_t));
    int64_t *anc = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!prev || !anc) {
        free(prev); free(anc);
        return SGS_NOMEM;
    }
    for (int64_t r = 0; r < m; r++)
        prev[r] = -1;
    for (int64_t k = 0; k < n; k++) {
        int64_t c = q[k];
        parent[k] = -1;
        anc[k] = -1;
        for (int64_t p = ap[c]; p < ap[c + 1]; p++) {
            int64_t r = ai[p];
            if (rowmap && rowmap[r] < 0)
                continue;
            int64_t j = prev[r];
            while (j != -1 && j < k) {
                int64_t nxt = anc[j];
                anc[j] = k;
                if (nxt == -1)
                    parent[j] = k;
                j = nxt;
            }
            prev[r] = k;
        }
    }
    free(prev); free(anc);
    return SGS_OK;
}

/* Postorder of a forest, children (and roots) in increasing label order:
 * post[t] is the node visited t-th. Depth-first with an explicit stack. */
int sgs_postorder(int64_t n, const int64_t *parent, int64_t *post)
{
    int64_t *head = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *next = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *stack = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!head || !next || !stack) {
        free(head); free(next); free(stack);
        return SGS_NOMEM;
    }
    for (int64_t j = 0; j <= n; j++)
        head[j] = -1;
    for (int64_t j = n - 1; j >= 0; j--) {  /* lists in increasing order; n: the roots */
        int64_t p = parent[j] < 0 ? n : parent[j];
        next[j] = head[p];
        head[p] = j;
    }
    int64_t t = 0, top = 0;
    stack[0] = n;
    while (top >= 0) {
        int64_t v = stack[top];
        int64_t c = head[v];
        if (c == -1) {                       /* every child done: leave v */
            top--;
            if (v != n)
                post[t++] = v;
        } else {                             /* enter the next child */
            head[v] = next[c];
            stack[++top] = c;
        }
    }
    free(head); free(next); free(stack);
    return SGS_OK;
}

static int64_t find(int64_t *anc, int64_t x)
{
    int64_t r = x;
    while (anc[r] != r)
        r = anc[r];
    while (anc[x] != r) {                    /* path compression */
        int64_t nx = anc[x];
        anc[x] = r;
        x = nx;
    }
    return r;
}

/* Column counts of R (rows of R = columns of chol(B'B)) for a postordered tree.
 *
 * Column k of R has the pattern T_k, the union of the tree paths from p to k
 * over its "leaves" p: k itself and leftmost[i] for every row i holding k.
 * Skeleton formula: +1 at each distinct leaf, -1 at the LCA of consecutive
 * leaves (in postorder), -1 at parent(k), then subtree sums. Leaves are
 * visited in increasing label (rows bucketed by leftmost column), so each
 * column's consecutive pair is (its previous leaf, this one); when leaf p is
 * visited every node < p has been joined to its parent in a union-find, and
 * the set of the previous leaf is then their LCA (the lowest ancestor >= p).
 */
int sgs_column_counts(int64_t m, int64_t n, const int64_t *indptr, const int64_t *indices,
                      const int64_t *parent, const int64_t *leftmost, int64_t *counts)
{
    int64_t *rptr = calloc((size_t)n + 2, sizeof(int64_t));
    int64_t *rows = malloc(((size_t)m + 1) * sizeof(int64_t));
    int64_t *prev = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *anc = malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!rptr || !rows || !prev || !anc) {
        free(rptr); free(rows); free(prev); free(anc);
        return SGS_NOMEM;
    }
    for (int64_t i = 0; i < m; i++)         /* rows by leftmost column (empty: n) */
        rptr[leftmost[i] + 1]++;
    for (int64_t j = 0; j <= n; j++)
        rptr[j + 1] += rptr[j];
    for (int64_t i = 0; i < m; i++)
        rows[rptr[leftmost[i]]++] = i;       /* rptr[j] moves to bucket j's end */
    for (int64_t j = 0; j < n; j++) {
        prev[j] = -1;
        anc[j] = j;
        counts[j] = 0;
    }
    int64_t start = 0;
    for (int64_t p = 0; p < n; p++) {
        /* the diagonal: p is a leaf of column p */
        int64_t k = p;
        counts[p]++;
        if (prev[k] != -1)
            counts[find(anc, prev[k])]--;
        prev[k] = p;
        for (int64_t r = start; r < rptr[p]; r++) {
            int64_t i = rows[r];
            for (int64_t q = indptr[i]; q < indptr[i + 1]; q++) {
                k = indices[q];
                if (prev[k] == p)
                    continue;                /* leaf p already counted for k */
                counts[p]++;
                if (prev[k] != -1)
                    counts[find(anc, prev[k])]--;
                prev[k] = p;
            }
        }
        start = rptr[p];
        if (parent[p] >= 0) {
            counts[parent[p]]--;
            anc[p] = parent[p];              /* p is done: join it to its parent */
        }
    }
    for (int64_t j = 0; j < n; j++)          /* subtree sums (children before parents) */
        if (parent[j] >= 0)
            counts[parent[j]] += counts[j];
    free(rptr); free(rows); free(prev); free(anc);
    return SGS_OK;
}

/* Sort a[0..k) of values in [0, 2^(8*passes)): insertion sort for short
 * lists, else least-significant-digit radix sort by bytes through tmp. */
static void sort_small_ints(int64_t *a, int64_t k, int64_t *tmp, int passes)
{
    if (k <= 32) {
        for (int64_t i = 1; i < k; i++) {
            int64_t v = a[i], j = i - 1;
            while (j >= 0 && a[j] > v) {
                a[j + 1] = a[j];
                j--;
            }
            a[j + 1] = v;
        }
        return;
    }
    int64_t *src = a, *dst = tmp;
    for (int d = 0; d < passes; d++) {
        int64_t count[257] = {0};
        int shift = 8 * d;
        for (int64_t i = 0; i < k; i++)
            count[((src[i] >> shift) & 255) + 1]++;
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (int64_t i = 0; i < k; i++)
            dst[count[(src[i] >> shift) & 255]++] = src[i];
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, (size_t)k * sizeof(int64_t));
}

/* The fronts' column lists, their children's Rjmap, the S entries' local
 * columns, fm and cm (fronts.build_fronts' level loop), front after front in
 * postorder (children first). Front f's columns: its pivots, then the sorted
 * distinct columns past them of its S entries and of its children's non-pivot
 * columns; a column's local index is its place in that list. fm[f] = its S
 * rows + its children's contribution-block rows; cm[f] = min(fm - min(fm, fp),
 * fn - fp). The list must have fn - fp non-pivot columns (the column counts):
 * otherwise SGS_COUNTS with bad[0] = the front and bad[1] = the count found.
 */
int sgs_front_columns(int64_t nf, int64_t n, const int64_t *front_ptr, const int64_t *fn,
                      const int64_t *col_ptr, const int64_t *s_ptr, const int64_t *s_indices,
                      const int64_t *child_ptr, const int64_t *children, const int64_t *na,
                      const int64_t *rjmap_ptr, int64_t *cols, int64_t *rjmap,
                      int64_t *ent_col, int64_t *fm, int64_t *cm, int64_t *bad)
{
    int64_t cap = 1;
    for (int64_t f = 0; f < nf; f++) {       /* the largest candidate list of a front */
        int64_t c = s_ptr[f + 1] - s_ptr[f];
        for (int64_t q = child_ptr[f]; q < child_ptr[f + 1]; q++)
            c += col_ptr[children[q] + 1] - col_ptr[children[q]];
        if (c > cap)
            cap = c;
    }
    int64_t *mark = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *where = malloc(((size_t)n + 1) * sizeof(int64_t));
    int64_t *buf = malloc((size_t)cap * sizeof(int64_t));
    int64_t *tmp = malloc((size_t)cap * sizeof(int64_t));
    if (!mark || !where || !buf || !tmp) {
        free(mark); free(where); free(buf); free(tmp);
        return SGS_NOMEM;
    }
    int passes = 1;
    while (passes < 8 && (n >> (8 * passes)) > 0)
        passes++;
    for (int64_t j = 0; j <= n; j++)
        mark[j] = -1;
    for (int64_t f = 0; f < nf; f++) {
        int64_t lo = front_ptr[f], hi = front_ptr[f + 1], fp = hi - lo;
        int64_t c0 = col_ptr[f], ncb = fn[f] - fp, nb = 0;
        for (int64_t e = s_ptr[f]; e < s_ptr[f + 1]; e++) {
            int64_t j = s_indices[e];
            if (j >= hi && mark[j] != f) {
                mark[j] = f;
                buf[nb++] = j;
            }
        }
        for (int64_t q = child_ptr[f]; q < child_ptr[f + 1]; q++) {
            int64_t c = children[q];
            int64_t cfp = front_ptr[c + 1] - front_ptr[c];
            for (int64_t t = col_ptr[c] + cfp; t < col_ptr[c + 1]; t++) {
                int64_t j = cols[t];
                if (j >= hi && mark[j] != f) {
                    mark[j] = f;
                    buf[nb++] = j;
                }
            }
        }
        if (nb != ncb) {
            bad[0] = f;
            bad[1] = nb;
            free(mark); free(where); free(buf); free(tmp);
            return SGS_COUNTS;
        }
        sort_small_ints(buf, nb, tmp, passes);
        for (int64_t t = 0; t < fp; t++)
            cols[c0 + t] = lo + t;
        for (int64_t t = 0; t < nb; t++) {
            cols[c0 + fp + t] = buf[t];
            where[buf[t]] = fp + t;
        }
        for (int64_t e = s_ptr[f]; e < s_ptr[f + 1]; e++) {
            int64_t j = s_indices[e];
            ent_col[e] = j < hi ? j - lo : where[j];
        }
        int64_t m_f = na[f];
        for (int64_t q = child_ptr[f]; q < child_ptr[f + 1]; q++) {
            int64_t c = children[q];
            int64_t cfp = front_ptr[c + 1] - front_ptr[c];
            int64_t r0 = rjmap_ptr[c], t0 = col_ptr[c] + cfp;
            for (int64_t t = t0; t < col_ptr[c + 1]; t++) {
                int64_t j = cols[t];
                rjmap[r0 + t - t0] = j < hi ? j - lo : where[j];
            }
            m_f += cm[c];
        }
        fm[f] = m_f;
        int64_t k = m_f < fp ? m_f : fp;
        cm[f] = (m_f - k) < ncb ? (m_f - k) : ncb;
    }
    free(mark); free(where); free(buf); free(tmp);
    return SGS_OK;
}

/* Relaxed amalgamation (fronts.relaxed_amalgamation's loop, the same rule and
 * arithmetic): supernodes from the last to the first, j merged into the group
 * headed by j+1 when that group holds its parent and the merged front passes
 * the nrelax/zrelax test. nscol, snz and zeros are updated in place (the
 * group's values live at its head); keep[j] = 0 for a merged-away head. */
void sgs_relaxed_amalgamation(int64_t ns_total, const int64_t *sparent, int64_t *nscol,
                              int64_t *snz, int64_t *zeros, const int64_t *nrelax,
                              const double *zrelax, int8_t *keep)
{
    int64_t end = ns_total;
    for (int64_t j = 0; j < ns_total; j++)
        keep[j] = 1;
    for (int64_t j = ns_total - 2; j >= 0; j--) {
        int64_t p = sparent[j];
        if (p < 0 || p >= end) {
            end = j + 1;
            continue;
        }
        p = j + 1;
        int64_t c0 = nscol[j], c1 = nscol[p], ns = c0 + c1;
        int64_t lnz0 = snz[j], lnz1 = snz[p];
        int64_t totzeros = zeros[p];
        int merge;
        if (ns <= nrelax[0]) {
            merge = 1;
        } else {
            int64_t newzeros = c0 * (lnz1 + c0 - lnz0);
            if (newzeros == 0) {
                merge = 1;
            } else {
                totzeros += newzeros;
                double size = (double)(ns * (ns + 1)) / 2.0 + (double)(ns * (lnz1 - c1));
                double z = (double)totzeros / size;
                merge = (ns <= nrelax[1] && z < zrelax[0]) || (ns <= nrelax[2] && z < zrelax[1])
                        || z < zrelax[2];
            }
        }
        if (merge) {
            nscol[j] = ns;
            snz[j] = c0 + lnz1;
            zeros[j] = totzeros;
            keep[p] = 0;
        } else {
            end = j + 1;
        }
    }
}

/* The fronts' rows (fronts.build_fronts after its column lists): each row of
 * front f sits in the slot of its leftmost local column (S row s: leftmost[s]
 * - first pivot; row ci of child c: Rjmap_c[ci]); rows go by slot, in one slot
 * the S rows first (S order), then the children's rows (child order, then
 * row order). Writes stair (rows up to each slot, within the front),
 * arow_local (each S row's place), rimap (each child row's place in its
 * parent) and s_index (each S entry's row-major position in its front).
 * cnt and nxt: scratch of the largest fn. */
int sgs_front_rows(int64_t nf, const int64_t *front_ptr, const int64_t *fn,
                   const int64_t *col_ptr, const int64_t *arow_ptr, const int64_t *leftmost,
                   const int64_t *s_indptr, const int64_t *ent_col, const int64_t *child_ptr,
                   const int64_t *children, const int64_t *cm, const int64_t *rjmap_ptr,
                   const int64_t *rjmap, const int64_t *rimap_ptr, int64_t *stair,
                   int64_t *arow_local, int64_t *rimap, int64_t *s_index)
{
    int64_t most = 1;
    for (int64_t f = 0; f < nf; f++)
        if (fn[f] > most)
            most = fn[f];
    int64_t *scnt = malloc((size_t)most * sizeof(int64_t));
    int64_t *snext = malloc((size_t)most * sizeof(int64_t));
    int64_t *cnext = malloc((size_t)most * sizeof(int64_t));
    if (!scnt || !snext || !cnext) {
        free(scnt); free(snext); free(cnext);
        return SGS_NOMEM;
    }
    for (int64_t f = 0; f < nf; f++) {
        int64_t lo = front_ptr[f], w = fn[f], c0 = col_ptr[f];
        int64_t *st = stair + c0;
        for (int64_t k = 0; k < w; k++) {
            scnt[k] = 0;
            st[k] = 0;                       /* the children's rows per slot, for now */
        }
        for (int64_t r = arow_ptr[f]; r < arow_ptr[f + 1]; r++)
            scnt[leftmost[r] - lo]++;
        for (int64_t q = child_ptr[f]; q < child_ptr[f + 1]; q++) {
            int64_t c = children[q];
            for (int64_t ci = 0; ci < cm[c]; ci++)
                st[rjmap[rjmap_ptr[c] + ci]]++;
        }
        int64_t before = 0;                  /* rows in the slots before k */
        for (int64_t k = 0; k < w; k++) {
            snext[k] = before;
            cnext[k] = before + scnt[k];
            before += scnt[k] + st[k];
            st[k] = before;
        }
        for (int64_t r = arow_ptr[f]; r < arow_ptr[f + 1]; r++) {
            int64_t loc = snext[leftmost[r] - lo]++;
            arow_local[r] = loc;
            for (int64_t e = s_indptr[r]; e < s_indptr[r + 1]; e++)
                s_index[e] = loc * w + ent_col[e];
        }
        for (int64_t q = child_ptr[f]; q < child_ptr[f + 1]; q++) {
            int64_t c = children[q];
            for (int64_t ci = 0; ci < cm[c]; ci++)
                rimap[rimap_ptr[c] + ci] = cnext[rjmap[rjmap_ptr[c] + ci]]++;
        }
    }
    free(scnt); free(snext); free(cnext);
    return SGS_OK;
}

/* Householder flops and nnz(H) of every front (counts.front_work): reflector k
 * of front f spans rows k .. t-1, t = max(min(stair[k], fm), k + 1), for
 * k < min(fm, fn); it costs (t - k) * (3 + 4 * (fn - k - 1)) flops. The sums
 * are exact in int64; flops is returned as double, as NumPy's sum cast. */
void sgs_front_work(int64_t nf, const int64_t *col_ptr, const int64_t *fm, const int64_t *fn,
                    const int64_t *stair, double *flops, int64_t *nnz_h)
{
    for (int64_t f = 0; f < nf; f++) {
        int64_t w = fn[f], rows = fm[f], lim = rows < w ? rows : w;
        const int64_t *st = stair + col_ptr[f];
        int64_t fl = 0, h = 0;
        for (int64_t k = 0; k < lim; k++) {
            int64_t t = st[k] < rows ? st[k] : rows;
            if (t < k + 1)
                t = k + 1;
            fl += (t - k) * (3 + 4 * (w - k - 1));
            h += t - k;
        }
        flops[f] = (double)fl;
        nnz_h[f] = h;
    }
}
