"""A `—` row after an owned row for its issue needs a spec that owes the issue."""

DASH = "\u2014"


def test_de_adoption_without_owed_is_refused(tree):
    tree.append(f"| #3 | {DASH} | alpha dropped | capability |")
    tree.baseline(unowned=2)  # keep the ratchet quiet: only the ordering rule speaks
    owned = tree.line_of("| #3 | `ALPHA-ONE` | alpha | capability |")
    dropped = tree.line_of(f"| #3 | {DASH} | alpha dropped | capability |")
    tree.refused(f"issue-index.md:{dropped}: {DASH} row for #3 after owned row at line {owned} "
                 "(`ALPHA-ONE`)", "records FAILED: 1 error")


def test_de_adoption_with_owed_is_explicit_and_passes(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n- `BETA-X` \u2014 x\n\n## Owed\n\n"
              "- #3 \u2014 alpha's row was dropped; beta owes it\n")
    tree.append(f"| #3 | {DASH} | alpha dropped | capability |")
    tree.passes()


def test_unowned_before_owned_is_adoption_not_de_adoption(tree):
    tree.index([f"| #3 | {DASH} | alpha | capability |",
                "| #3 | `ALPHA-ONE` | alpha adopted | capability |",
                f"| #4 | {DASH} | beta | capability |",
                f"| #5 | {DASH} | gamma | process |"])
    tree.passes()
