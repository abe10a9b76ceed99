"""The command line: summary on success, every error on failure, real tree."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DASH = "\u2014"


def test_valid_tree_prints_one_line_summary(tree):
    res = tree.passes()
    assert res.stdout.strip().splitlines()[-1] == (
        "records OK: 3 rows, 1 owners, 1 owed, anchors 1/0/0 ok/stale/broken, "
        "base SKIPPED (no --base given)")


def test_every_error_is_listed(tree):
    tree.append("| #3 | `NOBODY` | undeclared | capability |", "| #3 | oops |")
    tree.refused("records FAILED: 2 errors", "malformed row", "`NOBODY`")


def test_missing_index_fails(tree):
    (tree.root / ".agents" / "issue-index.md").unlink()
    tree.refused("issue-index.md: missing")


def test_real_tree_passes_and_indexes_every_issue(checker):
    res = checker("--root", str(REPO))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1].startswith("records OK: ")
    text = (REPO / ".agents" / "issue-index.md").read_text(encoding="utf-8")
    indexed = {int(n) for n in re.findall(r"^\| #(\d+) \|", text, re.M)}
    assert set(range(2, 10)) <= indexed
