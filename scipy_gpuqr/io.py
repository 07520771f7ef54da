"""Matrix Market reader that accepts SuiteSparse's relaxed conventions.

:func:`mmread` reads the coordinate and array formats with real, double,
integer, pattern or complex fields and general, symmetric, skew-symmetric or
hermitian storage (expanded to both triangles), and returns a
``scipy.sparse.coo_array``. On top of the Matrix Market specification it
accepts what files in the SuiteSparse test sets use:

* blank lines before the ``%%MatrixMarket`` banner and anywhere in the body;
* 0-based indices. The rule is unambiguous: a coordinate file is read as
  0-based exactly when some row or column index is 0; it is then an error for
  any index to equal its dimension (such a file is neither 0- nor 1-based).
  Otherwise indices are 1-based as in the specification;
* pattern files whose entry lines carry values (the values are ignored);
* Fortran ``D`` exponents (``1.0D+00``).

Anything else that is wrong raises :class:`MatrixMarketError` (a
``ValueError``) naming the file, the line and what is wrong. The body is
parsed vectorized (one ``split`` and NumPy conversions), so a few megabytes
load in a fraction of a second.
"""

from __future__ import annotations

import bz2
import gzip
import os
import re

import numpy as np
import scipy.sparse as sp

from ._errors import MatrixMarketError

__all__ = ["mmread", "MatrixMarketError"]

_FORMATS = ("coordinate", "array")
_FIELDS = ("real", "double", "integer", "pattern", "complex")
_SYMMETRIES = ("general", "symmetric", "skew-symmetric", "hermitian")
_NVALUES = {"real": 1, "double": 1, "integer": 1, "pattern": 0, "complex": 2}
_COMMENT_LINE = re.compile(rb"(?m)^[ \t]*%[^\n]*")
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def mmread(source) -> sp.coo_array:
    """Read a Matrix Market file into a COO sparse array.

    Parameters
    ----------
    source : str, path-like or file-like
        A file name (``.gz`` and ``.bz2`` are decompressed) or an open file
        (text or binary).

    Returns
    -------
    scipy.sparse.coo_array
        float64 for real, double and pattern (pattern entries are 1), int64
        for integer (an index, size or integer value outside int64 is a
        :class:`MatrixMarketError`, never a wrap-around), complex128 for
        complex fields. Symmetric, skew-symmetric
        and hermitian storage is expanded; duplicate entries are kept (they
        sum when converted, as in SciPy). Array-format files give all m·n
        entries, zeros included.

    Raises
    ------
    MatrixMarketError
        For a malformed file, naming the line and the problem.
    OSError
        When the file cannot be read.
    """
    name, data = _read_bytes(source)
    return _Parser(name, data).parse()


def _read_bytes(source) -> tuple[str, bytes]:
    if hasattr(source, "read"):
        data = source.read()
        if isinstance(data, str):
            data = data.encode("utf-8")
        return str(getattr(source, "name", "<stream>")), data
    path = os.fspath(source)
    if str(path).endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return str(path), fh.read()
    if str(path).endswith(".bz2"):
        with bz2.open(path, "rb") as fh:
            return str(path), fh.read()
    with open(path, "rb") as fh:
        return str(path), fh.read()


class _Parser:
    """One parse of one file's bytes (holds the position while reading the header)."""

    def __init__(self, name: str, data: bytes):
        self.name = name
        self.data = data
        self.pos = 0
        self.lineno = 0

    def error(self, lineno, reason) -> MatrixMarketError:
        return MatrixMarketError(self.name, lineno, reason)

    def _next_line(self) -> bytes | None:
        if self.pos >= len(self.data):
            return None
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            end = len(self.data)
        line = self.data[self.pos:end]
        self.pos = end + 1
        self.lineno += 1
        return line

    # -------------------------------------------------------------- header

    def _header(self):
        line = self._next_line()
        while line is not None and not line.strip():
            line = self._next_line()
        if line is None:
            raise self.error(None, "empty file (no %%MatrixMarket banner)")
        tokens = line.decode("latin-1").split()
        if not tokens or tokens[0].lower() != "%%matrixmarket":
            raise self.error(self.lineno, "missing '%%MatrixMarket' banner, found "
                             f"{line[:60].decode('latin-1')!r}")
        if len(tokens) != 5:
            raise self.error(self.lineno, "banner must read '%%MatrixMarket matrix <format> "
                             f"<field> <symmetry>', found {len(tokens)} words")
        obj, fmt, field, symmetry = (t.lower() for t in tokens[1:])
        if obj != "matrix":
            raise self.error(self.lineno, f"object {tokens[1]!r} is not supported (only 'matrix')")
        for value, allowed, what in ((fmt, _FORMATS, "format"), (field, _FIELDS, "field"),
                                     (symmetry, _SYMMETRIES, "symmetry")):
            if value not in allowed:
                raise self.error(self.lineno, f"unknown {what} {value!r} (expected one of "
                                 f"{', '.join(allowed)})")
        if fmt == "array" and field == "pattern":
            raise self.error(self.lineno, "the array format cannot have a pattern field")
        if symmetry == "hermitian" and field != "complex":
            symmetry = "symmetric"  # a real hermitian matrix is symmetric
        banner_line = self.lineno

        line = self._next_line()
        while line is not None and (not line.strip() or line.lstrip().startswith(b"%")):
            line = self._next_line()
        if line is None:
            raise self.error(self.lineno + 1, "file ends before the size line")
        words = line.decode("latin-1").split()
        want = 3 if fmt == "coordinate" else 2
        labels = "rows columns entries" if want == 3 else "rows columns"
        if len(words) != want:
            raise self.error(self.lineno, f"size line must hold {want} integers ({labels}), "
                             f"found {line.strip()[:60].decode('latin-1')!r}")
        try:
            sizes = [int(w) for w in words]
        except ValueError:
            raise self.error(self.lineno, f"size line holds a non-integer: "
                             f"{line.strip()[:60].decode('latin-1')!r}") from None
        if min(sizes) < 0:
            raise self.error(self.lineno, f"negative size in {sizes}")
        if max(sizes) > _INT64_MAX:
            raise self.error(self.lineno, f"size {max(sizes)} out of range (int64)")
        m, n = sizes[:2]
        if symmetry != "general" and m != n:
            raise self.error(self.lineno, f"a {symmetry} matrix must be square, size line "
                             f"says {m}x{n}")
        nnz = sizes[2] if fmt == "coordinate" else None
        if fmt == "coordinate" and symmetry == "general" and nnz > m * n:
            raise self.error(self.lineno, f"{nnz} entries declared for a {m}x{n} matrix")
        return fmt, field, symmetry, m, n, nnz, banner_line

    # ---------------------------------------------------------------- body

    def parse(self) -> sp.coo_array:
        fmt, field, symmetry, m, n, nnz, _ = self._header()
        first = self.lineno + 1  # line number of the body's first line
        body = self.data[self.pos:]
        if b"%" in body:  # comment lines inside the body: blank them, keep numbering
            body = _COMMENT_LINE.sub(b"", body)
        nvals = _NVALUES[field]
        per_entry = (2 if fmt == "coordinate" else 0) + nvals
        if fmt == "coordinate":
            count = nnz
        elif symmetry == "general":
            count = m * n
        elif symmetry == "skew-symmetric":
            count = n * (n - 1) // 2
        else:
            count = n * (n + 1) // 2

        counts = _tokens_per_line(body)
        entry_lines = np.flatnonzero(counts)
        if entry_lines.size < count:
            last = first + (int(entry_lines[-1]) if entry_lines.size else -1)
            raise self.error(last + 1, f"file ends after {entry_lines.size} of the {count} "
                             "entries declared (truncated, or a wrong size line)")
        if entry_lines.size > count:
            raise self.error(first + int(entry_lines[count]),
                             f"more entries than the {count} declared in the size line")
        found = counts[entry_lines]
        relaxed_pattern = field == "pattern" and np.all(found >= 2)
        bad = np.flatnonzero(found != per_entry) if not relaxed_pattern else np.zeros(0, int)
        if bad.size:
            k = int(bad[0])
            what = "row column" + {0: "", 1: " value", 2: " real imaginary"}[nvals] \
                if fmt == "coordinate" else ("value" if nvals == 1 else "real imaginary")
            raise self.error(first + int(entry_lines[k]), f"entry has {int(found[k])} fields, "
                             f"expected {per_entry} ({what})")
        try:
            text = body.decode("ascii")
        except UnicodeDecodeError as exc:
            line = first + body.count(b"\n", 0, exc.start)
            raise self.error(line, "non-ASCII byte in the data") from None
        if relaxed_pattern and np.any(found != 2):
            # SuiteSparse pattern files with values: keep the two indices of each line
            tokens = [tok for line in text.splitlines() for tok in line.split()[:2]]
            per_entry = 2
        else:
            tokens = text.split()
        line_of = first + entry_lines  # line number of each entry

        if fmt == "coordinate":
            rows = self._ints(tokens[0::per_entry], line_of, "row index")
            cols = self._ints(tokens[1::per_entry], line_of, "column index")
            vals = self._values(tokens, 2, per_entry, field, line_of, count)
            rows, cols = self._rebase(rows, cols, m, n, line_of)
        else:
            vals = self._values(tokens, 0, per_entry, field, line_of, count)
            rows, cols = _array_indices(m, n, symmetry)

        if symmetry != "general":
            rows, cols, vals = self._expand(rows, cols, vals, symmetry, line_of, fmt)
        return sp.coo_array((vals, (rows, cols)), shape=(m, n))

    def _ints(self, toks, line_of, what, label=None) -> np.ndarray:
        """Convert integer tokens to int64, naming the line of the first bad one.

        ``what`` names a token in the "is not an integer" message and ``label``
        (default ``what``) in the "out of range" one. A token that is an integer
        but does not fit int64 is an error rather than a silent wrap-around or
        a float: the result's dtype is int64, as documented by :func:`mmread`.
        """
        if not toks:
            return np.zeros(0, np.int64)
        try:
            return np.array(toks, dtype=np.int64)
        except (ValueError, OverflowError):
            pass
        # slow path, only for a file that fails the fast one: find the first bad token
        values = []
        for k, tok in enumerate(toks):
            try:
                value = int(tok)
            except ValueError:
                raise self.error(int(line_of[k]), f"{what} {tok!r} is not an "
                                 "integer") from None
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise self.error(int(line_of[k]), f"{label or what} {tok} out of range "
                                 "(int64)")
            values.append(value)
        return np.array(values, dtype=np.int64)

    def _floats(self, toks, line_of, what) -> np.ndarray:
        if not toks:
            return np.zeros(0)
        try:
            return np.array(toks, dtype=np.float64)
        except ValueError:
            pass
        fixed = [t.replace("D", "E").replace("d", "e") for t in toks]
        try:
            return np.array(fixed, dtype=np.float64)
        except ValueError:
            for k, tok in enumerate(fixed):
                try:
                    float(tok)
                except ValueError:
                    raise self.error(int(line_of[k]), f"{what} {toks[k]!r} is not a "
                                     "number") from None
            raise

    def _values(self, tokens, offset, per_entry, field, line_of, count) -> np.ndarray:
        if field == "pattern":
            return np.ones(count, dtype=np.float64)
        if field == "integer":
            return self._ints(tokens[offset::per_entry], line_of, "integer value",
                              label="integer")
        re_ = self._floats(tokens[offset::per_entry], line_of, "value")
        if field == "complex":
            im = self._floats(tokens[offset + 1::per_entry], line_of, "imaginary part")
            return re_ + 1j * im
        return re_

    def _rebase(self, rows, cols, m, n, line_of):
        """Apply the 0-/1-based rule of the module docstring and check ranges."""
        if rows.size == 0:
            return rows, cols
        lo = min(int(rows.min()), int(cols.min()))
        if lo < 0:
            k = int(np.flatnonzero((rows < 0) | (cols < 0))[0])
            raise self.error(int(line_of[k]), f"negative index ({rows[k]}, {cols[k]})")
        if lo == 0:
            at_dim = (rows == m) | (cols == n)
            if at_dim.any():
                k = int(np.flatnonzero(at_dim)[0])
                z = int(np.flatnonzero((rows == 0) | (cols == 0))[0])
                raise self.error(int(line_of[k]), f"index ({rows[k]}, {cols[k]}) equals the "
                                 f"dimension {m}x{n} while line {int(line_of[z])} uses index "
                                 "0: neither 0-based nor 1-based")
            base, lo_ok = 0, 0
        else:
            base, lo_ok = 1, 1
        out = (rows - base >= m) | (cols - base >= n)
        if out.any():
            k = int(np.flatnonzero(out)[0])
            raise self.error(int(line_of[k]), f"index ({rows[k]}, {cols[k]}) out of range for "
                             f"a {m}x{n} matrix ({'0' if base == 0 else '1'}-based: rows "
                             f"{lo_ok}..{m - 1 + base}, columns {lo_ok}..{n - 1 + base})")
        return rows - base, cols - base

    def _expand(self, rows, cols, vals, symmetry, line_of, fmt):
        off = rows != cols
        if symmetry == "skew-symmetric" and fmt == "coordinate":
            diag = (~off) & (vals != 0)
            if diag.any():
                k = int(np.flatnonzero(diag)[0])
                raise self.error(int(line_of[k]), "a skew-symmetric matrix has a nonzero "
                                 f"diagonal entry at ({rows[k]}, {cols[k]}) (0-based)")
        mirrored = vals[off]
        if symmetry == "skew-symmetric":
            mirrored = -mirrored
        elif symmetry == "hermitian":
            mirrored = np.conj(mirrored)
        return (np.concatenate([rows, cols[off]]), np.concatenate([cols, rows[off]]),
                np.concatenate([vals, mirrored]))


def _tokens_per_line(body: bytes) -> np.ndarray:
    """Number of whitespace-separated tokens on each line of ``body``."""
    buf = np.frombuffer(body, dtype=np.uint8)
    if buf.size == 0:
        return np.zeros(1, dtype=np.int64)
    newline = buf == 10
    space = newline | (buf == 32) | (buf == 9) | (buf == 13) | (buf == 11) | (buf == 12)
    start = ~space
    start[1:] &= space[:-1]
    line = np.cumsum(newline) - newline  # line index of each byte
    return np.bincount(line[start], minlength=int(newline.sum()) + 1)


def _array_indices(m: int, n: int, symmetry: str):
    """Row and column of each value of an array-format file (column-major order)."""
    if symmetry == "general":
        cols, rows = np.divmod(np.arange(m * n, dtype=np.int64), m) if m else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64))
        return rows, cols
    # lower triangle, column by column (strictly lower for skew-symmetric)
    upper_r, upper_c = np.triu_indices(n, k=1 if symmetry == "skew-symmetric" else 0)
    return upper_c.astype(np.int64), upper_r.astype(np.int64)
