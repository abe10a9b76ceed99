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


@_framework.follows("x")
def nvfp4_quantize(x: Any, scale: float = 1.0, *, four_over_six: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 codes and block scales of ``x``, as vLLM 0.33's ``nvfp4`` KV store writes them.

    Groups of 16 consecutive elements along the last axis share one e4m3
    block scale ``sf = e4m3(a / 6 / scale)`` (``a`` the group's largest
    ``|x|``, NaN left out); each element becomes the FP4 E2M1 code (values
    0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, round to nearest even,
    saturating) of ``x * 1 / (sf * scale)``, two codes per byte, element
    ``2j`` in the low nibble. ``scale`` is the checkpoint's ``k_scale`` /
    ``v_scale`` (vLLM's global scale is its reciprocal). With
    ``four_over_six`` (``nvfp4_4over6``) each group also tries ``a / 4`` and
    keeps it when its squared reconstruction error is strictly smaller.
    Every step is one float32 rounding; vLLM's CUDA kernel uses approximate
    reciprocals (``rcp.approx``) where this uses divisions, so a value within
    an ulp of a rounding boundary can get the neighbouring code there.

    Parameters
    ----------
    x : array_like, shape (..., n)
        float32, float16 or bfloat16; ``n`` a multiple of 16.
    scale : float
        Positive finite (rounded to float32).
    four_over_six : bool
        The ``nvfp4_4over6`` scale choice.

    Returns
    -------
    codes : ndarray of uint8, shape (..., n // 2)
    block_scales : ndarray of uint8, shape (..., n // 16)
        e4m3fn bytes (``.view(ml_dtypes.float8_e4m3fn)`` reads them).
    """
    return _C.nvfp4_quantize(x, scale, four_over_six=four_over_six)


@_framework.follows("codes")
def nvfp4_dequantize(codes: Any, block_scales: Any, scale: float = 1.0) -> np.ndarray:
    """Decode NVFP4: ``E2M1 value * e4m3 block scale * scale`` in float32.

    Parameters
    ----------
    codes : array_like of uint8, shape (..., n // 2)
        Two codes per byte (element ``2j`` in the low nibble); ``n`` a multiple of 16.
    block_scales : array_like of uint8 or float8_e4m3fn, shape (..., n // 16)
    scale : float
        The scale the codes were made with (positive finite).

    Returns
    -------
    ndarray of float32, shape (..., n)
    """
    return _C.nvfp4_dequantize(codes, block_scales, scale)
