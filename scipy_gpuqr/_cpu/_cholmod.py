"""CHOLMOD object layouts and helpers for calling SuiteSparse through cffi (ABI mode).

All knowledge of C struct layouts lives here:

* ``cholmod_sparse`` and ``cholmod_dense`` are declared to cffi field by field
  (their layout is the same in CHOLMOD 3.x, 4.x and 5.x, i.e. SuiteSparse 5.x
  and 7.x), so cffi computes their offsets.
* ``cholmod_common`` is opaque to cffi: we allocate a zeroed byte buffer larger
  than the struct in any supported version and read or write the few fields we
  use at the byte offsets in :data:`COMMON_FIELDS`. These offsets are the same
  in CHOLMOD 3.0 (SuiteSparse 5.12: sizeof 2664), 4.0 and 5.0: CHOLMOD 5
  renamed ``dtype`` to ``other_5`` and shortened ``SPQR_istat`` from 10 to 8
  entries, putting 16 bytes of new fields after it, so nothing before moved.

The offsets are verified twice: ``tests/test_cpu_spqr.py`` compiles a probe
against the installed headers (``offsetof``) when a compiler and headers are
present, and :class:`Common` checks at run time, after ``cholmod_l_start``,
that the fields hold their documented defaults (``print`` = 3,
``itype`` = CHOLMOD_LONG, ``SPQR_grain`` = 1, ``SPQR_small`` = 1e6,
``SPQR_shrink`` = 1, ``status`` = 0). A library whose layout differs is
refused with :class:`CholmodLayoutError` instead of being corrupted.

Nothing is module-global except the immutable cdef text and tables; each
:class:`Common` is one ``cholmod_common`` owned by one call.
"""

from __future__ import annotations

import struct

import numpy as np

from .._errors import CholmodLayoutError
from .._trusted_csc import csc_of

__all__ = ["CDEF", "COMMON_FIELDS", "COMMON_BYTES", "Common", "CholmodLayoutError",
           "CHOLMOD_LONG", "CHOLMOD_REAL", "CHOLMOD_DOUBLE", "sparse_view", "dense_view",
           "sparse_to_scipy", "dense_to_numpy", "STATUS_NAMES"]

#: cffi declarations of the CHOLMOD objects and functions we call (int64 ``_l_`` API)
CDEF = """
typedef struct cholmod_sparse_struct {
    size_t nrow; size_t ncol; size_t nzmax;
    void *p; void *i; void *nz; void *x; void *z;
    int stype; int itype; int xtype; int dtype; int sorted; int packed;
} cholmod_sparse;

typedef struct cholmod_dense_struct {
    size_t nrow; size_t ncol; size_t nzmax; size_t d;
    void *x; void *z;
    int xtype; int dtype;
} cholmod_dense;

typedef struct cholmod_common_struct cholmod_common;

int cholmod_l_start(cholmod_common *);
int cholmod_l_finish(cholmod_common *);
int cholmod_l_free_sparse(cholmod_sparse **, cholmod_common *);
int cholmod_l_free_dense(cholmod_dense **, cholmod_common *);
void *cholmod_l_free(size_t, size_t, void *, cholmod_common *);
int cholmod_l_version(int version[3]);
"""

#: field name -> (byte offset in cholmod_common, C type); see the module docstring
COMMON_FIELDS: dict[str, tuple[int, str]] = {
    "print": (144, "int"),
    "try_catch": (152, "int"),
    "itype": (1960, "int"),
    "status": (1972, "int"),
    "memory_usage": (2016, "size_t"),
    "memory_inuse": (2024, "size_t"),
    "SPQR_grain": (2080, "double"),
    "SPQR_small": (2088, "double"),
    "SPQR_shrink": (2096, "int"),
    "SPQR_nthreads": (2100, "int"),
    "SPQR_flopcount": (2104, "double"),
    "SPQR_analyze_time": (2112, "double"),
    "SPQR_factorize_time": (2120, "double"),
    "SPQR_solve_time": (2128, "double"),
    "SPQR_flopcount_bound": (2136, "double"),
    "SPQR_tol_used": (2144, "double"),
    "SPQR_norm_E_fro": (2152, "double"),
    "SPQR_istat": (2160, "int64_t"),  # array: 10 entries in CHOLMOD 3/4, 8 in 5
}

#: bytes allocated for one cholmod_common: more than sizeof in every supported
#: version (2664 in CHOLMOD 3.0 and 4.0; 2680 in 5.0)
COMMON_BYTES = 4096

#: entries of SPQR_istat that exist in every version, and what they mean
SPQR_ISTAT = ("nnz_R_bound", "nnz_H_bound", "n_fronts", "n_tasks", "rank",
              "n_column_singletons", "n_singleton_rows", "ordering_used")

CHOLMOD_LONG = 2
CHOLMOD_REAL = 1
CHOLMOD_DOUBLE = 0
CHOLMOD_OK = 0
CHOLMOD_OUT_OF_MEMORY = -2

STATUS_NAMES = {0: "CHOLMOD_OK", -1: "CHOLMOD_NOT_INSTALLED", -2: "CHOLMOD_OUT_OF_MEMORY",
                -3: "CHOLMOD_TOO_LARGE", -4: "CHOLMOD_INVALID", -5: "CHOLMOD_GPU_PROBLEM",
                1: "CHOLMOD_NOT_POSDEF", 2: "CHOLMOD_DSMALL"}

#: ``struct`` formats (native byte order and sizes) and sizes of COMMON_FIELDS' C types
_FORMATS = {"int": "=i", "double": "=d", "size_t": "@N", "int64_t": "=q"}
_SIZES = {ctype: struct.calcsize(fmt) for ctype, fmt in _FORMATS.items()}

# defaults set by cholmod_l_start, used to check the layout at run time
_EXPECTED_DEFAULTS = {"print": 3, "itype": CHOLMOD_LONG, "status": 0, "SPQR_grain": 1.0,
                      "SPQR_small": 1e6, "SPQR_shrink": 1}


class Common:
    """One ``cholmod_common``, started on entry and finished on exit.

    Use as a context manager; ``ptr`` is the ``cholmod_common *`` to pass to C.
    Printing by CHOLMOD is turned off (``print`` = 0): errors come back as
    exceptions from :meth:`check`. The layout of the started common is checked
    against the defaults we know (:class:`CholmodLayoutError`) unless
    ``check_layout`` is False: a caller that checked this library's layout once
    (its handle does not change) skips the reads on every later common.
    """

    def __init__(self, ffi, lib, *, check_layout: bool = True):
        self._ffi = ffi
        self._lib = lib
        self._check = check_layout
        self._buf = None
        self.ptr = None

    def __enter__(self) -> "Common":
        ffi = self._ffi
        self._buf = ffi.new("char[]", COMMON_BYTES)
        self.ptr = ffi.cast("cholmod_common *", self._buf)
        if not self._lib.cholmod_l_start(self.ptr):
            raise RuntimeError("cholmod_l_start failed")
        if self._check:
            try:
                self._check_layout()
            except BaseException:
                self._lib.cholmod_l_finish(self.ptr)
                raise
        self["print"] = 0
        return self

    def __exit__(self, *exc) -> None:
        if self.ptr is not None:
            self._lib.cholmod_l_finish(self.ptr)
            self.ptr = None

    def _field(self, name: str):
        offset, ctype = COMMON_FIELDS[name]
        return self._ffi.cast(ctype + " *", self._buf + offset)

    def __getitem__(self, name: str):
        return self._field(name)[0]

    def __setitem__(self, name: str, value) -> None:
        self._field(name)[0] = value

    def istat(self) -> dict:
        """SPQR's integer statistics (``SPQR_istat[0:8]``) by name."""
        offset = COMMON_FIELDS["SPQR_istat"][0]
        fmt = f"={len(SPQR_ISTAT)}q"
        raw = self._ffi.buffer(self._buf)[offset:offset + struct.calcsize(fmt)]
        return dict(zip(SPQR_ISTAT, struct.unpack_from(fmt, raw)))

    def values(self, names) -> tuple:
        """The scalar fields ``names`` (of :data:`COMMON_FIELDS`, not ``SPQR_istat``), read
        from one copy of the span that holds them: what ``self[name]`` reads, for each."""
        spans = [COMMON_FIELDS[name] for name in names]
        lo = min(offset for offset, _ in spans)
        hi = max(offset + _SIZES[ctype] for offset, ctype in spans)
        raw = self._ffi.buffer(self._buf)[lo:hi]
        return tuple(struct.unpack_from(_FORMATS[ctype], raw, offset - lo)[0]
                     for offset, ctype in spans)

    def _check_layout(self) -> None:
        found = {name: self[name] for name in _EXPECTED_DEFAULTS}
        if found != _EXPECTED_DEFAULTS:
            raise CholmodLayoutError(
                "the loaded CHOLMOD library's cholmod_common layout is not the one "
                f"scipy_gpuqr knows (defaults after cholmod_l_start read as {found}, "
                f"expected {_EXPECTED_DEFAULTS}); SuiteSparse 5.x or 7.x is supported")

    def status(self) -> int:
        return int(self["status"])

    def check(self, function: str, ok: bool = True) -> None:
        """Raise if ``function`` failed (``ok`` false) or left an error status.

        Raises
        ------
        MemoryError
            For CHOLMOD_OUT_OF_MEMORY.
        RuntimeError
            For any other failure; the message names ``function`` and the status.
        """
        status = self.status()
        if ok and status >= CHOLMOD_OK:
            return
        name = STATUS_NAMES.get(status, str(status))
        if status == CHOLMOD_OUT_OF_MEMORY:
            raise MemoryError(f"{function}: SuiteSparse ran out of memory "
                              f"({name}; peak {self['memory_usage']} bytes)")
        raise RuntimeError(f"{function} failed with status {status} ({name})")


def sparse_view(ffi, A, keep: list):
    """A ``cholmod_sparse`` (CHOLMOD_LONG, real double, packed) viewing CSC arrays.

    Parameters
    ----------
    A : scipy.sparse.csc_array
        float64 data, int64 indptr/indices, canonical (sorted, no duplicates).
    keep : list
        The arrays and cffi objects that must outlive the view are appended.
    """
    m, n = A.shape
    indptr = np.ascontiguousarray(A.indptr, dtype=np.int64)
    # never hand C a zero-length buffer (some checks reject NULL pointers)
    indices = np.ascontiguousarray(A.indices, dtype=np.int64)
    data = np.ascontiguousarray(A.data, dtype=np.float64)
    if indices.size == 0:
        indices = np.zeros(1, dtype=np.int64)
        data = np.zeros(1, dtype=np.float64)
    s = ffi.new("cholmod_sparse *")
    s.nrow, s.ncol, s.nzmax = m, n, max(int(indptr[-1]), 1)
    pp = ffi.from_buffer("int64_t[]", indptr)
    ip = ffi.from_buffer("int64_t[]", indices)
    xp = ffi.from_buffer("double[]", data)
    s.p, s.i, s.x = pp, ip, xp
    s.nz = ffi.NULL
    s.z = ffi.NULL
    s.stype = 0
    s.itype = CHOLMOD_LONG
    s.xtype = CHOLMOD_REAL
    s.dtype = CHOLMOD_DOUBLE
    s.sorted = 1
    s.packed = 1
    keep.extend((indptr, indices, data, pp, ip, xp, s))
    return s


def dense_view(ffi, X: np.ndarray, keep: list):
    """A ``cholmod_dense`` viewing a 2-D float64 Fortran-ordered array (no copy)."""
    assert X.ndim == 2 and X.dtype == np.float64 and X.flags.f_contiguous
    m, k = X.shape
    buf = X if X.size else np.zeros(1, dtype=np.float64)
    d = ffi.new("cholmod_dense *")
    d.nrow, d.ncol, d.nzmax, d.d = m, k, max(m * k, 1), max(m, 1)
    xp = ffi.from_buffer("double[]", buf.reshape(-1, order="F"))
    d.x = xp
    d.z = ffi.NULL
    d.xtype = CHOLMOD_REAL
    d.dtype = CHOLMOD_DOUBLE
    keep.extend((buf, xp, d))
    return d


def sparse_to_scipy(ffi, s):
    """Copy a packed CHOLMOD_LONG real ``cholmod_sparse`` into a csc_array."""
    m, n = int(s.nrow), int(s.ncol)
    if s.packed != 1 or s.itype != CHOLMOD_LONG or s.xtype != CHOLMOD_REAL:
        raise RuntimeError(f"unexpected cholmod_sparse from SuiteSparse (packed={s.packed}, "
                           f"itype={s.itype}, xtype={s.xtype})")
    indptr = np.frombuffer(ffi.buffer(ffi.cast("int64_t *", s.p), 8 * (n + 1)),
                           dtype=np.int64).copy()
    nnz = int(indptr[-1])
    indices = np.frombuffer(ffi.buffer(ffi.cast("int64_t *", s.i), 8 * nnz),
                            dtype=np.int64).copy()
    data = np.frombuffer(ffi.buffer(ffi.cast("double *", s.x), 8 * nnz),
                         dtype=np.float64).copy()
    return csc_of(data, indices, indptr, (m, n))


def dense_to_numpy(ffi, d) -> np.ndarray:
    """Copy a real ``cholmod_dense`` into a Fortran-ordered (nrow, ncol) array."""
    m, k, ld = int(d.nrow), int(d.ncol), int(d.d)
    if d.xtype != CHOLMOD_REAL:
        raise RuntimeError(f"unexpected cholmod_dense xtype {d.xtype} from SuiteSparse")
    if m == 0 or k == 0:
        return np.zeros((m, k), dtype=np.float64, order="F")
    raw = np.frombuffer(ffi.buffer(ffi.cast("double *", d.x), 8 * ld * k), dtype=np.float64)
    return np.asfortranarray(raw.reshape(ld, k, order="F")[:m].copy(order="F"))
