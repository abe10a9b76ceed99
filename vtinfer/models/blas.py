"""Limit the BLAS thread pool NumPy uses for the decoder's matmuls.

OpenBLAS worker threads spin while they wait; on a small or shared machine
(2 cores here, other processes busy) a threaded OpenBLAS made this decoder's
matmuls about 6x slower than one thread (``prefill 200 tokens: 7.3 s with the
default pool, 1.2 s with one thread``). ``threadpoolctl`` is used when
installed; otherwise the OpenBLAS library NumPy loaded is found in
``/proc/self/maps`` and its ``*openblas_set_num_threads*`` is called.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator

__all__ = ["blas_threads"]

_SET = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
        "scipy_openblas_set_num_threads")
_GET = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
        "scipy_openblas_get_num_threads")


@functools.lru_cache(maxsize=1)
def _openblas_libs() -> tuple[ctypes.CDLL, ...]:
    import numpy  # noqa: F401  (loads the BLAS)

    paths = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if "openblas" in p.lower() and (p.endswith(".so") or ".so." in p):
                    if p not in paths:
                        paths.append(p)
    except OSError:
        return ()
    libs = []
    for p in paths:
        try:
            libs.append(ctypes.CDLL(p))
        except OSError:
            pass
    return tuple(libs)


def _fn(lib: ctypes.CDLL, names: tuple[str, ...]):
    for n in names:
        f = getattr(lib, n, None)
        if f is not None:
            return f
    return None


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Within the block, BLAS uses ``n`` threads (None: leave it alone)."""
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=int(n), user_api="blas"):
            yield
        return
    saved = []
    for lib in _openblas_libs():
        s, g = _fn(lib, _SET), _fn(lib, _GET)
        if s is None or g is None:
            continue
        saved.append((s, int(g())))
        s(ctypes.c_int(int(n)))
    try:
        yield
    finally:
        for s, old in saved:
            s(ctypes.c_int(old))
