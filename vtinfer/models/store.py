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

__all__ = ["MARKER", "cache_dir", "atomic_dir", "provenance", "written_by_vtinfer", "save_safetensors", "load_safetensors", "write_json"]


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


def _sha256(path: Path) -> str:
    """A file's SHA-256, hex (the marker's record of each file; a converted GGUF's provenance)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _record(root: Path) -> dict[str, Any]:
    """The marker of a directory vtinfer just built: every entry, and each
    file's size and SHA-256 (the proof, later, that a file is still the one
    vtinfer wrote)."""
    import stat

    entries = _entries(root)
    files: dict[str, dict[str, Any]] = {}
    dirs = []
    for e in entries:
        st = os.lstat(root / e)
        if stat.S_ISDIR(st.st_mode):
            dirs.append(e)
        elif stat.S_ISREG(st.st_mode):
            files[e] = {"size": st.st_size, "sha256": _sha256(root / e)}
    return {"written_by": "vtinfer", "entries": sorted(entries), "files": files, "dirs": sorted(dirs)}


def _read_marker(d: Path) -> dict[str, Any] | None:
    import stat

    m = d / MARKER
    try:
        if not stat.S_ISREG(os.lstat(m).st_mode):
            return None
        rec = json.loads(m.read_bytes()[: 1 << 24].decode("utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("written_by") == "vtinfer" else None


def provenance(d: Path) -> tuple[list[str], list[str]] | None:
    """Which entries of ``d`` vtinfer provably wrote: (``ours`` deepest
    first, ``others`` as "<entry>: <why>"); None when ``d`` has no marker.

    An entry is vtinfer's only when the walk of ``d`` itself finds it (so a
    name in the marker never reaches outside ``d``: no ``..``, no absolute
    path, no symlink followed) and the marker records it: a regular file
    (not a symlink) whose size and SHA-256 still equal the recorded ones, or
    a real directory. The marker file is vtinfer's when the marker is."""
    import stat

    rec = _read_marker(d)
    if rec is None:
        return None
    files = rec.get("files") if isinstance(rec.get("files"), dict) else {}
    dirs = set(rec.get("dirs")) if isinstance(rec.get("dirs"), list) else set()
    ours: list[str] = []
    others: list[str] = []
    for e in _entries(d):
        q = d / e
        try:
            st = os.lstat(q)
        except OSError:
            continue  # gone meanwhile: nothing to remove
        if e == MARKER:
            ours.append(e)
        elif stat.S_ISLNK(st.st_mode):
            others.append(f"{e}: a symlink (vtinfer writes none)")
        elif stat.S_ISDIR(st.st_mode):
            (ours if e in dirs else others).append(e if e in dirs else f"{e}: a directory vtinfer did not make")
        elif not stat.S_ISREG(st.st_mode) or not isinstance(files.get(e), dict):
            others.append(f"{e}: not written by vtinfer" + ("" if "files" in rec else
                                                            " (the marker of an older vtinfer records no hashes)"))
        elif files[e].get("size") != st.st_size or files[e].get("sha256") != _sha256(q):
            others.append(f"{e}: changed since vtinfer wrote it")
        else:
            ours.append(e)
    return ours, others


def written_by_vtinfer(d: Path) -> list[str] | None:
    """The entries of ``d`` (deepest first) when vtinfer provably wrote every
    one of them (:func:`provenance`), so removing them removes nothing
    vtinfer did not write; None otherwise."""
    p = provenance(d)
    return p[0] if p is not None and not p[1] else None


class atomic_dir:
    """Build a directory under a temporary name and rename it into place on success.

    A failed or interrupted build leaves nothing at ``final`` and removes the
    temporary directory (and any parent directory this created), so a later
    run never mistakes half a checkpoint for a whole one. Never removes
    anything vtinfer did not write: an existing ``final`` must be
    absent or an empty directory, or, with ``overwrite=True``, a directory
    whose every entry the marker file (:data:`MARKER`, which every
    directory built here carries, with each file's size and SHA-256) proves
    vtinfer's (:func:`provenance`); anything else raises FileExistsError
    naming the entries that are not, and changes nothing.
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
        prov = provenance(f)
        if prov is None:
            raise FileExistsError(f"{self.what} must be a new or empty directory; '{f}' holds {len(have)} entries "
                                  f"that vtinfer did not write (nothing was changed)")
        ours, others = prov
        if others:
            shown = "; ".join(others[:5]) + (f"; and {len(others) - 5} more" if len(others) > 5 else "")
            raise FileExistsError(f"{self.what} must be a new or empty directory, or a previous vtinfer output "
                                  f"holding only what vtinfer wrote; '{f}' holds {len(others)} entries vtinfer did "
                                  f"not write or that changed ({shown}): they were left in place and nothing was "
                                  f"removed")
        if not self.overwrite:
            raise FileExistsError(f"{self.what} must be a new or empty directory; '{f}' is a previous vtinfer "
                                  f"output: pass --overwrite (overwrite=True) to replace it")
        return ours

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
                write_json(self.tmp / MARKER, _record(self.tmp))
                os.chmod(self.tmp, 0o755)
                old = self.check()  # again: the directory may have changed while we built
                for e in old:  # deepest first; only what provenance() proved vtinfer's (no symlink among them)
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
