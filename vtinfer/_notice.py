"""One-line notices for long steps (downloads, conversions) that must be seen while they run."""

from __future__ import annotations

import sys


def notice(msg: str, *, tty: str = "/dev/tty") -> None:
    """``vtinfer: msg`` on stderr, and on the controlling terminal when stderr
    is not one: pytest and pip capture stderr, and a 321 MB download must not
    start unannounced. Without a terminal (CI, a log file) stderr is all."""
    line = f"vtinfer: {msg}"
    err = sys.stderr
    print(line, file=err, flush=True)
    try:
        if err.isatty():
            return
    except (AttributeError, ValueError):
        pass
    try:
        with open(tty, "w", encoding="utf-8", errors="replace") as t:
            t.write(line + "\n")
    except OSError:
        pass
