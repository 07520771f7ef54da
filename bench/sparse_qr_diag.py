"""Diagnose GPU vs NumPy executor mismatches launch by launch (prints the first bad launch)."""
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: another tree can be timed


def main():
    import cupy as cp

    from scipy_gpuqr._engine.gpu import factorize_kernels as variants
    from scipy_gpuqr._engine.host.simulate import execute_task
    from scipy_gpuqr._kernels import load_module
    from scipy_gpuqr._schedule.sparse import build_schedule
    from scipy_gpuqr._schedule.tasks import TASK_BYTES, TaskType
    from scipy_gpuqr._symbolic import analyze, canonical_csc
    from scipy_gpuqr._testing_matrices import grid3d_least_squares
    from scipy_gpuqr.io import mmread
    import os
    mats = [("494_bus", sp.csc_array(mmread(os.environ["SHARED_MATRICES"] + "/494_bus.mtx")).astype(float)),
            ("grid5", grid3d_least_squares(5))]
    mod = load_module(variants.UBERKERNEL_FILE, variants.KERNEL_VARIANTS[variants.UBERKERNEL_FILE])
    kern = mod.get_function(variants.kernel_name("double", 32, 3, 256))
    smem = variants.tile_smem_bytes(32, 3, 8)
    kern.max_dynamic_shared_size_bytes = smem
    for name, A in mats:
        an = analyze(A)
        fs = an.fronts
        st = build_schedule(an).stages[0]
        vals = canonical_csc(A).data.astype(np.float64)[fs.s_nz]
        maps = np.concatenate([fs.rimap, fs.rjmap]).astype(np.int64)
        sched_vt = build_schedule(an).vt_size
        vt_h = np.full(max(sched_vt, 1), np.nan)
        vt_d = cp.full(vt_h.shape, cp.nan)
        s0, s1 = st.s_range
        sidx, sval = fs.s_index[s0:s1], vals[s0:s1]
        pool_h = np.zeros(st.pool_size)
        pool_d = cp.zeros(st.pool_size)
        tasks_d = cp.asarray(np.ascontiguousarray(st.tasks).view(np.uint8))
        args = (pool_d, vt_d, cp.asarray(sidx.astype(np.int64)), cp.asarray(sval), cp.asarray(maps))
        for L in range(st.nlaunch):
            a, b = int(st.launch_ptr[L]), int(st.launch_ptr[L + 1])
            if b <= a:
                continue
            kern((b - a,), (256,), (tasks_d[a * TASK_BYTES:],) + args, shared_mem=smem)
            for k in range(a, b):
                execute_task(st.tasks[k], pool_h, vt_h, 32, spool=(sidx, sval), maps=maps)
            got = cp.asnumpy(pool_d)
            bad = np.flatnonzero(~np.isclose(got, pool_h, rtol=1e-9, atol=1e-9))
            gv = cp.asnumpy(vt_d)
            badv = np.flatnonzero(~(np.isclose(gv, vt_h, rtol=1e-9, atol=1e-9) | (np.isnan(gv) & np.isnan(vt_h))))
            if len(bad) or len(badv):
                types = [TaskType(int(x)).name for x in np.unique(st.tasks["type"][a:b])]
                print(name, "launch", L, "types", types, "bad pool", len(bad), "bad vt", len(badv))
                foff = st.foff
                for p in bad[:5]:
                    f = int(np.searchsorted(foff[foff >= 0], p, side="right") - 1)
                    off = p - foff[f]
                    print("  pool", p, "front", f, "fm fn", fs.fm[f], fs.fn[f], "row col",
                          off // fs.fn[f], off % fs.fn[f], "gpu", got[p], "np", pool_h[p])
                    sel = st.tasks[a:b][st.tasks["front"][a:b] == f]
                    print("  tasks of front:", sel[["type", "F", "fm", "fn", "col", "nref", "nfrows", "napply", "c0", "c1", "aux"]].tolist()[:4], sel["rows"][:4].tolist())
                for p in badv[:3]:
                    print("  vt", p, "gpu", gv[p], "np", vt_h[p])
                break
        else:
            print(name, "all launches match")


if __name__ == "__main__":
    main()
