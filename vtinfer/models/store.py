"""Where converted and generated checkpoints live, and small safetensors / JSON helpers.

The cache directory is ``$VTINFER_CACHE`` when set, else
``$XDG_CACHE_HOME/vtinfer``, else ``~/.cache/vtinfer``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["cache_dir", "atomic_dir", "save_safetensors", "load_safetensors", "write_json"]


def cache_dir() -> Path:
    """The directory vtinfer caches converted checkpoints in (not created here)."""
    env = os.environ.get("VTINFER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vtinfer"


class atomic_dir:
    """Build a directory under a temporary name and rename it into place on success.

    A failed or interrupted build leaves nothing at ``final``, so a later run
    never mistakes half a checkpoint for a whole one.
    """

    def __init__(self, final: str | os.PathLike) -> None:
        self.final = Path(final)

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        os.chmod(self.tmp, 0o755)
        if self.final.exists():
            shutil.rmtree(self.final)
        os.replace(self.tmp, self.final)


def save_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                     metadata: dict[str, str] | None = None) -> None:
    """Write NumPy arrays (float32/float16/bfloat16/int) as one safetensors file."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.fspath(path), metadata=metadata)


def load_safetensors(paths: list[str | os.PathLike] | tuple) -> dict[str, np.ndarray]:
    """Read every tensor of the given shards (memory-mapped where possible)."""
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for p in paths:
        out.update(load_file(os.fspath(p)))
    return out


def write_json(path: str | os.PathLike, obj: Any) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
