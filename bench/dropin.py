"""The drop-in promise, measured: ``auto`` against the SciPy function it replaces.

Run on a CPU-only machine and on the GPU machine (one run each)::

    python3 bench/dropin.py --json /tmp/dropin_cpu.json --png /tmp/dropin_cpu.png
    source .dev/remote-setup.sh
    python3 bench/dropin.py --gpu --json $OUT/dropin.json --png $OUT/dropin.png

The ladder: every real matrix of ``tests/data/matrices`` (or ``$SHARED_MATRICES``; square ones through
``spsolve`` and ``lsqr``, rectangular ones through ``lsqr`` and ``lsmr``),
generated 3-D grid least-squares problems, random least squares and
chessboard complexes (``--gpu`` adds the multi-TFlop ones). b is random
(seeded by the problem's name, so ``--only`` runs the same rows), and
least-squares problems have a nonzero residual.

Each row times SciPy's own function (``scipy.sparse.linalg``, unpatched, its
default arguments) and ours under ``backend='auto'`` with the same
arguments: one first call each (kernels compiled, caches and BLAS threads
warm), then timed calls alternating SciPy / ours until about ``--budget``
seconds were spent per solver (at least one, at most ``--reps``); the median
is reported. Where the two first calls together take ``--budget`` or more,
they are the row's timings (one call each: a process's first use of
something, the QR's analysis say, then lands in that row's time; warm it
before the ladder where that matters). With ``--clock process`` the clock is
the process's CPU time instead of the wall clock, for a host that other jobs
load. A call's time ends when it returns, as
its caller sees it: NumPy in, NumPy out, so a GPU's answer has been copied back
(a result on the device would be timed to the device's synchronize). The device
is synchronized before each window opens, outside it, and again once the call has
returned; that second figure, work a call left queued on the device included, is
kept beside the first (``*_synced_s``) and its medians printed in the summary.
Reported per row: SciPy's seconds, istop/itn and backward error; ours
(seconds, backward error, what answered, from the ``scipy_gpuqr`` log); the
ratio ours/SciPy. Backward error: ‖r‖/(‖A‖_F‖x‖+‖b‖) for a consistent
system, for tall or square A the smaller of that and ‖Aᵀr‖/(‖A‖_F‖r‖) (a
singular square A with a random b is an inconsistent least-squares problem).

A row *converges* when SciPy's iterations stop by its convergence tests
(lsqr/lsmr istop 1 or 2) within 1000 iterations, or for ``spsolve``; the
issue's targets are ours/SciPy ≤ 1.10 there (medians over the converging
lsqr/lsmr rows, which the summary gives beside the median over every
converging row, ``spsolve``'s included) and, where SciPy stops at
``iter_lim``/``conlim`` or needs more than 1000 iterations, a working
precision answer faster than SciPy's; our backward error never worse.
A markdown table (for bench/RESULTS.md) and the medians are printed last;
``--png`` plots the ratio per row on a log scale (matplotlib, skipped with a
message when it is missing) and ``--svg`` draws the same plot as SVG without
any plotting library; ``--plot-from`` redraws either from an earlier run's
``--json`` without running the ladder::

    python3 bench/dropin.py --plot-from dropin.json --svg dropin.svg
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import math
import statistics
import sys
import time
import zlib
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import scipy_gpuqr  # noqa: E402
from scipy_gpuqr._cli.solve_report import captured_decisions  # noqa: E402
from scipy_gpuqr._gpu import import_cupy, is_cupy_array  # noqa: E402
from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,  # noqa: E402
                                           random_least_squares)
from scipy_gpuqr.io import mmread  # noqa: E402

MATRICES = Path(os.environ.get("SHARED_MATRICES") or ROOT / "tests" / "data" / "matrices")
#: matrices whose factorization does not fit a 24 GB host (arrow: nnz(R) about 3e9)
TOO_LARGE = {"arrow.mtx"}
CONVERGED_ISTOP = (1, 2)


def ladder(gpu: bool, quick: bool):
    """``(name, kind, make_matrix)`` of every problem, shared matrices first."""
    rows = []
    for path in sorted(MATRICES.glob("*.mtx")):
        if path.name in TOO_LARGE:
            continue
        rows.append((path.stem, "shared", lambda p=path: sp.csc_array(mmread(str(p)))))
    gen = [("grid16", lambda: grid3d_least_squares(16)),
           ("grid24", lambda: grid3d_least_squares(24)),
           ("rand20000x4000", lambda: random_least_squares(20000, 4000, 0.0012, seed=1)),
           ("ch6-7-b3", lambda: chessboard_boundary(6, 7, 3))]
    if not quick:
        gen += [("grid32", lambda: grid3d_least_squares(32)),
                ("rand40000x8000", lambda: random_least_squares(40000, 8000, 0.0006, seed=1))]
    if gpu:
        gen += [("grid40", lambda: grid3d_least_squares(40)),
                ("ch7-8-b3", lambda: chessboard_boundary(7, 8, 3))]
    rows += [(name, "generated", make) for name, make in gen]
    return rows


def row_rhs(name: str, m: int) -> np.ndarray:
    """The row's b: random, seeded by the problem's name (the same b whether the row
    runs in the whole ladder or alone with ``--only``)."""
    return np.random.default_rng([20261126, zlib.crc32(name.encode())]).standard_normal(m)


def usable(A) -> bool:
    """Real, nonempty matrices (complex ones go to SciPy's original by design)."""
    return min(A.shape) > 0 and A.nnz > 0 and not np.iscomplexobj(A.data)


def backward_error(A, x, b, afro: float) -> float:
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        return float("nan")
    r = b - A @ x
    rn = float(np.linalg.norm(r))
    consistent = rn / (afro * float(np.linalg.norm(x)) + float(np.linalg.norm(b)))
    if A.shape[0] >= A.shape[1] and rn > 0:
        return min(consistent, float(np.linalg.norm(A.T @ r)) / (afro * rn))
    return consistent


@functools.lru_cache(maxsize=None)
def _device_sync():
    """The current device's synchronize, or a no-op without a GPU (looked up once: asking
    for the GPU's description at every timed call added tens of microseconds to both sides
    of every row, a tenth of a small row's time)."""
    cp = import_cupy()
    if cp is not None and scipy_gpuqr.gpu_info()["available"]:
        return cp.cuda.Device().synchronize
    return lambda: None


def _synchronize():
    _device_sync()()


def _on_device(out) -> bool:
    """Whether a call's result (an array or SciPy's tuple) holds a device array."""
    first = out[0] if isinstance(out, tuple) else out
    return is_cupy_array(first)


def timed(fn, *args, clock=time.perf_counter, **kwargs):
    """``(out, seconds, synced seconds)`` of one call: seconds until it returned (until
    the device's synchronize where the result is on the device), and until the device
    was synchronized after it (whatever work the call left queued there)."""
    gc.collect()
    _synchronize()
    t0 = clock()
    out = fn(*args, **kwargs)
    t1 = clock()
    _synchronize()
    t2 = clock()
    return out, (t2 if _on_device(out) else t1) - t0, t2 - t0


def compare(method: str, A, b, *, budget: float, reps: int,
            clock=time.perf_counter) -> dict:
    """One row: SciPy's ``method`` against ours (``auto``) on ``A x ≈ b``."""
    theirs = {"lsqr": spla.lsqr, "lsmr": spla.lsmr, "spsolve": spla.spsolve}[method]
    ours = {"lsqr": scipy_gpuqr.lsqr, "lsmr": scipy_gpuqr.lsmr,
            "spsolve": scipy_gpuqr.spsolve}[method]
    kwargs = {"backend": "auto"}
    row = {"method": method}
    with captured_decisions() as decisions:
        out_ours, first_ours, first_ours_synced = timed(ours, A, b, clock=clock, **kwargs)
    out_theirs, first_theirs, first_theirs_synced = timed(theirs, A, b, clock=clock)
    t_ours, t_theirs = [first_ours], [first_theirs]
    s_ours, s_theirs = [first_ours_synced], [first_theirs_synced]
    if first_ours + first_theirs < budget:
        t_ours, t_theirs, s_ours, s_theirs = [], [], [], []
        spent = 0.0
        while len(t_ours) < reps and (not t_ours or spent < budget):
            _, s, synced = timed(theirs, A, b, clock=clock)
            t_theirs.append(s)
            s_theirs.append(synced)
            _, o, synced = timed(ours, A, b, clock=clock, **kwargs)
            t_ours.append(o)
            s_ours.append(synced)
            spent += s + o
    afro = float(sp.linalg.norm(A))
    x_ours = out_ours if method == "spsolve" else out_ours[0]
    x_theirs = out_theirs if method == "spsolve" else out_theirs[0]
    cp = import_cupy()
    if cp is not None and is_cupy_array(x_ours):
        x_ours = cp.asnumpy(x_ours)
    row.update(
        scipy_s=statistics.median(t_theirs), ours_s=statistics.median(t_ours),
        scipy_synced_s=statistics.median(s_theirs), ours_synced_s=statistics.median(s_ours),
        scipy_calls=len(t_theirs), ours_calls=len(t_ours),
        scipy_be=backward_error(A, x_theirs, b, afro), ours_be=backward_error(A, x_ours, b, afro),
        answered=(decisions[-1] if decisions else ""))
    if method != "spsolve":
        row.update(scipy_istop=int(out_theirs[1]), scipy_itn=int(out_theirs[2]),
                   ours_istop=int(out_ours[1]), ours_itn=int(out_ours[2]))
        row["converges"] = (row["scipy_istop"] in CONVERGED_ISTOP and row["scipy_itn"] <= 1000)
    else:
        row["converges"] = True
    row["ratio"] = row["ours_s"] / max(row["scipy_s"], 1e-12)
    row["synced_ratio"] = row["ours_synced_s"] / max(row["scipy_synced_s"], 1e-12)
    return row


def raises_alike(method: str, A, b, exc: Exception) -> bool:
    """Whether SciPy's own ``method`` raises what ours raised (``exc``: same type and
    message) on this row: a drop-in's right answer (SuperLU's "failed to factorize" on
    a singular matrix, say), which the summary counts apart from our failures."""
    theirs = {"lsqr": spla.lsqr, "lsmr": spla.lsmr, "spsolve": spla.spsolve}[method]
    try:
        theirs(A, b)
    except Exception as mine:  # noqa: BLE001 - compared, not handled
        return type(mine) is type(exc) and str(mine) == str(exc)
    return False


def methods_for(A):
    m, n = A.shape
    return ["spsolve", "lsqr"] if m == n else ["lsqr", "lsmr"]


def table(rows) -> str:
    out = ["| problem | shape | call | SciPy s | istop/itn | SciPy bwd err | ours s | ours bwd err "
           "| answered by | ours/SciPy |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            alike = " (SciPy raises the same)" if r.get("same_as_scipy") else ""
            out.append(f"| {r['name']} | {r['shape']} | {r['method']} | – | – | – | – | – "
                       f"| {r['error']}{alike} | – |")
            continue
        its = f"{r['scipy_istop']}/{r['scipy_itn']}" if "scipy_istop" in r else "–"
        out.append(f"| {r['name']} | {r['shape']} | {r['method']} | {r['scipy_s']:.4g} | {its} "
                   f"| {r['scipy_be']:.1e} | {r['ours_s']:.4g} | {r['ours_be']:.1e} "
                   f"| {short_answer(r['answered'])} | {r['ratio']:.2f} |")
    return "\n".join(out)


def short_answer(text: str) -> str:
    """The decision's last clause, trimmed for a table cell."""
    text = text.replace("|", "/")
    return text if len(text) <= 70 else "…" + text[-69:]


def summary(rows) -> str:
    """The medians the issue's targets read: over the rows where SciPy's lsqr/lsmr
    iterations converge (the targets' rows), and beside it over every converging row
    (``spsolve`` rows included: SciPy's SuperLU answers them, about 1.0 by design)."""
    ok = [r for r in rows if "error" not in r]
    alike = sum(bool(r.get("same_as_scipy")) for r in rows if "error" in r)
    conv = [r["ratio"] for r in ok if r["converges"]]
    iterated = [r["ratio"] for r in ok if r["converges"] and r["method"] != "spsolve"]
    stall = [r for r in ok if not r["converges"]]
    lines = [f"rows: {len(ok)} ({len(rows) - len(ok) - alike} failed; {alike} where ours raises "
             f"what SciPy raises)"]
    if iterated:
        synced = [r["synced_ratio"] for r in ok if r["converges"] and r["method"] != "spsolve"]
        lines.append(f"converging lsqr/lsmr rows (the issue's rows): {len(iterated)}, median "
                     f"ours/SciPy {statistics.median(iterated):.3f}, max {max(iterated):.2f}, "
                     f"over 1.10: {sum(c > 1.10 for c in iterated)}; timed to the device's "
                     f"synchronize after the call: median {statistics.median(synced):.3f}")
    if conv:
        lines.append(f"all converging rows (spsolve included): {len(conv)}, median ours/SciPy "
                     f"{statistics.median(conv):.2f}, max {max(conv):.2f}, over 1.10: "
                     f"{sum(c > 1.10 for c in conv)}")
    if stall:
        lines.append(f"stalling rows: {len(stall)}, median ours/SciPy "
                     f"{statistics.median(r['ratio'] for r in stall):.2f}, our worst backward "
                     f"error {max(r['ours_be'] for r in stall):.1e}")
    worse = [r for r in ok if r["ours_be"] > max(r["scipy_be"], 1e-15) * 1.01]
    lines.append(f"rows where our backward error is worse than SciPy's: {len(worse)} "
                 + ", ".join(f"{r['name']}/{r['method']}" for r in worse))
    return "\n".join(lines)


def plot(rows, path: str, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    ok = [r for r in rows if "error" not in r]
    fig, ax = plt.subplots(figsize=(max(8, 0.22 * len(ok)), 4.5))
    colors = ["tab:blue" if r["converges"] else "tab:red" for r in ok]
    ax.bar(range(len(ok)), [r["ratio"] for r in ok], color=colors)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.1, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels([f"{r['name']} {r['method']}" for r in ok], rotation=90, fontsize=6)
    ax.set_ylabel("ours (auto) / SciPy, time")
    ax.set_title(f"{title}: blue = SciPy converges, red = SciPy stalls")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"plot: {path}")


#: Reference lines of the SVG plot: (ratio, dash pattern or None, label, the label's
#: offset in pixels: close lines' labels apart).
REFERENCES = ((1.0, None, "1", 8), (1.1, "6,4", "1.10", -2), (0.3, "2,3", "0.3", 9),
              (1 / 3, "8,3,2,3", "1/3", -2))


def _svg_range(ratios) -> tuple:
    """Decades the plot's log axis spans: from below the least ratio and 0.1 to above
    the greatest and 2."""
    lo = math.floor(math.log10(min(min(ratios), 0.1)))
    hi = math.ceil(math.log10(max(max(ratios), 2.0)))
    return lo, max(hi, lo + 1)


def plot_svg(rows, path: str, title: str) -> None:
    """The ratio per row (ours/SciPy, time) as bars on a log scale, written as SVG by hand
    (no plotting library): blue where SciPy's iterations converge, red where they stall
    (``iter_lim``/``conlim``, or more than 1000 iterations); lines at 1, 1.10, 0.3 and
    1/3. Each bar's ``<title>`` holds its row, ratio and what answered."""
    ok = [r for r in rows if "error" not in r and r.get("ratio", 0) > 0]
    if not ok:
        print("no rows to plot")
        return
    lo, hi = _svg_range([r["ratio"] for r in ok])
    step, left, top, height, bottom = 14, 60, 40, 300, 170
    width = left + step * len(ok) + 40

    def y(ratio: float) -> float:
        return top + height * (hi - math.log10(ratio)) / (hi - lo)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{top + height + bottom}" font-family="sans-serif" font-size="9">',
           f'<text x="{left}" y="16" font-size="12">{escape(title)}: ours (auto) / SciPy, '
           f'time; blue = SciPy converges, red = SciPy stalls</text>']
    for k in range(lo, hi + 1):
        out.append(f'<line x1="{left}" x2="{width - 30}" y1="{y(10.0 ** k):.1f}" '
                   f'y2="{y(10.0 ** k):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{y(10.0 ** k) + 3:.1f}" '
                   f'text-anchor="end">{10.0 ** k:g}</text>')
    base = y(10.0 ** lo)
    for i, r in enumerate(ok):
        x = left + step * i + 2
        color = "#1f77b4" if r["converges"] else "#d62728"
        label = escape(f"{r['name']} {r['method']}")
        tip = escape(f"{r['name']} {r['method']}: {r['ratio']:.3g} ({r.get('answered', '')})")
        out.append(f'<rect class="bar" data-ratio="{r["ratio"]:.6g}" x="{x}" '
                   f'y="{y(r["ratio"]):.2f}" width="{step - 4}" '
                   f'height="{base - y(r["ratio"]):.2f}" fill="{color}">'
                   f'<title>{tip}</title></rect>')
        out.append(f'<text transform="translate({x + step / 2 - 1:.1f},{base + 6:.1f}) '
                   f'rotate(90)" font-size="8">{label}</text>')
    for ratio, dash, text, dy in REFERENCES:
        if lo <= math.log10(ratio) <= hi:
            pattern = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(f'<line x1="{left}" x2="{width - 30}" y1="{y(ratio):.1f}" '
                       f'y2="{y(ratio):.1f}" stroke="black"{pattern}/>')
            out.append(f'<text x="{width - 28}" y="{y(ratio) + dy:.1f}">{text}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")
    print(f"plot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="add the multi-TFlop generated problems")
    ap.add_argument("--quick", action="store_true", help="fewer generated problems")
    ap.add_argument("--only", default="", help="comma-separated problem names")
    ap.add_argument("--methods", default="",
                    help="comma-separated calls to time (spsolve, lsqr, lsmr; default all)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per solver and row")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="wall: time.perf_counter; process: the process's CPU time, all its "
                         "threads (time.process_time: not counting time the process waited "
                         "for a core, steadier on a loaded host; GPU runs: use wall)")
    ap.add_argument("--json")
    ap.add_argument("--png")
    ap.add_argument("--svg", help="the plot as SVG (no plotting library needed)")
    ap.add_argument("--plot-from", metavar="JSON",
                    help="draw --png/--svg from an earlier run's --json; run nothing")
    args = ap.parse_args(argv)
    if args.plot_from:
        saved = json.loads(Path(args.plot_from).read_text())
        if args.png:
            plot(saved["rows"], args.png, saved["device"])
        if args.svg:
            plot_svg(saved["rows"], args.svg, saved["device"])
        return 0
    only = {s for s in args.only.split(",") if s}
    methods = {s for s in args.methods.split(",") if s}
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    info = scipy_gpuqr.gpu_info()
    device = info.get("name") if info["available"] else f"no GPU ({info['reason']})"
    print(f"device: {device}; scipy_gpuqr {scipy_gpuqr.__version__}; clock {args.clock}")
    rows = []
    for name, kind, make in ladder(args.gpu, args.quick):
        if only and name not in only:
            continue
        A = make()
        if not usable(A):
            continue
        A = sp.csc_array(A, dtype=np.float64)
        b = row_rhs(name, A.shape[0])
        for method in methods_for(A):
            if methods and method not in methods:
                continue
            base = {"name": name, "kind": kind, "shape": f"{A.shape[0]}x{A.shape[1]}",
                    "nnz": int(A.nnz)}
            try:
                row = base | compare(method, A, b, budget=args.budget, reps=args.reps,
                                     clock=clock)
            except Exception as exc:  # noqa: BLE001 - a failing row is reported, not fatal
                row = base | {"method": method, "error": f"{type(exc).__name__}: {exc}"[:80],
                              "same_as_scipy": raises_alike(method, A, b, exc)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    if args.png:
        plot(rows, args.png, device)
    if args.svg:
        plot_svg(rows, args.svg, device)
    print(table(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
