"""--base REV: the index only grows; the baseline only falls; SKIP when unusable."""

DASH = "\u2014"
NEW = f"| #6 | {DASH} | delta | capability |"
HEAD = ("--base", "HEAD")


def test_appended_row_passes(tree):
    tree.commit()
    tree.append("| #6 | `ALPHA-TWO` | delta | capability |")
    res = tree.passes(*HEAD)
    assert res.stdout.strip().endswith("base HEAD checked")
    assert "SKIP" not in res.stdout


def test_edited_line_is_refused(tree):
    tree.commit()
    path = tree.root / ".agents" / "issue-index.md"
    path.write_text(path.read_text(encoding="utf-8").replace("| beta |", "| beta, renamed |"),
                    encoding="utf-8")
    line = tree.line_of(f"| #4 | {DASH} | beta, renamed | capability |")
    tree.refused(f"lines {line}-{line} of HEAD were edited", args=HEAD)


def test_removed_line_is_refused(tree):
    tree.commit()
    tree.index(["| #3 | `ALPHA-ONE` | alpha | capability |",
                f"| #4 | {DASH} | beta | capability |"])
    tree.baseline(unowned=0)
    tree.refused("lines 9-9 of HEAD were removed", args=HEAD)


def test_inserted_in_the_middle_is_refused(tree):
    tree.commit()
    tree.index(["| #3 | `ALPHA-ONE` | alpha | capability |",
                "| #6 | `ALPHA-TWO` | delta | capability |",
                f"| #4 | {DASH} | beta | capability |",
                f"| #5 | {DASH} | gamma | process |"])
    tree.refused("lines 8-8 inserted before line 8 of HEAD; append at the end", args=HEAD)


def test_raised_high_water_mark_is_refused(tree):
    tree.commit()
    tree.append(NEW)
    tree.baseline(unowned=2)
    tree.refused("unowned raised from 1 at HEAD to 2; a ratchet only falls", args=HEAD)


def test_index_new_at_base_counts_as_growth(tree):
    (tree.root / "README").write_text("before records\n")
    tree.git("init", "-q")
    tree.git("add", "README")
    tree.git("commit", "-q", "-m", "first")
    assert "base HEAD checked" in tree.passes(*HEAD).stdout


def test_unusable_rev_skips_loudly_never_passes(tree):
    tree.commit()  # a single commit: HEAD~1 does not exist
    tree.append(NEW)  # would be fine anyway; nothing is compared
    tree.baseline(unowned=2)
    res = tree.passes("--base", "HEAD~1")
    assert res.stdout.startswith("SKIP !!! append-only check NOT run")
    assert res.stdout.strip().endswith("base HEAD~1 SKIPPED")
    assert "PASS" not in res.stdout and "checked" not in res.stdout


def test_not_a_git_repo_skips(tree):
    # The ceiling keeps git from finding a repository above tmp_path.
    res = tree.passes("--base", "HEAD", env={"GIT_CEILING_DIRECTORIES": str(tree.root.parent)})
    assert "SKIP !!!" in res.stdout
