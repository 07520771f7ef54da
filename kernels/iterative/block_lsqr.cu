// SciPy's LSQR and LSMR in one thread block: many iterations per launch, no host copy
// between them.
//
// For problems whose products take microseconds, a run of SciPy's algorithm over
// CuPy kernels costs its launches and one device->host copy per iteration (tens to
// hundreds of microseconds), far more than the arithmetic. Here one block runs the
// Golub-Kahan bidiagonalization, the plane rotations, the norm estimates and SciPy's
// stopping tests (scipy/sparse/linalg/_isolve/lsqr.py and lsmr.py, statement for
// statement) for as many iterations as the launch allows, checking the tests after
// every iteration. Every thread holds the scalar recurrences in registers and
// computes them identically from the same block-wide sums, so no scalar is
// broadcast; only thread 0 writes the state and the history.
//
// Products: thread i owns rows i, i + THREADS, ... (A v by A's CSR, a gather) and
// columns j, j + THREADS, ... (A^T u by A's CSC, a gather in ascending row order, the
// order of SciPy's csc_matvec on A.T). u and v are kept unscaled with their scale
// factors (1/beta, 1/alpha, or 1 where SciPy leaves the vector unscaled): a thread
// reads other threads' entries only in a product, after the block-wide sum that
// made the scale, so a phase never writes what another thread of it reads. Sums
// are block tree reductions in a fixed order: a run is deterministic.
//
// A launch returns when a stopping test fires or the iteration count reaches
// `stop_at`; the state (below) lets the next launch go on where it stopped, so the
// host can watch a long run between launches (the iterate-first rule) at a few
// launches' cost. Host side: scipy_gpuqr/_iterative/block.py (its STATE fields
// mirror the enums here; a test compares them).

#ifndef BLOCK_LSQR_MAX_THREADS
#define BLOCK_LSQR_MAX_THREADS 1024
#endif

namespace gpuqr {
namespace block_lsqr {

// Inputs and options (input, not modified): the first slots of `state`.
enum Options {
    OPT_DAMP = 0, OPT_ATOL, OPT_BTOL, OPT_CTOL, OPT_ITER_LIM, OPT_CALC_VAR, OPT_HAS_X0,
    OPT_HIST_ROWS, N_OPTIONS
};

// LSQR's scalar recurrences, named as in SciPy (input and output: the next launch
// goes on from them).
enum LsqrState {
    LQ_STARTED = N_OPTIONS, LQ_DONE, LQ_ITN, LQ_ISTOP, LQ_SU, LQ_SV, LQ_ALFA, LQ_ANORM,
    LQ_ACOND, LQ_DDNORM, LQ_RES2, LQ_XNORM, LQ_XXNORM, LQ_Z, LQ_CS2, LQ_SN2, LQ_RHOBAR,
    LQ_PHIBAR, LQ_R1NORM, LQ_R2NORM, LQ_ARNORM, LQ_BNORM, LQ_TEST1, LQ_TEST2, LQ_RTOL,
    LQ_END
};

// LSMR's scalar recurrences.
enum LsmrState {
    LM_STARTED = N_OPTIONS, LM_DONE, LM_ITN, LM_ISTOP, LM_SU, LM_SV, LM_ALPHA, LM_ZETABAR,
    LM_ALPHABAR, LM_RHO, LM_RHOBAR, LM_CBAR, LM_SBAR, LM_BETADD, LM_BETAD, LM_RHODOLD,
    LM_TAUTILDEOLD, LM_THETATILDE, LM_ZETA, LM_D, LM_NORMA2, LM_MAXRBAR, LM_MINRBAR,
    LM_NORMA, LM_CONDA, LM_NORMX, LM_NORMR, LM_NORMAR, LM_NORMB, LM_TEST1, LM_TEST2,
    LM_RTOL, LM_END
};

// One history row per iteration (a ring of OPT_HIST_ROWS rows, row (itn - 1) mod rows):
// what the host's callback sees.
enum History {
    H_ISTOP = 0, H_NORMR, H_NORMAR, H_NORMA, H_CONDA, H_NORMX, H_TEST1, H_TEST2, H_RTOL,
    H_FIELDS
};

struct Csr {            // one compressed matrix: pointers, indices, values
    const int* ptr;
    const int* idx;
    const double* val;
};

// The sum of `value` over the block, in a fixed order; every thread gets it.
template <int THREADS>
__device__ double block_sum(double value, double* scratch) {
    const int t = threadIdx.x;
    scratch[t] = value;
    __syncthreads();
#pragma unroll
    for (int half = THREADS / 2; half > 0; half >>= 1) {
        if (t < half) scratch[t] += scratch[t + half];
        __syncthreads();
    }
    const double total = scratch[0];
    __syncthreads();
    return total;
}

// Row `i` of M times the vector whose entry k is raw[k] * scale.
__device__ __forceinline__ double gather(const Csr& M, int i, const double* raw,
                                         double scale) {
    double s = 0.0;
    for (int k = M.ptr[i]; k < M.ptr[i + 1]; ++k) s += M.val[k] * (raw[M.idx[k]] * scale);
    return s;
}

__device__ __forceinline__ double sign_of(double a) {
    return a > 0 ? 1.0 : (a < 0 ? -1.0 : (a == 0 ? 0.0 : a));
}

// SciPy's _sym_ortho: [c s; -s c] [a; b] = [r; 0], r >= 0.
__device__ void sym_ortho(double a, double b, double& c, double& s, double& r) {
    if (b == 0) {
        c = sign_of(a); s = 0; r = fabs(a);
    } else if (a == 0) {
        c = 0; s = sign_of(b); r = fabs(b);
    } else if (fabs(b) > fabs(a)) {
        const double tau = a / b;
        s = sign_of(b) / sqrt(1 + tau * tau);
        c = s * tau;
        r = b / s;
    } else {
        const double tau = b / a;
        c = sign_of(a) / sqrt(1 + tau * tau);
        s = c * tau;
        r = a / c;
    }
}

// SciPy's istop: the last test that holds wins.
__device__ int stopping_code(double itn, double iter_lim, double test1, double test2,
                             double test3, double t1, double rtol, double atol, double ctol) {
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

// Iteration itn's row of the history ring (row (itn - 1) mod rows; none without rows).
__device__ void record_history(double* hist, int rows, int itn, int istop, double normr,
                               double normar, double norma, double conda, double normx,
                               double test1, double test2, double rtol) {
    if (rows <= 0) return;
    double* h = hist + (long long)((itn - 1) % rows) * H_FIELDS;
    h[H_ISTOP] = istop; h[H_NORMR] = normr; h[H_NORMAR] = normar;
    h[H_NORMA] = norma; h[H_CONDA] = conda; h[H_NORMX] = normx;
    h[H_TEST1] = test1; h[H_TEST2] = test2; h[H_RTOL] = rtol;
}

// The first Golub-Kahan step, shared by both: x (x0 or 0), u = b - A x unscaled with
// su, v = A^T u unscaled with sv, beta and alpha. Where beta = 0 SciPy's lsqr takes
// v = x and its lsmr v = 0 (`v_is_x`), alpha = 0. Returns ||b||.
template <int THREADS>
__device__ double start(int m, int n, const Csr& A, const Csr& At, const double* b,
                        const double* x0, bool has_x0, double* u, double* v, double* x,
                        bool v_is_x, double* scratch, double& beta, double& alpha,
                        double& su, double& sv) {
    const int t = threadIdx.x;
    double acc = 0.0;
    for (int i = t; i < m; i += THREADS) acc += b[i] * b[i];
    const double normb = sqrt(block_sum<THREADS>(acc, scratch));
    for (int j = t; j < n; j += THREADS) x[j] = has_x0 ? x0[j] : 0.0;
    __syncthreads();
    acc = 0.0;
    for (int i = t; i < m; i += THREADS) {
        const double ui = has_x0 ? b[i] - gather(A, i, x, 1.0) : b[i];
        u[i] = ui;
        acc += ui * ui;
    }
    const double bb = block_sum<THREADS>(acc, scratch);
    beta = has_x0 ? sqrt(bb) : normb;
    alpha = 0.0;
    su = sv = 1.0;
    if (beta > 0) {
        su = 1 / beta;
        acc = 0.0;
        for (int j = t; j < n; j += THREADS) {
            const double vj = gather(At, j, u, su);
            v[j] = vj;
            acc += vj * vj;
        }
        alpha = sqrt(block_sum<THREADS>(acc, scratch));
        if (alpha > 0) sv = 1 / alpha;
    } else {
        for (int j = t; j < n; j += THREADS) v[j] = v_is_x ? x[j] : 0.0;
    }
    return normb;
}

// One bidiagonalization step: u = A v - alpha u (unscaled, su), and where beta > 0
// v = A^T u - beta v (unscaled, sv). Returns beta; alpha and the scales updated.
template <int THREADS>
__device__ double bidiagonalize(int m, int n, const Csr& A, const Csr& At, double* u,
                                double* v, double* scratch, double& alpha, double& su,
                                double& sv) {
    const int t = threadIdx.x;
    double acc = 0.0;
    for (int i = t; i < m; i += THREADS) {
        const double ui = gather(A, i, v, sv) - (u[i] * su) * alpha;
        u[i] = ui;
        acc += ui * ui;
    }
    const double beta = sqrt(block_sum<THREADS>(acc, scratch));
    su = 1.0;
    if (beta > 0) {
        su = 1 / beta;
        acc = 0.0;
        for (int j = t; j < n; j += THREADS) {
            const double vj = gather(At, j, u, su) - (v[j] * sv) * beta;
            v[j] = vj;
            acc += vj * vj;
        }
        alpha = sqrt(block_sum<THREADS>(acc, scratch));
        sv = alpha > 0 ? 1 / alpha : 1.0;
    }
    return beta;
}

}  // namespace block_lsqr

using namespace block_lsqr;

// LSQR (SciPy's statements). vec: u (m), v (n), w (n); out: x (n), var (n);
// state: options and LsqrState; hist: H_FIELDS x OPT_HIST_ROWS.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
lsqr_block(int m, int n, const int* __restrict__ a_ptr, const int* __restrict__ a_idx,
           const double* __restrict__ a_val, const int* __restrict__ t_ptr,
           const int* __restrict__ t_idx, const double* __restrict__ t_val,
           const double* __restrict__ b, const double* __restrict__ x0, double* vec,
           double* x, double* var, double* state, double* hist, int stop_at) {
    __shared__ double scratch[THREADS];
    const int t = threadIdx.x;
    const Csr A{a_ptr, a_idx, a_val}, At{t_ptr, t_idx, t_val};
    double* u = vec;
    double* v = vec + m;
    double* w = vec + m + n;
    const double damp = state[OPT_DAMP], atol = state[OPT_ATOL], btol = state[OPT_BTOL];
    const double ctol = state[OPT_CTOL], iter_lim = state[OPT_ITER_LIM];
    const bool calc_var = state[OPT_CALC_VAR] != 0;
    const int rows = (int)state[OPT_HIST_ROWS];
    const double dampsq = damp * damp;
    const double eps = 2.220446049250313e-16;

    double su, sv, alfa;
    if (state[LQ_STARTED] == 0) {
        double beta;
        const double bnorm = start<THREADS>(m, n, A, At, b, x0, state[OPT_HAS_X0] != 0, u, v,
                                            x, true, scratch, beta, alfa, su, sv);
        for (int j = t; j < n; j += THREADS) {
            w[j] = v[j] * sv;
            var[j] = 0.0;
        }
        __syncthreads();
        if (t == 0) {
            state[LQ_STARTED] = 1;
            state[LQ_ITN] = 0; state[LQ_ISTOP] = 0;
            state[LQ_SU] = su; state[LQ_SV] = sv; state[LQ_ALFA] = alfa;
            state[LQ_ANORM] = 0; state[LQ_ACOND] = 0; state[LQ_DDNORM] = 0;
            state[LQ_RES2] = 0; state[LQ_XNORM] = 0; state[LQ_XXNORM] = 0; state[LQ_Z] = 0;
            state[LQ_CS2] = -1; state[LQ_SN2] = 0;
            state[LQ_RHOBAR] = alfa; state[LQ_PHIBAR] = beta;
            state[LQ_R1NORM] = beta; state[LQ_R2NORM] = beta;
            state[LQ_ARNORM] = alfa * beta; state[LQ_BNORM] = bnorm;
            state[LQ_TEST1] = 1; state[LQ_TEST2] = 0; state[LQ_RTOL] = 0;
            state[LQ_DONE] = (alfa * beta == 0) ? 1 : 0;    // x = x0 (or 0) is exact
        }
        __syncthreads();
    }
    if (state[LQ_DONE] != 0) return;
    int itn = (int)state[LQ_ITN];
    su = state[LQ_SU]; sv = state[LQ_SV]; alfa = state[LQ_ALFA];
    double anorm = state[LQ_ANORM], acond = state[LQ_ACOND], ddnorm = state[LQ_DDNORM];
    double res2 = state[LQ_RES2], xnorm = state[LQ_XNORM], xxnorm = state[LQ_XXNORM];
    double z = state[LQ_Z], cs2 = state[LQ_CS2], sn2 = state[LQ_SN2];
    double rhobar = state[LQ_RHOBAR], phibar = state[LQ_PHIBAR];
    double r1norm = state[LQ_R1NORM], r2norm = state[LQ_R2NORM], arnorm = state[LQ_ARNORM];
    const double bnorm = state[LQ_BNORM];
    double test1 = state[LQ_TEST1], test2 = state[LQ_TEST2], rtol = state[LQ_RTOL];
    int istop = 0;
    __syncthreads();                // every thread read the state before thread 0 writes it

    while (itn < iter_lim && itn < stop_at) {
        itn = itn + 1;
        const double alfa_old = alfa;
        const double beta = bidiagonalize<THREADS>(m, n, A, At, u, v, scratch, alfa, su, sv);
        if (beta > 0) anorm = sqrt(anorm * anorm + alfa_old * alfa_old + beta * beta + dampsq);

        double rhobar1, psi;
        if (damp > 0) {
            rhobar1 = sqrt(rhobar * rhobar + dampsq);
            const double cs1 = rhobar / rhobar1;
            const double sn1 = damp / rhobar1;
            psi = sn1 * phibar;
            phibar = cs1 * phibar;
        } else {
            rhobar1 = rhobar;
            psi = 0.0;
        }
        double cs, sn, rho;
        sym_ortho(rhobar1, beta, cs, sn, rho);
        const double theta = sn * alfa;
        rhobar = -cs * alfa;
        const double phi = cs * phibar;
        phibar = sn * phibar;
        const double tau = sn * phi;

        const double t1 = phi / rho;
        const double t2 = -theta / rho;
        const double inv_rho = 1 / rho;
        double acc = 0.0;
        for (int j = t; j < n; j += THREADS) {
            const double wj = w[j];
            const double dk = wj * inv_rho;
            x[j] += wj * t1;
            w[j] = wj * t2 + v[j] * sv;
            acc += dk * dk;
            if (calc_var) var[j] += dk * dk;
        }
        const double dd = sqrt(block_sum<THREADS>(acc, scratch));
        ddnorm = ddnorm + dd * dd;

        const double delta = sn2 * rho;
        const double gambar = -cs2 * rho;
        const double rhs = phi - delta * z;
        const double zbar = rhs / gambar;
        xnorm = sqrt(xxnorm + zbar * zbar);
        const double gamma = sqrt(gambar * gambar + theta * theta);
        cs2 = gambar / gamma;
        sn2 = theta / gamma;
        z = rhs / gamma;
        xxnorm = xxnorm + z * z;

        acond = anorm * sqrt(ddnorm);
        const double res1 = phibar * phibar;
        res2 = res2 + psi * psi;
        const double rnorm = sqrt(res1 + res2);
        arnorm = alfa * fabs(tau);
        if (damp > 0) {
            const double r1sq = rnorm * rnorm - dampsq * xxnorm;
            r1norm = sqrt(fabs(r1sq));
            if (r1sq < 0) r1norm = -r1norm;
        } else {
            r1norm = rnorm;
        }
        r2norm = rnorm;

        test1 = rnorm / bnorm;
        test2 = arnorm / (anorm * rnorm + eps);
        const double test3 = 1 / (acond + eps);
        const double tt1 = test1 / (1 + anorm * xnorm / bnorm);
        rtol = btol + atol * anorm * xnorm / bnorm;
        istop = stopping_code(itn, iter_lim, test1, test2, test3, tt1, rtol, atol, ctol);
        if (t == 0)
            record_history(hist, rows, itn, istop, r2norm, arnorm, anorm, acond, xnorm, test1,
                           test2, rtol);
        if (istop != 0) break;
    }
    if (t == 0) {
        state[LQ_ITN] = itn; state[LQ_ISTOP] = istop;
        state[LQ_SU] = su; state[LQ_SV] = sv; state[LQ_ALFA] = alfa;
        state[LQ_ANORM] = anorm; state[LQ_ACOND] = acond; state[LQ_DDNORM] = ddnorm;
        state[LQ_RES2] = res2; state[LQ_XNORM] = xnorm; state[LQ_XXNORM] = xxnorm;
        state[LQ_Z] = z; state[LQ_CS2] = cs2; state[LQ_SN2] = sn2;
        state[LQ_RHOBAR] = rhobar; state[LQ_PHIBAR] = phibar;
        state[LQ_R1NORM] = r1norm; state[LQ_R2NORM] = r2norm; state[LQ_ARNORM] = arnorm;
        state[LQ_TEST1] = test1; state[LQ_TEST2] = test2; state[LQ_RTOL] = rtol;
        if (istop != 0) state[LQ_DONE] = 1;
    }
}

// LSMR (SciPy's statements). vec: u (m), v (n), h (n), hbar (n); out: x (n);
// state: options and LsmrState; hist as for LSQR.
template <int THREADS>
__global__ void __launch_bounds__(THREADS)
lsmr_block(int m, int n, const int* __restrict__ a_ptr, const int* __restrict__ a_idx,
           const double* __restrict__ a_val, const int* __restrict__ t_ptr,
           const int* __restrict__ t_idx, const double* __restrict__ t_val,
           const double* __restrict__ b, const double* __restrict__ x0, double* vec,
           double* x, double* state, double* hist, int stop_at) {
    __shared__ double scratch[THREADS];
    const int t = threadIdx.x;
    const Csr A{a_ptr, a_idx, a_val}, At{t_ptr, t_idx, t_val};
    double* u = vec;
    double* v = vec + m;
    double* h = vec + m + n;
    double* hbar = vec + m + 2 * (long long)n;
    const double damp = state[OPT_DAMP], atol = state[OPT_ATOL], btol = state[OPT_BTOL];
    const double ctol = state[OPT_CTOL], iter_lim = state[OPT_ITER_LIM];
    const int rows = (int)state[OPT_HIST_ROWS];

    double su, sv, alpha;
    if (state[LM_STARTED] == 0) {
        double beta;
        const double normb = start<THREADS>(m, n, A, At, b, x0, state[OPT_HAS_X0] != 0, u, v,
                                            x, false, scratch, beta, alpha, su, sv);
        for (int j = t; j < n; j += THREADS) {
            h[j] = v[j] * sv;
            hbar[j] = 0.0;
        }
        const double normar = alpha * beta;
        const bool zero_b = normar != 0 && normb == 0;      // SciPy: x = 0
        if (zero_b)
            for (int j = t; j < n; j += THREADS) x[j] = 0.0;
        __syncthreads();
        if (t == 0) {
            state[LM_STARTED] = 1;
            state[LM_ITN] = 0; state[LM_ISTOP] = 0;
            state[LM_SU] = su; state[LM_SV] = sv; state[LM_ALPHA] = alpha;
            state[LM_ZETABAR] = alpha * beta; state[LM_ALPHABAR] = alpha;
            state[LM_RHO] = 1; state[LM_RHOBAR] = 1; state[LM_CBAR] = 1; state[LM_SBAR] = 0;
            state[LM_BETADD] = beta; state[LM_BETAD] = 0; state[LM_RHODOLD] = 1;
            state[LM_TAUTILDEOLD] = 0; state[LM_THETATILDE] = 0; state[LM_ZETA] = 0;
            state[LM_D] = 0; state[LM_NORMA2] = alpha * alpha; state[LM_MAXRBAR] = 0;
            state[LM_MINRBAR] = 1e+100; state[LM_NORMA] = sqrt(alpha * alpha);
            state[LM_CONDA] = 1; state[LM_NORMX] = 0; state[LM_NORMR] = beta;
            state[LM_NORMAR] = normar; state[LM_NORMB] = normb;
            state[LM_TEST1] = 1; state[LM_TEST2] = 0; state[LM_RTOL] = 0;
            state[LM_DONE] = (normar == 0 || normb == 0) ? 1 : 0;
        }
        __syncthreads();
    }
    if (state[LM_DONE] != 0) return;
    int itn = (int)state[LM_ITN];
    su = state[LM_SU]; sv = state[LM_SV]; alpha = state[LM_ALPHA];
    double zetabar = state[LM_ZETABAR], alphabar = state[LM_ALPHABAR], rho = state[LM_RHO];
    double rhobar = state[LM_RHOBAR], cbar = state[LM_CBAR], sbar = state[LM_SBAR];
    double betadd = state[LM_BETADD], betad = state[LM_BETAD], rhodold = state[LM_RHODOLD];
    double tautildeold = state[LM_TAUTILDEOLD], thetatilde = state[LM_THETATILDE];
    double zeta = state[LM_ZETA], d = state[LM_D], normA2 = state[LM_NORMA2];
    double maxrbar = state[LM_MAXRBAR], minrbar = state[LM_MINRBAR], normA = state[LM_NORMA];
    double condA = state[LM_CONDA], normx = state[LM_NORMX], normr = state[LM_NORMR];
    double normar = state[LM_NORMAR];
    const double normb = state[LM_NORMB];
    double test1 = state[LM_TEST1], test2 = state[LM_TEST2], rtol = state[LM_RTOL];
    int istop = 0;
    __syncthreads();

    while (itn < iter_lim && itn < stop_at) {
        itn = itn + 1;
        const double beta = bidiagonalize<THREADS>(m, n, A, At, u, v, scratch, alpha, su, sv);

        double chat, shat, alphahat;
        sym_ortho(alphabar, damp, chat, shat, alphahat);
        const double rhoold = rho;
        double c, s;
        sym_ortho(alphahat, beta, c, s, rho);
        const double thetanew = s * alpha;
        alphabar = c * alpha;
        const double rhobarold = rhobar;
        const double zetaold = zeta;
        const double thetabar = sbar * rho;
        const double rhotemp = cbar * rho;
        sym_ortho(cbar * rho, thetanew, cbar, sbar, rhobar);
        zeta = cbar * zetabar;
        zetabar = -sbar * zetabar;

        const double k_hbar = -(thetabar * rho / (rhoold * rhobarold));
        const double k_x = zeta / (rho * rhobar);
        const double k_h = -(thetanew / rho);
        double acc = 0.0;
        for (int j = t; j < n; j += THREADS) {
            const double hb = hbar[j] * k_hbar + h[j];
            hbar[j] = hb;
            const double xj = x[j] + hb * k_x;
            x[j] = xj;
            h[j] = h[j] * k_h + v[j] * sv;
            acc += xj * xj;
        }
        normx = sqrt(block_sum<THREADS>(acc, scratch));

        const double betaacute = chat * betadd;
        const double betacheck = -shat * betadd;
        const double betahat = c * betaacute;
        betadd = -s * betaacute;
        const double thetatildeold = thetatilde;
        double ctildeold, stildeold, rhotildeold;
        sym_ortho(rhodold, thetabar, ctildeold, stildeold, rhotildeold);
        thetatilde = stildeold * rhobar;
        rhodold = ctildeold * rhobar;
        betad = -stildeold * betad + ctildeold * betahat;
        tautildeold = (zetaold - thetatildeold * tautildeold) / rhotildeold;
        const double taud = (zeta - thetatilde * tautildeold) / rhodold;
        d = d + betacheck * betacheck;
        normr = sqrt(d + (betad - taud) * (betad - taud) + betadd * betadd);
        normA2 = normA2 + beta * beta;
        normA = sqrt(normA2);
        normA2 = normA2 + alpha * alpha;
        maxrbar = fmax(maxrbar, rhobarold);
        if (itn > 1) minrbar = fmin(minrbar, rhobarold);
        condA = fmax(maxrbar, rhotemp) / fmin(minrbar, rhotemp);
        normar = fabs(zetabar);

        test1 = normr / normb;
        test2 = (normA * normr) != 0 ? normar / (normA * normr)
                                      : __longlong_as_double(0x7ff0000000000000LL);
        const double test3 = 1 / condA;
        const double t1 = test1 / (1 + normA * normx / normb);
        rtol = btol + atol * normA * normx / normb;
        istop = stopping_code(itn, iter_lim, test1, test2, test3, t1, rtol, atol, ctol);
        if (t == 0)
            record_history(hist, rows, itn, istop, normr, normar, normA, condA, normx, test1,
                           test2, rtol);
        if (istop != 0) break;
    }
    if (t == 0) {
        state[LM_ITN] = itn; state[LM_ISTOP] = istop;
        state[LM_SU] = su; state[LM_SV] = sv; state[LM_ALPHA] = alpha;
        state[LM_ZETABAR] = zetabar; state[LM_ALPHABAR] = alphabar; state[LM_RHO] = rho;
        state[LM_RHOBAR] = rhobar; state[LM_CBAR] = cbar; state[LM_SBAR] = sbar;
        state[LM_BETADD] = betadd; state[LM_BETAD] = betad; state[LM_RHODOLD] = rhodold;
        state[LM_TAUTILDEOLD] = tautildeold; state[LM_THETATILDE] = thetatilde;
        state[LM_ZETA] = zeta; state[LM_D] = d; state[LM_NORMA2] = normA2;
        state[LM_MAXRBAR] = maxrbar; state[LM_MINRBAR] = minrbar; state[LM_NORMA] = normA;
        state[LM_CONDA] = condA; state[LM_NORMX] = normx; state[LM_NORMR] = normr;
        state[LM_NORMAR] = normar;
        state[LM_TEST1] = test1; state[LM_TEST2] = test2; state[LM_RTOL] = rtol;
        if (istop != 0) state[LM_DONE] = 1;
    }
}

}  // namespace gpuqr
