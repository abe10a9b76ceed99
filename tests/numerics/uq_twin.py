"""An independent NumPy twin of vLLM 0.33's UltraQuant store and read (ultraquant_4bit), written from
the wheel's format.py and triton_store.py (read, not imported): the key's float32 Walsh-Hadamard
butterflies, per group of 32 a UE8M0 power-of-two scale 2^floor(log2(0.156 absmax) + 0.5), FP4 E2M1 codes
by strict comparison with the 14 midpoints, two codes per byte. A group whose absmax is 0 or not finite, or
whose 0.156 * absmax underflows to 0 (float32 input), stores scale byte 0 and +0 codes (format.py's zero
sentinel; reference.py's rule for non-finite scales)."""

from __future__ import annotations

import numpy as np

GROUP = 32
LEVELS = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
MIDS = ((LEVELS[:-1] + LEVELS[1:]) / 2).astype(np.float32)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def slot_bytes(d: int) -> int:
    return d + 2 * (d // GROUP)


def rotate(x: np.ndarray) -> np.ndarray:
    """The store kernel's rotation of rows [..., D] (D a power of two), float32 stage by stage."""
    y = np.asarray(x, np.float32).copy()
    d = y.shape[-1]
    idx = np.arange(d)
    c = np.float32(0.7071067811865476)
    b = 1
    while b < d:
        sign = np.where(idx & b, np.float32(-1), np.float32(1))
        y = ((sign * y + y[..., idx ^ b]) * c).astype(np.float32)
        b *= 2
    return y


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows [..., D] float32 -> (codes [..., D / 2] uint8, scale bytes [..., D / 32] uint8)."""
    x = np.asarray(x, np.float32)
    g = x.reshape(*x.shape[:-1], -1, GROUP)
    with np.errstate(all="ignore"):
        a = np.abs(g).max(axis=-1)
        bad = (a * np.float32(0.156) == 0) | ~np.isfinite(a)
        e = np.floor(np.log2(np.where(bad, np.float32(1), a) * np.float32(0.156)) + np.float32(0.5))
        s = np.exp2(e).astype(np.float32)
        v = g / s[..., None]
    n = (v[..., None] > MIDS).sum(axis=-1)
    bits = np.where(n < 7, 15 - n, n - 7)
    bits = np.where(bad[..., None], 0, bits).astype(np.uint8).reshape(x.shape)
    byte = e + 127
    byte = np.where(bad | (byte < 0) | (byte > 255), 0, byte).astype(np.uint8)
    return (bits[..., 0::2] | (bits[..., 1::2] << 4)).astype(np.uint8), byte


def dequantize(codes: np.ndarray, scales: np.ndarray, d: int) -> np.ndarray:
    bits = np.empty((*codes.shape[:-1], d), np.uint8)
    bits[..., 0::2] = codes & 0xF
    bits[..., 1::2] = codes >> 4
    # 2^(byte - 127) exactly (ldexp: NumPy's float32 exp2 is off by an ulp near 2^126; 255 overflows to inf)
    with np.errstate(over="ignore"):
        p2 = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)
    s = np.where(scales == 0, np.float32(0), p2)
    return (E2M1[bits].reshape(*codes.shape[:-1], -1, GROUP) * s[..., None]).reshape(*codes.shape[:-1], d)


def store(key: np.ndarray, value: np.ndarray, cache: np.ndarray, slots: np.ndarray) -> None:
    """key, value [T, H, D] (any float dtype, widened to float32) into cache [NB, BS, H, slot_bytes]."""
    d = key.shape[-1]
    kc, ks = quantize(rotate(np.asarray(key, np.float32)))
    vc, vs = quantize(np.asarray(value, np.float32))
    slot = np.concatenate([kc, ks, vc, vs], axis=-1)
    flat = cache.reshape(-1, cache.shape[2], cache.shape[3])
    for t, s in enumerate(np.asarray(slots).tolist()):
        if s >= 0:
            flat[s, :, : slot_bytes(d)] = slot[t]


def gather(cache: np.ndarray, slots: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(K in the rotated basis, V) float32 [n, H, D] of slots."""
    rows = cache.reshape(-1, cache.shape[2], cache.shape[3])[np.asarray(slots)]
    h, g = d // 2, d // GROUP
    k = dequantize(rows[..., :h], rows[..., h:h + g], d)
    v = dequantize(rows[..., h + g:2 * h + g], rows[..., 2 * h + g:2 * h + 2 * g], d)
    return k, v
