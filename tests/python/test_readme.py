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


def test_readme_names_torchs_cpu_wheel_and_the_torch_extra_agrees():
    from vtinfer._optional import TORCH_CPU

    text = " ".join((ROOT / "README.md").read_text().split())
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert TORCH_CPU == "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    # every other mention of the bare command says what it fetches instead
    for m in re.finditer(r"pip install torch==2\.13\.0(?! --index-url)", text):
        assert "CUDA build" in text[m.end():m.end() + 60], text[m.start() - 40:m.end() + 60]
    pyproject = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r'^torch = \["torch>=([0-9.]+)"\]', pyproject, re.M)
    assert extra and extra.group(1) == "2.13", "the torch extra's floor is the tested torch"


def test_readme_documents_vtinfer_cuda_and_the_first_run():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`VTINFER_CUDA=auto|0|1`" in text and "only where a GPU is present" in text
    assert re.search(r"`pip install -e '\.\[test\]'` took \d+ s .* the first `pytest` \d+ s", text)
    assert re.search(r"`pip install '\.\[demo\]'` \d+ s, the first `vtinfer demo` \d+ s", text)
    assert re.search(r"load [0-9-]+", text), "a time without the machine's load means little"
