"""A tqdm progress bar shown only in a terminal or a notebook (and only when tqdm is installed)."""

from __future__ import annotations

import sys
from typing import Any, Iterable


def _interactive() -> bool:
    if "ipykernel" in sys.modules:
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def bar(it: Iterable[Any], *, desc: str = "", total: int | None = None, enabled: bool | None = None) -> Iterable[Any]:
    """``tqdm(it)`` when ``enabled`` (default: interactive), else ``it`` unchanged."""
    if enabled is None:
        enabled = _interactive()
    if not enabled:
        return it
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return it
    return tqdm(it, desc=desc, total=total, leave=False)
