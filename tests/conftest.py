"""Shared fixtures: the GPU marker's skip rule, the shared test matrices, the
recorded LSQR/LSMR histories the drop-in rule's tests replay, and the decisions
logged by logger ``scipy_gpuqr``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from scipy_gpuqr._gpu import gpu_available

REPO = Path(__file__).resolve().parents[1]


TEST_MATRICES = REPO / "tests" / "data" / "matrices"


def load_bench(filename: str, alias: str):
    """A fresh module object of ``bench/<filename>`` (the bench scripts are not on
    the import path) under the module name ``alias``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(alias, REPO / "bench" / filename)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def stand_in_device(monkeypatch, min_order=None):
    """NumPy in CuPy's place for the rank decision's dense device work
    (:mod:`scipy_gpuqr._factor.lstsq`: a GPU said to be there, its arrays NumPy's);
    returns the list of the orders of the dense copies made "there", filled as they
    are made. ``min_order``: lstsq's ``SVD_GPU_MIN_ORDER`` for the test."""
    from scipy_gpuqr._factor import lstsq
    made = []
    real_dense = lstsq.dense_from_sparse

    def dense(T, xp):
        made.append(T.shape[0])
        return real_dense(T, xp)
    monkeypatch.setattr(lstsq, "dense_from_sparse", dense)
    monkeypatch.setattr(lstsq._gpu, "gpu_available", lambda: True)
    monkeypatch.setattr(lstsq._gpu, "import_cupy", lambda: np)
    if min_order is not None:
        monkeypatch.setattr(lstsq, "SVD_GPU_MIN_ORDER", min_order)
    return made


def shared_matrices_dir() -> Path | None:
    """The test matrices: ``$SHARED_MATRICES`` when set, else the ones in the repository.

    ``tests/data/matrices`` carries every matrix the tests read (see its
    README), so a fresh clone needs no files from outside the repository.
    """
    env = os.environ.get("SHARED_MATRICES")
    for c in ([Path(env)] if env else []) + [TEST_MATRICES]:
        if c.is_dir():
            return c
    return None


def pytest_configure(config):
    # the tile-schedule disk cache (scipy_gpuqr._schedule.cache) stays out of the
    # user's cache folder: off unless the caller names a folder; its own tests use
    # temporary folders
    os.environ.setdefault("SCIPY_GPUQR_SCHEDULE_CACHE", "off")


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def real_shared_matrices(matrices_dir: Path, *, nonempty: bool = True):
    """``(file name, float64 csc_array)`` of every real or integer shared matrix.

    Complex ones and files our reader refuses are skipped, empty ones too
    unless ``nonempty=False``.
    """
    import scipy.sparse as sp

    from scipy_gpuqr.io import mmread
    for f in sorted(matrices_dir.glob("*.mtx")):
        try:
            A = sp.csc_array(mmread(str(f)))
        except Exception:                       # noqa: BLE001 - a reader gap is not ours
            continue
        if np.iscomplexobj(A.data) or (nonempty and min(A.shape) == 0):
            continue
        yield f.name, A.astype(np.float64)


def banded_deficient(n: int, dead: int, seed: int):
    """An n × n csc_array of rank n − ``dead``: tridiagonal columns plus ``dead``
    columns each the sum of two neighbours, so R stays sparse (the gap-checked
    sparse COD's case)."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    m = n - dead
    B = sp.diags([rng.uniform(1, 2, m), rng.uniform(-1, 1, m), rng.uniform(-1, 1, m)],
                 [0, 1, -1], shape=(n, m), format="csc")
    idx = np.linspace(0, m - 3, dead).astype(int)
    return sp.hstack([B, B[:, idx] + B[:, idx + 1]]).tocsc()


@pytest.fixture
def decisions(caplog):
    """The INFO messages of logger ``scipy_gpuqr`` during the test (what auto says
    answered and why), as a callable returning them."""
    caplog.set_level(logging.INFO, logger="scipy_gpuqr")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "scipy_gpuqr"]


@pytest.fixture(scope="session")
def matrices_dir() -> Path:
    d = shared_matrices_dir()
    if d is None:
        pytest.fail(f"test matrices not found: {TEST_MATRICES} is part of the repository")
    return d


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


#: Residual histories of SciPy's LSQR/LSMR on the shared matrices
#: (``bench/lsqr_histories.py``), replayed by the drop-in rule's tests.
LSQR_HISTORIES = Path(__file__).resolve().parent / "data" / "lsqr_histories.npz"


@pytest.fixture(scope="module")
def histories():
    with np.load(LSQR_HISTORIES) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture
def nominal(monkeypatch):
    """The factorization's prediction of a 2-core machine without calibration, and a
    rule whose analysis takes no time (the replay's clock is the only one)."""
    import types

    from scipy_gpuqr._dispatch import iterate_first as policy
    monkeypatch.setattr(policy, "predicted_seconds",
                        lambda backend, flops, gpu=None: 3e-3 + flops / 8e9)
    monkeypatch.setattr(policy, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))


def nullspace_blocks_fail_on(monkeypatch, device_xp) -> list:
    """Make the nullspace COD's blocks on ``device_xp`` raise MemoryError, as on a
    device whose memory the factors fill; returns the array modules it was tried
    with, in order."""
    from scipy_gpuqr._factor import lstsq as _lstsq
    real = _lstsq.NullspaceCOD
    tried = []

    def tight(*args, xp=np, **kwargs):
        tried.append(xp)
        if xp is device_xp:
            raise MemoryError("the q × d blocks do not fit")
        return real(*args, xp=xp, **kwargs)
    monkeypatch.setattr(_lstsq, "NullspaceCOD", tight)
    return tried
