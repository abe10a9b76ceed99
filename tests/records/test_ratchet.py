"""The unowned count must equal the high-water mark in records-baseline.json."""

DASH = "\u2014"


def test_rise_is_refused(tree):
    tree.append(f"| #6 | {DASH} | delta | capability |")
    line = tree.line_of(f"| #6 | {DASH} | delta | capability |")
    tree.refused("unowned rows rose to 2 over the high-water mark 1", f"#6 at line {line}")


def test_unrecorded_fall_is_refused(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n- `BETA-X` \u2014 x\n\n## Owed\n\n- #5 \u2014 y\n")
    tree.refused('unowned rows fell to 0 from 1 (none); record it: set "unowned": 0')


def test_recorded_fall_passes(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n- `BETA-X` \u2014 x\n\n## Owed\n\n- #5 \u2014 y\n")
    tree.baseline(unowned=0)
    assert "2 owed" in tree.passes().stdout


def test_owed_issue_is_not_counted(tree):
    # #4 is unowned but alpha owes it: the fixture's mark of 1 counts #5 only.
    tree.baseline(unowned=2)
    tree.refused("unowned rows fell to 1 from 2 (#5 at line")


def test_missing_baseline_is_an_error(tree):
    (tree.root / ".agents" / "records-baseline.json").unlink()
    tree.refused("records-baseline.json: missing")


def test_malformed_baseline_is_an_error(tree):
    (tree.root / ".agents" / "records-baseline.json").write_text('{"unowned": "1"}')
    tree.refused("unowned, anchors_stale, anchors_broken must be a non-negative integer")
