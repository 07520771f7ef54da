"""Generators of the sparse test and benchmark families.

* :func:`chessboard_boundary` -- boundary maps of chessboard complexes, the
  SuiteSparse ``ch{m}-{n}-b{k}`` family (``ch7-8-b3`` is the paper's 58800×11760
  problem with 235200 entries).
* :func:`qap_linearization` -- the constraint matrix of the linearized
  quadratic assignment LPs, Netlib's ``lp_nug{n}`` family (``lp_nug20`` is
  15240×72600 with 304800 entries; its transpose is a rank-deficient
  least-squares problem of issue 16's and 18's benchmarks).
* :func:`grid3d_least_squares` -- the 7-point Laplacian on a k×k×k grid stacked
  over ``shift·I`` (a 2k³×k³ full-rank least-squares problem).
* :func:`random_least_squares` -- random sparse matrices with optional dense
  rows, empty columns and duplicated (rank-deficient) columns.
* :func:`singleton_rich` -- a random sparse matrix whose first columns form a
  chain of column singletons, with an empty (dead) column.
* :func:`random_values` -- a pattern with fresh random values;
  :func:`engine_families` -- the small families of the engine tests.

Every generator is deterministic for a given seed and returns a
``scipy.sparse.csc_array`` of float64.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import scipy.sparse as sp

__all__ = ["small_families", "chessboard_boundary", "chessboard_shape", "engine_families",
           "grid3d_least_squares", "qap_linearization", "qap_shape", "random_least_squares", "random_values", "singleton_rich",
           "staircase_front"]


def chessboard_shape(m: int, n: int, k: int) -> tuple[int, int]:
    """Shape of :func:`chessboard_boundary` ``(m, n, k)`` without building it.

    Rows count k-faces (k+1 non-attacking rooks), columns (k-1)-faces.
    """
    def faces(r):
        if r > min(m, n) or r < 0:
            return 0
        return math.comb(m, r) * math.comb(n, r) * math.factorial(r)
    return faces(k + 1), faces(k)


def _faces(m: int, n: int, r: int) -> np.ndarray:
    """All placements of r non-attacking rooks on an m×n board, as an array of
    shape (count, r, 2) of (row, column) pairs, rooks sorted by board row, in
    lexicographic order."""
    rows = np.array(list(itertools.combinations(range(m), r)), dtype=np.int64).reshape(-1, r)
    cols = np.array(list(itertools.permutations(range(n), r)), dtype=np.int64).reshape(-1, r)
    nr, nc = len(rows), len(cols)
    out = np.empty((nr * nc, r, 2), dtype=np.int64)
    out[:, :, 0] = np.repeat(rows, nc, axis=0)
    out[:, :, 1] = np.tile(cols, (nr, 1))
    return out


def _encode(faces: np.ndarray, m: int, n: int) -> np.ndarray:
    """Injective integer key of each face (cells are rook positions row*n+col)."""
    cells = faces[:, :, 0] * n + faces[:, :, 1]
    base = m * n
    key = np.zeros(len(faces), dtype=np.int64)
    for j in range(cells.shape[1]):
        key = key * base + cells[:, j]
    return key


def chessboard_boundary(m: int, n: int, k: int) -> sp.csc_array:
    """Boundary map ∂_k of the m×n chessboard complex, transposed.

    The k-faces of the chessboard complex are the sets of k+1 non-attacking
    rooks on an m×n board. Row ``i`` of the result is a k-face σ = (v_0, …, v_k)
    (rooks sorted by board row); its entries are ``(-1)^j`` in the columns of the
    (k-1)-faces σ \\ v_j. ``chessboard_boundary(7, 8, 3)`` has the shape,
    entry count and ±1 pattern of SuiteSparse's ``ch7-8-b3`` (58800×11760,
    235200 entries).

    Parameters
    ----------
    m, n : int
        Board size.
    k : int
        Face dimension of the rows (k ≥ 1).

    Returns
    -------
    scipy.sparse.csc_array of float64, shape ``chessboard_shape(m, n, k)``
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    hi = _faces(m, n, k + 1)
    lo = _faces(m, n, k)
    nrows, ncols = len(hi), len(lo)
    if nrows == 0 or ncols == 0:
        return sp.csc_array((nrows, ncols), dtype=np.float64)
    lo_keys = _encode(lo, m, n)
    order = np.argsort(lo_keys)
    sorted_keys = lo_keys[order]
    rows, cols, vals = [], [], []
    for j in range(k + 1):
        sub = np.delete(hi, j, axis=1)
        key = _encode(sub, m, n)
        pos = order[np.searchsorted(sorted_keys, key)]
        rows.append(np.arange(nrows, dtype=np.int64))
        cols.append(pos)
        vals.append(np.full(nrows, (-1.0) ** j))
    A = sp.coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                     shape=(nrows, ncols))
    return sp.csc_array(A)


def qap_shape(n: int) -> tuple[int, int]:
    """Shape of :func:`qap_linearization` ``(n)`` without building it."""
    pairs = n * n * (n - 1) * (n - 1) // 2
    return 2 * n + 2 * n * n * (n - 1), n * n + pairs


def qap_linearization(n: int) -> sp.csc_array:
    """Constraint matrix of the linearized quadratic assignment LP of order n.

    The LP relaxation of an n-facility quadratic assignment problem in the
    Adams--Johnson linearization, whose constraint matrices are Netlib's
    ``lp_nug{n}`` (and ``lp_qap{n}``) family; the flow and distance data enter
    only the objective, so the matrix depends on n alone. The variables are
    the assignments ``x[k, l]`` (facility k at location l; column ``k*n + l``)
    followed by one ``y`` per unordered pair of assignments ``{(i, j), (k, l)}``
    with ``i != k`` and ``j != l`` (in the order of the pair's smaller
    assignment index, then the larger). The rows are

    * ``sum_l x[k, l] = 1`` for each facility k (rows ``0 .. n-1``) and
      ``sum_k x[k, l] = 1`` for each location l (rows ``n .. 2n-1``);
    * for each assignment (k, l) and location ``j != l``:
      ``sum_{i != k} y{(i, j), (k, l)} - x[k, l] = 0``;
    * for each assignment (k, l) and facility ``i != k``:
      ``sum_{j != l} y{(i, j), (k, l)} - x[k, l] = 0``.

    ``qap_linearization(20)`` has lp_nug20's shape and entry count (15240 rows,
    72600 columns, 304800 entries); Netlib's file may order rows and columns
    differently, which an ordering such as COLAMD does not see. The matrix is
    rank deficient (the two families of assignment rows have the same sum).

    Parameters
    ----------
    n : int
        Order of the assignment problem (n >= 2).

    Returns
    -------
    scipy.sparse.csc_array of float64, shape ``qap_shape(n)``, entries ±1
    """
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    nn = n * n
    links = nn * (n - 1)                 # rows per family of linking constraints
    base_col, base_row = 2 * n, 2 * n + links
    # Ordered pairs of assignments a = (i, j), b = (k, l) with i != k and j != l.
    i, j, k, l = (g.ravel() for g in np.meshgrid(*(np.arange(n),) * 4, indexing="ij"))
    keep = (i != k) & (j != l)
    i, j, k, l = i[keep], j[keep], k[keep], l[keep]
    a, b = i * n + j, k * n + l
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    pair_keys = np.unique(lo[a < b] * nn + hi[a < b])
    y_col = nn + np.searchsorted(pair_keys, lo * nn + hi)
    # Each ordered pair (a, b) puts y{a, b} into b's two linking rows of a.
    j_skip = np.where(j < l, j, j - 1)   # position of location j among j != l
    i_skip = np.where(i < k, i, i - 1)
    y_rows = np.concatenate([base_col + b * (n - 1) + j_skip, base_row + b * (n - 1) + i_skip])
    y_cols = np.concatenate([y_col, y_col])
    # x[k, l]: its two assignment rows and -1 in each of its 2(n - 1) linking rows.
    x = np.arange(nn)
    own = (x[:, None] * (n - 1) + np.arange(n - 1)[None, :]).ravel()
    x_rows = np.concatenate([x // n, n + x % n, base_col + own, base_row + own])
    x_cols = np.concatenate([x, x, np.repeat(x, n - 1), np.repeat(x, n - 1)])
    x_vals = np.concatenate([np.ones(2 * nn), -np.ones(2 * links)])
    rows = np.concatenate([x_rows, y_rows])
    cols = np.concatenate([x_cols, y_cols])
    vals = np.concatenate([x_vals, np.ones(len(y_rows))])
    A = sp.coo_array((vals, (rows, cols)), shape=qap_shape(n))
    return sp.csc_array(A)


def grid3d_least_squares(k: int, shift: float = 0.1) -> sp.csc_array:
    """The 7-point Laplacian on a k×k×k grid stacked over ``shift·I``.

    Returns a (2k³)×k³ matrix of full column rank (for shift ≠ 0).
    """
    one = sp.diags_array([-np.ones(k - 1), 2 * np.ones(k), -np.ones(k - 1)],
                         offsets=[-1, 0, 1], shape=(k, k))
    eye = sp.eye_array(k)
    lap = (sp.kron(sp.kron(one, eye), eye) + sp.kron(sp.kron(eye, one), eye)
           + sp.kron(sp.kron(eye, eye), one))
    N = k ** 3
    return sp.csc_array(sp.vstack([lap, shift * sp.eye_array(N)]))


def random_least_squares(m: int, n: int, density: float = 0.05, *, dense_rows: int = 0,
                         empty_cols: int = 0, duplicate_cols: int = 0,
                         seed: int = 0) -> sp.csc_array:
    """Random sparse matrix with optional dense rows and structural defects.

    Parameters
    ----------
    m, n : int
        Shape.
    density : float
        Fraction of entries of the random part.
    dense_rows : int
        Number of rows (chosen at random) made completely dense.
    empty_cols : int
        Number of columns (chosen at random) zeroed.
    duplicate_cols : int
        Number of columns replaced by copies of other columns (numerical rank
        deficiency).
    seed : int
        Seed of ``numpy.random.default_rng``.
    """
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=density, rng=rng, format="lil",
                        data_sampler=rng.standard_normal)
    if m and n:
        for i in rng.choice(m, size=min(dense_rows, m), replace=False):
            A[int(i), :] = rng.standard_normal(n)
    A = sp.csc_array(A)
    if n and (empty_cols or duplicate_cols):
        # column map M: A @ M zeroes some columns and copies others (scaled)
        cols = rng.permutation(n)
        diag = np.ones(n)
        diag[cols[:empty_cols]] = 0.0
        rows_m, cols_m, vals_m = [np.arange(n)], [np.arange(n)], [diag]
        rest = cols[empty_cols:]
        for t in range(min(duplicate_cols, len(rest) // 2)):
            src, dst = rest[2 * t], rest[2 * t + 1]
            diag[dst] = 0.0
            rows_m.append([src]), cols_m.append([dst]), vals_m.append([2.0])
        M = sp.csc_array((np.concatenate(vals_m), (np.concatenate(rows_m), np.concatenate(cols_m))),
                         shape=(n, n))
        A = sp.csc_array(A @ M)
    A.eliminate_zeros()
    return A


def singleton_rich(m: int, n: int, density: float = 0.08, *, seed: int = 0) -> sp.csc_array:
    """Random sparse m×n matrix with chains of column singletons.

    Columns ``0 … min(m, n)//2 - 1`` are replaced by an upper-triangular chain
    (column j: a diagonal entry in [1, 2) on row j and up to two entries in
    rows < j), so they are found as column singletons one after another; the
    last column is empty (a dead singleton). The rest is random.
    """
    rng = np.random.default_rng(seed)
    A = sp.coo_array(sp.random_array((m, n), density=density, rng=rng, format="coo"))
    k = min(m, n) // 2
    keep = (A.col >= k) & (A.col < n - 1)
    rows, cols, vals = [A.row[keep]], [A.col[keep]], [A.data[keep]]
    for j in range(k):
        above = rng.choice(j + 1, size=min(j, 2), replace=False)
        above = above[above != j]
        rows.append(np.concatenate(([j], above)))
        cols.append(np.full(len(above) + 1, j))
        vals.append(np.concatenate(([rng.uniform(1, 2)], rng.standard_normal(len(above)))))
    return sp.csc_array(sp.coo_array((np.concatenate(vals),
                                      (np.concatenate(rows), np.concatenate(cols))),
                                     shape=(m, n)))


def small_families():
    """(name, matrix) of small shapes every sparse-QR test should pass.

    Tall, wide, square, rank-deficient, a dense row, empty columns, a single
    row and column, a grid, a chessboard boundary, degenerate shapes and
    singleton-rich ones. The order is stable (tests slice it).
    """
    yield "tall", random_least_squares(60, 25, 0.1, seed=1)
    yield "wide", random_least_squares(20, 45, 0.12, seed=2)
    yield "square", random_least_squares(40, 40, 0.08, seed=3)
    yield "rankdef", random_least_squares(50, 30, 0.1, duplicate_cols=4, seed=4)
    yield "dense_row", random_least_squares(40, 30, 0.05, dense_rows=2, seed=5)
    yield "empty_cols", random_least_squares(40, 30, 0.1, empty_cols=5, seed=6)
    yield "single_row", sp.csc_array(np.array([[0.0, 2.0, 0.0, -1.0, 3.0]]))
    yield "single_col", sp.csc_array(np.array([[0.0], [2.0], [1.0]]))
    yield "grid", grid3d_least_squares(5)
    yield "chess", chessboard_boundary(4, 5, 2)
    yield "0x0", sp.csc_array((0, 0))
    yield "5x0", sp.csc_array((5, 0))
    yield "0x5", sp.csc_array((0, 5))
    yield "zero_matrix", sp.csc_array((4, 3))
    yield "singletons", singleton_rich(60, 40, seed=3)
    yield "singletons_wide", singleton_rich(30, 50, seed=4)


def staircase_front(fm: int, fn: int, rng, dense_rows: int = 0) -> tuple:
    """A random dense ``fm × fn`` front in staircase order and its staircase.

    Row ``i``'s leading nonzero column is drawn at random (the first
    ``dense_rows`` rows start at column 0) and the rows are sorted by it;
    ``stair[c]`` counts the rows whose leading column is at most ``c`` (the
    dense-front tests' input, :func:`~scipy_gpuqr._engine.dense_front.panels_of`).

    Returns
    -------
    (ndarray of shape (fm, fn), ndarray of shape (fn,))
    """
    lead = np.sort(rng.integers(0, max(fn, 1), size=fm))
    lead[:dense_rows] = 0
    lead = np.sort(lead)
    F = rng.standard_normal((fm, fn))
    F[np.arange(fn)[None, :] < lead[:, None]] = 0.0
    return F, np.searchsorted(lead, np.arange(fn), side="right")


def random_values(A, rng) -> sp.csc_array:
    """A float64 copy of ``A`` with standard normal values drawn from ``rng``."""
    A = sp.csc_array(A, dtype=np.float64, copy=True)
    A.data = rng.standard_normal(A.nnz)
    return A


def engine_families(rng, grid: int = 5):
    """(name, matrix) of the engine tests: fresh values on every call.

    A ``grid``³ grid with random values, the rank-deficient chessboard
    boundary ``ch4-5-b2`` and random least squares with dense rows; the
    values and the seed are drawn from ``rng`` in this order.
    """
    yield f"grid{grid}", random_values(grid3d_least_squares(grid), rng)
    yield "chess-4-5-2", chessboard_boundary(4, 5, 2).astype(np.float64)
    yield "randls", random_least_squares(400, 150, density=0.03, dense_rows=3,
                                         seed=int(rng.integers(1 << 30)))
