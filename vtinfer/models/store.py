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

__all__ = ["MARKER", "cache_dir", "atomic_dir", "written_by_vtinfer", "save_safetensors", "load_safetensors", "write_json"]


def cache_dir() -> Path:
    """The directory vtinfer caches converted checkpoints in (not created here)."""
    env = os.environ.get("VTINFER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vtinfer"


MARKER = ".vtinfer-written.json"


def _entries(root: Path) -> list[str]:
    """Every path under ``root`` (relative, POSIX), symlinks not followed, deepest first."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, topdown=False, followlinks=False):
        rel = Path(dirpath).relative_to(root)
        out += [(rel / n).as_posix() for n in filenames]
        out += [(rel / n).as_posix() for n in dirnames]
    return out


def written_by_vtinfer(d: Path) -> list[str] | None:
    """The entries vtinfer recorded in ``d``'s marker when every entry of ``d``
    is one of them (so removing them removes nothing vtinfer did not write);
    None otherwise."""
    import stat

    m = d / MARKER
    try:
        if not stat.S_ISREG(os.lstat(m).st_mode):
            return None
        rec = json.loads(m.read_bytes()[: 1 << 24].decode("utf-8"))
    except (OSError, ValueError):
        return None
    listed = rec.get("entries") if isinstance(rec, dict) and rec.get("written_by") == "vtinfer" else None
    if not isinstance(listed, list) or not all(isinstance(e, str) for e in listed):
        return None
    have = _entries(d)
    if not set(have) <= set(listed) | {MARKER}:
        return None
    return have


class atomic_dir:
    """Build a directory under a temporary name and rename it into place on success.

    A failed or interrupted build leaves nothing at ``final`` and removes the
    temporary directory (and any parent directory this created), so a later
    run never mistakes half a checkpoint for a whole one. Never removes
    anything vtinfer did not write (issue #15): an existing ``final`` must be
    absent or an empty directory, or, with ``overwrite=True``, a directory
    whose every entry is listed in the marker file (:data:`MARKER`) that
    every directory built here carries; anything else raises
    FileExistsError and changes nothing.
    """

    def __init__(self, final: str | os.PathLike, overwrite: bool = False, what: str = "out") -> None:
        self.final = Path(final)
        self.overwrite = overwrite
        self.what = what

    def check(self) -> list[str]:
        """What replacing ``final`` would remove (raises FileExistsError if not allowed)."""
        f = self.final
        if os.path.islink(f):
            raise FileExistsError(f"{self.what} must not be a symlink; got '{f}' -> '{os.readlink(f)}'")
        if not os.path.lexists(f):
            return []
        if not f.is_dir():
            raise FileExistsError(f"{self.what} must be a new or empty directory; got an existing file '{f}'")
        have = _entries(f)
        if not have:
            return []
        listed = written_by_vtinfer(f)
        if listed is None:
            raise FileExistsError(f"{self.what} must be a new or empty directory; '{f}' holds {len(have)} entries "
                                  f"that vtinfer did not write (nothing was changed)")
        if not self.overwrite:
            raise FileExistsError(f"{self.what} must be a new or empty directory; '{f}' is a previous vtinfer "
                                  f"output: pass --overwrite (overwrite=True) to replace it")
        return listed

    def __enter__(self) -> Path:
        self.check()
        self.made: list[Path] = []
        for parent in reversed(self.final.parents):
            if not os.path.lexists(parent):
                parent.mkdir()
                self.made.append(parent)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.final.name}.", dir=self.final.parent))
        return self.tmp

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                write_json(self.tmp / MARKER, {"written_by": "vtinfer", "entries": sorted(_entries(self.tmp))})
                os.chmod(self.tmp, 0o755)
                old = self.check()  # again: the directory may have changed while we built
                for e in old:  # deepest first; only what the marker lists
                    q = self.final / e
                    (q.rmdir if q.is_dir() and not q.is_symlink() else q.unlink)()
                os.replace(self.tmp, self.final)  # onto nothing or an empty directory
                return
            except BaseException:
                self._clean()
                raise
        self._clean()

    def _clean(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        for parent in reversed(self.made):
            try:
                parent.rmdir()
            except OSError:
                pass


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
