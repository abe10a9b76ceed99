"""Independent NumPy twin of vLLM 0.33's int4_per_token_head store and read.

Written from the rules recorded in .agents/specs/kv-formats.md
(vllm/v1/attention/ops/int4_per_token_head.py), not from vtinfer's C code:

- rotation (``single_rht``): b = largest power-of-two divisor of D; each
  block of b elements becomes ``H_b (s * x)``, H_b the unnormalized
  Walsh-Hadamard butterfly in float32 (stages h = 1, 2, 4, ...: a + b, a - b),
  s the first b of torch's ``2 * bernoulli(0.5) - 1`` from a CPU generator
  seeded 0x9E3779B9 (torch's draws, checked in as tests/numerics/rht_signs.txt
  so that the twin runs without torch; test_int4_signs.py draws them from
  torch again and compares); the rotated
  float32 row is rounded to the source dtype;
- per (token, head): scale = max((max - min) / 15, 1e-6); zp = rhaz(-min /
  scale) clamped to [0, 15]; code = rhaz(x * (1 / scale) + zp) clamped, with
  rhaz(t) = int32(t >= 0 ? t + 0.5 : t - 0.5) (truncation, saturating, NaN
  -> 0); byte i = code[2i] | code[2i + 1] << 4; the stored scale's bits =
  (bits(scale) & ~0xF) | zp;
- read: value = (code - zp) * float(bits & ~0xF); queries rotated the same
  way, softmax_scale / b, the output rotated back (H x, then * s) and / b.
"""

from __future__ import annotations

import functools
from pathlib import Path

import ml_dtypes
import numpy as np

from tests.numerics.signs_file import read_signs

F = np.float32


SIGNS_FILE = Path(__file__).with_name("rht_signs.txt")


@functools.cache
def _all_signs() -> np.ndarray:
    return read_signs(SIGNS_FILE)


def signs(b: int) -> np.ndarray:
    """vLLM's _get_rht_signs(b, 0) as float32 +-1: the first b of torch's CPU
    draws, read from the checked-in rht_signs.txt."""
    s = _all_signs()
    if not 1 <= b <= s.size:
        raise ValueError(f"signs: b must be in [1, {s.size}]; got {b}")
    return s[:b].copy()


def block(d: int) -> int:
    return d & -d


def _butterfly(x: np.ndarray) -> np.ndarray:
    d = x.shape[-1]
    h = 1
    while h < d:
        v = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, c = v[..., 0, :], v[..., 1, :]
        x = np.stack([(a + c).astype(F), (a - c).astype(F)], axis=-2).reshape(x.shape)
        h *= 2
    return x


def rht(x: np.ndarray, inverse: bool = False) -> np.ndarray:
    """single_rht over the last dimension, float32 throughout (inverse: no 1 / b)."""
    x = np.asarray(x, F)
    d = x.shape[-1]
    b = block(d)
    xb = x.reshape(*x.shape[:-1], d // b, b)
    s = signs(b)
    y = _butterfly(xb) * s if inverse else _butterfly(xb * s)
    return y.astype(F).reshape(x.shape)


def _rhaz(t: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        r = np.where(t >= 0, t + F(0.5), t - F(0.5)).astype(F)
        r = np.where(np.isnan(r), F(0), np.trunc(np.clip(r, -2.0**31, 2.0**31 - 128)))
    return np.clip(r, 0, 15).astype(F)


def quantize_rotated(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rotated rows y [..., D] float32 -> (packed codes [..., D/2] uint8, stored scales [...] float32)."""
    y = np.asarray(y, F)
    with np.errstate(all="ignore"):
        mn = np.fmin.reduce(y, axis=-1, initial=F(np.inf))
        mx = np.fmax.reduce(y, axis=-1, initial=F(-np.inf))
        scale = np.fmax(((mx - mn) / F(15.0)).astype(F), F(1e-6)).astype(F)
        zp = _rhaz((-mn / scale).astype(F))
        inv = (F(1.0) / scale).astype(F)
        s = ((y * inv[..., None]).astype(F) + zp[..., None]).astype(F)
    codes = _rhaz(s).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    bits = (scale.view(np.uint32) & np.uint32(0xFFFFFFF0)) | zp.astype(np.uint32)
    return packed, bits.view(F)


def round_to(x: np.ndarray, src: str) -> np.ndarray:
    if src == "float32":
        return np.asarray(x, F)
    dt = ml_dtypes.bfloat16 if src == "bfloat16" else np.float16
    with np.errstate(over="ignore"):  # a rotated row past float16's range becomes inf, as torch's .to() does
        return np.asarray(x, F).astype(dt).astype(F)


def quantize(x: np.ndarray, src: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """Rows as given to the store (already of dtype `src`): rotate, round to `src`, quantize."""
    return quantize_rotated(round_to(rht(np.asarray(x).astype(F)), src))


def dequantize(packed: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """(code - zp) * scale in the rotated space, float32 [..., D]."""
    bits = np.asarray(stored, F).view(np.uint32)
    zp = (bits & np.uint32(0xF)).astype(F)
    scale = (bits & np.uint32(0xFFFFFFF0)).view(F)
    codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), F)
    codes[..., 0::2] = packed & 0xF
    codes[..., 1::2] = packed >> 4
    with np.errstate(all="ignore"):
        return ((codes - zp[..., None]).astype(F) * scale[..., None]).astype(F)


def page_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_size: int) -> int:
    """vLLM's page: content (D/2 + D/2) * 1 + 2 * 4 per (head, slot) (triton_attn.py:308-319)."""
    return num_layers * num_kv_heads * block_size * (head_size // 2 + head_size // 2 + 8)
