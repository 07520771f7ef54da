"""csc_of and transposed_csc make what SciPy's constructor and ``A.T.tocsc()`` make.

Pinned: the same attributes, arrays (values, dtypes) and flags as SciPy's
validated objects; every input SciPy's constructor would convert or refuse goes
to it (its conversion or its own error); the exact answers that use them
(SuiteSparseQR's R and H, lsqr/lsmr on wide A) are unchanged.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from scipy_gpuqr._trusted_csc import _known_layout, csc_of, transposed_csc


def _arrays(m=7, n=5, density=0.4, seed=0, itype=np.int64):
    A = sp.random_array((m, n), density=density, format="csc", rng=seed)
    A.sum_duplicates()
    return A.data.copy(), A.indices.astype(itype), A.indptr.astype(itype), (m, n)


def _same(P, Q):
    assert type(P) is type(Q)
    assert set(vars(P)) >= {"_shape", "maxprint", "indptr", "indices", "data"}
    assert P.shape == Q.shape and P.maxprint == Q.maxprint
    for name in ("indptr", "indices", "data"):
        a, b = getattr(P, name), getattr(Q, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (P != Q).nnz == 0


def test_this_scipy_layout_is_known():
    """The fast path is live with the SciPy the tests run on (else nothing below tests it)."""
    assert _known_layout() is not None


@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("shape,density", [((7, 5), 0.4), ((3, 9), 0.5), ((4, 4), 0.0),
                                           ((1, 1), 1.0)])
def test_csc_of_equals_scipy_constructor(itype, shape, density):
    data, indices, indptr, shape = _arrays(*shape, density=density, itype=itype)
    fast = csc_of(data, indices, indptr, shape)
    slow = sp.csc_array((data.copy(), indices.copy(), indptr.copy()), shape=shape)
    _same(fast, slow)
    assert set(vars(fast)) == set(vars(slow))
    assert fast.data is data and fast.indices is indices and fast.indptr is indptr
    assert fast.has_canonical_format == slow.has_canonical_format
    fast.check_format(full_check=True)          # SciPy's full checks pass on it
    assert np.array_equal(fast.toarray(), slow.toarray())


@pytest.mark.parametrize("case", ["mixed_index_dtypes", "int16_indices", "float32_data",
                                  "list_data", "2d_indptr"])
def test_csc_of_converting_inputs_go_to_scipy(case):
    """Inputs SciPy's constructor converts: its conversion, the same object as SciPy's."""
    data, indices, indptr, shape = _arrays()
    if case == "mixed_index_dtypes":
        indices = indices.astype(np.int32)
    elif case == "int16_indices":
        indices, indptr = indices.astype(np.int16), indptr.astype(np.int16)
    elif case == "float32_data":
        data = data.astype(np.float32)
    elif case == "list_data":
        data = list(data)
    elif case == "2d_indptr":
        with pytest.raises(ValueError):
            sp.csc_array((data, indices, indptr[None, :]), shape=shape)
        with pytest.raises(ValueError):
            csc_of(data, indices, indptr[None, :], shape)
        return
    fast = csc_of(data, indices, indptr, shape)
    slow = sp.csc_array((data, indices, indptr), shape=shape)
    _same(fast, slow)


@pytest.mark.parametrize("case", ["indptr_length", "indptr_start", "indptr_end",
                                  "indices_length"])
def test_csc_of_refuses_what_scipy_refuses(case):
    data, indices, indptr, shape = _arrays()
    if case == "indptr_length":
        indptr = indptr[:-1]
    elif case == "indptr_start":
        indptr = indptr.copy()
        indptr[0] = 1
    elif case == "indptr_end":
        indptr = indptr.copy()
        indptr[-1] += 1
    else:
        indices = indices[:-1]
    with pytest.raises(ValueError) as scipy_error:
        sp.csc_array((data, indices, indptr), shape=shape)
    with pytest.raises(ValueError) as ours:
        csc_of(data, indices, indptr, shape)
    assert str(ours.value) == str(scipy_error.value)


def test_csc_of_keeps_trailing_space_rule():
    """More stored slots than ``indptr[-1]``: SciPy prunes them; ours hands over to it."""
    data, indices, indptr, shape = _arrays()
    data2 = np.concatenate([data, [9.0]])
    indices2 = np.concatenate([indices, [0]]).astype(indices.dtype)
    fast = csc_of(data2, indices2, indptr, shape)
    slow = sp.csc_array((data2, indices2, indptr), shape=shape)
    _same(fast, slow)
    assert fast.data.shape[0] == indptr[-1]


@pytest.mark.parametrize("cls", [sp.csc_array, sp.csc_matrix])
@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(5, 9), (9, 5), (1, 6), (6, 1)])
def test_transposed_csc_equals_scipy(cls, itype, shape):
    A = cls(sp.random_array(shape, density=0.5, format="csc", rng=3))
    A.indices, A.indptr = A.indices.astype(itype), A.indptr.astype(itype)
    want = A.T.tocsc()
    want.sort_indices()
    got = transposed_csc(A)
    assert type(got) is sp.csc_array
    _same(got, sp.csc_array(want))
    assert got.indices.dtype == want.indices.dtype
    assert got.has_sorted_indices
    assert got.has_canonical_format == A.has_canonical_format
    got.check_format(full_check=True)


def test_transposed_csc_not_canonical_input():
    """Duplicates in A: only the sorted flag is set (as SciPy's tocsc sets it)."""
    A = sp.csc_array((np.array([1.0, 2.0, 3.0]), np.array([0, 0, 1]), np.array([0, 2, 3])),
                     shape=(2, 2))
    got = transposed_csc(A)
    want = A.T.tocsc()
    _same(got, want)
    assert got.__dict__.get("_has_canonical_format") is None
    assert got.has_sorted_indices


def test_transposed_csc_other_dtypes_use_scipy():
    A = sp.csc_array(sp.random_array((4, 6), density=0.5, format="csc", rng=1).astype(np.float32))
    got = transposed_csc(A)
    _same(got, sp.csc_array(A.T.tocsc()))


def test_spqr_outputs_are_scipy_arrays():
    """SuiteSparseQR's R and H made by csc_of are the arrays SciPy's constructor makes."""
    spqr = pytest.importorskip("scipy_gpuqr._cpu.spqr")
    if not spqr.spqr_available()[0]:
        pytest.skip("SuiteSparseQR not installed")
    A = sp.random_array((30, 12), density=0.3, format="csc", rng=5)
    num = spqr.spqr_factorize(A, tol=None)
    for M in (num.R, num.H):
        assert type(M) is sp.csc_array
        _same(M, sp.csc_array((M.data.copy(), M.indices.copy(), M.indptr.copy()), shape=M.shape))
        M.check_format(full_check=True)
