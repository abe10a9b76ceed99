"""Reading a model directory without trusting it.

Every file vtinfer reads from a checkpoint goes through here:

* only **regular files** are opened (a FIFO, socket or device named
  ``model.safetensors`` or listed in the index would block ``open`` or
  ``read`` forever); the type is checked before opening and again on the
  open descriptor (opened with ``O_NONBLOCK``, so even a FIFO swapped in
  between the two checks cannot block);
* a name taken from an index (``weight_map`` values) must be a relative
  path without ``..``, NUL or a drive, and the file it reaches, symlinks
  followed, must lie inside the model directory. One exception, because it
  is how the Hugging Face hub cache lays out every downloaded model: a
  directory ``.../snapshots/<rev>`` may hold symlinks into the sibling
  ``.../blobs`` directory;
* JSON documents are read up to :data:`MAX_JSON_BYTES`.

Errors are :class:`vtinfer.ConfigError` (a ``ValueError``) naming the file
and what was expected, or ``FileNotFoundError`` for a file that is not there.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

__all__ = ["MAX_JSON_BYTES", "display", "file_kind", "index_member", "check_inside", "open_regular", "read_regular"]

MAX_JSON_BYTES = 64 << 20  # config.json / index / hf_quant_config.json; real ones are < 10 MB


def _config_error(msg: str) -> Exception:
    from vtinfer._C import ConfigError

    return ConfigError(msg)


def display(path: str | os.PathLike) -> str:
    """``path`` as UTF-8-encodable text for a message (a path that is not valid
    UTF-8 shows its odd bytes as ``\\xff``; the C reader's names must encode)."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a socket``, ``a directory``, ... for a message."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symlink"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _allowed_roots(root: Path) -> tuple[Path, ...]:
    r = root.resolve()
    roots = [r]
    if r.parent.name == "snapshots":  # the Hugging Face hub cache: snapshots/<rev>/x -> ../../blobs/<sha>
        roots.append(r.parent.parent / "blobs")
    return tuple(roots)


def check_inside(path: Path, root: Path, what: str) -> Path:
    """``path`` itself when it resolves (symlinks followed) inside ``root``
    (or the hub cache's ``blobs``); ConfigError naming ``what`` otherwise."""
    target = Path(path).resolve()
    for r in _allowed_roots(root):
        if target == r or r in target.parents:
            return Path(path)
    raise _config_error(f"{what} must resolve inside the model directory {root}; got {path} -> {target}")


def index_member(root: Path, name: object, what: str) -> Path:
    """The path a name from an index (``weight_map`` value) denotes, inside ``root``.

    Raises ConfigError for a non-string, empty, absolute, ``..``-containing
    or NUL-containing name, or one whose file resolves outside ``root``."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise _config_error(f"{what} must be a relative file name inside the model directory; got {name!r}")
    pp = PurePosixPath(name)
    if pp.is_absolute() or ".." in pp.parts or (len(name) > 1 and name[1] == ":"):
        raise _config_error(f"{what} must be a relative path without '..' inside the model directory; got {name!r}")
    p = root / Path(*pp.parts)
    if os.path.lexists(p):
        check_inside(p, root, what)
    return p


def open_regular(path: str | os.PathLike, what: str | None = None) -> BinaryIO:
    """Open ``path`` for binary reading only if it is a regular file (symlinks followed).

    Raises FileNotFoundError when it is missing and ConfigError when it is
    a FIFO, socket, device or directory; never blocks on one."""
    p = os.fspath(path)
    label = what or str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{label} must exist; got no file at {path}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _config_error(f"{label} must be a regular file; got {file_kind(st.st_mode)} at {path}")
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _config_error(f"{label} must be a regular file; got {file_kind(st.st_mode)} at {path}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (ConfigError beyond)."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise _config_error(f"{what or path} must be at most {limit} bytes; got {size}")
        # read what fstat says is there (not limit + 1 bytes: read(n) allocates n bytes up front),
        # then what a file that grew since holds, up to one byte past the limit
        data = f.read(min(size, limit) + 1)
        if len(data) > size:
            data += f.read(limit + 1 - len(data))
    if len(data) > limit:
        raise _config_error(f"{what or path} must be at most {limit} bytes; got more")
    return data
