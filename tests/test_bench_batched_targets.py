"""``bench/batched.py --targets``: issue 17's targets judged on the rows of a
``--public`` run (no GPU: rows as the run writes them)."""

from __future__ import annotations

from conftest import load_bench


def _row(op, n, pub, kern=None, cublas=float("nan"), torch=float("nan"), host=10.0,
         dtype="float64"):
    return dict(tag="t", dtype=dtype, n=n, batch=1, op=op, kernel_ms=kern or pub,
                public_ms=pub, async_ms=pub, kernel_host_us=host, host_us=host, work_us=host,
                e2e_ms=pub, cublas_ms=cublas, torch_ms=torch, device="x")


def _verdicts(lines):
    """target -> (measured, verdict) of the table's body."""
    body = [ln.strip("|").split("|") for ln in lines[2:]]
    return {c[0].strip(): (c[1].strip(), c[3].strip()) for c in body}


def test_targets_met_missed_and_not_run():
    bench = load_bench("batched.py", "bench_batched_targets")
    rows = [_row("lu", 8, 0.39), _row("lu", 32, 6.01), _row("inv", 8, 0.61, kern=0.50),
            _row("lu", 128, 7.2, cublas=14.4), _row("lu", 256, 7.0, cublas=10.4),
            _row("lu", 512, 17.4), _row("chol", 64, 1.0, torch=1.2),
            _row("chol", 512, 2.0, torch=1.9), _row("inv", 32, 6.0, host=31.0),
            _row("lu", 512, 99.0, dtype="float32")]
    lines = bench.target_table(rows)
    assert lines[0].startswith("| target |")
    v = _verdicts(lines)
    assert v["lu n = 8, public ms"] == ("0.390", "met")
    assert v["lu n = 32, public ms"][1] == "**missed**"
    assert v["inv n = 8, public ms"][1] == "**missed**"
    assert v["inv n = 32, public ms"][1] == "met"
    assert v["lu n = 64, cuBLAS ms / public ms"] == ("-", "not run")
    assert v["lu n = 128, cuBLAS ms / public ms"] == ("2.00", "met")
    assert v["lu n = 256, cuBLAS ms / public ms"] == ("1.49", "**missed**")
    assert v["lu n = 512, public ms"] == ("17.400", "met")       # the float64 row
    assert v["chol n = 64, torch ms / public ms"] == ("1.20", "met")
    assert v["chol n = 512, torch ms / public ms"] == ("0.95", "**missed**")
    assert v["inv n = 8, public ms / kernel ms"] == ("1.220", "**missed**")
    assert v["lu n = 512, public ms / kernel ms"] == ("1.000", "met")
    assert v["inv n = 32, host us (asynchronous call)"] == ("31.0", "**missed**")
    assert v["lu n = 8, host us (asynchronous call)"] == ("10.0", "met")
    assert "lu n = 512, host us (asynchronous call)" not in v


def test_targets_without_cholesky_rows():
    bench = load_bench("batched.py", "bench_batched_targets2")
    v = _verdicts(bench.target_table([_row("lu", 512, 18.2)]))
    assert v["lu n = 512, public ms"] == ("18.200", "**missed**")
    assert v["chol n = any, torch ms / public ms"] == ("-", "not run")
    assert v["lu n = 8, public ms"] == ("-", "not run")


def test_host_target_judged_on_calls_back_to_back():
    """Where a row has the host time of calls made back to back, the host
    target is judged on it; the time after a wait and the pure-Python
    reference are shown beside it."""
    bench = load_bench("batched.py", "bench_batched_targets3")
    row = _row("lu", 8, 0.35, host=80.0)
    row.update(host_b2b_us=20.0, ref_b2b_us=40.0, ref_after_us=41.0)
    v = _verdicts(bench.target_table([row]))
    measured, verdict = v["lu n = 8, host us (asynchronous call)"]
    assert verdict == "met"
    assert measured.startswith("20.0 (after a wait: 80.0")
    row.update(host_b2b_us=31.0)
    assert _verdicts(bench.target_table([row]))[
        "lu n = 8, host us (asynchronous call)"][1] == "**missed**"


def test_round_trip_shown_beside_the_ratio():
    """A row with the tail measurements (the results held past the end
    event, a bare synchronization between events) shows them beside the
    public / kernel ratio, which is judged on the default call alone."""
    bench = load_bench("batched.py", "bench_batched_targets4")
    row = _row("lu", 8, 0.360, kern=0.340)
    row.update(public_held_ms=0.350, sync_ms=0.012)
    measured, verdict = _verdicts(bench.target_table([row]))["lu n = 8, public ms / kernel ms"]
    assert verdict == "**missed**"
    assert measured == ("1.059 (results held: 1.029; public - kernel 20.0 us, "
                        "a bare synchronization 12.0 us)")


def test_host_table_medians_ranges_and_verdict():
    """``bench/batched_host.py``'s table across worker processes: per
    function and variant the median of the processes' medians and their
    range per tree, the last tree judged against 30 µs, the Python
    reference per tree on the last line."""
    bench = load_bench("batched_host.py", "bench_batched_host_table")

    def proc(tag, jacobi, lu, ref):
        return dict(tag=tag, rows=[
            dict(function="block_jacobi", variant="default", host_us=jacobi, ref_us=ref),
            dict(function="lu_factor_batched", variant="async", host_us=lu, ref_us=ref)])
    results = [proc("base", 35.0, 20.0, 36.0), proc("new", 31.0, 21.0, 80.0),
               proc("base", 33.0, 19.0, 35.0), proc("new", 25.0, 22.0, 37.0),
               proc("new", 27.0, 40.0, 36.0)]
    lines = bench.host_table(results)
    assert lines[0] == "| function | variant | base µs | new µs | new ≤ 30 µs |"
    body = {tuple(c.strip() for c in ln.strip("|").split("|")[:2]):
            [c.strip() for c in ln.strip("|").split("|")[2:]] for ln in lines[2:]}
    assert body[("block_jacobi", "default")] == ["34.0 (33.0-35.0)", "27.0 (25.0-31.0)", "met"]
    assert body[("lu_factor_batched", "async")][1:] == ["22.0 (21.0-40.0)", "met"]
    ref = body[("Python reference (fixed loop)", "back to back")]
    assert ref[0] == "35.5 (35.0-36.0)" and ref[1] == "37.0 (36.0-80.0)"
    results.append(proc("new", 45.0, 22.0, 36.0))
    results.append(proc("new", 46.0, 22.0, 36.0))
    body = {ln.strip("|").split("|")[0].strip(): ln for ln in bench.host_table(results)[2:]}
    assert body["block_jacobi"].rstrip().endswith("| **missed** |")
