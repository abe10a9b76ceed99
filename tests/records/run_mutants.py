#!/usr/bin/env python3
"""run_mutants.py [--in-place] [NAME ...]

Red-first evidence for .agents/check_records.py (spec .agents/specs/records.md).
Each mutant replaces exactly one line of the checker; the records tests then
run against it (RECORDS_CHECKER points them at the mutant) and every mutant
must turn at least one test red.  The two named pair mutants must red
disjoint sets of tests.

By default a mutated copy is written to a temporary folder and the real file
is never touched.  --in-place mutates the real file and restores it after
each run, printing its sha256 before and after.  Not collected by pytest
(no test_ prefix); the hardening runner may import MUTANTS.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHECKER = REPO / ".agents" / "check_records.py"

# name -> (line as it stands, replacement); indentation is kept.
MUTANTS: dict[str, tuple[str, str]] = {
    "pair-key-number-only": ("key = (row.issue, row.owner)", "key = row.issue"),
    "every-pair-new": ("if key in seen:", "if False:"),
    "drop-index-errors": ("errors.extend(index_errors)", "pass"),
    "drop-spec-errors": ("errors.extend(spec_errors)", "pass"),
    "drop-baseline-errors": ("errors.extend(baseline_errors)", "pass"),
    "drop-unique-pairs": ("errors.extend(check_unique_pairs(rows))", "pass"),
    "drop-owners-declared": ("errors.extend(check_owners_declared(rows, specs))", "pass"),
    "drop-owed-indexed": ("errors.extend(check_owed_indexed(rows, specs))", "pass"),
    "drop-ordering": ("errors.extend(check_ordering(rows, specs))", "pass"),
    "drop-ratchet": ("errors.extend(check_ratchet(rows, specs, baseline))", "pass"),
    "drop-anchor-baseline": ("errors.extend(check_anchor_baseline(counts, notes, baseline))",
                             "pass"),
    "drop-base-check": ("base_errors, base_word = check_base(root, args.base, index_lines, "
                        "baseline)", "pass"),
    "drop-append-only": ("errors.extend(check_append_only(old.splitlines() if old is not None "
                         "else [], new_index, rev))", "pass"),
    "drop-baseline-not-raised": ("errors.extend(check_baseline_not_raised(git_show(root, rev, "
                                 "BASELINE)[0], baseline, rev))", "pass"),
}
DISJOINT = ("pair-key-number-only", "every-pair-new")


def mutate(text: str, old: str, new: str) -> str:
    hits = [m for m in re.finditer(r"^([ \t]*)" + re.escape(old) + r"[ \t]*$", text, re.M)]
    if len(hits) != 1:
        raise SystemExit(f"mutant line found {len(hits)} times, want 1: {old!r}")
    m = hits[0]
    return text[:m.start()] + m.group(1) + new + text[m.end():]


def red_tests(checker: Path) -> set[str]:
    env = {**os.environ, "RECORDS_CHECKER": str(checker)}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                          str(HERE)], capture_output=True, text=True, env=env, cwd=REPO)
    return set(re.findall(r"^FAILED (\S+)", res.stdout, re.M))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    in_place = "--in-place" in argv
    names = [a for a in argv if a != "--in-place"] or list(MUTANTS)
    original = CHECKER.read_text(encoding="utf-8")
    before = sha256(CHECKER)
    print(f"checker sha256 before: {before}")
    baseline_red = red_tests(CHECKER)
    if baseline_red:
        print(f"unmutated checker already red: {sorted(baseline_red)}")
        return 1
    reds: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            text = mutate(original, *MUTANTS[name])
            target = CHECKER if in_place else Path(tmp) / "check_records.py"
            try:
                target.write_text(text, encoding="utf-8")
                reds[name] = red_tests(target)
            finally:
                if in_place:
                    CHECKER.write_text(original, encoding="utf-8")
            short = sorted(t.split("::", 1)[1] if "::" in t else t for t in reds[name])
            print(f"| {name} | {len(short)} | {', '.join(short) or 'NONE (survived)'} |")
    after = sha256(CHECKER)
    print(f"checker sha256 after:  {after} ({'restored' if after == before else 'CHANGED'})")
    status = 0 if after == before else 1
    survived = [n for n, r in reds.items() if not r]
    if survived:
        print(f"survivors: {survived}")
        status = 1
    if all(n in reds for n in DISJOINT):
        common = reds[DISJOINT[0]] & reds[DISJOINT[1]]
        print(f"{DISJOINT[0]} vs {DISJOINT[1]}: "
              f"{'disjoint' if not common else 'OVERLAP ' + str(sorted(common))}")
        status |= bool(common)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
