"""The block kernel (kernels/iterative/block_lsqr.cu) emulated in NumPy, for tests without a GPU.

:class:`BlockEmulator` stands in for ``scipy_gpuqr._iterative.block._CupyDevice``
(``block_lsqr(..., _device=BlockEmulator)``): it keeps the uploaded buffer,
reads the kernel's arguments as offsets into it (the emulated buffer sits at
address 0) and runs the kernel's statements on NumPy views of its parts: the
state read from the buffer (``started``, ``itn``, the recurrences, the scale
factors of u and v), the launch's iterations up to ``stop_at``, the history
ring and the state written back. What it checks is the host side: the
packing, the pointers, the state a run starts or goes on from, the
stretches and the reading back; the sums run in NumPy's order, not the
block's (the kernel's own rounding is the GPU tests' concern).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from scipy_gpuqr._iterative._common import stopping_code
from scipy_gpuqr._iterative.block import HISTORY, LSMR_STATE, LSQR_STATE

_EPS = 2.220446049250313e-16


def _sym_ortho(a, b):
    """The kernel's sym_ortho (SciPy's _sym_ortho on doubles)."""
    if b == 0:
        return float(np.sign(a)), 0.0, abs(a)
    if a == 0:
        return 0.0, float(np.sign(b)), abs(b)
    if abs(b) > abs(a):
        tau = a / b
        s = float(np.sign(b)) / math.sqrt(1 + tau * tau)
        return s * tau, s, b / s
    tau = b / a
    c = float(np.sign(a)) / math.sqrt(1 + tau * tau)
    return c, c * tau, a / c


class BlockEmulator:
    """A device of one emulated block: ``upload``, ``launch``, ``fetch`` as the CuPy one's.

    Attributes
    ----------
    launches : list
        ``(itn before, itn after)`` of each launch.
    """

    def __init__(self, method: str, threads: int):
        self.method, self.threads = method, threads
        self.buf = None
        self.syncs = 0
        self.launches = []

    def upload(self, host: np.ndarray) -> int:
        self.buf = host.copy()
        return 0

    def fetch(self, nbytes: int) -> np.ndarray:
        self.syncs += 1
        return self.buf[:nbytes].copy()

    # -- the kernel's arguments ------------------------------------------------------

    def _f64(self, at: int, size: int) -> np.ndarray:
        return self.buf[at:at + 8 * size].view(np.float64)

    def _i32(self, at: int, size: int) -> np.ndarray:
        return self.buf[at:at + 4 * size].view(np.int32)

    def launch(self, args: tuple) -> None:
        m, n = int(args[0]), int(args[1])
        a_ptr, a_idx, a_val, t_ptr, t_idx, t_val, b, x0, vec, x = (int(a) for a in args[2:12])
        lsqr = self.method == "lsqr"
        var = int(args[12]) if lsqr else None
        state_at, hist_at, stop_at = (int(a) for a in args[-3:])
        names = LSQR_STATE if lsqr else LSMR_STATE
        state = self._f64(state_at, len(names))
        nnz = int(self._i32(a_ptr, m + 1)[-1])
        A = sp.csr_array((self._f64(a_val, nnz), self._i32(a_idx, nnz), self._i32(a_ptr, m + 1)),
                         shape=(m, n))
        At = sp.csr_array((self._f64(t_val, nnz), self._i32(t_idx, nnz), self._i32(t_ptr, n + 1)),
                          shape=(n, m))
        rows = int(state[names.index("hist_rows")])
        hist = self._f64(hist_at, rows * len(HISTORY)).reshape(rows, len(HISTORY))
        parts = [self._f64(vec, m)] + [self._f64(vec + 8 * (m + j * n), n)
                                      for j in range(2 if lsqr else 3)]
        s = _State(state, names)
        before = int(s["itn"]) if s["started"] else 0
        b_vec = self._f64(b, m)
        x0_vec = self._f64(x0, n) if s["has_x0"] else None
        xv = self._f64(x, n)
        if lsqr:
            _lsqr(s, A, At, b_vec, x0_vec, parts, xv, self._f64(var, n), hist, rows, stop_at)
        else:
            _lsmr(s, A, At, b_vec, x0_vec, parts, xv, hist, rows, stop_at)
        self.launches.append((before, int(s["itn"])))


class _State:
    """The state slots by name."""

    def __init__(self, state, names):
        self.state, self.at = state, {name: k for k, name in enumerate(names)}

    def __getitem__(self, name):
        return float(self.state[self.at[name]])

    def __setitem__(self, name, value):
        self.state[self.at[name]] = value


def _start(s, A, At, b, x0, u, v, x, v_is_x):
    """The kernel's start(): x, u (unscaled, su), v (unscaled, sv), beta, alpha, ‖b‖."""
    normb = math.sqrt(float(b @ b))
    x[:] = x0 if x0 is not None else 0.0
    u[:] = b - A @ x if x0 is not None else b
    beta = math.sqrt(float(u @ u)) if x0 is not None else normb
    alpha, su, sv = 0.0, 1.0, 1.0
    if beta > 0:
        su = 1 / beta
        v[:] = At @ (u * su)
        alpha = math.sqrt(float(v @ v))
        if alpha > 0:
            sv = 1 / alpha
    else:
        v[:] = x if v_is_x else 0.0
    return normb, beta, alpha, su, sv


def _bidiagonalize(A, At, u, v, alpha, su, sv):
    """The kernel's bidiagonalize(): beta, alpha, su, sv."""
    u[:] = A @ (v * sv) - (u * su) * alpha
    beta = math.sqrt(float(u @ u))
    su = 1.0
    if beta > 0:
        su = 1 / beta
        v[:] = At @ (u * su) - (v * sv) * beta
        alpha = math.sqrt(float(v @ v))
        sv = 1 / alpha if alpha > 0 else 1.0
    return beta, alpha, su, sv


def _record(hist, rows, itn, values):
    if rows > 0:
        hist[(itn - 1) % rows] = values


def _lsqr(s, A, At, b, x0, parts, x, var, hist, rows, stop_at):
    u, v, w = parts
    damp, atol, btol, ctol, iter_lim = (s[k] for k in ("damp", "atol", "btol", "ctol",
                                                        "iter_lim"))
    calc_var = s["calc_var"] != 0
    dampsq = damp * damp
    if s["started"] == 0:
        bnorm, beta, alfa, su, sv = _start(s, A, At, b, x0, u, v, x, True)
        w[:] = v * sv
        var[:] = 0.0
        for name, value in (("started", 1), ("itn", 0), ("istop", 0), ("su", su), ("sv", sv),
                            ("alfa", alfa), ("anorm", 0), ("acond", 0), ("ddnorm", 0),
                            ("res2", 0), ("xnorm", 0), ("xxnorm", 0), ("z", 0), ("cs2", -1),
                            ("sn2", 0), ("rhobar", alfa), ("phibar", beta), ("r1norm", beta),
                            ("r2norm", beta), ("arnorm", alfa * beta), ("bnorm", bnorm),
                            ("test1", 1), ("test2", 0), ("rtol", 0),
                            ("done", 1 if alfa * beta == 0 else 0)):
            s[name] = value
    if s["done"] != 0:
        return
    itn = int(s["itn"])
    su, sv, alfa = s["su"], s["sv"], s["alfa"]
    anorm, acond, ddnorm, res2 = s["anorm"], s["acond"], s["ddnorm"], s["res2"]
    xnorm, xxnorm, z, cs2, sn2 = s["xnorm"], s["xxnorm"], s["z"], s["cs2"], s["sn2"]
    rhobar, phibar, r1norm, r2norm = s["rhobar"], s["phibar"], s["r1norm"], s["r2norm"]
    arnorm, bnorm, test1, test2, rtol = s["arnorm"], s["bnorm"], s["test1"], s["test2"], s["rtol"]
    istop = 0
    while itn < iter_lim and itn < stop_at:
        itn += 1
        alfa_old = alfa
        beta, alfa, su, sv = _bidiagonalize(A, At, u, v, alfa, su, sv)
        if beta > 0:
            anorm = math.sqrt(anorm * anorm + alfa_old * alfa_old + beta * beta + dampsq)
        if damp > 0:
            rhobar1 = math.sqrt(rhobar * rhobar + dampsq)
            cs1, sn1 = rhobar / rhobar1, damp / rhobar1
            psi = sn1 * phibar
            phibar = cs1 * phibar
        else:
            rhobar1, psi = rhobar, 0.0
        cs, sn, rho = _sym_ortho(rhobar1, beta)
        theta = sn * alfa
        rhobar = -cs * alfa
        phi = cs * phibar
        phibar = sn * phibar
        tau = sn * phi
        t1, t2 = phi / rho, -theta / rho
        dk = w * (1 / rho)
        x += w * t1
        w[:] = w * t2 + v * sv
        if calc_var:
            var += dk * dk
        ddnorm = ddnorm + float(dk @ dk)
        delta = sn2 * rho
        gambar = -cs2 * rho
        rhs = phi - delta * z
        zbar = rhs / gambar
        xnorm = math.sqrt(xxnorm + zbar * zbar)
        gamma = math.sqrt(gambar * gambar + theta * theta)
        cs2, sn2, z = gambar / gamma, theta / gamma, rhs / gamma
        xxnorm = xxnorm + z * z
        acond = anorm * math.sqrt(ddnorm)
        res2 = res2 + psi * psi
        rnorm = math.sqrt(phibar * phibar + res2)
        arnorm = alfa * abs(tau)
        if damp > 0:
            r1sq = rnorm * rnorm - dampsq * xxnorm
            r1norm = math.sqrt(abs(r1sq))
            if r1sq < 0:
                r1norm = -r1norm
        else:
            r1norm = rnorm
        r2norm = rnorm
        test1 = rnorm / bnorm
        test2 = arnorm / (anorm * rnorm + _EPS)
        test3 = 1 / (acond + _EPS)
        tt1 = test1 / (1 + anorm * xnorm / bnorm)
        rtol = btol + atol * anorm * xnorm / bnorm
        istop = stopping_code(itn, iter_lim, test1, test2, test3, tt1, rtol, atol, ctol)
        _record(hist, rows, itn, (istop, r2norm, arnorm, anorm, acond, xnorm, test1, test2,
                                  rtol))
        if istop != 0:
            break
    for name, value in (("itn", itn), ("istop", istop), ("su", su), ("sv", sv), ("alfa", alfa),
                        ("anorm", anorm), ("acond", acond), ("ddnorm", ddnorm), ("res2", res2),
                        ("xnorm", xnorm), ("xxnorm", xxnorm), ("z", z), ("cs2", cs2),
                        ("sn2", sn2), ("rhobar", rhobar), ("phibar", phibar),
                        ("r1norm", r1norm), ("r2norm", r2norm), ("arnorm", arnorm),
                        ("test1", test1), ("test2", test2), ("rtol", rtol)):
        s[name] = value
    if istop != 0:
        s["done"] = 1


def _lsmr(s, A, At, b, x0, parts, x, hist, rows, stop_at):
    u, v, h, hbar = parts
    damp, atol, btol, ctol, iter_lim = (s[k] for k in ("damp", "atol", "btol", "ctol",
                                                        "iter_lim"))
    if s["started"] == 0:
        normb, beta, alpha, su, sv = _start(s, A, At, b, x0, u, v, x, False)
        h[:] = v * sv
        hbar[:] = 0.0
        normar = alpha * beta
        if normar != 0 and normb == 0:
            x[:] = 0.0
        for name, value in (("started", 1), ("itn", 0), ("istop", 0), ("su", su), ("sv", sv),
                            ("alpha", alpha), ("zetabar", alpha * beta), ("alphabar", alpha),
                            ("rho", 1), ("rhobar", 1), ("cbar", 1), ("sbar", 0),
                            ("betadd", beta), ("betad", 0), ("rhodold", 1),
                            ("tautildeold", 0), ("thetatilde", 0), ("zeta", 0), ("d", 0),
                            ("normA2", alpha * alpha), ("maxrbar", 0), ("minrbar", 1e100),
                            ("normA", abs(alpha)), ("condA", 1), ("normx", 0), ("normr", beta),
                            ("normar", normar), ("normb", normb), ("test1", 1), ("test2", 0),
                            ("rtol", 0), ("done", 1 if normar == 0 or normb == 0 else 0)):
            s[name] = value
    if s["done"] != 0:
        return
    itn = int(s["itn"])
    su, sv, alpha = s["su"], s["sv"], s["alpha"]
    (zetabar, alphabar, rho, rhobar, cbar, sbar, betadd, betad, rhodold, tautildeold,
     thetatilde, zeta, d, normA2, maxrbar, minrbar, normA, condA, normx, normr, normar, normb,
     test1, test2, rtol) = (s[k] for k in LSMR_STATE[LSMR_STATE.index("zetabar"):])
    istop = 0
    while itn < iter_lim and itn < stop_at:
        itn += 1
        beta, alpha, su, sv = _bidiagonalize(A, At, u, v, alpha, su, sv)
        chat, shat, alphahat = _sym_ortho(alphabar, damp)
        rhoold = rho
        c, sn, rho = _sym_ortho(alphahat, beta)
        thetanew = sn * alpha
        alphabar = c * alpha
        rhobarold, zetaold = rhobar, zeta
        thetabar = sbar * rho
        rhotemp = cbar * rho
        cbar, sbar, rhobar = _sym_ortho(cbar * rho, thetanew)
        zeta = cbar * zetabar
        zetabar = -sbar * zetabar
        hbar[:] = hbar * -(thetabar * rho / (rhoold * rhobarold)) + h
        x += hbar * (zeta / (rho * rhobar))
        h[:] = h * -(thetanew / rho) + v * sv
        normx = math.sqrt(float(x @ x))
        betaacute = chat * betadd
        betacheck = -shat * betadd
        betahat = c * betaacute
        betadd = -sn * betaacute
        thetatildeold = thetatilde
        ctildeold, stildeold, rhotildeold = _sym_ortho(rhodold, thetabar)
        thetatilde = stildeold * rhobar
        rhodold = ctildeold * rhobar
        betad = -stildeold * betad + ctildeold * betahat
        tautildeold = (zetaold - thetatildeold * tautildeold) / rhotildeold
        taud = (zeta - thetatilde * tautildeold) / rhodold
        d = d + betacheck * betacheck
        normr = math.sqrt(d + (betad - taud) ** 2 + betadd * betadd)
        normA2 = normA2 + beta * beta
        normA = math.sqrt(normA2)
        normA2 = normA2 + alpha * alpha
        maxrbar = max(maxrbar, rhobarold)
        if itn > 1:
            minrbar = min(minrbar, rhobarold)
        condA = max(maxrbar, rhotemp) / min(minrbar, rhotemp)
        normar = abs(zetabar)
        test1 = normr / normb
        test2 = normar / (normA * normr) if normA * normr != 0 else math.inf
        test3 = 1 / condA
        t1 = test1 / (1 + normA * normx / normb)
        rtol = btol + atol * normA * normx / normb
        istop = stopping_code(itn, iter_lim, test1, test2, test3, t1, rtol, atol, ctol)
        _record(hist, rows, itn, (istop, normr, normar, normA, condA, normx, test1, test2, rtol))
        if istop != 0:
            break
    s["itn"], s["istop"], s["su"], s["sv"], s["alpha"] = itn, istop, su, sv, alpha
    for name, value in zip(LSMR_STATE[LSMR_STATE.index("zetabar"):],
                           (zetabar, alphabar, rho, rhobar, cbar, sbar, betadd, betad, rhodold,
                            tautildeold, thetatilde, zeta, d, normA2, maxrbar, minrbar, normA,
                            condA, normx, normr, normar, normb, test1, test2, rtol)):
        s[name] = value
    if istop != 0:
        s["done"] = 1
