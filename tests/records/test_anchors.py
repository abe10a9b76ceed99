"""`path:LINE` anchors in specs: ok / stale / broken, and the baseline ratchet."""

import pytest

ANCHORED = """\
# gamma

## Rows

- `GAMMA-A` \u2014 anchors

## Measured

{body}

## Owed
"""


def anchored(tree, *anchors):
    tree.spec("gamma", ANCHORED.format(body="\n".join(anchors)))


@pytest.mark.parametrize("anchor, kind", [
    ('`src/mod.py:1`', "ok"),
    ('`src/mod.py:3` "return 1"', "ok"),
    ('`src/mod.py:3` "return 2"', "stale"),
    ('`src/mod.py:4`', "stale"),            # a blank line cites nothing
    ('`src/mod.py:5`', "broken"),           # past end of file
    ('`src/mod.py:0`', "broken"),
    ('`src/gone.py:1`', "broken"),
    ('`../outside/mod.py:1`', "broken"),    # outside the tree
])
def test_classification(tree, anchor, kind):
    anchored(tree, anchor)
    tree.baseline(unowned=1, stale=1, broken=1)
    res = tree.passes()
    want = {"ok": "2/0/0", "stale": "1/1/0", "broken": "1/0/1"}[kind]  # +1 ok from alpha
    assert f"anchors {want} ok/stale/broken" in res.stdout


def test_stale_rise_is_refused(tree):
    anchored(tree, '`src/mod.py:2` "def g"')
    tree.refused("stale anchors rose to 1 over the baseline 0",
                 "gamma.md:9: anchor src/mod.py:2 is stale")


def test_broken_rise_is_refused(tree):
    anchored(tree, "`src/mod.py:99`", "`src/mod.py:98`")
    tree.baseline(unowned=1, broken=1)
    tree.refused("broken anchors rose to 2 over the baseline 1")


def test_fenced_code_is_not_an_anchor(tree):
    anchored(tree, "```", "`src/mod.py:99`", "```")
    assert "anchors 1/0/0" in tree.passes().stdout
