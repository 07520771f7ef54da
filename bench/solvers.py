"""End-to-end solvers: our lsqr/spsolve (auto, gpu, cpu) against SciPy, cupyx and SuiteSparseQR.

Run on the GPU machine (one run)::

    source .dev/remote-setup.sh
    python3 bench/solvers.py --json $OUT/solvers.json --png $OUT/solvers.png

and CPU-side only (SciPy, SuiteSparseQR, our cpu/reference and auto; no GPU
needed)::

    python3 bench/solvers.py --cpu-only --quick --png /tmp/solvers.png

Problems: generated least-squares families (3-D grid LS, chessboard
boundaries, random LS with dense rows; analysis intensities about 4 to 1000
flops/byte) and the larger ``$SHARED_MATRICES`` files (tall ones as least
squares; square ones also through spsolve). b = A·x_true (+ ``--noise``,
default 1e-3, relative noise for tall A, so the least-squares residual is not
zero; ``--noise 0`` gives consistent systems, where auto's LSQR-first pass
answers more often).

Solvers (per problem, the ones that apply):
    ``ours lsqr auto|gpu|cpu|reference``  ``scipy_gpuqr.lsqr(A, b, backend=...)``
    (auto may answer by LSQR iterations first, see ``scipy_gpuqr._dispatch.iterate_first``);
    ``ours spsolve auto|gpu|cpu|reference`` (square A);
    ``SciPy lsqr`` (SciPy's defaults, as an unpatched script calls it);
    ``SciPy spsolve`` (SuperLU, square A);
    ``cupyx lsmr`` and ``cupyx spsolve`` (A and b already on the GPU; square A
    for spsolve); ``SuiteSparseQR A\\b`` (``SuiteSparseQR_C_backslash``, its
    default ordering and rank tolerance).

Timing: warm, median wall time. Each solver runs once untimed (kernels
compiled, GPU context, BLAS threads started), then ``--reps`` timed calls
(our auto/cpu/gpu of one entry point take turns, A B C A B C ..., so that the
machine's drifts fall on all three; the garbage collector runs before each
call, outside the clock),
fewer when one call is long (about ``--budget`` seconds per solver and
problem); a CPU-side solver whose first call already takes longer than the
budget is timed by that call alone (no per-call caches on that side).
GPU-side timings synchronize the device before reading the clock. Everything
includes the symbolic analysis (what a user's call costs).

Reported per solver: median seconds, timed calls, backward error
(‖r‖/(‖A‖_F‖x‖+‖b‖); for tall A the smaller of that and ‖Aᵀr‖/(‖A‖_F‖r‖),
so consistent and inconsistent systems are both judged fairly), and what auto
chose (from the ``scipy_gpuqr`` log). A PNG (matplotlib, skipped with a
message when it is missing) shows the GPU speedup of our lsqr over the CPU
path (``cpu`` time / ``gpu`` time) against intensity on log-log axes, like the
paper's Figure 15, with auto's threshold drawn (the calibrated one of this
GPU model, else the default 10), and auto's time over the better of our two
backends. ``--cpu-only`` plots ``cpu`` over ``reference`` instead, to prove
the plot. A markdown table (for bench/RESULTS.md) is printed last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed

from scipy_gpuqr._cli.solve_report import captured_decisions  # noqa: E402

_SHARED = ("Groebner_id2003_aug.mtx", "Franz6_id1959_aug.mtx", "bayer10.mtx", "rajat01.mtx",
           "adder_dcop_05.mtx", "watt_2.mtx", "hangGlider_2.mtx", "nnc1374.mtx",
           "rajat19.mtx")


# -- problems ----------------------------------------------------------------------------


def generated(quick: bool):
    """(name, family, maker) of the generated problems, increasing intensity."""
    from scipy_gpuqr._testing_matrices import (chessboard_boundary, grid3d_least_squares,
                                               random_least_squares)

    def grid(k):
        return f"grid{k}", "3-D grid LS", lambda: grid3d_least_squares(k)

    def ch(m, n, k):
        return f"ch{m}-{n}-b{k}", "chessboard", lambda: chessboard_boundary(m, n, k)

    def rand(m, n, d, r):
        return (f"rand{m}x{n}r{r}", "random LS",
                lambda: random_least_squares(m, n, d, dense_rows=r, seed=1))

    if quick:
        return [grid(4), grid(8), ch(5, 6, 2), grid(12), rand(4000, 1000, 0.003, 20),
                grid(16)]
    return [grid(4), grid(6), grid(8), ch(5, 6, 2), rand(2000, 500, 0.004, 0), grid(12),
            ch(5, 6, 3), ch(6, 7, 2), grid(16), rand(4000, 1000, 0.003, 20), grid(20),
            rand(8000, 2000, 0.0015, 40), grid(24), ch(6, 7, 3), grid(32), ch(7, 7, 3),
            rand(20000, 4000, 0.0012, 40), grid(40), ch(7, 8, 3)]


def shared(directory):
    if not directory:
        return []
    out = []
    for fname in _SHARED:
        path = Path(directory) / fname
        if path.exists():
            def load(p=path):
                from scipy_gpuqr.io import mmread
                return sp.csc_array(mmread(str(p))).astype(np.float64)
            out.append((fname.removesuffix(".mtx"), "shared", load))
    return out


def rhs(A, noise_level=1e-3, seed=7):
    """b = A x_true, plus ``noise_level`` relative noise for tall A."""
    rng = np.random.default_rng(seed)
    m, n = A.shape
    b = A @ rng.standard_normal(n)
    if m > n and noise_level > 0:
        noise = rng.standard_normal(m)
        b = b + noise_level * np.linalg.norm(b) / max(np.linalg.norm(noise), 1e-300) * noise
    return b


def backward_error(A, x, b, afro):
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        return float("nan")
    r = b - A @ x
    rn = float(np.linalg.norm(r))
    square = rn / (afro * float(np.linalg.norm(x)) + float(np.linalg.norm(b)))
    m, n = A.shape
    if m > n and rn > 0:  # x is backward stable if either problem's measure is small
        return min(square, float(np.linalg.norm(A.T @ r)) / (afro * rn))
    return square


# -- solvers -----------------------------------------------------------------------------


class Solver:
    """A named way of solving; ``make(A, b)`` returns the call to time (returns x on the host)."""

    def __init__(self, name, kind, gpu, make, group):
        self.name, self.kind, self.gpu, self.make, self.group = name, kind, gpu, make, group


def solvers(cpu_only: bool, max_reference_flops: float):
    import scipy.sparse.linalg as spla

    import scipy_gpuqr as gq

    def ours_lsqr(backend):
        return lambda A, b: (lambda: gq.lsqr(A, b, backend=backend)[0])

    def ours_spsolve(backend):
        return lambda A, b: (lambda: gq.spsolve(A, b, backend=backend))

    def spqr(A, b):
        from scipy_gpuqr._cpu.spqr import spqr_solve_default
        return lambda: spqr_solve_default(A, b)

    out = [Solver("ours lsqr auto", "any", not cpu_only, ours_lsqr("auto"), "lsqr"),
           Solver("ours lsqr cpu", "any", False, ours_lsqr("cpu"), "lsqr")]
    if not cpu_only:
        out.append(Solver("ours lsqr gpu", "any", True, ours_lsqr("gpu"), "lsqr"))
    out.append(Solver("ours lsqr reference", "any", False, ours_lsqr("reference"), "lsqr"))
    out += [Solver("SciPy lsqr", "any", False, lambda A, b: (lambda: spla.lsqr(A, b)[0]),
                   "lsqr"),
            Solver("SuiteSparseQR A\\b", "any", False, spqr, "lsqr")]
    if not cpu_only:
        out.append(Solver("cupyx lsmr", "any", True, _cupyx("lsmr"), "lsqr"))
    out += [Solver("ours spsolve auto", "square", not cpu_only, ours_spsolve("auto"),
                   "spsolve"),
            Solver("ours spsolve cpu", "square", False, ours_spsolve("cpu"), "spsolve")]
    if not cpu_only:
        out.append(Solver("ours spsolve gpu", "square", True, ours_spsolve("gpu"), "spsolve"))
    out.append(Solver("SciPy spsolve", "square", False,
                      lambda A, b: (lambda: spla.spsolve(A, b)), "spsolve"))
    if not cpu_only:
        out.append(Solver("cupyx spsolve", "square", True, _cupyx("spsolve"), "spsolve"))
    for s in out:
        s.max_flops = max_reference_flops if s.name.endswith("reference") else None
    return out


def _cupyx(which):
    def make(A, b):
        import cupy as cp
        import cupyx.scipy.sparse as csp
        import cupyx.scipy.sparse.linalg as cspla
        Ag = csp.csr_matrix(sp.csr_matrix(A))
        bg = cp.asarray(b)
        if which == "lsmr":
            return lambda: cspla.lsmr(Ag, bg)[0].get()
        return lambda: cspla.spsolve(Ag, bg).get()
    return make


def _sync():
    import cupy as cp
    cp.cuda.Device().synchronize()




def auto_choice(msgs) -> str:
    for m in msgs:
        if "answered without factorizing" in m:
            its = re.search(r"in (\d+) iterations", m)
            return f"LSQR ({its.group(1)} its)" if its else "LSQR"
    ran = [re.findall(r"running '(\w+)'", m) for m in msgs]
    ran = [r[-1] for r in ran if r]
    return ran[-1] if ran else "?"


def _once(call, gpu):
    """(seconds, x) of one call; the collector runs first, outside the clock."""
    sync = _sync if gpu else (lambda: None)
    gc.collect()
    sync()
    t0 = time.perf_counter()
    x = call()
    sync()
    return time.perf_counter() - t0, x


def _count(first, gpu, reps, budget):
    """Timed calls a solver gets after its untimed first call (0: the first one counts)."""
    if not gpu and first >= budget:
        return 0
    return max(1, min(reps, int(budget // max(first, 1e-9))))


def time_solvers(entries, reps, budget):
    """Time solvers of one problem in interleaved rounds.

    ``entries`` is a list of ``(call, gpu)``. Each runs once untimed (its log
    captured), then the solvers take turns, each up to its own count of timed
    calls, the order rotated every round (A B C, B C A, C A B, ...), so that
    drifts of the machine (clocks, other load, the memory pools' state, the
    BLAS threads still spinning after the previous call) fall on all of them
    alike and no solver always follows the same one.

    Returns
    -------
    list of (median seconds, timed calls, x, log messages of the first call)
    """
    out = []
    for call, gpu in entries:
        with captured_decisions() as msgs, np.errstate(all="ignore"):
            first, x = _once(call, gpu)
        out.append([first, _count(first, gpu, reps, budget), x, msgs, []])
    with np.errstate(all="ignore"):
        pairs = list(zip(entries, out))
        for r in range(max((o[1] for o in out), default=0)):
            k = r % max(len(pairs), 1)
            for (call, gpu), o in pairs[k:] + pairs[:k]:
                if r < o[1]:
                    t, o[2] = _once(call, gpu)
                    o[4].append(t)
    return [(float(statistics.median(o[4])) if o[4] else o[0], max(len(o[4]), 1), o[2], o[3])
            for o in out]


# -- the run -----------------------------------------------------------------------------


def run_problem(name, family, make, solver_list, args):
    from scipy_gpuqr._symbolic import analyze
    A = make()
    b = rhs(A, args.noise)
    m, n = A.shape
    t0 = time.perf_counter()
    an = analyze(A if m >= n else sp.csc_array(A.T))
    row = {"problem": name, "family": family, "shape": [m, n], "nnz": int(A.nnz),
           "flops": float(an.flops), "intensity": float(an.intensity),
           "analysis_seconds": time.perf_counter() - t0, "solvers": {}}
    if args.max_flops is not None and an.flops > args.max_flops:
        print(f"  {name:24} skipped: {an.flops:.3g} flops > --max-flops", flush=True)
        return None
    afro = float(sp.linalg.norm(A))
    todo = []
    for s in solver_list:
        if s.kind == "square" and m != n:
            continue
        if s.max_flops is not None and an.flops > s.max_flops:
            row["solvers"][s.name] = {"skipped": f"flops {an.flops:.2g} > {s.max_flops:.2g}"}
            continue
        todo.append(s)
    # our auto/cpu/gpu of one entry point are compared with each other: interleaved
    groups = [[s for s in todo if s.name.startswith(f"ours {g} ")
               and s.name.split()[-1] in ("auto", "cpu", "gpu")] for g in ("lsqr", "spsolve")]
    grouped = {s.name for g in groups for s in g}
    for batch in groups + [[s] for s in todo if s.name not in grouped]:
        if batch:
            _run_batch(batch, A, b, afro, row, args)
    return row


def _run_batch(batch, A, b, afro, row, args):
    """Time a batch of solvers together (see :func:`time_solvers`) into ``row``."""
    import warnings
    calls, ok = [], []
    for s in batch:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                calls.append((s.make(A, b), s.gpu))
            ok.append(s)
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["solvers"][s.name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            timed = time_solvers(calls, args.reps, args.budget)
    except Exception as exc:  # noqa: BLE001 - report and go on
        if args.verbose:
            traceback.print_exc()
        timed = [None] * len(ok)
        for s in ok:
            row["solvers"][s.name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    for s, t in zip(ok, timed):
        if t is not None:
            sec, ncalls, x, msgs = t
            res = {"seconds": sec, "calls": ncalls,
                   "backward_error": backward_error(A, x, b, afro)}
            if s.name.endswith(" auto"):
                res["auto_chose"] = auto_choice(msgs)
            row["solvers"][s.name] = res
        print(f"  {row['problem']:24} {s.name:22} " + _cell(row["solvers"][s.name], long=True),
              flush=True)


def _cell(res, long=False):
    if res is None:
        return ""
    if "skipped" in res:
        return "skipped" if not long else f"skipped ({res['skipped']})"
    if "error" in res:
        return "error" if not long else f"error ({res['error']})"
    text = f"{res['seconds']:.3g} s ({res['backward_error']:.0e})"
    if long:
        text += f" x{res['calls']}" + (f" auto: {res['auto_chose']}" if "auto_chose" in res
                                       else "")
    return text


def threshold_line(cpu_only):
    """(threshold, label) auto uses on this machine's GPU model (or the default)."""
    from scipy_gpuqr import GpuqrOptions
    from scipy_gpuqr._dispatch.plan import auto_threshold
    from scipy_gpuqr._gpu import gpu_info
    info = gpu_info()
    t, source = auto_threshold(GpuqrOptions(), info.get("name") if info["available"] else None)
    return t, f"threshold {t:.3g} flops/byte ({source})"


def speedups(rows, fast, slow):
    pts = []
    for r in rows:
        a, b = r["solvers"].get(slow, {}), r["solvers"].get(fast, {})
        if "seconds" in a and "seconds" in b and b["seconds"] > 0:
            pts.append((r["intensity"], a["seconds"] / b["seconds"], r["family"], r["problem"]))
    return pts


def auto_ratios(rows, group, pair):
    pts = []
    for r in rows:
        auto = r["solvers"].get(f"ours {group} auto", {})
        best = [r["solvers"].get(f"ours {group} {p}", {}).get("seconds") for p in pair]
        best = [t for t in best if t]
        if "seconds" in auto and best:
            pts.append((r["intensity"], auto["seconds"] / min(best), r["family"], r["problem"]))
    return pts


def plot(rows, path, cpu_only, threshold, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no plot written ({path})", file=sys.stderr)
        return False
    fast = "ours lsqr reference" if cpu_only else "ours lsqr gpu"
    pts = speedups(rows, fast, "ours lsqr cpu")
    pair = ("cpu", "reference") if cpu_only else ("cpu", "gpu")
    ratios = auto_ratios(rows, "lsqr", pair)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    markers = {"3-D grid LS": "o", "chessboard": "s", "random LS": "^", "shared": "D"}
    for fam, mk in markers.items():
        sel = [(x, y) for x, y, f, _ in pts if f == fam]
        if sel:
            ax.scatter(*zip(*sel), marker=mk, label=fam)
        sel = [(x, y) for x, y, f, _ in ratios if f == fam]
        if sel:
            ax2.scatter(*zip(*sel), marker=mk, label=fam)
    ax.axhline(1.0, color="gray", lw=0.8)
    if np.isfinite(threshold):
        ax.axvline(threshold, color="red", ls="--", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flops/byte)")
    ax.set_ylabel("lsqr time cpu / " + ("reference" if cpu_only else "gpu"))
    ax.set_title(("CPU-only run: SuiteSparseQR path over our reference" if cpu_only
                  else "GPU speedup over the CPU path (scipy_gpuqr.lsqr, warm, e2e)"))
    ax.legend(fontsize=7)
    ax2.axhline(1.1, color="red", ls="--", label="10% over the better backend")
    ax2.axhline(1.0, color="gray", lw=0.8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("arithmetic intensity (flops/byte)")
    ax2.set_ylabel(f"auto time / min({pair[0]}, {pair[1]})")
    ax2.set_title("lsqr backend='auto' against our better backend")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}", file=sys.stderr)
    return True


def markdown(rows, solver_list, header):
    names = [s.name for s in solver_list if any(s.name in r["solvers"] for r in rows)]
    lines = [header, "",
             "| problem | m×n | nnz | intensity | GFlop | auto chose | "
             + " | ".join(names) + " |",
             "|" + "---|" * (6 + len(names))]
    for r in rows:
        chose = "; ".join(f"{k.split()[1]}: {v['auto_chose']}" for k, v in r["solvers"].items()
                          if "auto_chose" in v)
        cells = [_cell(r["solvers"].get(n)) for n in names]
        lines.append(f"| {r['problem']} | {r['shape'][0]}×{r['shape'][1]} | {r['nnz']} | "
                     f"{r['intensity']:.1f} | {r['flops'] / 1e9:.3g} | {chose} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Cells: warm median seconds (backward error). Auto chose: what "
              "`backend='auto'` ran (LSQR iterations answered, or the factorization backend)."]
    return "\n".join(lines)


def _environment():
    import scipy

    from scipy_gpuqr._gpu import gpu_info
    info = gpu_info()
    gpu = f"{info['name']} (cc {info['compute_capability']})" if info["available"] else "none"
    blas = ""
    try:
        from threadpoolctl import threadpool_info
        blas = ", ".join(f"{d.get('internal_api')} {d.get('num_threads')} threads"
                         for d in threadpool_info() if d.get("user_api") == "blas")
    except ImportError:
        pass
    return (f"GPU {gpu}; {os.cpu_count()} CPU cores; numpy {np.__version__}, scipy "
            f"{scipy.__version__}, cupy {info.get('cupy_version')}; BLAS {blas or '?'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-only", action="store_true",
                   help="only CPU-side solvers (SciPy, SuiteSparseQR, ours cpu/reference/auto)")
    p.add_argument("--quick", action="store_true", help="a short generated ladder")
    p.add_argument("--only", default="", help="comma list of problem names")
    p.add_argument("--no-shared", action="store_true", help="skip $SHARED_MATRICES")
    p.add_argument("--max-flops", type=float, default=None,
                   help="skip problems whose factorization needs more flops")
    p.add_argument("--max-reference-flops", type=float, default=2e10,
                   help="skip our reference backend above this many flops")
    p.add_argument("--noise", type=float, default=1e-3,
                   help="relative noise added to b for tall A (0: consistent systems)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--budget", type=float, default=10.0,
                   help="about this many seconds of timed calls per solver and problem")
    p.add_argument("--json", help="write the rows here (after every problem)")
    p.add_argument("--png", default="solvers.png", help="plot file")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if not args.cpu_only:
        from scipy_gpuqr._gpu import gpu_info
        info = gpu_info()
        if not info["available"]:
            print(f"no GPU ({info['reason']}); use --cpu-only", file=sys.stderr)
            return 2
    only = {x for x in args.only.split(",") if x}
    problems = generated(args.quick)
    if not args.no_shared:
        problems += shared(os.environ.get("SHARED_MATRICES") or _default_shared())
    if only:
        problems = [q for q in problems if q[0] in only]
    solver_list = solvers(args.cpu_only, args.max_reference_flops)
    env = _environment()
    print(env, flush=True)
    rows = []
    for name, family, make in problems:
        try:
            row = run_problem(name, family, make, solver_list, args)
        except Exception:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            continue
        if row is None:
            continue
        rows.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    threshold, label = threshold_line(args.cpu_only)
    plot(rows, args.png, args.cpu_only, threshold, label)
    header = (f"bench/solvers.py ({'--cpu-only, ' if args.cpu_only else ''}"
              f"{'quick' if args.quick else 'full'} ladder, noise {args.noise:g}): {env}; "
              f"auto's {label}")
    print()
    print(markdown(rows, solver_list, header))
    return 0


def _default_shared():
    d = Path(__file__).resolve().parents[2] / "shared" / "matrices"
    return str(d) if d.is_dir() else None


if __name__ == "__main__":
    sys.exit(main())
