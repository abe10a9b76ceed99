"""Independent NumPy twin of vLLM 0.33's TurboQuant KV store and read.

Written from the rules recorded in .agents/specs/kv-formats.md
(``## TurboQuant``: vLLM's triton_turboquant_store.py, triton_turboquant_decode.py,
turboquant/config.py, centroids.py and turboquant_attn.py), not from vLLM's
code. One packed slot per (token, KV head):

    [key part (KPS bytes) | value codes (VAL_DATA_BYTES) | v_scale fp16 | v_zero fp16 | pad to even]

- key, ``turboquant_k8v4``: the D float32 elements cast to e4m3fn with no
  scale, round to nearest even, saturating to +-448 (Triton's
  ``cvt.rn.satfinite``), NaN stays NaN.
- key, MSE presets: ``norm = ||k||`` (float32 squares), ``y = (k / (norm + 1e-8)) @ H`` (H the
  orthonormal Sylvester Hadamard, float32), index = number of codebook
  midpoints <= y (binary search ``y >= mid``), packed 4-bit (element 2j low
  nibble) or 3-bit (8 elements per 3 bytes, element i of a group at bit 3i,
  only D // 8 groups written), then the norm as fp16 (little endian).
- value: ``vmin``, ``vmax`` over the row, ``scale = (vmax - vmin) / (2^b - 1)``
  floored at 1e-8, ``q = clamp(trunc((v - vmin) / scale + 0.5), 0, 2^b - 1)``
  (division, not a reciprocal), packed as the key indices, then scale and vmin
  as fp16.
- read: ``v = q * float(scale16) + float(zero16)``; MSE key in the rotated
  basis ``norm16 * c[idx]`` (norm-correction presets first divide c[idx] by
  ``sqrt(sum c^2 + 1e-16)``); a k8v4 key is its e4m3 value.

Rows are float32 ``[..., D]``; the store returns uint8 ``[..., slot_bytes]``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

#: --kv-cache-dtype -> (key bits: 8 = fp8, 3/4 = Lloyd-Max indices; value bits; norm correction)
PRESETS = {
    "turboquant_k8v4": (8, 4, False),
    "turboquant_4bit_nc": (4, 4, True),
    "turboquant_k3v4_nc": (3, 4, True),
    "turboquant_3bit_nc": (3, 3, True),
}
F32 = np.float32


def layout(fmt: str, D: int) -> dict:
    """Byte layout of one (token, head) slot."""
    kb, vb, _ = PRESETS[fmt]
    mse = D if kb == 8 else -(-D * kb // 8)
    kps = D if kb == 8 else mse + 2
    vdb = -(-D * vb // 8)
    slot = kps + vdb + 4
    return dict(key_bits=kb, value_bits=vb, mse_bytes=mse, kps=kps, vdb=vdb, slot=slot, slot_aligned=slot + slot % 2)


def page_bytes(fmt: str, num_layers: int, block_size: int, num_kv_heads: int, head_size: int) -> int:
    """vLLM's page: num_kv_heads * block_size * slot_size_aligned per layer."""
    return num_layers * num_kv_heads * block_size * layout(fmt, head_size)["slot_aligned"]


def lloyd_max(D: int, bits: int) -> np.ndarray:
    """The 2^bits Lloyd-Max centroids for N(0, 1/D), float32, ascending: start
    uniform over +-3.5 sigma (cell centres), then up to 200 rounds of
    centroid = E[x | cell] with 200-step trapezoid integrals over cells
    bounded by the midpoints and +-10.5 sigma; stop when no centroid moved by
    1e-10 (the round that converged is not kept)."""
    n = 1 << bits
    var = 1.0 / D
    sd = math.sqrt(var)
    a0, b0 = -3.5 * sd, 3.5 * sd

    def density(x):
        return (1.0 / math.sqrt(2 * math.pi * var)) * math.exp(-x * x / (2 * var))

    def integral(g, a, b, steps=200):
        h = (b - a) / steps
        acc = 0.5 * (g(a) + g(b))
        for i in range(1, steps):
            acc += g(a + i * h)
        return acc * h

    c = [a0 + (b0 - a0) * (i + 0.5) / n for i in range(n)]
    for _ in range(200):
        cuts = [a0 * 3] + [(c[i] + c[i + 1]) / 2.0 for i in range(n - 1)] + [b0 * 3]
        new = []
        for i in range(n):
            lo, hi = cuts[i], cuts[i + 1]
            mass = integral(density, lo, hi)
            new.append(integral(lambda x: x * density(x), lo, hi) / mass if mass > 1e-15 else c[i])
        if max(abs(new[i] - c[i]) for i in range(n)) < 1e-10:
            break
        c = new
    return np.array(c, dtype=F32)


def midpoints(c: np.ndarray) -> np.ndarray:
    c = np.sort(c.astype(F32))
    return ((c[:-1] + c[1:]) / F32(2)).astype(F32)


def hadamard(D: int) -> np.ndarray:
    """Orthonormal Sylvester Hadamard, float32 (+-1 divided by sqrt(D))."""
    h = np.ones((1, 1), F32)
    while h.shape[0] < D:
        h = np.block([[h, h], [h, -h]])
    return (h / F32(math.sqrt(D))).astype(F32)


def _pack(q: np.ndarray, bits: int, nbytes: int) -> np.ndarray:
    """Indices ``[..., D]`` (0 .. 2^bits - 1) -> ``[..., nbytes]`` uint8."""
    D = q.shape[-1]
    out = np.zeros(q.shape[:-1] + (nbytes,), np.uint8)
    q = q.astype(np.uint32)
    if bits == 4:
        half = D // 2
        out[..., :half] = (q[..., 0::2] & 0xF) | ((q[..., 1::2] & 0xF) << 4)
        return out
    g = D // 8  # trailing D % 8 elements are not stored (vLLM's group mask)
    word = np.zeros(q.shape[:-1] + (g,), np.uint32)
    for i in range(8):
        word |= (q[..., i: 8 * g: 8] & 0x7) << (3 * i)
    for b in range(3):
        out[..., b: 3 * g: 3] = (word >> (8 * b)) & 0xFF
    return out


def _unpack(raw: np.ndarray, bits: int, D: int) -> np.ndarray:
    """``[..., nbytes]`` uint8 -> indices ``[..., D]`` (vLLM's read: 16 bits from byte bit // 8)."""
    raw = np.concatenate([raw, np.zeros(raw.shape[:-1] + (1,), np.uint8)], axis=-1).astype(np.uint32)
    bit = np.arange(D) * bits
    word = raw[..., bit // 8] | (raw[..., bit // 8 + 1] << 8)
    return (word >> (bit % 8)) & ((1 << bits) - 1)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(F32).astype(np.float16).view(np.uint8).reshape(x.shape + (2,))


def quantize_values(v: np.ndarray, bits: int, nbytes: int) -> np.ndarray:
    """Rows ``[..., D]`` -> ``[..., nbytes + 4]``: codes, fp16 scale, fp16 zero (= row min)."""
    v = np.asarray(v).astype(F32)
    L = F32((1 << bits) - 1)
    with np.errstate(all="ignore"):
        vmin = v.min(axis=-1)
        vmax = v.max(axis=-1)
        scale = ((vmax - vmin) / L).astype(F32)
        scale = np.where(scale > F32(1e-8), scale, F32(1e-8)).astype(F32)
        t = (((v - vmin[..., None]).astype(F32) / scale[..., None]).astype(F32) + F32(0.5)).astype(F32)
        t = np.where(np.isfinite(t), t, F32(0))  # a NaN / inf row: not defined here, kept finite
        q = np.clip(np.trunc(t).astype(np.int64), 0, int(L))
    return np.concatenate([_pack(q, bits, nbytes), _f16_bytes(scale), _f16_bytes(vmin)], axis=-1)


def fp8_key(k: np.ndarray) -> np.ndarray:
    """float32 rows -> e4m3fn bytes, nearest even, saturating to +-448 (NaN kept)."""
    k = np.asarray(k).astype(F32)
    with np.errstate(invalid="ignore"):
        k = np.where(np.isnan(k), k, np.clip(k, F32(-448), F32(448)))
    return k.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def rotate(k: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``[..., D]`` -> (y ``[..., D]``, norms ``[...]``), both float32 (float64 inside)."""
    k = np.asarray(k).astype(F32)
    with np.errstate(under="ignore", over="ignore"):
        sq = (k * k).astype(F32)  # squared in float32 (1e-30 squares to 0), summed in float64
        norm = np.sqrt(sq.astype(np.float64).sum(axis=-1)).astype(F32)
        xh = (k / (norm[..., None] + F32(1e-8))).astype(F32)
    return (xh.astype(np.float64) @ H.astype(np.float64)).astype(F32), norm


def mse_key(y: np.ndarray, norm: np.ndarray, mids: np.ndarray, bits: int, nbytes: int) -> np.ndarray:
    """Rotated unit rows ``y`` and norms -> ``[..., nbytes + 2]``: packed indices, fp16 norm."""
    idx = np.searchsorted(mids.astype(F32), y.astype(F32), side="right")  # count of mids <= y
    idx = np.where(np.isnan(y), 0, np.minimum(idx, (1 << bits) - 1))
    return np.concatenate([_pack(idx, bits, nbytes), _f16_bytes(np.asarray(norm, F32))], axis=-1)


def store(fmt: str, k: np.ndarray, v: np.ndarray, *, y=None, norms=None, mids=None) -> np.ndarray:
    """Rows ``k, v [..., D]`` -> slots ``[..., slot_bytes]`` uint8 (the pad byte 0).

    MSE presets: ``y`` / ``norms`` override the rotation (to feed the exact
    float32 values another implementation rotated), ``mids`` the codebook."""
    D = k.shape[-1]
    lay = layout(fmt, D)
    kb = lay["key_bits"]
    if kb == 8:
        key = fp8_key(k)
    else:
        if y is None:
            y, norms = rotate(k, hadamard(D))
        if mids is None:
            mids = midpoints(lloyd_max(D, kb))
        key = mse_key(y, norms, mids, kb, lay["mse_bytes"])
    val = quantize_values(v, lay["value_bits"], lay["vdb"])
    out = np.zeros(k.shape[:-1] + (lay["slot_aligned"],), np.uint8)
    out[..., : lay["kps"]] = key
    out[..., lay["kps"]: lay["slot"]] = val
    return out


def dequantize(fmt: str, slot: np.ndarray, D: int, centroids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Slots ``[..., slot_bytes]`` -> (K, V) float32 ``[..., D]``; an MSE K is in the rotated basis
    (K in the model's basis is ``K @ hadamard(D)``)."""
    lay = layout(fmt, D)
    kb, vb, nc = PRESETS[fmt]
    slot = np.asarray(slot, np.uint8)
    if kb == 8:
        k = slot[..., :D].view(ml_dtypes.float8_e4m3fn).astype(F32)
    else:
        c = (lloyd_max(D, kb) if centroids is None else centroids).astype(F32)
        cv = c[_unpack(slot[..., : lay["mse_bytes"]], kb, D)]
        if nc:
            cv = (cv * (F32(1) / np.sqrt((cv * cv).sum(axis=-1, dtype=F32) + F32(1e-16)))[..., None]).astype(F32)
        nrm = slot[..., lay["mse_bytes"]: lay["mse_bytes"] + 2].copy().view(np.float16).astype(F32)
        k = (nrm * cv).astype(F32)
    o = lay["kps"]
    q = _unpack(slot[..., o: o + lay["vdb"]], vb, D).astype(F32)
    sc = slot[..., o + lay["vdb"]: o + lay["vdb"] + 2].copy().view(np.float16).astype(F32)
    zr = slot[..., o + lay["vdb"] + 2: o + lay["vdb"] + 4].copy().view(np.float16).astype(F32)
    return k, (q * sc + zr).astype(F32)
