"""Issue #15 item 8: a mutant that no longer applies fails the mutation run
up front, for the whole list, even with --fast; and today's list applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "run.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=120)


def test_every_mutant_of_the_list_applies_to_the_working_tree():
    p = _run("--check", "--rev", "WORKTREE")
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_stale_mutant_fails_even_a_fast_run_that_does_not_select_it(tmp_path):
    toml = tmp_path / "m.toml"
    toml.write_text('''
[[mutant]]
name = "applies"
file = "vtinfer/cli.py"
find = "def build_parser()"
replace = "def build_parser_x()"
tests = ["tests/python/test_api.py"]
fast = true

[[mutant]]
name = "rotted"
file = "vtinfer/cli.py"
find = "this text was refactored away long ago"
replace = "x"
tests = ["tests/python/test_api.py"]
''')
    for args in (["--check"], ["--fast"], ["applies"]):
        p = _run(*args, "--rev", "WORKTREE", "--toml", str(toml))
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "STALE rotted: vtinfer/cli.py: find text occurs 0 times" in p.stdout, p.stdout
        assert "killed" not in p.stdout  # nothing was built or run
    good = tmp_path / "good.toml"
    good.write_text(toml.read_text().split("[[mutant]]\nname = \"rotted\"")[0])
    assert _run("--check", "--rev", "WORKTREE", "--toml", str(good)).returncode == 0
