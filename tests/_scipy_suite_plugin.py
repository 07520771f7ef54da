"""pytest plugin: SciPy's own test files run against ``scipy_gpuqr.patch()``.

Loaded by :mod:`test_scipy_suite` in a separate pytest process
(``-p _scipy_suite_plugin``). SciPy's test modules bind ``spsolve``,
``factorized``, ``lsqr`` and ``lsmr`` when they are imported, so SciPy is
patched when pytest is configured, before collection imports them; each
collected module that holds one of those names is then checked to hold
ours (a test of SciPy's unpatched function would prove nothing).

``test_lsqr.py`` draws its problem from NumPy's global random state when it is
imported, unseeded, and its tolerances are fragile (SciPy's gh-15301): about one
draw in two hundred fails ``test_initialization`` with SciPy's own ``lsqr`` as
well (ours, equal to SciPy's there, fails with it). The state is seeded before
collection, so every run tests the same problems.
"""

from __future__ import annotations

import numpy as np
import pytest

import scipy_gpuqr
from scipy_gpuqr._api.patch import OURS


#: Seed of NumPy's global random state before SciPy's test modules are imported.
SEED = 0


def pytest_configure(config):
    np.random.seed(SEED)
    scipy_gpuqr.patch()
    # SciPy's conftest (not loaded here) registers the markers its tests use
    config.addinivalue_line("markers", "slow: SciPy's long-running tests")


def pytest_collection_modifyitems(session, config, items):
    for module in {item.module for item in items if getattr(item, "module", None)}:
        namespace = vars(module)
        for name, ours in OURS.items():
            if name in namespace and namespace[name] is not ours:
                raise pytest.UsageError(f"{module.__name__}.{name} is not scipy_gpuqr's: "
                                        "SciPy was not patched before its tests were imported")
