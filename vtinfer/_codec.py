"""fp8 / bf16 / f16 codecs: thin wrappers that document the C functions."""

from __future__ import annotations

from typing import Any

import numpy as np

from vtinfer import _C, _framework


@_framework.follows("x", fp8_fmt="fmt")
def fp8_quantize(
    x: Any,
    scale: float = 1.0,
    fmt: str = "e4m3",
    *,
    out: np.ndarray | None = None,
    num_threads: int | None = None,
) -> np.ndarray:
    """Quantize to fp8 codes with vLLM's CUDA store semantics.

    ``code = encode(x / scale)``: a true float32 division, round to nearest
    even, saturating (``|x/scale|`` beyond the largest finite value, and
    infinities, become +-448 for e4m3fn, +-57344 for e5m2), ``-0.0`` keeps its
    sign, subnormals are exact. A NaN becomes the canonical NaN code ``0x7F``
    (CUDA's conversion canonicalises NaN inputs, dropping their sign).

    Parameters
    ----------
    x : array_like, shape (...)
        float32, float16 or ml_dtypes.bfloat16 values (a NumPy array or any
        object with ``__dlpack__``, e.g. a CPU torch tensor). A
        non-contiguous NumPy array is copied to a contiguous one first; a
        non-contiguous DLPack input is refused. Other dtypes (float64,
        integers, objects) raise TypeError: convert explicitly.
    scale : float
        Positive finite scale, rounded to float32 (vLLM keeps scales as
        float32 tensors).
    fmt : {"e4m3", "e5m2"}
        Also accepted: ``"fp8"``, ``"fp8_e4m3"``, ``"float8_e4m3fn"``,
        ``"fp8_e5m2"``, ``"float8_e5m2"``, or the ml_dtypes dtypes.
    out : ndarray, shape (...), optional
        C-contiguous writable uint8 (or the matching ml_dtypes float8) array
        of x's shape to write into.
    num_threads : int, optional
        Threads to use; default ``VTINFER_NUM_THREADS`` or the CPU affinity.

    Returns
    -------
    ndarray of uint8, shape (...)
        The codes (``.view(ml_dtypes.float8_e4m3fn)`` reads them as values).
    """
    return _C.fp8_quantize(x, scale, fmt, out=out, num_threads=num_threads)


@_framework.follows("codes", dtype="dtype")
def fp8_dequantize(
    codes: Any,
    scale: float = 1.0,
    fmt: str | None = None,
    dtype: Any = np.float32,
    *,
    out: np.ndarray | None = None,
    num_threads: int | None = None,
) -> np.ndarray:
    """Decode fp8 codes: ``decode(code) * scale`` in float32, then ``dtype``.

    Decoding is exact for all 256 codes; the product with ``scale`` is one
    float32 multiplication, rounded to nearest even into ``dtype``.

    Parameters
    ----------
    codes : array_like of uint8 or ml_dtypes float8, shape (...)
        The codes (a non-contiguous NumPy array is copied first).
    scale : float
        Positive finite scale (float32).
    fmt : {"e4m3", "e5m2"}, optional
        Default: the format of an ml_dtypes float8 array, else ``"e4m3"``.
        A format that contradicts the array's dtype raises TypeError.
    dtype : {np.float32, np.float16, ml_dtypes.bfloat16}
        Output dtype.
    out : ndarray, shape (...), optional
        C-contiguous writable array of ``dtype`` to write into.
    num_threads : int, optional
        Threads to use.

    Returns
    -------
    ndarray of dtype, shape (...)
    """
    return _C.fp8_dequantize(codes, scale, fmt, dtype, out=out, num_threads=num_threads)


@_framework.follows("x", dtype="dtype")
def convert(x: Any, dtype: Any, *, out: np.ndarray | None = None, num_threads: int | None = None) -> np.ndarray:
    """Convert between float32, float16 and bfloat16, rounding to nearest even.

    Parameters
    ----------
    x : array_like, shape (...)
        float32, float16 or ml_dtypes.bfloat16 values.
    dtype : {np.float32, np.float16, ml_dtypes.bfloat16}
        Target dtype.

    Returns
    -------
    ndarray of dtype, shape (...)
    """
    return _C.convert(x, dtype, out=out, num_threads=num_threads)
