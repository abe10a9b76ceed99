"""README.md stays true: its Python example runs, and its two set-up
commands are the ones .ci/run uses."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "PagedKVCache(" in r.stdout and "(1, 8, 64)" in r.stdout


def test_readme_commands_are_the_ci_commands():
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install '.[demo]' && vtinfer demo" in text
    assert "pip install -e '.[test]' && pytest" in text
    assert "pip install -e '.[test]' && pytest" in ci
    assert "vtinfer demo --json" in ci
