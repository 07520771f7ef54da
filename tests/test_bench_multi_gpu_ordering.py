"""bench/multi_gpu.py's ``--ordering``: each matrix analysed with each column ordering,
its rows labelled and its speedups against one device of the same ordering (NumPy
device layers: no GPU)."""

import json

import pytest

from conftest import load_bench
from scipy_gpuqr._cpu.metis import metis_available


def test_orderings_parse_and_label():
    bench = load_bench("multi_gpu.py", "multi_gpu_bench_ordering")
    assert bench._orderings("") == ["colamd"]
    assert bench._orderings("metis, colamd,metis") == ["metis", "colamd"]
    with pytest.raises(ValueError, match="nd"):
        bench._orderings("colamd,nd")
    with pytest.raises(ValueError, match="given"):
        bench._orderings("given")
    assert bench._label("grid56", "colamd", ["colamd"]) == "grid56"
    assert bench._label("grid56", "colamd", ["colamd", "metis"]) == "grid56 colamd"
    assert bench._label("grid56", "metis", ["metis"]) == "grid56 metis"


@pytest.mark.skipif(not metis_available()[0], reason="METIS not installed")
def test_numpy_run_takes_each_ordering(tmp_path, capsys):
    bench = load_bench("multi_gpu.py", "multi_gpu_bench_ordering_run")
    out = tmp_path / "mg.json"
    rc = bench.main(["--numpy", "--only", "grid8", "--gpus", "1,2", "--reps", "1",
                     "--ordering", "colamd,metis", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["matrix"] for r in rows] == ["grid8 colamd", "grid8 metis"]
    assert [r["ordering"] for r in rows] == ["colamd", "metis"]
    assert rows[0]["flops"] != rows[1]["flops"]
    for r in rows:
        one, two = r["runs"]
        assert (one["gpus"], two["gpus"]) == (1, 2)
        # each ordering's two devices against its own one device
        assert two["speedup"] == pytest.approx(one["seconds"] / two["seconds"])
        assert two["R_diff"] < 1e-10
    assert "| grid8 metis |" in capsys.readouterr().out
