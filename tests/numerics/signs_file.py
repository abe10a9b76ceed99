"""The checked-in sign patterns of the rotated formats (rht_signs.txt for int4_per_token_head,
octave_signs.txt for Octave): '#' comment lines, then '+' / '-' characters, read as float32 +-1."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def read_signs(path: Path) -> np.ndarray:
    rows = [ln.strip() for ln in path.read_text(encoding="ascii").splitlines()]
    text = "".join(r for r in rows if r and not r.startswith("#"))
    if set(text) - {"+", "-"}:
        raise ValueError(f"{path}: only '+' and '-' may follow the comments")
    return np.where(np.frombuffer(text.encode(), np.uint8) == ord("+"), np.float32(1), np.float32(-1)).astype(
        np.float32)
