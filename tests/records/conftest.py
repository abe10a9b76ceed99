"""Fixture trees for the records checker (.agents/check_records.py).

Every test builds a small tree in tmp_path and runs the checker's real
command-line entry point in a subprocess.  RECORDS_CHECKER may point at
another copy of the checker (tests/records/run_mutants.py uses it to run
this suite against mutants).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKER = Path(os.environ.get("RECORDS_CHECKER", REPO / ".agents" / "check_records.py"))
DASH = "\u2014"

SPEC = """\
# alpha

Purpose: a fixture capability.

## Rows

- `ALPHA-ONE` \u2014 the first row
- `ALPHA-TWO` \u2014 the second row

## Measured

`src/mod.py:2` "def f" is where f lives.

## Owed

- #4 \u2014 something alpha still owes
"""

HEADER = """\
# Issue index

Append-only.

| issue | owner | title | kind |
|---|---|---|---|
"""

ROWS = [
    "| #3 | `ALPHA-ONE` | alpha | capability |",
    f"| #4 | {DASH} | beta | capability |",
    f"| #5 | {DASH} | gamma | process |",
]


def pytest_collection_modifyitems(items):
    # House style: warnings are errors (the project's pytest config says so
    # too; this keeps the folder honest when run on its own).
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.filterwarnings("error"))


class Tree:
    """A records tree: .agents/{issue-index.md,records-baseline.json,specs/}."""

    def __init__(self, root: Path):
        self.root = root
        (root / ".agents" / "specs").mkdir(parents=True)
        (root / "src").mkdir()
        (root / "src" / "mod.py").write_text("# mod\ndef f():\n    return 1\n\n")
        self.spec("alpha", SPEC)
        self.index(ROWS)
        self.baseline(unowned=1)

    def spec(self, name: str, text: str) -> None:
        (self.root / ".agents" / "specs" / f"{name}.md").write_text(text, encoding="utf-8")

    def index(self, rows: list[str], header: str = HEADER) -> None:
        text = header + "".join(r + "\n" for r in rows)
        (self.root / ".agents" / "issue-index.md").write_text(text, encoding="utf-8")

    def append(self, *rows: str) -> None:
        with open(self.root / ".agents" / "issue-index.md", "a", encoding="utf-8") as fh:
            fh.write("".join(r + "\n" for r in rows))

    def baseline(self, unowned: int, stale: int = 0, broken: int = 0) -> None:
        data = {"unowned": unowned, "anchors_stale": stale, "anchors_broken": broken}
        (self.root / ".agents" / "records-baseline.json").write_text(json.dumps(data))

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return run_checker("--root", str(self.root), *args, env=env)

    def passes(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run the checker: it must succeed (its stderr is the failure message)."""
        res = self.run(*args, env=env)
        assert res.returncode == 0, res.stderr
        return res

    def refused(self, *fragments: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """Run the checker: it must fail, with every fragment in its stderr."""
        res = self.run(*args)
        assert res.returncode == 1, res.stdout
        for fragment in fragments:
            assert fragment in res.stderr, res.stderr
        return res

    def line_of(self, text: str, nth: int = 1) -> int:
        """1-based line number of the nth index line equal to text."""
        lines = (self.root / ".agents" / "issue-index.md").read_text(encoding="utf-8")
        hits = [n for n, line in enumerate(lines.splitlines(), 1) if line == text]
        return hits[nth - 1]

    def git(self, *args: str) -> None:
        subprocess.run(["git", "-C", str(self.root), "-c", "user.name=t", "-c",
                        "user.email=t@example.invalid", "-c", "commit.gpgsign=false", *args],
                       check=True, capture_output=True, timeout=60)

    def commit(self, message: str = "records") -> None:
        if not (self.root / ".git").exists():
            self.git("init", "-q")
        self.git("add", ".")
        self.git("commit", "-q", "--no-verify", "-m", message)


def run_checker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(CHECKER), *args], capture_output=True,
                          text=True, timeout=60, env=full_env)


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


@pytest.fixture
def checker():
    """The checker's command line as a function: checker(*args) -> CompletedProcess."""
    return run_checker
