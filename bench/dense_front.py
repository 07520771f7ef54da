"""The dense fronts' blocked QR alone: one-launch panels vs cuSOLVER panels vs cupy.linalg.qr.

Run on the GPU machine::

    source .dev/remote-setup.sh
    python3 bench/dense_front.py [--shapes 49340x9375,20000x4000] [--panels 256]
                                 [--methods kernel,kernel:noahead,geqrf] [--reps 3]
                                 [--json out.json]

Per shape (a dense random row-major front, float64 unless ``--dtype``): for each
panel method of ``scipy_gpuqr._engine.dense_front.factorize_cupy`` (``:noahead``:
without look-ahead) and panel width, the factorization time (CUDA events around the call, fresh copy each
time, after one warm-up call; median of ``--reps``), TF/s of the Householder
flops ``2mn² - 2n³/3`` and the dense-front rule's modelled time of the front
alone (``model``); then ``cupy.linalg.qr(mode='r')`` (cuSOLVER ``geqrf``
on the whole matrix) the same way. Every factorization is checked: R's Gram
matrix against ``AᵀA`` (max error relative to max ``|AᵀA|``), ``Qᵀ A[:, :8] =
[R[:, :8]; 0]`` and the norms of ``Qᵀ X`` for random ``X``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed


def _time(cp, fn, reps, prepare):
    out = []
    for _ in range(reps):
        arg = prepare()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        cp.cuda.Device().synchronize()
        a.record()
        res = fn(arg)
        b.record()
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(out)), out, arg, res


def _check(cp, A, F, panels, T):
    from scipy_gpuqr._engine.dense_front import DenseFront
    m, n = A.shape
    k = min(m, n)
    R = cp.triu(F[:k])
    G = A.T @ A
    gram = float(cp.abs(R.T @ R - G).max() / cp.abs(G).max())
    d = DenseFront(F, panels, T)
    Y = A[:, :8].copy()
    d.apply_qt(Y)
    qa = float(max(cp.abs(Y[:k] - R[:, :8]).max(), cp.abs(Y[k:]).max() if m > k else 0)
               / cp.abs(A).max())
    X = cp.random.standard_normal((m, 4))
    nx = cp.linalg.norm(X, axis=0)
    d.apply_qt(X)
    orth = float(cp.abs(cp.linalg.norm(X, axis=0) / nx - 1).max())
    return {"gram_rel": gram, "qta_rel": qa, "qtx_norm_rel": orth}


def _model_seconds(m, n, nb):
    """The dense-front rule's time of this front alone
    (``scipy_gpuqr._schedule.dense.dense_path_seconds``, panel width ``nb``)."""
    from dataclasses import replace

    from scipy_gpuqr._schedule.dense import DenseModel, dense_path_seconds
    return dense_path_seconds(m, n, None, replace(DenseModel(), panel=int(nb)))


def run_shape(cp, m, n, dtype, methods, panels, reps):
    from scipy_gpuqr._engine.dense_front import factorize_cupy, panels_of
    flops = 2.0 * m * n * n - 2.0 * n ** 3 / 3 if m >= n else 2.0 * n * m * m - 2.0 * m ** 3 / 3
    A = cp.random.standard_normal((m, n)).astype(dtype)
    rows = []
    for method in methods:
        pm, _, opt = method.partition(":")
        kw = {"panel_method": pm, "lookahead": opt != "noahead"}
        for nb in panels:
            pn = panels_of(m, n, None, nb)
            factorize_cupy(A.copy(), pn, nb, **kw)                    # warm-up (compile)
            med, all_, F, T = _time(cp, lambda F: factorize_cupy(F, pn, nb, **kw),
                                    reps, A.copy)
            r = {"shape": [m, n], "dtype": np.dtype(dtype).name, "method": method, "panel": nb,
                 "seconds": med, "all": all_, "tflops": flops / med / 1e12,
                 "model_seconds": _model_seconds(m, n, nb), **_check(cp, A, F, pn, T)}
            print(json.dumps(r), flush=True)
            rows.append(r)
            del F, T
    cp.linalg.qr(A[:256], mode="r")
    med, all_, _, R = _time(cp, lambda X: cp.linalg.qr(X, mode="r"), reps, lambda: A)
    k = min(m, n)
    G = A.T @ A
    gram = float(cp.abs(R[:k].T @ R[:k] - G).max() / cp.abs(G).max())
    r = {"shape": [m, n], "dtype": np.dtype(dtype).name, "method": "cupy.linalg.qr(r)",
         "panel": None, "seconds": med, "all": all_, "tflops": flops / med / 1e12,
         "gram_rel": gram}
    print(json.dumps(r), flush=True)
    rows.append(r)
    return rows


def kernel_only(cp, dtype, heights, reps=20, max_blocks=(None, 96, 64)):
    """Microseconds per column of the panel kernel alone (m × 32, back-to-back
    launches), per cap on the blocks of a launch."""
    from scipy_gpuqr._engine.gpu.dense_panel import panel_kernel
    out = []
    for m, mb in ((m, mb) for m in heights for mb in max_blocks):
        k = panel_kernel(dtype, mb)
        if k.plan(m) is None:
            continue
        F = cp.random.standard_normal((m, 32)).astype(dtype)
        V = cp.zeros((32, m), dtype=dtype)
        tau = cp.empty(32, dtype=dtype)
        T = cp.empty((32, 32), dtype=dtype)
        ws = k.workspace()

        def go(_):
            for _ in range(reps):
                k.launch(F.data.ptr, 32, m, 32, V.data.ptr, m, tau.data.ptr, T.data.ptr, ws)
        go(None)
        med, _, _, _ = _time(cp, go, 3, lambda: None)
        r = {"kernel_only_m": m, "max_blocks": mb, "blocks": k.plan(m)[1], "rows_per_block": k.plan(m)[0],
             "us_per_column": med / reps / 32 * 1e6}
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def main(argv=None) -> int:
    import cupy as cp
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="49340x9375,20000x4000")
    p.add_argument("--panels", default="256")
    p.add_argument("--methods", default="kernel,kernel:noahead,geqrf")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kernel-heights", default="49340,20000,5000,800",
                   help="panel heights for the kernel-only timing ('' : none)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    rows = []
    kern = kernel_only(cp, np.dtype(a.dtype), [int(x) for x in a.kernel_heights.split(",") if x])
    for sh in a.shapes.split(","):
        m, n = (int(x) for x in sh.split("x"))
        rows += run_shape(cp, m, n, np.dtype(a.dtype), a.methods.split(","),
                          [int(x) for x in a.panels.split(",")], a.reps)
        cp.get_default_memory_pool().free_all_blocks()
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"\ndevice: {dev}")
    for r in kern:
        print(f"panel kernel alone, {r['kernel_only_m']} x 32 on {r['blocks']} blocks: "
              f"{r['us_per_column']:.2f} us per column")
    print(f"{'shape':>12s} {'method':>18s} {'nb':>4s} {'s':>8s} {'TF/s':>6s} {'gram':>8s} "
          f"{'QtA':>8s} {'QtX':>8s} {'model':>8s}")
    for r in rows:
        print(f"{'x'.join(map(str, r['shape'])):>12s} {r['method']:>18s} {str(r['panel']):>4s} "
              f"{r['seconds']:8.4f} {r['tflops']:6.2f} {r['gram_rel']:8.1e} "
              f"{r.get('qta_rel', float('nan')):8.1e} {r.get('qtx_norm_rel', float('nan')):8.1e} "
              f"{r.get('model_seconds', float('nan')):8.4f}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": dev, "rows": rows, "kernel_only": kern}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
