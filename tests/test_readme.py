"""The README: its example runs as written, CI runs its two commands as written."""

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


def test_ci_runs_the_readme_commands_verbatim():
    """Exactly two shell commands in the README, and .ci/run runs both as written."""
    text = (REPO / "README.md").read_text()
    commands = [c.strip() for c in re.findall(r"```bash\n(.*?)```", text, re.S)]
    assert len(commands) == 2, commands
    ci = (REPO / ".ci" / "run").read_text()
    for command in commands:
        assert command in ci, f".ci/run does not run the README's command {command!r}"
    assert "--upgrade" not in ci, "a newcomer's venv keeps its stock pip and setuptools"


def test_readme_states_the_drop_in_promise_with_its_table():
    """Issue 15 item 5: the promise in one paragraph, followed by the ladder's table
    (ours/SciPy per group of rows, from bench/dropin.py), naming the machine it ran on."""
    text = (REPO / "README.md").read_text()
    start = text.index("**The drop-in promise.**")
    paragraph, rest = text[start:].split("\n\n", 1)
    for word in ("atol", "iter_lim", "lsqr", "spsolve", "SuperLU", "minimum 2-norm",
                 "bench/dropin.py", "SCIPY_GPUQR_VERBOSE"):
        assert word in paragraph, word
    table = rest.split("\n\n", 1)[0].splitlines()
    assert table[0].startswith("|") and "ours/SciPy" in table[0], table[:2]
    assert set(table[1]) <= set("|-: ") and len(table) >= 3
    assert all(row.startswith("|") and row.count("|") == table[0].count("|") for row in table)
    assert any("core" in row for row in table), "the table names its machine"
