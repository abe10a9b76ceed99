"""Outputs in the caller's framework: torch tensors in, torch tensors out.

The C core allocates NumPy arrays. When a function's primary array input is
a torch tensor, :func:`follows` hands its outputs back as torch tensors
instead: the same memory (zero-copy through DLPack, the NumPy array is kept
alive by the tensor), on the CPU, with the dtype vLLM's op would give
(``torch.bfloat16`` for bfloat16, ``torch.float8_e4m3fn`` /
``torch.float8_e5m2`` for fp8 codes, where NumPy holds ``uint8``).

Nothing here imports torch: a tensor can only be a torch tensor when the
caller has imported torch already, so ``sys.modules`` is asked, never the
import system. NumPy callers pay one dictionary lookup per call.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, TypeVar

import ml_dtypes
import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

# NumPy dtypes torch's DLPack import takes as they are; bfloat16 and fp8 go
# through a same-width integer view (NumPy cannot export ml_dtypes dtypes).
_VIEWED = {
    np.dtype(ml_dtypes.bfloat16): (np.uint16, "bfloat16"),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, "float8_e4m3fn"),
    np.dtype(ml_dtypes.float8_e5m2): (np.uint8, "float8_e5m2"),
}


def torch_of(x: Any) -> Any:
    """The torch module when ``x`` is a torch tensor, else None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, getattr(torch, "Tensor", ())):
        return None
    return torch


def to_torch(a: Any, torch: Any, fp8: str | None = None) -> Any:
    """A NumPy array as a torch tensor on the same memory.

    ``fp8`` (``"e4m3"`` / ``"e5m2"``) reads a uint8 array as torch float8
    codes. Anything that is not a NumPy array is returned unchanged.
    """
    if not isinstance(a, np.ndarray):
        return a
    torch_name = None
    if a.dtype in _VIEWED:
        view, torch_name = _VIEWED[a.dtype]
        a = a.view(view)
    elif fp8 is not None and a.dtype == np.uint8:
        torch_name = "float8_e5m2" if fp8 == "e5m2" else "float8_e4m3fn"
    t = torch.from_dlpack(a)
    return t.view(getattr(torch, torch_name)) if torch_name else t


def numpy_dtype(dtype: Any, torch: Any) -> Any:
    """A torch float dtype as the NumPy dtype the C core takes; others unchanged."""
    names = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}
    return names.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype


def fp8_name(fmt: Any) -> str:
    """``"e5m2"`` when a format spelling (string or dtype) names e5m2, else ``"e4m3"``."""
    return "e5m2" if "e5m2" in str(fmt).lower() else "e4m3"


def follows(primary: str, *, fp8_fmt: str | None = None, dtype: str | None = None) -> Callable[[F], F]:
    """Decorate a wrapper so its outputs follow ``primary``'s framework.

    When the argument named ``primary`` is a torch tensor: a torch dtype
    given as the argument named ``dtype`` is passed on as its NumPy
    equivalent; every NumPy array in the result (or in a result tuple)
    becomes a torch tensor on the same memory, uint8 codes as the float8
    dtype named by the argument ``fp8_fmt``; a caller's ``out`` is
    returned as itself. Otherwise the wrapper runs untouched.
    """

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        names = list(sig.parameters)
        pos = names.index(primary)
        dpos = names.index(dtype) if dtype else -1

        def reader(name: str | None) -> Callable[[tuple, dict], Any]:
            """The argument ``name`` of one call (its default when not passed), without binding the
            whole signature (inspect's bind cost more than the C call of a decode step)."""
            if name is None or name not in sig.parameters:
                return lambda args, kwargs: None
            p = sig.parameters[name]
            i = names.index(name) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
            default = None if p.default is p.empty else p.default
            if i is None:
                return lambda args, kwargs: kwargs.get(name, default)
            return lambda args, kwargs: args[i] if len(args) > i else kwargs.get(name, default)

        read_fmt, read_out = reader(fp8_fmt), reader("out")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            x = args[pos] if len(args) > pos else kwargs.get(primary)
            if type(x) is np.ndarray:  # the common case, without a module lookup
                return fn(*args, **kwargs)
            torch = torch_of(x)
            if torch is None:
                return fn(*args, **kwargs)
            if dtype is not None:
                if len(args) > dpos:
                    args = (*args[:dpos], numpy_dtype(args[dpos], torch), *args[dpos + 1:])
                elif dtype in kwargs:
                    kwargs[dtype] = numpy_dtype(kwargs[dtype], torch)
            result = fn(*args, **kwargs)
            fmt = fp8_name(read_fmt(args, kwargs)) if fp8_fmt is not None else None
            out = read_out(args, kwargs)
            if isinstance(result, tuple):
                first = out if out is not None else to_torch(result[0], torch, fmt)
                return (first, *(to_torch(r, torch, fmt) for r in result[1:]))
            return out if out is not None else to_torch(result, torch, fmt)

        return wrapper  # type: ignore[return-value]

    return decorate
