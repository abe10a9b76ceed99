#!/usr/bin/env python3
"""check_records.py [--root DIR] [--base REV]

The gate that keeps vtinfer's records honest (issue #8, spec
`.agents/specs/records.md`).  Standard library only.

Reads three things under ROOT (default: the folder above this file):

- `.agents/specs/*.md`: each spec declares its row IDs in `## Rows`
  (``- `ROW-ID` — one line``) and what it owes in `## Owed` (``- #N — ...``);
  backticked `` `path:LINE` `` anchors, optionally followed by ``"snippet"``.
- `.agents/issue-index.md`: append-only table, one row per statement,
  ``| #N | `ROW-ID` or — | title | kind |``.
- `.agents/records-baseline.json`: the recorded figures the ratchets compare
  against (`unowned`, `anchors_stale`, `anchors_broken`).

Exit 0 with a one-line summary, or 1 listing every error.  Line numbers in
messages are computed when the files are read; nothing stores them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

INDEX = ".agents/issue-index.md"
SPECS = ".agents/specs"
BASELINE = ".agents/records-baseline.json"
BASELINE_KEYS = ("unowned", "anchors_stale", "anchors_broken")
UNOWNED = "\u2014"  # the em dash that marks a row nobody owns

ROW_ID = r"[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*"
INDEX_ROW = re.compile(
    r"^\|\s*#(?P<issue>\d+)\s*\|\s*(?:`(?P<owner>" + ROW_ID + r")`|" + UNOWNED
    + r")\s*\|\s*(?P<title>[^|]*\S)\s*\|\s*(?P<kind>[a-z][a-z-]*)\s*\|\s*$"
)
INDEX_HEADER = re.compile(r"^\|\s*issue\s*\|\s*owner\s*\|\s*title\s*\|\s*kind\s*\|\s*$")
INDEX_RULE = re.compile(r"^\|(?:\s*:?-+:?\s*\|)+\s*$")
DECLARED_ROW = re.compile(r"^- `(" + ROW_ID + r")`\s*(?:\u2014|\u2013|-|:)\s*\S")
OWED_ITEM = re.compile(r"^- #(\d+)\b")
ANCHOR = re.compile(r'`(?P<path>[\w.-]*[/.][\w./-]*):(?P<line>\d+)`(?:\s+"(?P<snip>[^"]+)")?')
HEADING = re.compile(r"^##\s+(\S.*?)\s*$")


@dataclass(frozen=True)
class Row:
    """One index row; `lineno` is 1-based and computed at read time."""

    lineno: int
    issue: int
    owner: str  # a row ID, or UNOWNED
    raw: str


@dataclass
class Specs:
    declared: dict[str, str] = field(default_factory=dict)  # row ID -> "spec:line"
    owed: set[int] = field(default_factory=set)
    owed_at: list[tuple[str, int]] = field(default_factory=list)  # ("spec:line", N)
    anchors: list[tuple[str, str, int, str | None]] = field(default_factory=list)


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# --- reading -----------------------------------------------------------------

def parse_index(lines: list[str], where: str) -> tuple[list[Row], list[str]]:
    """Rows of the index table; any other `|` line is an error."""
    rows: list[Row] = []
    errors: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.startswith("|") or INDEX_HEADER.match(line) or INDEX_RULE.match(line):
            continue
        m = INDEX_ROW.match(line)
        if m is None:
            errors.append(f"{where}:{n}: malformed row; want | #N | `ROW-ID` or {UNOWNED} "
                          f"| title | kind |, got {line!r}")
            continue
        owner = m.group("owner") or UNOWNED
        rows.append(Row(n, int(m.group("issue")), owner, line))
    if not rows and not errors:
        errors.append(f"{where}: no index rows found")
    return rows, errors


def parse_specs(root: Path) -> tuple[Specs, list[str]]:
    """Declared row IDs, owed issues and anchors of every spec that exists."""
    specs = Specs()
    errors: list[str] = []
    spec_dir = root / SPECS
    paths = sorted(spec_dir.glob("*.md")) if spec_dir.is_dir() else []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        section = None
        seen_sections: set[str] = set()
        fenced = False
        for n, line in enumerate(read_lines(path), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            head = HEADING.match(line)
            if head:
                section = head.group(1)
                seen_sections.add(section)
                continue
            for m in ANCHOR.finditer(line):
                specs.anchors.append((f"{rel}:{n}", m.group("path"),
                                      int(m.group("line")), m.group("snip")))
            if not line.startswith("- "):
                continue
            if section == "Rows":
                m = DECLARED_ROW.match(line)
                if m is None:
                    errors.append(f"{rel}:{n}: ## Rows bullet must be - `ROW-ID` "
                                  f"\u2014 one line (ID in A-Z, 0-9, -); got {line!r}")
                elif m.group(1) in specs.declared:
                    errors.append(f"{rel}:{n}: row `{m.group(1)}` already declared at "
                                  f"{specs.declared[m.group(1)]}")
                else:
                    specs.declared[m.group(1)] = f"{rel}:{n}"
            elif section == "Owed":
                m = OWED_ITEM.match(line)
                if m is None:
                    errors.append(f"{rel}:{n}: ## Owed bullet must start with #N; got {line!r}")
                else:
                    specs.owed.add(int(m.group(1)))
                    specs.owed_at.append((f"{rel}:{n}", int(m.group(1))))
        for needed in ("Rows", "Owed"):
            if needed not in seen_sections:
                errors.append(f"{rel}: missing section ## {needed}")
    return specs, errors


def read_baseline(root: Path) -> tuple[dict[str, int] | None, list[str]]:
    path = root / BASELINE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, [f"{BASELINE}: missing; it records {', '.join(BASELINE_KEYS)}"]
    except json.JSONDecodeError as exc:
        return None, [f"{BASELINE}: not valid JSON ({exc})"]
    bad = [k for k in BASELINE_KEYS
           if not isinstance(data, dict) or type(data.get(k)) is not int or data[k] < 0]
    if bad:
        return None, [f"{BASELINE}: {', '.join(bad)} must be a non-negative integer"]
    return {k: data[k] for k in BASELINE_KEYS}, []


# --- rules -------------------------------------------------------------------

def check_unique_pairs(rows: list[Row]) -> list[str]:
    """The pair (issue, owner) appears once; another owner is a hand-off."""
    errors: list[str] = []
    seen: dict[object, Row] = {}
    for row in rows:
        key = (row.issue, row.owner)
        if key in seen:
            first = seen[key]
            same = " (byte-identical line)" if first.raw == row.raw else ""
            errors.append(f"{INDEX}:{row.lineno}: duplicate pair (#{row.issue}, {row.owner}) "
                          f"already at line {first.lineno}{same}")
        else:
            seen[key] = row
    return errors


def check_owners_declared(rows: list[Row], specs: Specs) -> list[str]:
    """A named owner must be declared in some spec's ## Rows."""
    return [f"{INDEX}:{r.lineno}: owner `{r.owner}` of #{r.issue} is not declared in any "
            f"{SPECS}/*.md ## Rows" for r in rows
            if r.owner != UNOWNED and r.owner not in specs.declared]


def check_owed_indexed(rows: list[Row], specs: Specs) -> list[str]:
    """Every owed #N names an issue the index knows."""
    known = {r.issue for r in rows}
    return [f"{where}: owes #{n}, which has no row in {INDEX}"
            for where, n in specs.owed_at if n not in known]


def unowned_rows(rows: list[Row], specs: Specs) -> list[Row]:
    """`—` rows still current (no later owned row for the issue), issue not owed."""
    out = []
    for i, row in enumerate(rows):
        if row.owner != UNOWNED or row.issue in specs.owed:
            continue
        if any(later.issue == row.issue and later.owner != UNOWNED for later in rows[i + 1:]):
            continue
        out.append(row)
    return out


def check_ratchet(rows: list[Row], specs: Specs, baseline: dict[str, int]) -> list[str]:
    """The unowned count equals the recorded high-water mark."""
    loose = unowned_rows(rows, specs)
    mark = baseline["unowned"]
    if len(loose) == mark:
        return []
    lines = ", ".join(f"#{r.issue} at line {r.lineno}" for r in loose) or "none"
    if len(loose) > mark:
        return [f"{INDEX}: unowned rows rose to {len(loose)} over the high-water mark {mark} "
                f"({lines}); give the issue an owner or owe it in a spec"]
    return [f"{INDEX}: unowned rows fell to {len(loose)} from {mark} ({lines}); record it: "
            f'set "unowned": {len(loose)} in {BASELINE}']


def check_ordering(rows: list[Row], specs: Specs) -> list[str]:
    """A `—` row after an owned row for its issue needs a spec that owes it."""
    errors: list[str] = []
    owned: dict[int, Row] = {}
    for row in rows:
        if row.owner != UNOWNED:
            owned.setdefault(row.issue, row)
        elif row.issue in owned and row.issue not in specs.owed:
            first = owned[row.issue]
            errors.append(f"{INDEX}:{row.lineno}: {UNOWNED} row for #{row.issue} after owned "
                          f"row at line {first.lineno} (`{first.owner}`); de-adoption must be "
                          f"explicit: list #{row.issue} under ## Owed in a spec")
    return errors


def classify_anchor(root: Path, path: str, line: int, snip: str | None) -> str:
    """broken: outside the tree, no such file, or line not in it; stale: the
    line is blank or lacks the quoted snippet; ok otherwise."""
    target = (root / path).resolve()
    if not target.is_relative_to(root.resolve()) or not target.is_file():
        return "broken"
    try:
        text = read_lines(target)
    except (OSError, UnicodeDecodeError):
        return "broken"
    if not 1 <= line <= len(text):
        return "broken"
    cited = text[line - 1]
    if not cited.strip() or (snip is not None and snip not in cited):
        return "stale"
    return "ok"


def classify_anchors(root: Path, specs: Specs) -> tuple[dict[str, int], list[str]]:
    counts = {"ok": 0, "stale": 0, "broken": 0}
    notes = []
    for where, path, line, snip in specs.anchors:
        kind = classify_anchor(root, path, line, snip)
        counts[kind] += 1
        if kind != "ok":
            notes.append(f"{where}: anchor {path}:{line} is {kind}")
    return counts, notes


def check_anchor_baseline(counts: dict[str, int], notes: list[str],
                          baseline: dict[str, int]) -> list[str]:
    """Stale and broken anchors may not rise over the recorded baseline."""
    errors = []
    for kind in ("stale", "broken"):
        if counts[kind] > baseline[f"anchors_{kind}"]:
            listed = "; ".join(n for n in notes if n.endswith(kind))
            errors.append(f"{SPECS}: {kind} anchors rose to {counts[kind]} over the baseline "
                          f"{baseline[f'anchors_{kind}']} ({listed})")
    return errors


# --- --base REV --------------------------------------------------------------

def git_show(root: Path, rev: str, rel: str) -> tuple[str | None, str | None]:
    """(text, None); (None, None) when REV lacks the file; (None, why) when REV
    is unusable."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    try:
        rp = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except OSError as exc:
        return None, f"git not runnable ({exc})"
    if rp.returncode != 0:
        return None, f"{rev!r} is not a commit here (not a git repo, shallow clone, or first commit)"
    shown = git("show", f"{rev}:./{rel}")
    if shown.returncode != 0:
        return None, None
    return shown.stdout, None


def check_append_only(old: list[str], new: list[str], rev: str) -> list[str]:
    """Relative to REV the index only grows at its end."""
    errors = []
    sm = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, a1, a2, b1, b2 in sm.get_opcodes():
        if tag in ("replace", "delete"):
            what = "edited" if tag == "replace" else "removed"
            errors.append(f"{INDEX}: lines {a1 + 1}-{a2} of {rev} were {what} (now lines "
                          f"{b1 + 1}-{b2}); the index is append-only")
        elif tag == "insert" and a1 < len(old):
            errors.append(f"{INDEX}: lines {b1 + 1}-{b2} inserted before line {a1 + 1} of "
                          f"{rev}; append at the end")
    return errors


def check_baseline_not_raised(old_text: str | None, now: dict[str, int], rev: str) -> list[str]:
    """A ratchet: relative to REV the recorded figures may only fall."""
    try:
        old = json.loads(old_text) if old_text is not None else {}
    except json.JSONDecodeError:
        return []
    return [f"{BASELINE}: {k} raised from {old[k]} at {rev} to {now[k]}; a ratchet only falls"
            for k in BASELINE_KEYS
            if isinstance(old, dict) and type(old.get(k)) is int and now[k] > old[k]]


def check_base(root: Path, rev: str, new_index: list[str],
               baseline: dict[str, int] | None) -> tuple[list[str], str]:
    """Errors and the summary's word on the base: `checked` or `SKIPPED`."""
    old, why = git_show(root, rev, INDEX)
    if why is not None:
        print(f"SKIP !!! append-only check NOT run: {why}. Nothing was compared "
              f"against --base {rev}.")
        return [], f"base {rev} SKIPPED"
    errors: list[str] = []
    errors.extend(check_append_only(old.splitlines() if old is not None else [], new_index, rev))
    if baseline is not None:
        errors.extend(check_baseline_not_raised(git_show(root, rev, BASELINE)[0], baseline, rev))
    return errors, f"base {rev} checked"


# --- entry point -------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--base", metavar="REV", help="refuse index lines removed or edited since REV")
    args = ap.parse_args(argv)
    root = args.root.resolve()

    try:
        index_lines = read_lines(root / INDEX)
    except FileNotFoundError:
        print(f"records FAILED: 1 error\n  {INDEX}: missing", file=sys.stderr)
        return 1
    rows, index_errors = parse_index(index_lines, INDEX)
    specs, spec_errors = parse_specs(root)
    baseline, baseline_errors = read_baseline(root)
    counts, notes = classify_anchors(root, specs)
    base_errors, base_word = [], "base SKIPPED (no --base given)"
    if args.base is not None:
        base_errors, base_word = check_base(root, args.base, index_lines, baseline)

    # One statement per rule, so that each can be removed by a mutant.
    errors: list[str] = []
    errors.extend(index_errors)
    errors.extend(spec_errors)
    errors.extend(baseline_errors)
    errors.extend(check_unique_pairs(rows))
    errors.extend(check_owners_declared(rows, specs))
    errors.extend(check_owed_indexed(rows, specs))
    errors.extend(check_ordering(rows, specs))
    if baseline is not None:
        errors.extend(check_ratchet(rows, specs, baseline))
        errors.extend(check_anchor_baseline(counts, notes, baseline))
    errors.extend(base_errors)

    if errors:
        print(f"records FAILED: {len(errors)} error{'s' * (len(errors) != 1)}", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note} (within baseline)")
    if baseline is not None and (counts["stale"] < baseline["anchors_stale"]
                                 or counts["broken"] < baseline["anchors_broken"]):
        print(f"note: anchors fell below {BASELINE}; lower anchors_stale/anchors_broken to "
              f"{counts['stale']}/{counts['broken']}")
    owners = {r.owner for r in rows if r.owner != UNOWNED}
    print(f"records OK: {len(rows)} rows, {len(owners)} owners, {len(specs.owed)} owed, "
          f"anchors {counts['ok']}/{counts['stale']}/{counts['broken']} ok/stale/broken, "
          f"{base_word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
