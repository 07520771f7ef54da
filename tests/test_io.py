"""scipy_gpuqr.io.mmread: every shared matrix, SciPy agreement, relaxed and malformed files."""

from __future__ import annotations

import gzip
import io as pyio
import time

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import scipy_gpuqr
from scipy_gpuqr.io import MatrixMarketError, mmread

# files scipy.io.mmread refuses (SuiteSparse's relaxed conventions), and why
RELAXED = {
    "a1": "0-based indices, pattern with values",
    "a2": "0-based", "a4": "0-based", "az88": "0-based", "c2": "0-based complex",
    "c32": "0-based complex", "r2": "0-based", "s32": "0-based",
    "row0": "leading blank line, 0-based",
}


def shared_files(matrices_dir):
    return sorted(matrices_dir.glob("*.mtx"))


def test_public_name():
    assert scipy_gpuqr.io.mmread is mmread


def test_every_shared_matrix_loads_and_matches_scipy(matrices_dir):
    files = shared_files(matrices_dir)
    assert len(files) >= 50
    refused = set()
    for path in files:
        A = mmread(path)
        assert isinstance(A, sp.coo_array)
        try:
            B = scipy.io.mmread(path)
        except ValueError:
            refused.add(path.stem)
            continue
        assert A.shape == B.shape, path.name
        assert A.dtype == B.dtype, path.name
        if A.shape[0] * A.shape[1] <= 2e7:
            np.testing.assert_array_equal(sp.csr_array(A).toarray(), sp.csr_array(B).toarray(),
                                          err_msg=path.name)
        else:  # arrow.mtx, bayer10.mtx: compare canonical CSR
            a, b = sp.csr_array(A), sp.csr_array(B)
            a.sum_duplicates()
            b.sum_duplicates()
            assert (a != b).nnz == 0, path.name
    assert refused == set(RELAXED), refused ^ set(RELAXED)


@pytest.mark.parametrize("name,expected", [
    ("a2", [[1.1, 0], [2.1, 2.2]]),
    ("r2", [[1.1, 1.2, 1.3], [0, 0, 2.3]]),
    ("a4", [[1.1, -99], [2.1, 2.2], [0, 0], [0, 0]]),
    ("a1", [[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]),
    ("c2", [[1.1 + 0.11j, 1.2 + 0.12j], [2.1 + 0.21j, 2.2 + 0.22j]]),
    ("row0", [[0, 0, 0, 0], [-1, 4, 0, 0], [0, 0, 4, -1], [0, 0, 1, 4]]),
])
def test_relaxed_files(matrices_dir, name, expected):
    A = mmread(matrices_dir / f"{name}.mtx")
    np.testing.assert_array_equal(A.toarray(), np.array(expected))


def test_degenerate_shared_files(matrices_dir):
    for name, shape in (("a0", (0, 0)), ("a00", (0, 0)), ("a01", (0, 1)), ("a10", (1, 0)),
                        ("a04", (0, 4))):
        A = mmread(matrices_dir / f"{name}.mtx")
        assert A.shape == shape and A.nnz == 0


def test_large_file_is_fast(matrices_dir):
    path = matrices_dir / "Groebner_id2003_aug.mtx"
    mmread(path)
    t0 = time.perf_counter()
    A = mmread(path)
    elapsed = time.perf_counter() - t0
    assert A.shape == (4967, 2456) and A.dtype == np.int64
    assert elapsed < 1.0, elapsed


# --------------------------------------------------------------------------
# formats, fields and symmetries on small generated files
# --------------------------------------------------------------------------

def read_text(text: str):
    return mmread(pyio.StringIO(text))


def roundtrip(rng, A, **kw):
    buf = pyio.BytesIO()
    scipy.io.mmwrite(buf, A, **kw)
    buf.seek(0)
    text = buf.getvalue()
    return mmread(pyio.BytesIO(text)), scipy.io.mmread(pyio.BytesIO(text)), text


VALID = [(kind, symmetry, dense)
         for kind in ("real", "integer", "complex", "pattern")
         for symmetry in ("general", "symmetric", "skew-symmetric", "hermitian")
         for dense in (False, True)
         if not (kind == "pattern" and (dense or symmetry in ("skew-symmetric", "hermitian")))
         and not (symmetry == "hermitian" and kind != "complex")]


@pytest.mark.parametrize("kind,symmetry,dense", VALID)
def test_matches_scipy_on_written_files(rng, kind, symmetry, dense):
    n = 7
    M = sp.random_array((n, n), density=0.4, rng=rng).toarray()
    if kind == "integer":
        M = np.round(M * 10).astype(np.int64)
    if kind == "complex":
        M = M + 1j * sp.random_array((n, n), density=0.4, rng=rng).toarray()
    if symmetry == "symmetric":
        M = np.tril(M) + np.tril(M, -1).T
    elif symmetry == "skew-symmetric":
        M = np.tril(M, -1) - np.tril(M, -1).T
    elif symmetry == "hermitian":
        M = np.tril(M, -1) + np.tril(M, -1).conj().T + np.diag(np.diag(M).real)
    A = M if dense else sp.coo_array(M)
    ours, theirs, text = roundtrip(rng, A, field=kind, symmetry=symmetry)
    assert symmetry.encode() in text.splitlines()[0]
    assert ours.dtype == np.asarray(theirs.toarray() if sp.issparse(theirs) else theirs).dtype
    ref = theirs.toarray() if sp.issparse(theirs) else theirs
    np.testing.assert_array_equal(ours.toarray(), ref)


def test_array_format_rectangular():
    A = read_text("%%MatrixMarket matrix array real general\n% c\n2 3\n1\n2\n3\n4\n5\n6\n")
    np.testing.assert_array_equal(A.toarray(), [[1, 3, 5], [2, 4, 6]])


def test_zero_based_and_one_based_rule():
    one = read_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 5\n2 2 6\n")
    zero = read_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n0 0 5\n1 1 6\n")
    np.testing.assert_array_equal(one.toarray(), zero.toarray())
    with pytest.raises(MatrixMarketError, match=r"line 4: .*neither 0-based nor 1-based"):
        read_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n0 0 5\n2 2 6\n")


def test_blank_lines_comments_crlf_and_fortran_exponents():
    text = ("\n  \n%%MatrixMarket matrix coordinate real symmetric\r\n%c\r\n\r\n3 3 3\r\n"
            "1 1 1.0D+00\r\n\r\n% a comment in the body\n2 1 -2.5d-1\r\n3 3 4\r\n")
    A = read_text(text)
    np.testing.assert_array_equal(A.toarray(), [[1, -0.25, 0], [-0.25, 0, 0], [0, 0, 4]])


def test_gzip_file(tmp_path, matrices_dir):
    src = (matrices_dir / "west0067.mtx").read_bytes()
    path = tmp_path / "w.mtx.gz"
    path.write_bytes(gzip.compress(src))
    np.testing.assert_array_equal(mmread(path).toarray(),
                                  mmread(matrices_dir / "west0067.mtx").toarray())


# --------------------------------------------------------------------------
# malformed files: MatrixMarketError with the line number
# --------------------------------------------------------------------------

HEAD = "%%MatrixMarket matrix coordinate real general\n"
INT = "%%MatrixMarket matrix coordinate integer general\n"

MALFORMED = [
    ("", None, "empty file"),
    ("\n\n", None, "empty file"),
    ("hello\n1 1 1\n", 1, "banner"),
    ("%%MatrixMarket matrix coordinate real\n1 1 0\n", 1, "words"),
    ("%%MatrixMarket vector coordinate real general\n1 1 0\n", 1, "object"),
    ("%%MatrixMarket matrix sparse real general\n1 1 0\n", 1, "format"),
    ("%%MatrixMarket matrix coordinate float general\n1 1 0\n", 1, "field"),
    ("%%MatrixMarket matrix coordinate real lower\n1 1 0\n", 1, "symmetry"),
    ("%%MatrixMarket matrix array pattern general\n1 1\n", 1, "pattern"),
    (HEAD + "% only comments\n", 3, "before the size line"),
    (HEAD + "2 2\n", 2, "3 integers"),
    (HEAD + "2 x 1\n1 1 1\n", 2, "non-integer"),
    (HEAD + "2 -2 1\n1 1 1\n", 2, "negative size"),
    (HEAD + "2 2 5\n", 2, "5 entries declared for a 2x2"),
    ("%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n1 1 1\n", 2, "square"),
    (HEAD + "2 2 3\n1 1 1\n2 2 2\n", 5, "ends after 2 of the 3"),          # truncated
    (HEAD + "2 2 1\n1 1 1\n2 2 2\n", 4, "more entries than the 1"),        # wrong count
    (HEAD + "2 2 2\n1 1 1\n2 2\n", 4, "2 fields, expected 3"),
    (HEAD + "2 2 2\n1 1 1\n2 2 2 7\n", 4, "4 fields, expected 3"),
    (HEAD + "2 2 2\n1 1 1\n2 2 abc\n", 4, "'abc' is not a number"),         # text in numbers
    (HEAD + "2 2 2\n1 1 1\n2 1.5 2\n", 4, "column index '1.5' is not an integer"),
    (HEAD + "2 2 2\n1 1 1\n3 1 2\n", 4, r"\(3, 1\) out of range"),          # index out of range
    (HEAD + "2 2 2\n0 0 1\n1 3 2\n", 4, r"\(1, 3\) out of range"),          # 0-based, too big
    (HEAD + "2 2 2\n1 1 1\n-1 1 2\n", 4, "negative index"),
    ("%%MatrixMarket matrix coordinate integer general\n1 2 2\n1 1 1\n1 2 2.5\n", 4,
     "'2.5' is not an integer"),
    ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n1 1 3\n", 3,
     "nonzero diagonal"),
    ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n", 6, "ends after 3 of the 4"),
    (HEAD + "2 2 1\n1 1 \xe9\n", 3, "non-ASCII"),
    # integers outside int64: an error naming the line, not a bare OverflowError
    (INT + "2 2 2\n1 1 3\n2 2 18446744073709551615\n", 4,
     "integer 18446744073709551615 out of range \\(int64\\)"),
    (INT + "2 2 2\n1 1 3\n2 2 -9223372036854775809\n", 4,
     "integer -9223372036854775809 out of range"),
    (INT + "2 2 2\n1 1 99999999999999999999\n2 2 x\n", 3, "integer 9+ out of range"),
    (INT + "2 2 2\n1 1 x\n2 2 99999999999999999999\n", 3, "'x' is not an integer"),
    ("%%MatrixMarket matrix array integer general\n2 1\n5\n18446744073709551615\n", 4,
     "integer 18446744073709551615 out of range"),
    ("%%MatrixMarket matrix array integer symmetric\n2 2\n5\n-9223372036854775809\n7\n", 4,
     "integer -9223372036854775809 out of range"),
    (HEAD + "2 2 2\n1 1 1\n18446744073709551617 1 2\n", 4, "row index 1844\\d+ out of range"),
    ("%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 1 7\n2 99999999999999999999 8\n",
     4, "column index 9+ out of range"),
    (HEAD + "99999999999999999999 2 0\n", 2, "size 9+ out of range"),
]


@pytest.mark.parametrize("text,line,message", MALFORMED,
                         ids=[f"case{k}" for k in range(len(MALFORMED))])
def test_malformed(text, line, message):
    with pytest.raises(MatrixMarketError, match=message) as info:
        mmread(pyio.BytesIO(text.encode("latin-1")))
    err = info.value
    assert isinstance(err, ValueError)
    assert err.lineno == line
    assert err.source == "<stream>"
    if line is not None:
        assert f"line {line}:" in str(err)


def test_error_names_the_file(tmp_path):
    path = tmp_path / "bad.mtx"
    path.write_text(HEAD + "2 2 1\n1 1 x\n")
    with pytest.raises(MatrixMarketError, match=r"bad\.mtx, line 3: value 'x' is not a number"):
        mmread(path)
    with pytest.raises(FileNotFoundError):
        mmread(tmp_path / "missing.mtx")


def test_integer_out_of_range_names_the_file_and_line(tmp_path):
    path = tmp_path / "big.mtx"
    path.write_text(INT + "% c\n" * 5 + "2 2 2\n1 1 3\n2 2 18446744073709551615\n")
    with pytest.raises(MatrixMarketError, match=r"big\.mtx, line 9: integer "
                       r"18446744073709551615 out of range \(int64\)") as info:
        mmread(path)
    assert info.value.lineno == 9 and info.value.source == str(path)


def test_int64_limits_are_read_exactly():
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    A = read_text(INT + f"2 2 2\n1 1 {lo}\n2 2 {hi}\n")
    assert A.dtype == np.int64
    np.testing.assert_array_equal(A.toarray(), np.array([[lo, 0], [0, hi]], dtype=np.int64))
    B = read_text(f"%%MatrixMarket matrix array integer general\n2 1\n{hi}\n{lo}\n")
    np.testing.assert_array_equal(B.toarray(), np.array([[hi], [lo]], dtype=np.int64))
