"""Spec structure, declared owners, and owed issues the index knows."""

DASH = "\u2014"


def test_undeclared_owner_is_refused(tree):
    tree.append("| #6 | `NOBODY-HOME` | delta | capability |")
    tree.refused("owner `NOBODY-HOME` of #6 is not declared")


def test_missing_spec_is_tolerated_for_unowned_rows(tree):
    # #6's capability has no spec yet: a `—` row needs none (the ratchet counts it).
    tree.append(f"| #6 | {DASH} | delta, spec not written yet | capability |")
    tree.baseline(unowned=2)
    tree.passes()


def test_row_declared_twice_is_refused(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n- `ALPHA-ONE` \u2014 stolen\n\n## Owed\n")
    tree.refused("beta.md:5: row `ALPHA-ONE` already declared at .agents/specs/alpha.md:7")


def test_malformed_rows_bullet_is_refused(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n- `beta-lower` \u2014 bad id\n\n## Owed\n")
    tree.refused("beta.md:5: ## Rows bullet must be")


def test_owed_bullet_without_issue_is_refused(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n## Owed\n\n- nothing, really\n")
    tree.refused("beta.md:7: ## Owed bullet must start with #N")


def test_owed_issue_missing_from_index_is_refused(tree):
    tree.spec("beta", "# beta\n\n## Rows\n\n## Owed\n\n- #42 \u2014 unknown\n")
    tree.refused("beta.md:7: owes #42, which has no row in .agents/issue-index.md")


def test_missing_sections_are_refused(tree):
    tree.spec("beta", "# beta\n\nNo sections.\n")
    tree.refused("beta.md: missing section ## Rows", "beta.md: missing section ## Owed")


def test_malformed_index_row_is_refused(tree):
    row = "| 6 | - | no hash, no dash | capability |"
    tree.append(row)
    tree.refused(f"issue-index.md:{tree.line_of(row)}: malformed row")
