"""``bench/dropin.py``'s plot without a plotting library: the ratio per row as SVG bars
on a log scale (``--svg``), redrawn from an earlier run's JSON (``--plot-from``)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import pytest

from conftest import TEST_MATRICES, load_bench

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def dropin():
    return load_bench("dropin.py", "bench_dropin_plot")


def _rows():
    return [
        {"name": "a", "method": "lsqr", "ratio": 1.0, "converges": True, "answered": "x"},
        {"name": "b", "method": "lsmr", "ratio": 10.0, "converges": True, "answered": "y"},
        {"name": "c", "method": "lsqr", "ratio": 0.01, "converges": False, "answered": "z"},
        {"name": "d", "method": "spsolve", "error": "ValueError: no"},
    ]


def _bars(path):
    root = ET.parse(path).getroot()
    return [r for r in root.iter(SVG + "rect") if r.get("class") == "bar"]


def test_bars_are_log_scaled_and_coloured(dropin, tmp_path):
    path = tmp_path / "plot.svg"
    dropin.plot_svg(_rows(), str(path), "host <1>")
    bars = _bars(path)
    # the error row is left out
    assert [float(b.get("data-ratio")) for b in bars] == [1.0, 10.0, 0.01]
    tops = [float(b.get("y")) for b in bars]
    bottoms = [float(b.get("y")) + float(b.get("height")) for b in bars]
    assert max(bottoms) - min(bottoms) < 1e-6                # one baseline
    decade = tops[0] - tops[1]                               # 1 -> 10: one decade up
    assert decade > 0
    assert tops[2] - tops[0] == pytest.approx(2 * decade, abs=0.02)   # 0.01: two decades down
    assert [b.get("fill") for b in bars] == ["#1f77b4", "#1f77b4", "#d62728"]
    assert "c lsqr: 0.01 (z)" in bars[2].find(SVG + "title").text
    assert "host &lt;1&gt;" in path.read_text()              # the title is escaped


def test_the_axis_spans_the_ratios_and_the_reference_lines(dropin):
    assert dropin._svg_range([0.5, 0.9]) == (-1, 1)
    assert dropin._svg_range([0.003, 40.0]) == (-3, 2)
    lo, hi = dropin._svg_range([0.2])
    for ratio, *_ in dropin.REFERENCES:
        assert lo <= math.log10(ratio) <= hi


def test_plot_from_a_saved_run(dropin, tmp_path, capsys):
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"device": "no GPU", "rows": _rows()}))
    svg = tmp_path / "again.svg"
    assert dropin.main(["--plot-from", str(saved), "--svg", str(svg)]) == 0
    assert len(_bars(svg)) == 3
    assert "plot:" in capsys.readouterr().out


def test_a_row_where_scipy_raises_the_same_is_no_failure(dropin):
    """SuperLU cannot factorize a singular matrix: SciPy's spsolve and ours (SciPy's call
    under auto) raise the same RuntimeError; the summary counts it apart from failures."""
    import numpy as np
    import scipy.sparse as sp

    A = sp.csc_array(dropin.mmread(str(TEST_MATRICES / "a1.mtx")), dtype=np.float64)
    b = dropin.row_rhs("a1", A.shape[0])
    try:
        dropin.scipy_gpuqr.spsolve(A, b)
    except RuntimeError as exc:
        assert dropin.raises_alike("spsolve", A, b, exc)
        assert not dropin.raises_alike("spsolve", A, b, RuntimeError("another message"))
    else:
        pytest.skip("this SciPy's SuperLU factorizes a1")
    assert not dropin.raises_alike("spsolve", sp.csc_array(np.eye(4)), b, ValueError("x"))
    rows = [{"name": "s", "shape": "2x2", "method": "spsolve", "error": "RuntimeError: x",
             "same_as_scipy": True},
            {"name": "t", "shape": "2x2", "method": "spsolve", "error": "ValueError: y",
             "same_as_scipy": False}] + _rows()[:1]
    rows[2] = dict(rows[2], scipy_be=0.0, ours_be=0.0, synced_ratio=1.0)
    text = dropin.summary(rows)
    assert "rows: 1 (1 failed; 1 where ours raises what SciPy raises)" in text
    assert "(SciPy raises the same)" in dropin.table(rows[:1])
