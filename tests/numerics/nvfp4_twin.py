"""A NumPy twin of vLLM 0.33's NVFP4 group encoding, written from its SM100 store kernel
(csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu and quantization/fp4/nvfp4_utils.cuh: the
candidate scale, the E2M1 conversion's round-to-nearest-even boundaries, the 4over6 error), with
exact reciprocals in place of the kernel's rcp.approx. Vectorised over groups; float32 throughout."""

from __future__ import annotations

import ml_dtypes
import numpy as np

F = np.float32
MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], F)


def fp4_index(v: np.ndarray) -> np.ndarray:
    """E2M1 code (sign in bit 3) of float32 v; NaN -> 7."""
    a = np.abs(v)
    # upper bounds of each magnitude's interval; '<=' where the tie rounds down to an even mantissa
    edges = [(0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True)]
    idx = np.full(v.shape, 7, np.uint8)
    for k, (e, inclusive) in reversed(list(enumerate(edges))):
        idx = np.where((a <= e) if inclusive else (a < e), np.uint8(k), idx)
    idx = np.where(np.signbit(v), idx | 8, idx).astype(np.uint8)
    return np.where(np.isnan(v), np.uint8(7), idx)


def fp4_value(code: np.ndarray) -> np.ndarray:
    m = MAGNITUDES[code & 7]
    return np.where(code & 8, -m, m).astype(F)


def e4m3(v: np.ndarray) -> np.ndarray:
    """float32 -> e4m3fn bytes, round to nearest even, saturating at 448."""
    return np.clip(v, F(-448), F(448)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _candidate(gs, amax, rden):
    b = e4m3(gs * (amax * rden))
    sf = b.view(ml_dtypes.float8_e4m3fn).astype(F)
    with np.errstate(divide="ignore"):
        mul = np.where(sf != 0, F(1) / (sf * (F(1) / gs)), F(0)).astype(F)
    return b, mul


def _error(x, mul):
    with np.errstate(divide="ignore", invalid="ignore"):
        dq = np.where(mul != 0, F(1) / mul, F(0)).astype(F)
    q = fp4_value(fp4_index(x * mul[:, None]))
    d = (q * dq[:, None] - x).astype(F)
    zero = (x * x).astype(F)
    e = np.zeros(x.shape[0], F)
    for i in range(0, 16, 2):
        with_q = (d[:, i] * d[:, i] + d[:, i + 1] * d[:, i + 1]).astype(F)
        plain = (zero[:, i] + zero[:, i + 1]).astype(F)
        e = (e + np.where(mul == 0, plain, with_q)).astype(F)
    return e


def quantize(x: np.ndarray, scale: float, four_over_six: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """x [..., n] (n % 16 == 0, any float dtype widened to float32) -> (codes [..., n / 2], scales [..., n / 16])."""
    shape = x.shape
    g = np.asarray(x, F).reshape(-1, 16)
    gs = F(1) / F(scale)
    a = np.abs(g)
    amax = np.where(np.isnan(a), F(0), a).max(axis=1).astype(F)
    b, mul = _candidate(gs, amax, F(1) / F(6))
    if four_over_six:
        b4, m4 = _candidate(gs, amax, F(0.25))
        use4 = _error(g, m4) < _error(g, mul)
        b, mul = np.where(use4, b4, b), np.where(use4, m4, mul)
    c = fp4_index(g * mul[:, None])
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)
    return packed.reshape(*shape[:-1], shape[-1] // 2), b.reshape(*shape[:-1], shape[-1] // 16)


def dequantize(codes: np.ndarray, scales: np.ndarray, scale: float) -> np.ndarray:
    c = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1, 16)
    sf = scales.view(ml_dtypes.float8_e4m3fn).astype(F)[..., None]
    v = (fp4_value(c) * sf).astype(F) * F(scale)
    return v.reshape(*codes.shape[:-1], codes.shape[-1] * 2).astype(F)
