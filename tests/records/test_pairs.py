"""Uniqueness is keyed on the pair (issue, owner); refusals name both lines.

Mutation "key on the number alone" reds the hand-off tests; mutation "every
pair is new" reds the duplicate tests.  The two sets are disjoint.
"""

DASH = "\u2014"


def test_same_pair_twice_names_both_lines(tree):
    tree.append("| #3 | `ALPHA-ONE` | alpha, said again | capability |")
    first = tree.line_of("| #3 | `ALPHA-ONE` | alpha | capability |")
    second = tree.line_of("| #3 | `ALPHA-ONE` | alpha, said again | capability |")
    res = tree.refused(
        f"issue-index.md:{second}: duplicate pair (#3, ALPHA-ONE) already at line {first}")
    assert "byte-identical" not in res.stderr


def test_byte_identical_line_refused_as_duplicate_pair(tree):
    line = "| #3 | `ALPHA-ONE` | alpha | capability |"
    tree.append(line)
    tree.refused(f"issue-index.md:{tree.line_of(line, 2)}: duplicate pair (#3, ALPHA-ONE) already "
                 f"at line {tree.line_of(line, 1)} (byte-identical line)")


def test_same_unowned_pair_twice_refused(tree):
    tree.append(f"| #5 | {DASH} | gamma again | process |")
    tree.refused(f"duplicate pair (#5, {DASH}) already at line")


def test_pair_key_ignores_cell_spacing(tree):
    tree.append("|  #3 |   `ALPHA-ONE`  | alpha | capability |")
    tree.refused("duplicate pair (#3, ALPHA-ONE)")


def test_hand_off_to_another_owner_is_legitimate(tree):
    tree.append("| #3 | `ALPHA-TWO` | alpha, handed to the second row | capability |")
    assert "records OK: 4 rows, 2 owners" in tree.passes().stdout


def test_unowned_issue_adopted_by_owner(tree):
    # #5 was unowned; an owned row for it is a new pair, and the ratchet falls.
    tree.append("| #5 | `ALPHA-TWO` | gamma adopted | process |")
    tree.baseline(unowned=0)
    tree.passes()
