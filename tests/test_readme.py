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
