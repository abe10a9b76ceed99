"""An independent NumPy twin of vLLM 0.33's Octave store and read (octave_k3v4, octave_k3v3,
octave_k3v3_compact), written from the wheel's rocm_octave.py (read, not imported): rows multiplied by
the sign pattern, Walsh-Hadamard butterflies per block then 1 / sqrt(block) in float32, per block the
Lloyd-Max int8 codebook on the block RMS (``torch.bucketize``'s lower bound: a NaN takes the last code),
the scale that keeps x . x_hat = |x|^2 times 64 as fp16, and the 4-bit / 3-bit plane packing. The
float32 sums run in element order (``np.cumsum``), as vtinfer's C does; torch orders its reductions as
its build vectorizes them."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from tests.numerics.signs_file import read_signs

F = np.float32
BLOCK = 64
LUT = {3: np.array([-127, -79, -45, -14, 14, 45, 79, 127], F),
       4: np.array([-126, -95, -74, -58, -43, -30, -18, -6, 6, 18, 30, 43, 58, 74, 95, 126], F)}
MULT = {3: F(59.0), 4: F(46.0)}
VBITS = {"octave_k3v4": 4, "octave_k3v3": 3, "octave_k3v3_compact": 3}
SIGNS_FILE = Path(__file__).with_name("octave_signs.txt")


@functools.cache
def _all_signs() -> np.ndarray:
    return read_signs(SIGNS_FILE)


def signs(d: int) -> np.ndarray:
    s = _all_signs()
    if not 1 <= d <= s.size:
        raise ValueError(f"signs: d must be in [1, {s.size}]; got {d}")
    return s[:d].copy()


def layout(fmt: str, d: int, rope: int) -> dict[str, int]:
    compact = fmt.endswith("_compact")
    wide = 0 if compact else rope
    vb = VBITS[fmt]
    off_nope = wide * 4 // 8
    off_v = off_nope + (d - wide) * 3 // 8
    off_sc = off_v + d * vb // 8
    nks = 1 if compact else d // BLOCK
    raw, align = off_sc + 2 * (nks + 1), 4 if compact else 8
    return dict(wide=wide, vb=vb, off_nope=off_nope, off_v=off_v, off_sc=off_sc, nks=nks,
                kblock=d if compact else BLOCK, vblock=d if d & (d - 1) == 0 else BLOCK,
                slot=-(-raw // align) * align, compact=int(compact))


def fwht(x: np.ndarray, block: int) -> np.ndarray:
    """Butterflies (a, b) -> (a + b, a - b) over consecutive blocks of the last dim, then * 1 / sqrt(block)."""
    shape = x.shape
    y = np.asarray(x, F).reshape(-1, shape[-1] // block, block).copy()
    h = 1
    with np.errstate(all="ignore"):  # inf scales read back as inf / NaN, as in torch
        while h < block:
            y = y.reshape(*y.shape[:-1], block // (2 * h), 2, h)
            a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
            y = np.stack((a + b, a - b), axis=-2).reshape(*y.shape[:-3], block).astype(F)
            h *= 2
        return (y * F(1.0 / np.sqrt(block))).astype(F).reshape(shape)


def quantize(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [..., n] float32 -> (codes [..., n] uint8, scale [...] float32 before its fp16 rounding)."""
    x = np.asarray(x, F)
    lut = LUT[bits]
    mids = ((lut[1:] + lut[:-1]) / F(2)).astype(F)
    with np.errstate(all="ignore"):
        ss = np.cumsum(x * x, axis=-1, dtype=F)[..., -1]
        rms = np.sqrt(ss / F(x.shape[-1])).astype(F)
        rms = np.where(rms < F(1e-12), F(1e-12), rms).astype(F)  # a NaN stays
        y = ((x / rms[..., None]).astype(F) * MULT[bits]).astype(F)
        codes = (~(mids >= y[..., None])).sum(-1).astype(np.uint8)
        dot = np.cumsum((x * lut[codes]).astype(F), axis=-1, dtype=F)[..., -1]
        scale = np.where(dot > 0, (ss / np.maximum(dot, F(1e-30))).astype(F), F(0)).astype(F) * F(64)
    return codes, scale.astype(F)


def pack(c: np.ndarray, bits: int) -> np.ndarray:
    c = c.astype(np.uint32)
    n = c.shape[-1]
    if bits == 4:
        g = c.reshape(*c.shape[:-1], n // 8, 2, 4)
        return (g[..., 0, :] | (g[..., 1, :] << 4)).reshape(*c.shape[:-1], n // 2).astype(np.uint8)
    lo = (c & 3).reshape(*c.shape[:-1], n // 16, 4, 4)
    lo = (lo << (2 * np.arange(4, dtype=np.uint32))[:, None]).sum(-2)
    hi = (c >> 2).reshape(*c.shape[:-1], n // 32, 8, 4)
    hi = (hi << np.arange(8, dtype=np.uint32)[:, None]).sum(-2)
    return np.concatenate([lo.reshape(*c.shape[:-1], -1), hi.reshape(*c.shape[:-1], -1)], -1).astype(np.uint8)


def unpack(p: np.ndarray, n: int, bits: int) -> np.ndarray:
    p = p.astype(np.uint32)
    if bits == 4:
        g = p.reshape(*p.shape[:-1], -1, 4)
        return np.stack((g & 15, g >> 4), axis=-2).reshape(*p.shape[:-1], n)
    lo = p[..., : n // 4].reshape(*p.shape[:-1], -1, 1, 4)
    lo = (lo >> (2 * np.arange(4, dtype=np.uint32))[:, None]) & 3
    hi = p[..., n // 4:].reshape(*p.shape[:-1], -1, 1, 4)
    hi = (hi >> np.arange(8, dtype=np.uint32)[:, None]) & 1
    return lo.reshape(*p.shape[:-1], n) + 4 * hi.reshape(*p.shape[:-1], n)


def encode(k: np.ndarray, v: np.ndarray, fmt: str, rope: int) -> np.ndarray:
    """K, V [..., D] -> slots [..., slot] uint8 (the pad bytes zero)."""
    k, v = np.asarray(k, np.float64).astype(F), np.asarray(v, np.float64).astype(F)
    d = k.shape[-1]
    g = layout(fmt, d, rope)
    out = np.zeros((*k.shape[:-1], g["slot"]), np.uint8)
    s = signs(d)
    kr = fwht(k * s, g["kblock"])
    if g["compact"]:
        codes, ks = quantize(kr, 3)
        out[..., : g["off_v"]] = pack(codes, 3)
        ks = ks[..., None]
    else:
        blocks = kr.reshape(*kr.shape[:-1], d // BLOCK, BLOCK)
        nr = rope // BLOCK
        cr, sr = quantize(blocks[..., :nr, :], 4)
        cn, sn = quantize(blocks[..., nr:, :], 3)
        if rope:
            out[..., : g["off_nope"]] = pack(cr.reshape(*k.shape[:-1], rope), 4)
        if d - rope:
            out[..., g["off_nope"]: g["off_v"]] = pack(cn.reshape(*k.shape[:-1], d - rope), 3)
        ks = np.concatenate([sr, sn], -1)
    vc, vs = quantize(fwht(v * s, g["vblock"]), g["vb"])
    out[..., g["off_v"]: g["off_sc"]] = pack(vc, g["vb"])
    with np.errstate(over="ignore"):  # a scale past fp16's 65504 stores inf, as torch's .to(float16)
        sc = np.concatenate([ks, vs[..., None]], -1).astype(np.float16)
    out[..., g["off_sc"]: g["off_sc"] + 2 * (g["nks"] + 1)] = sc.view(np.uint8).reshape(*k.shape[:-1], -1)
    return out


def decode(slots: np.ndarray, fmt: str, d: int, rope: int) -> tuple[np.ndarray, np.ndarray]:
    """slots [..., slot] -> (K, V) [..., D] float32 in the model's basis (reference_dequantize)."""
    g = layout(fmt, d, rope)
    lead = slots.shape[:-1]
    sc = np.ascontiguousarray(slots[..., g["off_sc"]: g["off_sc"] + 2 * (g["nks"] + 1)]).view(np.float16)
    sc = (sc.astype(F) / F(64)).astype(F)
    s = signs(d)
    if g["compact"]:
        with np.errstate(invalid="ignore"):
            k = (LUT[3][unpack(slots[..., : g["off_v"]], d, 3)] * sc[..., :1]).astype(F)
    else:
        parts = []
        if rope:
            parts.append(LUT[4][unpack(slots[..., : g["off_nope"]], rope, 4)])
        if d - rope:
            parts.append(LUT[3][unpack(slots[..., g["off_nope"]: g["off_v"]], d - rope, 3)])
        k = np.concatenate(parts, -1).reshape(*lead, d // BLOCK, BLOCK)
        k = (k * sc[..., : g["nks"], None]).astype(F).reshape(*lead, d)
    v = (LUT[g["vb"]][unpack(slots[..., g["off_v"]: g["off_sc"]], d, g["vb"])] * sc[..., -1:]).astype(F)
    return (fwht(k, g["kblock"]) * s).astype(F), (fwht(v, g["vblock"]) * s).astype(F)


def store(key: np.ndarray, value: np.ndarray, cache: np.ndarray, slots: np.ndarray, fmt: str, rope: int) -> None:
    """Into cache [num_blocks, block_size, H, slot] (pad bytes kept); a negative slot skips; the last wins."""
    enc = encode(key, value, fmt, rope)
    g = layout(fmt, key.shape[-1], rope)
    used = 2 * (g["nks"] + 1) + g["off_sc"]
    bs = cache.shape[1]
    for t, s in enumerate(np.asarray(slots)):
        if s >= 0:
            cache[s // bs, s % bs, :, :used] = enc[t, :, :used]
