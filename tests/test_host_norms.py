"""norm2 is NumPy's einsum sum of squares, bit for bit, for every array form it takes."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._factor.host_norms import frobenius_norm, norm2


def _einsum_norm(x) -> float:
    a = np.asarray(x).astype(np.float64, copy=False).ravel()
    return math.sqrt(float(np.einsum("i,i->", a, a)))


@pytest.mark.parametrize("make", [
    lambda r: r.standard_normal(253),
    lambda r: r.standard_normal(20001) * 1e150,                     # overflow as einsum's
    lambda r: r.standard_normal((37, 5)),
    lambda r: r.standard_normal((40, 6))[:, 2],                     # not contiguous
    lambda r: r.standard_normal(300).astype(np.float32),
    lambda r: r.integers(-5, 5, 77),
    lambda r: np.zeros(0),
    lambda r: [1.0, 2.0, 3.0],
])
def test_norm2_is_einsums_sum_bit_for_bit(make):
    x = make(np.random.default_rng(3))
    got = norm2(x)
    assert type(got) is float
    want = _einsum_norm(x)
    assert got == want or (math.isnan(got) and math.isnan(want)) or got == want == math.inf


def test_norm2_complex_and_frobenius():
    z = np.array([3 + 4j, 0])
    assert norm2(z) == float(np.linalg.norm(z))
    A = sp.random_array((30, 20), density=0.2, format="csc", rng=1)
    assert frobenius_norm(A) == _einsum_norm(A.data)
    assert frobenius_norm(A.toarray()) == _einsum_norm(A.toarray())
