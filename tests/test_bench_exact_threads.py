"""bench/exact_threads.py: its report on a small row, and its sampler sees a pool woken."""

import os
import subprocess
import sys

import pytest

from scipy_gpuqr._cpu.spqr import spqr_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "exact_threads.py")
LINUX = sys.platform.startswith("linux")


def _run(args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.skipif(not LINUX or not spqr_available()[0],
                    reason="per-thread CPU from /proc; SuiteSparseQR")
def test_report_on_a_small_row():
    out = _run([SCRIPT, "--rows", "dwt_878", "--reps", "1", "--gap", "0.05", "--plain-norms",
                "--lanes", "2"])
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "lanes 2, plain norms True" in text
    assert "dwt_878: wall" in text and "x crc" in text
    assert "\n  main " in text                      # the main thread's own CPU row
    assert "pools woken" in text


@pytest.mark.skipif(not LINUX, reason="per-thread CPU from /proc")
def test_sampler_charges_a_wake_to_the_call_that_spread():
    code = f"""
import sys, time
sys.path.insert(0, {os.path.join(ROOT, 'bench')!r})
import exact_threads as et
import numpy as np
pools = et.find_openblas_pools()
if not pools:
    print("no pools"); sys.exit(0)
for get, set_ in pools:
    before = et._tids(); set_(2)
    for t in et._tids() - before:
        et.LABELS[t] = "pool " + getattr(set_, "__name__", "?")
for n in (1000, 4_000_000):        # a short dot runs on the caller's thread alone
    x = np.ones(n)
    time.sleep(0.3)
    with et.Sampler() as s:
        time.sleep(0.05)
        for _ in range(50):
            x @ x                   # NumPy's dot spreads a long vector over its pool
        time.sleep(0.05)
    print("wakes", sum(s.wakes.values()))
"""
    out = _run(["-c", code])
    assert out.returncode == 0, out.stderr
    if "no pools" in out.stdout:
        pytest.skip("no OpenBLAS reachable in this process")
    short, long_ = (int(part.split()[0]) for part in out.stdout.split("wakes")[1:])
    assert short == 0
    assert long_ >= 1
