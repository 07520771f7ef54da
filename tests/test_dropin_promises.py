"""``lsqr`` under ``auto`` on a run whose tests fall as a power of the iteration count.

rajat01 (6833², singular: SuperLU finds it exactly singular) under SciPy's
defaults: SciPy's LSQR stops at ``iter_lim`` (13 666 iterations, backward
error about 1e-4), while every window's projection promises convergence within
a few hundred iterations more. Once two of those promises are broken, the rule
(:class:`scipy_gpuqr._dispatch.iterate_first.Allowance`) weighs the trend on
log(itn), which passes ``iter_lim``, and the QR answers with the minimum-norm
solution at working precision after under a tenth of SciPy's iterations.
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse as sp

from conftest import TEST_MATRICES
from scipy_gpuqr import lsqr
from scipy_gpuqr._dispatch import rank_cost
from scipy_gpuqr.io import mmread

EPS = float(np.finfo(np.float64).eps)


def _backward(A, x, b):
    """The least-squares backward error ``‖Aᵀr‖ / (‖A‖_F·‖r‖)``."""
    r = b - A @ x
    return np.linalg.norm(A.T @ r) / (sp.linalg.norm(A) * np.linalg.norm(r))


@pytest.mark.slow
def test_rajat01s_broken_promises_end_in_the_exact_answer(decisions, monkeypatch):
    """The rule stops the run by the iter_lim verdict on the power trend and the QR
    answers: lstsq's solution (the explicit QR's), backward error at working precision.
    The rank decision's prediction is pinned at 1e-6 s per entry of R (measured on
    rajat01: 0.6-1.4e-6) so that the verdict's cost test (the iterations to iter_lim
    cost more than the QR) does not hang on this host's speed: it holds above about
    25 us an iteration."""
    monkeypatch.setattr(rank_cost, "RANK_S_PER_R_ENTRY", 1e-6)
    A = sp.csr_array(mmread(str(TEST_MATRICES / "rajat01.mtx"))).astype(np.float64)
    b = np.random.default_rng(0).standard_normal(A.shape[0])
    x, istop, itn = lsqr(A, b)[:3]
    line = [m for m in decisions() if m.startswith("lsqr ")][-1]
    assert "QR on CPU" in line and "stopped by auto's rule" in line, line
    assert "power of itn" in line, line
    stopped = int(line.split("istop 0 after ")[1].split()[0])
    assert stopped < 13666 // 10, line
    assert istop in (1, 2) and itn == 0
    exact = lsqr(A, b, backend="cpu")[0]
    assert np.linalg.norm(x - exact) <= 1e-8 * np.linalg.norm(exact)
    assert _backward(A, x, b) <= 1e3 * EPS
