/* The schedule plan's loops in C (see native.py): the bucket simulation of tile
 * patterns with their rows, the fronts' row-tile buckets, the rows in element
 * units, the records of a range of launches, and a stage's assembly records.
 *
 * The compiled twin of bucket._simulate_numpy + bucket._records: the same bucket
 * rules (bucket.py's module docstring) run pattern by pattern instead of in lock
 * step, and each pattern's rows are written in the same order with the same
 * fields, so the outputs are byte for byte the NumPy path's (a test compares
 * both on many patterns). Built by native.py with the system C compiler into
 * the package cache folder and loaded with ctypes; plain C99, no
 * Python headers.
 *
 * Outputs (sgq_fetch): the rows of all patterns one after the other, column by
 * column (NCOL int32 columns: type col c0 c1 napply nfrows fstart flags ftop vt
 * vt2 mult) and the (nrow, MAXS) row-tile slots; per pattern its row and record
 * pointers (nlaunch + 1 each, local) and (nlaunch, nvt, first row, past-the-last
 * row).
 *
 * Also: sgq_arith_runs32/64, the expansion of arithmetic runs end to end that
 * R's layout (rlayout.py) makes of its column segments (row indices, gather
 * index), one pass over the output per range of runs (the caller splits the
 * runs over threads; ctypes releases the GIL).
 * And sgq_scatter: out[pos[i]] = src[i] over a range of i (4- or 8-byte items),
 * R's values of a staged factorization put in place by several threads.
 * And sgq_pack: Pack-Assemble records of a host stage (simulate.py's _pack) over
 * a range of records, a child's contribution-block piece copied into its parent
 * through the row and column maps (the upper trapezoid only where tri[k]).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SGQ_ABI 8
#define MAXB 5  /* MAX_BUNDLE (tasks.py) */
#define MAXS 6  /* MAX_SLOTS (tasks.py) */
#define NCOL 12

enum { T_FACTORIZE = 1, T_APPLY = 2, T_APPLY_FACTORIZE = 3, T_S_ASSEMBLE = 4, T_PACK_ASSEMBLE = 5 };
enum { C_TYPE, C_COL, C_C0, C_C1, C_NAPPLY, C_NFROWS, C_FSTART, C_FLAGS, C_FTOP, C_VT,
       C_VT2, C_MULT };
enum { SGQ_OK = 0, SGQ_NOMEM = 1, SGQ_FINAL = 2, SGQ_INPUT = 3, SGQ_LOOP = 4 };

typedef struct {
    int32_t t, b, n, af, src, trim, napp, afn;
    int32_t tiles[MAXB];
} bundle_t;

typedef struct {
    int32_t f[NCOL];
    int32_t rows[MAXS];
} row_t;

typedef struct {
    row_t *row;
    int64_t nrow, caprow;
    int64_t *rp, *lp;
    int64_t nptr, caprp, caplp;
    int64_t *pinfo;          /* 4 per pattern */
} result_t;

typedef struct {             /* scratch of one pattern, sized for the largest */
    int32_t *gbk, *park, *due[3], *grest, *gb, *gn, *gsrc, *grest2, *gb2, *gn2, *gsrc2;
    uint8_t *tri;
    int64_t *key;
    bundle_t *bnd;
    int64_t nbnd, capbnd;
} work_t;

int sgq_abi(void) { return SGQ_ABI; }

static int grow(void **p, int64_t *cap, int64_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    int64_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void sort64(int64_t *a, int64_t n)
{
    if (n < 24) {
        for (int64_t i = 1; i < n; i++) {
            int64_t v = a[i], j = i;
            for (; j > 0 && a[j - 1] > v; j--)
                a[j] = a[j - 1];
            a[j] = v;
        }
    } else {
        qsort(a, (size_t)n, sizeof(int64_t), cmp64);
    }
}

typedef struct {
    int32_t nfct, bundle, pip, t;
    int32_t *n1, *n2, *ng2;
} step_t;

/* A bundle of sorted members m[0..n) of bucket b: record it, then its top stays
 * (upper triangular, idle next launch) and the others advance. */
static int make_bundle(work_t *w, step_t *s, int32_t b, const int32_t *m, int32_t n,
                       int32_t af, int32_t src)
{
    if (grow((void **)&w->bnd, &w->capbnd, w->nbnd + 1, sizeof(bundle_t)))
        return SGQ_NOMEM;
    int32_t id = (int32_t)w->nbnd++;
    bundle_t *B = &w->bnd[id];
    B->t = s->t;
    B->b = b;
    B->n = n;
    B->af = af;
    B->src = src;
    B->trim = 0;
    for (int32_t k = 0; k < MAXB; k++)
        B->tiles[k] = k < n ? m[k] : -1;
    for (int32_t k = 0; k < n; k++)
        if (w->tri[m[k]])
            B->trim |= 1 << k;
    for (int32_t k = 0; k < n; k++)
        w->tri[m[k]] = 0;
    w->tri[m[0]] = 1;
    w->due[1][(*s->n1)++] = m[0];
    int last = b == s->nfct - 1;
    for (int32_t k = 1; k < n; k++) {
        w->gbk[m[k]] = last ? -1 : b + 1;
        if (!s->pip && !last)
            w->due[2][(*s->n2)++] = m[k];
    }
    if (s->pip && n >= 2 && !last) {       /* an Apply+Factorize group next launch */
        int32_t g = (*s->ng2)++;
        w->gb2[g] = b + 1;
        w->gn2[g] = n - 1;
        w->gsrc2[g] = id;
        for (int32_t k = 0; k < MAXB - 1; k++)
            w->grest2[g * (MAXB - 1) + k] = k + 1 < n ? m[k + 1] : -1;
    }
    return SGQ_OK;
}

/* The bucket rules on one pattern; its bundles in w->bnd in creation order. */
static int simulate(work_t *w, const int32_t *b0, int32_t nrt, int32_t nfct, int32_t bundle,
                    int32_t pip)
{
    int32_t ncur = 0, n1 = 0, n2 = 0, ng = 0, ng2 = 0;
    w->nbnd = 0;
    for (int32_t i = 0; i < nrt; i++) {
        w->tri[i] = 0;
        w->gbk[i] = b0[i] >= 0 ? b0[i] : -1;
        if (b0[i] >= nfct)
            return SGQ_INPUT;
        if (b0[i] >= 0)
            w->due[0][ncur++] = i;
    }
    for (int32_t b = 0; b < nfct; b++)
        w->park[b] = -1;
    step_t s = {nfct, bundle, pip, 0, &n1, &n2, &ng2};
    int64_t guard = 16 * ((int64_t)nrt + 2) * ((int64_t)nfct + 2);
    int32_t mem[2 * MAXB];
    for (int32_t t = 0; ncur || n1 || n2 || ng; t++) {
        if (t > guard)
            return SGQ_LOOP;
        s.t = t;
        /* idle tiles: those due now, and the parked tile of every bucket reached */
        int64_t k = 0;
        for (int32_t i = 0; i < ncur; i++) {
            int32_t x = w->due[0][i];
            w->key[k++] = ((int64_t)w->gbk[x] << 32) | x;
        }
        int64_t kf = k;
        for (int64_t i = 0; i < kf; i++) {
            int32_t b = (int32_t)(w->key[i] >> 32);
            if (w->park[b] >= 0) {
                w->key[k++] = ((int64_t)b << 32) | w->park[b];
                w->park[b] = -1;
            }
        }
        for (int32_t j = 0; j < ng; j++) {
            int32_t b = w->gb[j];
            if (w->park[b] >= 0) {
                w->key[k++] = ((int64_t)b << 32) | w->park[b];
                w->park[b] = -1;
            }
        }
        sort64(w->key, k);
        ng2 = 0;
        int64_t i = 0;
        int32_t j = 0;
        while (i < k || j < ng) {
            int32_t b = i < k ? (int32_t)(w->key[i] >> 32) : INT32_MAX;
            if (j < ng && w->gb[j] < b)
                b = w->gb[j];
            int64_t i0 = i;
            while (i < k && (int32_t)(w->key[i] >> 32) == b)
                i++;
            int32_t nidle = (int32_t)(i - i0);
            int32_t off = 0;
            for (; j < ng && w->gb[j] == b; j++) {
                /* a group takes the lowest idle tiles as its delta */
                int32_t nr = w->gn[j], cap = bundle - nr;
                int32_t d0 = off < nidle ? off : nidle;
                int32_t d1 = off + cap < nidle ? off + cap : nidle;
                off += cap;
                const int32_t *rest = &w->grest[j * (MAXB - 1)];
                int32_t a = 0, c = d0, n = 0;
                while (a < nr || c < d1) {
                    int32_t dt = c < d1 ? (int32_t)w->key[i0 + c] : INT32_MAX;
                    if (a < nr && rest[a] < dt)
                        mem[n++] = rest[a++];
                    else {
                        mem[n++] = dt;
                        c++;
                    }
                }
                int rc = make_bundle(w, &s, b, mem, n, 1, w->gsrc[j]);
                if (rc)
                    return rc;
            }
            int32_t nrem = nidle > off ? nidle - off : 0;
            if (nrem == 1) {
                int32_t x = (int32_t)w->key[i0 + off];
                if (x == b && !w->tri[x]) {
                    int rc = make_bundle(w, &s, b, &x, 1, 0, -1);
                    if (rc)
                        return rc;
                } else {
                    w->park[b] = x;        /* left alone until something else comes */
                }
            } else if (nrem >= 2) {        /* near-equal chunks, in row order */
                int32_t kk = (nrem + bundle - 1) / bundle;
                int32_t base = nrem / kk, extra = nrem - base * kk, pos = off;
                for (int32_t q = 0; q < kk; q++) {
                    int32_t sz = q < extra ? base + 1 : base;
                    for (int32_t r = 0; r < sz; r++)
                        mem[r] = (int32_t)w->key[i0 + pos + r];
                    pos += sz;
                    int rc = make_bundle(w, &s, b, mem, sz, 0, -1);
                    if (rc)
                        return rc;
                }
            }
        }
        /* next launch: due[0] <- due[1], groups <- new groups */
        int32_t *tmp = w->due[0];
        w->due[0] = w->due[1];
        w->due[1] = w->due[2];
        w->due[2] = tmp;
        ncur = n1;
        n1 = n2;
        n2 = 0;
        int32_t *g;
        g = w->gb; w->gb = w->gb2; w->gb2 = g;
        g = w->gn; w->gn = w->gn2; w->gn2 = g;
        g = w->gsrc; w->gsrc = w->gsrc2; w->gsrc2 = g;
        g = w->grest; w->grest = w->grest2; w->grest2 = g;
        ng = ng2;
    }
    /* every bucket ends with its upper triangular diagonal tile alone */
    for (int32_t b = 0; b < nfct; b++)
        w->park[b] = 0;
    for (int32_t i = 0; i < nrt; i++)
        if (w->gbk[i] >= 0)
            w->park[w->gbk[i]]++;
    for (int32_t b = 0; b < nfct; b++)
        if (w->park[b] != 1 || w->gbk[b] != b || !w->tri[b])
            return SGQ_FINAL;
    return SGQ_OK;
}

static int32_t ceil_pos(int32_t x, int32_t g) { return x > 0 ? (x + g - 1) / g : 0; }

/* Apply records of a bundle's reflector one launch later, and whether the first
 * granule is taken by an Apply+Factorize instead. */
static int32_t apply_count(const bundle_t *B, int32_t nct, int32_t nfct, int32_t granule,
                           int32_t pip, int32_t *af_next)
{
    int32_t ngran = ceil_pos(nct - B->b - 1, granule);
    *af_next = pip && B->n >= 2 && B->b + 1 < nfct;
    return ngran - *af_next;
}

/* One pattern's rows, in launch order: the Factorize and Apply+Factorize rows of
 * the bundles made at that launch, then the Apply runs of those made the launch
 * before (each in creation order). */
static int records(result_t *R, work_t *w, int64_t p, int32_t nct, int32_t nfct,
                   int32_t bundle, int32_t pip, int32_t granule)
{
    bundle_t *bn = w->bnd;
    int64_t nb = w->nbnd, nrun = 0;
    int32_t nl = 0;
    for (int64_t x = 0; x < nb; x++) {
        bn[x].napp = apply_count(&bn[x], nct, nfct, granule, pip, &bn[x].afn);
        nrun += bn[x].napp > 0;
        int32_t last = bn[x].napp > 0 ? bn[x].t + 1 : bn[x].t;
        if (last + 1 > nl)
            nl = last + 1;
    }
    if (grow((void **)&R->rp, &R->caprp, R->nptr + nl + 1, sizeof(int64_t))
        || grow((void **)&R->lp, &R->caplp, R->nptr + nl + 1, sizeof(int64_t))
        || grow((void **)&R->row, &R->caprow, R->nrow + nb + nrun, sizeof(row_t)))
        return SGQ_NOMEM;
    int64_t row0 = R->nrow;
    int64_t *rp = R->rp + R->nptr, *lp = R->lp + R->nptr;
    rp[0] = 0;
    lp[0] = 0;
    int64_t s = 0, a = 0;
    for (int32_t L = 0; L < nl; L++) {
        int64_t rows = 0, recs = 0;
        for (; s < nb && bn[s].t == L; s++) {
            const bundle_t *B = &bn[s];
            row_t *o = &R->row[R->nrow++];
            memset(o, 0, sizeof(row_t));
            for (int32_t k = 0; k < MAXS; k++)
                o->rows[k] = -1;
            o->f[C_NFROWS] = B->n;
            o->f[C_MULT] = 1;
            if (!B->af) {
                o->f[C_TYPE] = T_FACTORIZE;
                o->f[C_COL] = B->b;
                o->f[C_FLAGS] = B->trim;
                o->f[C_VT] = (int32_t)s;
                o->f[C_VT2] = -1;
                for (int32_t k = 0; k < bundle; k++)
                    o->rows[k] = B->tiles[k];
            } else {
                /* the source bundle (its Apply part), then the delta tiles */
                const bundle_t *S = &bn[B->src];
                int32_t sn = S->n, nd = 0, flags = 0;
                for (int32_t k = 0; k < bundle; k++)
                    o->rows[k] = S->tiles[k];
                int first_rest = 0;
                for (int32_t c = 0; c < B->n; c++) {
                    int rest = 0;
                    for (int32_t q = 1; q < sn; q++)
                        rest |= B->tiles[c] == S->tiles[q];
                    if (c == 0)
                        first_rest = rest;
                    if (!rest) {
                        int32_t slot = sn + nd++;
                        o->rows[slot] = B->tiles[c];
                        if (B->trim >> c & 1)
                            flags |= 1 << slot;
                    }
                }
                o->f[C_TYPE] = T_APPLY_FACTORIZE;
                o->f[C_COL] = B->b - 1;
                o->f[C_C0] = B->b;
                o->f[C_C1] = B->b + granule < nct ? B->b + granule : nct;
                o->f[C_NAPPLY] = sn;
                o->f[C_FSTART] = 1;
                o->f[C_FLAGS] = flags;
                o->f[C_FTOP] = first_rest ? 1 : sn;
                o->f[C_VT] = B->src;
                o->f[C_VT2] = (int32_t)s;
            }
            rows++;
            recs++;
        }
        for (; a < nb && bn[a].t <= L - 1; a++) {
            const bundle_t *B = &bn[a];
            int32_t napp = B->napp, afn = B->afn;
            if (napp <= 0)
                continue;
            row_t *o = &R->row[R->nrow++];
            memset(o, 0, sizeof(row_t));
            for (int32_t k = 0; k < MAXS; k++)
                o->rows[k] = k < bundle ? B->tiles[k] : -1;
            o->f[C_TYPE] = T_APPLY;
            o->f[C_COL] = B->b;
            o->f[C_C0] = B->b + 1 + afn * granule;
            o->f[C_C1] = o->f[C_C0] + granule;
            o->f[C_NAPPLY] = B->n;
            o->f[C_VT] = (int32_t)a;
            o->f[C_VT2] = -1;
            o->f[C_MULT] = napp;
            rows++;
            recs += napp;
        }
        rp[L + 1] = rp[L] + rows;
        lp[L + 1] = lp[L] + recs;
    }
    R->nptr += nl + 1;
    int64_t *pi = R->pinfo + 4 * p;
    pi[0] = nl;
    pi[1] = nb;
    pi[2] = row0;
    pi[3] = R->nrow;
    return SGQ_OK;
}

void sgq_free(void *h)
{
    result_t *R = (result_t *)h;
    if (!R)
        return;
    free(R->row);
    free(R->rp);
    free(R->lp);
    free(R->pinfo);
    free(R);
}

static void work_free(work_t *w)
{
    void *ps[] = {w->gbk, w->park, w->due[0], w->due[1], w->due[2], w->grest, w->gb, w->gn,
                  w->gsrc, w->grest2, w->gb2, w->gn2, w->gsrc2, w->tri, w->key, w->bnd};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        free(ps[i]);
}

/* Simulate P patterns (buckets end to end, nrt[p] row tiles each); returns a
 * handle for sgq_fetch (NULL on failure) and sizes[0..2] = rows, pointer
 * entries, status. */
void *sgq_simulate(int64_t P, const int32_t *buckets, const int64_t *nrt, const int64_t *nct,
                   const int64_t *nfct, int32_t bundle, int32_t pip, int32_t granule,
                   int64_t *sizes)
{
    sizes[0] = sizes[1] = 0;
    sizes[2] = SGQ_INPUT;
    if (bundle < 2 || bundle > MAXB || granule < 1 || P < 0)
        return NULL;
    int64_t mt = 1, mb = 1;
    for (int64_t p = 0; p < P; p++) {
        if (nrt[p] < 0 || nfct[p] < 0 || nfct[p] > nrt[p] || nrt[p] > INT32_MAX / 2
            || nct[p] < 0 || nct[p] > INT32_MAX / 2)
            return NULL;
        if (nrt[p] > mt)
            mt = nrt[p];
        if (nfct[p] > mb)
            mb = nfct[p];
    }
    sizes[2] = SGQ_NOMEM;
    result_t *R = (result_t *)calloc(1, sizeof(result_t));
    work_t w;
    memset(&w, 0, sizeof w);
    int rc = SGQ_NOMEM;
    if (!R || !(R->pinfo = (int64_t *)calloc((size_t)(4 * P + 1), sizeof(int64_t))))
        goto fail;
    w.gbk = malloc(mt * sizeof(int32_t));
    w.park = malloc(mb * sizeof(int32_t));
    for (int q = 0; q < 3; q++)
        w.due[q] = malloc(mt * sizeof(int32_t));
    w.grest = malloc(mt * (MAXB - 1) * sizeof(int32_t));
    w.grest2 = malloc(mt * (MAXB - 1) * sizeof(int32_t));
    w.gb = malloc(mt * sizeof(int32_t));
    w.gb2 = malloc(mt * sizeof(int32_t));
    w.gn = malloc(mt * sizeof(int32_t));
    w.gn2 = malloc(mt * sizeof(int32_t));
    w.gsrc = malloc(mt * sizeof(int32_t));
    w.gsrc2 = malloc(mt * sizeof(int32_t));
    w.tri = malloc(mt);
    w.key = malloc(mt * sizeof(int64_t));
    if (!w.gbk || !w.park || !w.due[0] || !w.due[1] || !w.due[2] || !w.grest || !w.grest2
        || !w.gb || !w.gb2 || !w.gn || !w.gn2 || !w.gsrc || !w.gsrc2 || !w.tri || !w.key)
        goto fail;
    const int32_t *b0 = buckets;
    for (int64_t p = 0; p < P; p++) {
        rc = simulate(&w, b0, (int32_t)nrt[p], (int32_t)nfct[p], bundle, pip);
        if (rc)
            goto fail;
        rc = records(R, &w, p, (int32_t)nct[p], (int32_t)nfct[p], bundle, pip, granule);
        if (rc)
            goto fail;
        b0 += nrt[p];
    }
    work_free(&w);
    sizes[0] = R->nrow;
    sizes[1] = R->nptr;
    sizes[2] = SGQ_OK;
    return R;
fail:
    work_free(&w);
    sgq_free(R);
    sizes[2] = rc;
    return NULL;
}

/* Copy the result out (caller's arrays: cols NCOL * nrow column-major by field,
 * rows nrow * MAXS, rp and lp nptr each, pinfo 4 * P) and free the handle. */
void sgq_fetch(void *h, int32_t *cols, int32_t *rows, int64_t *rp, int64_t *lp,
               int64_t *pinfo, int64_t P)
{
    result_t *R = (result_t *)h;
    int64_t n = R->nrow;
    for (int64_t r = 0; r < n; r++) {
        const row_t *o = &R->row[r];
        for (int c = 0; c < NCOL; c++)
            cols[c * n + r] = o->f[c];
        memcpy(rows + r * MAXS, o->rows, sizeof o->rows);
    }
    if (R->nptr) {
        memcpy(rp, R->rp, (size_t)R->nptr * sizeof(int64_t));
        memcpy(lp, R->lp, (size_t)R->nptr * sizeof(int64_t));
    }
    memcpy(pinfo, R->pinfo, (size_t)(4 * P) * sizeof(int64_t));
    sgq_free(R);
}

/* ------------------------------------------------------------------ records */

/* The task record (tasks.py's TASK_DTYPE, 96 bytes, C layout). */
typedef struct {
    int64_t F, vt, vt2, aux;
    int32_t type, fm, fn, col, c0, c1, nref, front;
    int16_t napply, nfrows, fstart;
    int8_t flags, ftop;
    int32_t rows[MAXS];
} task_t;

typedef char task_size_check[sizeof(task_t) == 96 ? 1 : -1];

/* bucket._element_rows: rows (column by column: type col c0 c1 napply nfrows
 * fstart flags ftop vt vt2, int32; the slots (n, MAXS)) as element-unit records
 * without the front's fields. */
void sgq_element_rows(int64_t n, const int64_t *colp, const int32_t *slots, int32_t tile,
                      task_t *out)
{
    const int32_t *c[11];
    for (int k = 0; k < 11; k++)
        c[k] = (const int32_t *)(intptr_t)colp[k];
    int64_t tt = (int64_t)tile * tile;
    for (int64_t r = 0; r < n; r++) {
        task_t *o = &out[r];
        memset(o, 0, sizeof *o);
        o->type = c[0][r];
        o->col = c[1][r] * tile;
        o->c0 = c[2][r] * tile;
        o->c1 = c[3][r] * tile;
        o->napply = (int16_t)c[4][r];
        o->nfrows = (int16_t)c[5][r];
        o->fstart = (int16_t)c[6][r];
        o->flags = (int8_t)c[7][r];
        o->ftop = (int8_t)c[8][r];
        o->vt = c[9][r] >= 0 ? c[9][r] * tt : -1;
        o->vt2 = c[10][r] >= 0 ? c[10][r] * tt : -1;
        for (int k = 0; k < MAXS; k++) {
            int32_t x = slots[r * MAXS + k];
            o->rows[k] = x >= 0 ? x * tile : -1;
        }
    }
}

/* sparse._StageMaker.records' factorization records: block j's template rows
 * [rstart[j], rstart[j] + rlen[j]) (each mult[row] times, the k-th an Apply
 * run's k-th granule) instantiated for front front[j] at out[dst[j]...]
 * (_Templates.fill). Returns 0, or -1 (writing stopped) when a block would not
 * fit in out[0..nout). */
int sgq_fill(int64_t nblk, const int64_t *rstart, const int64_t *rlen, const int64_t *front,
             const int64_t *dst, const task_t *tmpl, const int32_t *mult,
             const int64_t *foff, const int64_t *vt_base, const int32_t *fm,
             const int32_t *fn, const int32_t *nfact, int32_t tile, int32_t granule,
             task_t *out, int64_t nout)
{
    int32_t gt = granule * tile;
    for (int64_t j = 0; j < nblk; j++) {
        int64_t f = front[j], F = foff[f], vb = vt_base[f];
        int32_t m = fm[f], n = fn[f], nf = nfact[f];
        task_t *o = out + dst[j];
        for (int64_t r = rstart[j]; r < rstart[j] + rlen[j]; r++) {
            if (dst[j] < 0 || (o - out) + mult[r] > nout)
                return -1;                 /* the blocks do not fit: nothing sane to do */
            for (int32_t k = 0; k < mult[r]; k++, o++) {
                *o = tmpl[r];
                int af = o->type == T_APPLY_FACTORIZE;
                int32_t kg = k * gt;
                o->F = F;
                o->vt += vb;
                if (af)
                    o->vt2 += vb;
                o->fm = m;
                o->fn = n;
                o->c0 += kg;
                o->c1 = o->c1 + kg < n ? o->c1 + kg : n;
                o->nref = tile < nf - o->col ? tile : nf - o->col;
                o->front = (int32_t)f;
                o->aux = af ? (tile < nf - o->c0 ? tile : nf - o->c0) : 0;
            }
        }
    }
    return 0;
}

/* bucket.many_tile_buckets: the initial bucket of every front's row tiles (-1:
 * never factorized), out[] of sum(ceil(fm / tile)) entries; stair NULL: all
 * fronts dense. Returns 0, or -1 when a staircase decreases, its length is not
 * fn, or out does not hold nout = sum(ceil(fm / tile)) entries (nothing decided). */
int sgq_tile_buckets(int64_t nf, const int64_t *fm, const int64_t *fn, const int64_t *nfact,
                     const int64_t *stair, const int64_t *sp, int32_t tile, int32_t *out,
                     int64_t nout)
{
    int64_t need = 0;
    for (int64_t f = 0; f < nf; f++)
        need += fm[f] > 0 ? (fm[f] + tile - 1) / tile : 0;
    if (need != nout)
        return -1;
    int64_t at = 0;
    for (int64_t f = 0; f < nf; f++) {
        int64_t nrt = fm[f] > 0 ? (fm[f] + tile - 1) / tile : 0;
        int64_t nfct = nfact[f] > 0 ? (nfact[f] + tile - 1) / tile : 0;
        const int64_t *st = stair ? stair + sp[f] : NULL;
        int64_t n = fn[f], j = 0, last = 0;
        if (st && sp[f + 1] - sp[f] != n)
            return -1;
        if (st) {
            for (int64_t q = 1; q < n; q++)
                if (st[q] < st[q - 1])
                    return -1;
            last = n > 0 ? st[n - 1] : 0;
        }
        for (int64_t i = 0; i < nrt; i++) {
            int64_t first = i * tile, lead = 0;
            if (st) {
                /* columns whose staircase holds the tile's first row: lead = first
                 * column tile with a nonzero there; none past the staircase's end */
                while (j < n && st[j] <= first)
                    j++;
                lead = first >= last ? INT64_MAX / 2 : j / tile;
            }
            int64_t b = lead < i ? lead : i;
            out[at++] = b >= nfct ? -1 : (int32_t)b;
        }
    }
    return 0;
}

/* sparse._assembly_tasks, sorted by launch (stable): the S-Assemble records of
 * fronts first..last (schunk S entries each), then the Pack-Assemble records of
 * their children (pchunk entries each), each at its launch (asm_a, pack_a: in
 * stage order). out NULL: only count. Returns the number of records, or -1
 * when a launch falls outside [0, nlaunch) (nothing decided). */
/* sgq_assembly's record at launch L in pass 1: the next slot of L (at[L]++),
 * cleared, rows[first_unset:] = -1, its launch noted. */
static task_t *assembly_slot(task_t *out, int64_t *out_L, int64_t *at, int64_t L,
                             int first_unset)
{
    int64_t j = at[L]++;
    task_t *o = &out[j];
    memset(o, 0, sizeof *o);
    for (int k = first_unset; k < MAXS; k++)
        o->rows[k] = -1;
    out_L[j] = L;
    return o;
}

int64_t sgq_assembly(int64_t first, int64_t last, int64_t sid, const int64_t *s_ptr,
                     const int64_t *child_ptr, const int64_t *children, const int64_t *cm,
                     const int64_t *fn, const int64_t *fp, const int64_t *frank,
                     const int64_t *rimap_ptr, int64_t rimap_end, const int64_t *rjmap_ptr,
                     const int64_t *stage_of, const int64_t *foff, const int64_t *carried,
                     const int64_t *asm_a, const int64_t *pack_a, int64_t schunk,
                     int64_t pchunk, int64_t nlaunch, int64_t *at, task_t *out,
                     int64_t *out_L)
{
    int64_t nm = last - first + 1, sbase = s_ptr[first], n = 0;
    /* pass 0 counts per launch (at[L + 1]), pass 1 writes at at[L]++ */
    for (int pass = 0; pass < (out ? 2 : 1); pass++) {
        if (pass == 0)
            for (int64_t L = 0; L <= nlaunch; L++)
                at[L] = 0;
        else
            for (int64_t L = 0; L < nlaunch; L++)
                at[L + 1] += at[L];
        for (int64_t i = 0; i < nm; i++) {
            int64_t f = first + i, s0 = s_ptr[f] - sbase, s1 = s_ptr[f + 1] - sbase;
            int64_t L = asm_a[i];
            for (int64_t a = s0; a < s1; a += schunk) {
                if (pass == 0) {
                    if (L < 0 || L >= nlaunch)
                        return -1;
                    at[L + 1]++;
                    n++;
                    continue;
                }
                task_t *o = assembly_slot(out, out_L, at, L, 0);
                o->type = T_S_ASSEMBLE;
                o->F = foff[f];
                o->vt = a;
                o->vt2 = a + schunk < s1 ? a + schunk : s1;
                o->front = (int32_t)f;
            }
        }
        for (int64_t i = 0; i < nm; i++) {
            int64_t p = first + i;
            for (int64_t q = child_ptr[p]; q < child_ptr[p + 1]; q++) {
                int64_t c = children[q], cmc = cm[c], cn = fn[c] - fp[c];
                if (cmc <= 0 || cn <= 0)
                    continue;
                int car = stage_of[c] < sid;
                int64_t base = car ? carried[c] : foff[c] + frank[c] * fn[c] + fp[c];
                int64_t ld = car ? cn : fn[c];
                int64_t ci = c - first < 0 ? 0 : (c - first > nm - 1 ? nm - 1 : c - first);
                int64_t L = car ? 0 : pack_a[ci];
                int64_t per = pchunk / cn > 1 ? pchunk / cn : 1;
                for (int64_t r0 = 0; r0 < cmc; r0 += per) {
                    if (pass == 0) {
                        if (L < 0 || L >= nlaunch || (car && base < 0))
                            return -1;
                        at[L + 1]++;
                        n++;
                        continue;
                    }
                    task_t *o = assembly_slot(out, out_L, at, L, 2);
                    o->type = T_PACK_ASSEMBLE;
                    o->F = foff[p];
                    o->vt = base;
                    o->vt2 = rimap_ptr[c];
                    o->aux = rimap_end + rjmap_ptr[c];
                    o->fn = (int32_t)fn[p];
                    o->fm = (int32_t)cmc;
                    o->col = (int32_t)ld;
                    o->c1 = (int32_t)cn;
                    o->rows[0] = (int32_t)r0;
                    o->rows[1] = (int32_t)(r0 + per < cmc ? r0 + per : cmc);
                    o->front = (int32_t)c;
                    o->nfrows = 1;
                }
            }
        }
    }
    return n;
}

/* ------------------------------------------------------------------ arithmetic runs */

/* rlayout._arith_runs for runs [i0, i1): out[start[i] + k] = first[i] + step[i] * k,
 * k < length[i] (run i's entries, end to end; one write per entry). */
void sgq_arith_runs32(int64_t i0, int64_t i1, const int64_t *first, const int64_t *step,
                      const int64_t *length, const int64_t *start, int32_t *out)
{
    for (int64_t i = i0; i < i1; i++) {
        int32_t *o = out + start[i];
        int64_t v = first[i], d = step[i], n = length[i];
        for (int64_t k = 0; k < n; k++, v += d)
            o[k] = (int32_t)v;
    }
}

void sgq_arith_runs64(int64_t i0, int64_t i1, const int64_t *first, const int64_t *step,
                      const int64_t *length, const int64_t *start, int64_t *out)
{
    for (int64_t i = i0; i < i1; i++) {
        int64_t *o = out + start[i];
        int64_t v = first[i], d = step[i], n = length[i];
        for (int64_t k = 0; k < n; k++, v += d)
            o[k] = v;
    }
}

void sgq_scatter(int64_t i0, int64_t i1, const int64_t *pos, const void *src, void *out,
                 int32_t itemsize)
{
    if (itemsize == 8) {
        const uint64_t *a = (const uint64_t *)src;
        uint64_t *o = (uint64_t *)out;
        for (int64_t i = i0; i < i1; i++) o[pos[i]] = a[i];
    } else {
        const uint32_t *a = (const uint32_t *)src;
        uint32_t *o = (uint32_t *)out;
        for (int64_t i = i0; i < i1; i++) o[pos[i]] = a[i];
    }
}

/* Records k0..k1-1 of one launch (their writes are disjoint, as on the device):
 * rows r0[k]..r1[k]-1 and columns c0[k]..c1[k]-1 of the block at cb[k] (row
 * stride cld[k]) go to pool[par[k] + maps[ri[k] + r] * pld[k] + maps[rj[k] + c]],
 * only columns c >= r where tri[k]. 4- or 8-byte items. */
void sgq_pack(int64_t k0, int64_t k1, const int64_t *par, const int64_t *pld,
              const int64_t *cb, const int64_t *cld, const int64_t *ri, const int64_t *rj,
              const int64_t *r0, const int64_t *r1, const int64_t *c0, const int64_t *c1,
              const int64_t *tri, const int64_t *maps, void *pool, int32_t itemsize)
{
    for (int64_t k = k0; k < k1; k++) {
        for (int64_t r = r0[k]; r < r1[k]; r++) {
            int64_t dst = par[k] + maps[ri[k] + r] * pld[k];
            int64_t src = cb[k] + r * cld[k];
            int64_t c = tri[k] && r > c0[k] ? r : c0[k];
            const int64_t *cm = maps + rj[k];
            if (itemsize == 8) {
                uint64_t *o = (uint64_t *)pool;
                for (; c < c1[k]; c++) o[dst + cm[c]] = o[src + c];
            } else {
                uint32_t *o = (uint32_t *)pool;
                for (; c < c1[k]; c++) o[dst + cm[c]] = o[src + c];
            }
        }
    }
}
