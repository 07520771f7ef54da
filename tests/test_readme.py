"""The README's first example runs as written."""

import re

from conftest import REPO


def test_readme_solver_example_runs(capsys):
    text = (REPO / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    A, x1 = namespace["A"], namespace["x1"]
    assert x1.shape == (A.shape[1],)
    assert namespace["rank"] <= min(A.shape)
    assert capsys.readouterr().out.strip()
