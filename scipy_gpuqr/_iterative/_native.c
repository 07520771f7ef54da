/*
 * SciPy's LSQR and LSMR iteration loops in plain C99 (no Python headers),
 * for scipy_gpuqr/_iterative/native.py; built on first use by
 * scipy_gpuqr/_native_build.py with -ffp-contract=off (and never
 * -ffast-math).
 *
 * Every floating-point operation is the one the host loops
 * (scipy_gpuqr/_iterative/host.py, Python-float path) make, on the same
 * operands, in the same order, so that the iterates and the returned values
 * are SciPy's bit for bit:
 *
 *  - products: the loops of SciPy's sparsetools csr_matvec (a sum per row,
 *    started from the zero of a zeroed output) and csc_matvec (adding into
 *    a zeroed output, column after column);
 *  - dot products: the caller's BLAS ddot (NumPy's own, checked by the
 *    caller against numpy.dot), never a loop of ours: its kernels sum in
 *    several accumulators, with fused multiply-adds;
 *  - vector statements: one IEEE operation per entry, as NumPy's ufuncs;
 *  - scalars: C doubles are Python floats; x**2 is the C library's pow
 *    (as Python's float ** calls it), through a pointer the compiler cannot
 *    fold into x*x.  Python's int zeros (SciPy's initial 0s, _sym_ortho's
 *    0) differ from 0.0 only where negated (-0 is 0, -0.0 is not): those
 *    negations are made as Python makes them.
 *
 * Where the Python-float loop would raise (a division by zero, ** that
 * overflows, sqrt of a negative number) or any floating-point exception
 * flag (divide by zero, overflow, invalid) is raised, the run stops with
 * SGI_REPLAY before that iteration is reported: the caller then runs the
 * Python loops, which raise and replay as they do on their own.
 */

#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define SGI_ABI 4

/* outcomes */
#define SGI_DONE 0
#define SGI_REPLAY 1
#define SGI_REPORT_FAILED 2
#define SGI_NOT_FINITE 3

/* a report's answers */
#define REPORT_GO_ON 0
#define REPORT_STOP 1

/* the record a report reads: itn, istop, normr, normar, norma, conda, normx,
   test1, test2, rtol */
#define RECORD 10
/* rec's layout: the record, the gate (the first iteration to report; the
   caller sets it from a report, and each iteration that stops the run is
   reported whatever it says), then the records of the last WINDOW iterations
   (iteration i at row (i - 1) % WINDOW), from which a report that follows
   unreported iterations reads theirs */
#define GATE RECORD
#define RING (RECORD + 1)
/* kept (test1, test2, rtol) of the last iterations */
#define WINDOW 20
/* out's layout: istop, itn, the tuple's norms (six slots), exact start, reported; then,
   from OUT_STATE on, the recurrences' scalars after the run's last iteration (what a run
   that goes on elsewhere starts from: LSQR's alfa .. rtol, LSMR's alpha .. rtol, in the
   order of kernels/iterative/block_lsqr.cu's LsqrState and LsmrState) */
#define OUT_STATE 10

#define FLAGS (FE_DIVBYZERO | FE_OVERFLOW | FE_INVALID)

typedef double (*ddot_t)(int64_t, const double *, int64_t, const double *, int64_t);
typedef int (*report_t)(void);

int sgi_abi(void) { return SGI_ABI; }

/* the C library's pow, called (never folded into a product) */
static double (*volatile libm_pow)(double, double) = pow;

/* ------------------------------------------------------------------ */
/* the matrix and its two products                                     */

typedef struct {
    int64_t m, n;
    int csr;            /* 1: CSR arrays, 0: CSC */
    int wide;           /* 1: int64 indices, 0: int32 */
    const void *ptr, *idx;
    const double *val;
} matrix;

#define PRODUCTS(T, S)                                                            \
static void rows_##S(int64_t nrow, const T *Ap, const T *Aj, const double *Ax,   \
                     const double *x, double *y)                                   \
{                                                                                  \
    for (int64_t i = 0; i < nrow; i++) {                                          \
        double sum = 0.0;                                                          \
        for (T jj = Ap[i]; jj < Ap[i + 1]; jj++)                                   \
            sum += Ax[jj] * x[Aj[jj]];                                             \
        y[i] = sum;                                                                \
    }                                                                              \
}                                                                                  \
static void cols_##S(int64_t ncol, int64_t nrow, const T *Ap, const T *Ai,       \
                     const double *Ax, const double *x, double *y)                 \
{                                                                                  \
    memset(y, 0, (size_t)nrow * sizeof(double));                                   \
    for (int64_t j = 0; j < ncol; j++) {                                          \
        for (T ii = Ap[j]; ii < Ap[j + 1]; ii++)                                   \
            y[Ai[ii]] += Ax[ii] * x[j];                                            \
    }                                                                              \
}

PRODUCTS(int32_t, 32)
PRODUCTS(int64_t, 64)

/* y = A x (m entries): csr_matvec on CSR arrays, csc_matvec on CSC */
static void forward(const matrix *A, const double *x, double *y)
{
    if (A->wide) {
        if (A->csr) rows_64(A->m, A->ptr, A->idx, A->val, x, y);
        else cols_64(A->n, A->m, A->ptr, A->idx, A->val, x, y);
    } else {
        if (A->csr) rows_32(A->m, A->ptr, A->idx, A->val, x, y);
        else cols_32(A->n, A->m, A->ptr, A->idx, A->val, x, y);
    }
}

/* y = Aᵀ u (n entries): the same arrays read as the transpose's format */
static void backward(const matrix *A, const double *u, double *y)
{
    if (A->wide) {
        if (A->csr) cols_64(A->m, A->n, A->ptr, A->idx, A->val, u, y);
        else rows_64(A->n, A->ptr, A->idx, A->val, u, y);
    } else {
        if (A->csr) cols_32(A->m, A->n, A->ptr, A->idx, A->val, u, y);
        else rows_32(A->n, A->ptr, A->idx, A->val, u, y);
    }
}

/* exported for the caller's check of the products against SciPy's kernels */
void sgi_products(int64_t m, int64_t n, int csr, int wide, const void *ptr, const void *idx,
                  const double *val, const double *x, double *y, const double *u, double *z)
{
    matrix A = {m, n, csr, wide, ptr, idx, val};
    forward(&A, x, y);
    backward(&A, u, z);
}

/* whether every one of the n values of a is finite */
static int all_finite(const double *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

/* ------------------------------------------------------------------ */
/* Python's scalar operations                                          */

/* a / b; Python raises ZeroDivisionError where b is 0 */
static inline double dv(double a, double b, int *bad)
{
    if (b == 0) *bad = 1;
    return a / b;
}

/* math.sqrt; Python raises ValueError below 0 */
static inline double root(double a, int *bad)
{
    if (a < 0) *bad = 1;
    return sqrt(a);
}

/* Python's float a ** 2: 0.0 for a zero, pow(|a|, 2) otherwise (the sign
   of an even power is +); OverflowError where a finite a gives inf */
static inline double sq(double a, int *bad)
{
    double r;
    if (a == 0) return 0.0;
    if (isnan(a)) return a;
    r = libm_pow(fabs(a), 2.0);
    if (isinf(r) && isfinite(a)) *bad = 1;
    return r;
}

/* the sign as host.py's _sign (numpy.sign): 1, -1, 0 for either zero, NaN itself */
static inline double sgn(double a)
{
    if (a > 0) return 1.0;
    if (a < 0) return -1.0;
    return a == 0 ? 0.0 : a;
}

/* -a of a value that is Python's int 0 where int0: 0, never -0.0 */
static inline double neg(double a, int int0)
{
    return int0 ? 0.0 : -a;
}

/* SciPy's _sym_ortho(a, b) -> (c, s, r); c_int0 / s_int0: that c / s is
   the int 0 it returns */
static void sym_ortho(double a, double b, double *c, double *s, double *r, int *c_int0,
                      int *s_int0, int *bad)
{
    double tau;
    *c_int0 = *s_int0 = 0;
    if (b == 0) {
        *c = sgn(a); *s = 0.0; *s_int0 = 1; *r = fabs(a);
        return;
    }
    if (a == 0) {
        *c = 0.0; *c_int0 = 1; *s = sgn(b); *r = fabs(b);
        return;
    }
    if (fabs(b) > fabs(a)) {
        tau = a / b;
        *s = dv(sgn(b), root(1 + tau * tau, bad), bad);
        *c = *s * tau;
        *r = dv(b, *s, bad);
        return;
    }
    tau = b / a;
    *c = dv(sgn(a), root(1 + tau * tau, bad), bad);
    *s = *c * tau;
    *r = dv(a, *c, bad);
}

/* the C library's max/min as Python's max(a, b) / min(a, b) */
static inline double pmax(double a, double b) { return b > a ? b : a; }
static inline double pmin(double a, double b) { return b < a ? b : a; }

static int stopping_code(int64_t itn, int64_t iter_lim, double test1, double test2,
                         double test3, double t1, double rtol, double atol, double ctol)
{
    int istop = 0;
    if (itn >= iter_lim) istop = 7;
    if (1 + test3 <= 1) istop = 6;
    if (1 + test2 <= 1) istop = 5;
    if (1 + t1 <= 1) istop = 4;
    if (test3 <= ctol) istop = 3;
    if (test2 <= atol) istop = 2;
    if (test1 <= rtol) istop = 1;
    return istop;
}

static inline void scale(double *v, int64_t n, double k)
{
    for (int64_t i = 0; i < n; i++) v[i] = v[i] * k;
}

/* ------------------------------------------------------------------ */
/* the first Golub--Kahan step (host.py's _bidiagonal_start)           */

/* x (x0 or zeros, given), u and v (buffers), t (m scratch); returns beta and
   alpha; u = (1/beta)(b - A x), v = Aᵀu / alpha. Where beta is 0 the run
   ends at its start (alpha*beta = 0), so u and v are then left as they are. */
static void start(const matrix *A, const double *b, int has_x0, const double *x, double normb,
                  ddot_t ddot, double *u, double *v, double *t, double *beta_out,
                  double *alpha_out, int *bad)
{
    int64_t m = A->m, n = A->n, i;
    double beta, alpha = 0, k;
    if (!has_x0) {
        beta = normb;
        memcpy(u, b, (size_t)m * sizeof(double));
    } else {
        forward(A, x, t);
        for (i = 0; i < m; i++) u[i] = b[i] - t[i];
        beta = root(ddot(m, u, 1, u, 1), bad);
    }
    if (beta > 0) {
        k = 1 / beta;
        for (i = 0; i < m; i++) u[i] = k * u[i];
        backward(A, u, v);
        alpha = root(ddot(n, v, 1, v, 1), bad);
    }
    if (alpha > 0) {
        k = 1 / alpha;
        scale(v, n, k);
    }
    *beta_out = beta;
    *alpha_out = alpha;
}

static inline void remember(double *hist, int64_t itn, double test1, double test2, double rtol)
{
    double *h = hist + 3 * ((itn - 1) % WINDOW);
    h[0] = test1; h[1] = test2; h[2] = rtol;
}

/* the iteration's record in rec's ring; 1 where it is to be reported (then also in the
   record a report reads): it stops the run, or the gate has been reached */
static inline int fill_record(double *rec, int64_t itn, int istop, double normr, double normar,
                              double norma, double conda, double normx, double test1,
                              double test2, double rtol)
{
    double *row = rec + RING + RECORD * ((itn - 1) % WINDOW);
    row[0] = (double)itn; row[1] = istop; row[2] = normr; row[3] = normar; row[4] = norma;
    row[5] = conda; row[6] = normx; row[7] = test1; row[8] = test2; row[9] = rtol;
    if (istop == 0 && (double)itn < rec[GATE]) return 0;
    memcpy(rec, row, RECORD * sizeof(double));
    return 1;
}

/* what the loop does after an iteration's end */
enum { END_GO_ON, END_STOP, END_REPORT_FAILED };

/* An iteration's end, after its stopping tests: the history kept; then, where a caller
   watches (report), the record reported where fill_record says so, and the caller's answer
   decides (REPORT_STOP ends the run, a negative one fails it); where none watches, a
   stopping code ends the run. *reported: the last iteration reported. */
static int end_iteration(double *hist, double *rec, report_t report, int64_t itn, int istop,
                         double normr, double normar, double norma, double conda, double normx,
                         double test1, double test2, double rtol, int64_t *reported)
{
    int answer;
    remember(hist, itn, test1, test2, rtol);
    if (report == NULL) return istop != 0 ? END_STOP : END_GO_ON;
    if (!fill_record(rec, itn, istop, normr, normar, norma, conda, normx, test1, test2, rtol))
        return END_GO_ON;
    *reported = itn;
    answer = report();
    feclearexcept(FE_ALL_EXCEPT);   /* the report's flags are not the run's */
    if (answer < 0) return END_REPORT_FAILED;
    return answer == REPORT_STOP ? END_STOP : END_GO_ON;
}

/* ------------------------------------------------------------------ */
/* LSQR (scipy/sparse/linalg/_isolve/lsqr.py; host.py's _lsqr_body)     */

/*
 * par: damp, dampsq, atol, btol, conlim.
 * x (n): x0's copy or zeros, the result; var (n): zeros, the result.
 * work: 2 m + 4 n doubles.  hist: 3 WINDOW doubles.  rec: RING + RECORD WINDOW
 * doubles (see GATE and RING), the record filled before each call of report
 * (NULL: no reports); its gate set by the caller (0: report every iteration).
 * out: istop, itn, r1norm, r2norm, anorm, acond, arnorm, xnorm,
 *      exact start (1/0), reported (iterations reported); then (OUT_STATE) alfa, anorm,
 *      acond, ddnorm, res2, xnorm, xxnorm, z, cs2, sn2, rhobar, phibar, r1norm, r2norm,
 *      arnorm, bnorm, test1, test2, rtol.  u, v and w are then work's m entries from 0,
 *      n from 2 m and n from 2 m + n.
 * nval >= 0: first check that A's nval stored values and b's m are finite
 * (SGI_NOT_FINITE, nothing else done, where one is not); -1: no check.
 */
int sgi_lsqr(int64_t m, int64_t n, int csr, int wide, const void *ptr, const void *idx,
             const double *val, const double *b, int has_x0, double *x, double *var,
             double *work, const double *par, int64_t iter_lim, int calc_var, ddot_t ddot,
             report_t report, double *rec, double *hist, double *out, int64_t nval)
{
    matrix A = {m, n, csr, wide, ptr, idx, val};
    const double damp = par[0], dampsq = par[1], atol = par[2], btol = par[3],
                 conlim = par[4];
    const double eps = 2.220446049250313e-16;
    double *u = work, *t = work + m, *v = work + 2 * m, *w = v + n, *s = w + n, *dk = s + n;
    int bad = 0, istop = 0, damped = damp > 0, cs_int0, sn_int0, end;
    int64_t itn = 0, reported = 0, i;
    double ctol = 0, anorm = 0, acond = 0, ddnorm = 0, res2 = 0, xnorm = 0, xxnorm = 0, z = 0,
           cs2 = -1, sn2 = 0;
    double bnorm, beta, alfa, rhobar, phibar, rnorm, r1norm, r2norm, arnorm, k;
    double rhobar1, cs1, sn1, psi, cs, sn, rho, theta, phi, tau, t1, t2, delta, gambar, rhs,
           zbar, gamma, res1, r1sq, test1 = 1, test2 = 0, test3, rtol = 0;
    double *st = out + OUT_STATE;
    if (nval >= 0 && !(all_finite(val, nval) && all_finite(b, m))) return SGI_NOT_FINITE;
    feclearexcept(FE_ALL_EXCEPT);
    if (conlim > 0) ctol = 1 / conlim;
    bnorm = root(ddot(m, b, 1, b, 1), &bad);
    start(&A, b, has_x0, x, bnorm, ddot, u, v, t, &beta, &alfa, &bad);
    memcpy(w, v, (size_t)n * sizeof(double));
    rhobar = alfa;
    phibar = beta;
    rnorm = beta;
    r1norm = rnorm;
    r2norm = rnorm;
    arnorm = alfa * beta;
    out[8] = 0;
    if (bad || fetestexcept(FLAGS)) goto replay;
    if (arnorm == 0) {
        out[8] = 1;
        goto done;
    }
    if (bnorm == 0) goto replay;        /* x0 with b = 0: SciPy's tests divide by 0 */

    while (itn < iter_lim) {
        itn = itn + 1;
        forward(&A, v, t);
        for (i = 0; i < m; i++) u[i] = t[i] - u[i] * alfa;
        beta = root(ddot(m, u, 1, u, 1), &bad);
        if (beta > 0) {
            k = 1 / beta;
            scale(u, m, k);
            anorm = root(sq(anorm, &bad) + sq(alfa, &bad) + sq(beta, &bad) + dampsq, &bad);
            backward(&A, u, s);
            for (i = 0; i < n; i++) v[i] = s[i] - v[i] * beta;
            alfa = root(ddot(n, v, 1, v, 1), &bad);
            if (alfa > 0) {
                k = 1 / alfa;
                scale(v, n, k);
            }
        }

        if (damped) {
            rhobar1 = root(sq(rhobar, &bad) + dampsq, &bad);
            cs1 = dv(rhobar, rhobar1, &bad);
            sn1 = dv(damp, rhobar1, &bad);
            psi = sn1 * phibar;
            phibar = cs1 * phibar;
        } else {
            rhobar1 = rhobar;
            psi = 0.;
        }
        sym_ortho(rhobar1, beta, &cs, &sn, &rho, &cs_int0, &sn_int0, &bad);
        theta = sn * alfa;
        rhobar = neg(cs, cs_int0) * alfa;
        phi = cs * phibar;
        phibar = sn * phibar;
        tau = sn * phi;

        t1 = dv(phi, rho, &bad);
        t2 = dv(-theta, rho, &bad);
        k = dv(1, rho, &bad);
        for (i = 0; i < n; i++) dk[i] = w[i] * k;
        for (i = 0; i < n; i++) x[i] = x[i] + w[i] * t1;
        for (i = 0; i < n; i++) w[i] = w[i] * t2 + v[i];
        ddnorm = ddnorm + sq(root(ddot(n, dk, 1, dk, 1), &bad), &bad);
        if (calc_var)
            for (i = 0; i < n; i++) var[i] = var[i] + dk[i] * dk[i];

        delta = sn2 * rho;
        gambar = -cs2 * rho;
        rhs = phi - delta * z;
        zbar = dv(rhs, gambar, &bad);
        xnorm = root(xxnorm + sq(zbar, &bad), &bad);
        gamma = root(sq(gambar, &bad) + sq(theta, &bad), &bad);
        cs2 = dv(gambar, gamma, &bad);
        sn2 = dv(theta, gamma, &bad);
        z = dv(rhs, gamma, &bad);
        xxnorm = xxnorm + sq(z, &bad);

        acond = anorm * root(ddnorm, &bad);
        res1 = sq(phibar, &bad);
        res2 = res2 + sq(psi, &bad);
        rnorm = root(res1 + res2, &bad);
        arnorm = alfa * fabs(tau);
        if (damped) {
            r1sq = sq(rnorm, &bad) - dampsq * xxnorm;
            r1norm = root(fabs(r1sq), &bad);
            if (r1sq < 0) r1norm = -r1norm;
        } else {
            r1norm = rnorm;
        }
        r2norm = rnorm;

        test1 = dv(rnorm, bnorm, &bad);
        test2 = dv(arnorm, anorm * rnorm + eps, &bad);
        test3 = dv(1, acond + eps, &bad);
        t1 = dv(test1, 1 + dv(anorm * xnorm, bnorm, &bad), &bad);
        rtol = btol + dv(atol * anorm * xnorm, bnorm, &bad);
        istop = stopping_code(itn, iter_lim, test1, test2, test3, t1, rtol, atol, ctol);
        if (bad || fetestexcept(FLAGS)) goto replay;
        end = end_iteration(hist, rec, report, itn, istop, r2norm, arnorm, anorm, acond, xnorm,
                            test1, test2, rtol, &reported);
        if (end == END_REPORT_FAILED) {
            out[9] = (double)reported;
            return SGI_REPORT_FAILED;
        }
        if (end == END_STOP) break;
    }
done:
    out[0] = istop; out[1] = (double)itn; out[2] = r1norm; out[3] = r2norm; out[4] = anorm;
    out[5] = acond; out[6] = arnorm; out[7] = xnorm; out[9] = (double)reported;
    st[0] = alfa; st[1] = anorm; st[2] = acond; st[3] = ddnorm; st[4] = res2; st[5] = xnorm;
    st[6] = xxnorm; st[7] = z; st[8] = cs2; st[9] = sn2; st[10] = rhobar; st[11] = phibar;
    st[12] = r1norm; st[13] = r2norm; st[14] = arnorm; st[15] = bnorm; st[16] = test1;
    st[17] = test2; st[18] = rtol;
    return SGI_DONE;
replay:
    out[1] = (double)itn;
    out[9] = (double)reported;
    return SGI_REPLAY;
}

/* ------------------------------------------------------------------ */
/* LSMR (scipy/sparse/linalg/_isolve/lsmr.py; host.py's _lsmr_body)     */

/*
 * par: damp, atol, btol, conlim.
 * x (n): x0's copy or zeros, the result.  work: 2 m + 4 n doubles.
 * hist, rec, report as sgi_lsqr's.
 * out: istop, itn, normr, normar, normA, condA, normx, -,
 *      exact start (1/0), reported; then (OUT_STATE) alpha, zetabar, alphabar, rho, rhobar,
 *      cbar, sbar, betadd, betad, rhodold, tautildeold, thetatilde, zeta, d, normA2,
 *      maxrbar, minrbar, normA, condA, normx, normr, normar, normb, test1, test2, rtol.
 *      u, v, h and hbar are then work's m entries from 0, n from 2 m, n from 2 m + n and
 *      n from 2 m + 2 n.
 * nval as sgi_lsqr's.
 */
int sgi_lsmr(int64_t m, int64_t n, int csr, int wide, const void *ptr, const void *idx,
             const double *val, const double *b, int has_x0, double *x, double *work,
             const double *par, int64_t maxiter, ddot_t ddot, report_t report, double *rec,
             double *hist, double *out, int64_t nval)
{
    matrix A = {m, n, csr, wide, ptr, idx, val};
    const double damp = par[0], atol = par[1], btol = par[2], conlim = par[3];
    double *u = work, *t = work + m, *v = work + 2 * m, *h = v + n, *hbar = h + n, *s = hbar + n;
    int bad = 0, istop = 0, undamped = damp == 0, end;
    int s_int0, ignored, sbar_int0, st_int0;
    int64_t itn = 0, reported = 0, i;
    double normb, beta, alpha, zetabar, alphabar, rho = 1, rhobar = 1, cbar = 1, sbar = 0,
           betadd, betad = 0, rhodold = 1, tautildeold = 0, thetatilde = 0, zeta = 0, d = 0,
           normA2, maxrbar = 0, minrbar = 1e+100, normA, condA = 1, normx = 0, ctol = 0,
           normr, normar, k;
    double chat, shat, alphahat, rhoold, c, sn, thetanew, rhobarold, zetaold, thetabar,
           rhotemp, betaacute, betacheck, betahat, thetatildeold, ctildeold, stildeold,
           rhotildeold, taud, test1 = 1, test2 = 0, test3, t1, rtol = 0;
    double *st = out + OUT_STATE;
    if (nval >= 0 && !(all_finite(val, nval) && all_finite(b, m))) return SGI_NOT_FINITE;
    feclearexcept(FE_ALL_EXCEPT);
    normb = root(ddot(m, b, 1, b, 1), &bad);
    start(&A, b, has_x0, x, normb, ddot, u, v, t, &beta, &alpha, &bad);
    zetabar = alpha * beta;
    alphabar = alpha;
    memcpy(h, v, (size_t)n * sizeof(double));
    memset(hbar, 0, (size_t)n * sizeof(double));
    betadd = beta;
    normA2 = alpha * alpha;
    normA = root(normA2, &bad);
    if (conlim > 0) ctol = dv(1, conlim, &bad);
    normr = beta;
    normar = alpha * beta;
    out[8] = 0;
    if (bad || fetestexcept(FLAGS)) goto replay;
    if (normar == 0 || normb == 0) {
        if (normar != 0) memset(x, 0, (size_t)n * sizeof(double));
        out[8] = 1;
        goto done;
    }

    while (itn < maxiter) {
        itn = itn + 1;
        scale(u, m, -alpha);
        forward(&A, v, t);
        for (i = 0; i < m; i++) u[i] = u[i] + t[i];
        beta = root(ddot(m, u, 1, u, 1), &bad);
        if (beta > 0) {
            k = 1 / beta;
            scale(u, m, k);
            scale(v, n, -beta);
            backward(&A, u, s);
            for (i = 0; i < n; i++) v[i] = v[i] + s[i];
            alpha = root(ddot(n, v, 1, v, 1), &bad);
            if (alpha > 0) {
                k = 1 / alpha;
                scale(v, n, k);
            }
        }

        if (undamped) {             /* what _sym_ortho(alphabar, 0) returns */
            chat = sgn(alphabar);
            shat = 0.0;
            alphahat = fabs(alphabar);
        } else {
            sym_ortho(alphabar, damp, &chat, &shat, &alphahat, &ignored, &ignored, &bad);
        }
        rhoold = rho;
        sym_ortho(alphahat, beta, &c, &sn, &rho, &ignored, &s_int0, &bad);
        thetanew = sn * alpha;
        alphabar = c * alpha;
        rhobarold = rhobar;
        zetaold = zeta;
        thetabar = sbar * rho;
        rhotemp = cbar * rho;
        sym_ortho(cbar * rho, thetanew, &cbar, &sbar, &rhobar, &ignored, &sbar_int0, &bad);
        zeta = cbar * zetabar;
        zetabar = neg(sbar, sbar_int0) * zetabar;

        k = -dv(thetabar * rho, rhoold * rhobarold, &bad);
        for (i = 0; i < n; i++) hbar[i] = hbar[i] * k + h[i];
        k = dv(zeta, rho * rhobar, &bad);
        for (i = 0; i < n; i++) x[i] = x[i] + hbar[i] * k;
        k = -dv(thetanew, rho, &bad);
        for (i = 0; i < n; i++) h[i] = h[i] * k + v[i];

        betaacute = chat * betadd;
        /* shat is the int 0 when undamped; a damped _sym_ortho(alphabar, damp)
           never returns an int s (damp is not 0) */
        betacheck = neg(shat, undamped) * betadd;
        betahat = c * betaacute;
        betadd = neg(sn, s_int0) * betaacute;
        thetatildeold = thetatilde;
        sym_ortho(rhodold, thetabar, &ctildeold, &stildeold, &rhotildeold, &ignored, &st_int0,
                  &bad);
        thetatilde = stildeold * rhobar;
        rhodold = ctildeold * rhobar;
        betad = neg(stildeold, st_int0) * betad + ctildeold * betahat;
        tautildeold = dv(zetaold - thetatildeold * tautildeold, rhotildeold, &bad);
        taud = dv(zeta - thetatilde * tautildeold, rhodold, &bad);
        d = d + betacheck * betacheck;
        normr = root(d + sq(betad - taud, &bad) + betadd * betadd, &bad);
        normA2 = normA2 + beta * beta;
        normA = root(normA2, &bad);
        normA2 = normA2 + alpha * alpha;
        maxrbar = pmax(maxrbar, rhobarold);
        if (itn > 1) minrbar = pmin(minrbar, rhobarold);
        condA = dv(pmax(maxrbar, rhotemp), pmin(minrbar, rhotemp), &bad);
        normar = fabs(zetabar);
        normx = root(ddot(n, x, 1, x, 1), &bad);

        test1 = dv(normr, normb, &bad);
        if ((normA * normr) != 0) test2 = normar / (normA * normr);
        else test2 = INFINITY;
        test3 = dv(1, condA, &bad);
        t1 = dv(test1, 1 + dv(normA * normx, normb, &bad), &bad);
        rtol = btol + dv(atol * normA * normx, normb, &bad);
        istop = stopping_code(itn, maxiter, test1, test2, test3, t1, rtol, atol, ctol);
        if (bad || fetestexcept(FLAGS)) goto replay;
        end = end_iteration(hist, rec, report, itn, istop, normr, normar, normA, condA, normx,
                            test1, test2, rtol, &reported);
        if (end == END_REPORT_FAILED) {
            out[9] = (double)reported;
            return SGI_REPORT_FAILED;
        }
        if (end == END_STOP) break;
    }
done:
    out[0] = istop; out[1] = (double)itn; out[2] = normr; out[3] = normar; out[4] = normA;
    out[5] = condA; out[6] = normx; out[9] = (double)reported;
    st[0] = alpha; st[1] = zetabar; st[2] = alphabar; st[3] = rho; st[4] = rhobar; st[5] = cbar;
    st[6] = sbar; st[7] = betadd; st[8] = betad; st[9] = rhodold; st[10] = tautildeold;
    st[11] = thetatilde; st[12] = zeta; st[13] = d; st[14] = normA2; st[15] = maxrbar;
    st[16] = minrbar; st[17] = normA; st[18] = condA; st[19] = normx; st[20] = normr;
    st[21] = normar; st[22] = normb; st[23] = test1; st[24] = test2; st[25] = rtol;
    return SGI_DONE;
replay:
    out[1] = (double)itn;
    out[9] = (double)reported;
    return SGI_REPLAY;
}
