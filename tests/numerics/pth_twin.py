"""Independent NumPy twin of vLLM 0.33's per-token-head KV store and read.

Written from the rules recorded in .agents/specs/kv-formats.md (vLLM's
``_reshape_cache_per_token_head``, triton_reshape_and_cache_flash.py
lines 221-266), not from vtinfer's C code: one float32 scale per
(token, head) = max(absmax / QUANT_MAX, 1e-6); q = x * (1 / scale);
int8: q +- 0.5 by sign, clamp to [-128, 127], truncate; fp8: clamp to
[-448, 448] and round to e4m3 (ml_dtypes' cast, nearest even). NumPy's
fmax/fmin give the NaN rule (absmax ignores NaN, clamp maps NaN to the
lower bound), the same maxnum/minnum that Triton's tl.max / tl.clamp lower to.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

QUANT = {"int8_per_token_head": (127.0, -128.0), "fp8_per_token_head": (448.0, -448.0)}
SCALE_FLOOR = np.float32(1e-6)


def quantize(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x [..., D]`` (any float dtype, widened to float32 exactly) ->
    (codes ``[..., D]`` int8 or uint8 (e4m3 bits), scales ``[...]`` float32)."""
    qmax, qmin = (np.float32(v) for v in QUANT[fmt])
    x = np.asarray(x).astype(np.float32)
    with np.errstate(all="ignore"):
        absmax = np.fmax.reduce(np.abs(x), axis=-1, initial=np.float32(0.0))
        scale = np.fmax(absmax / qmax, SCALE_FLOOR).astype(np.float32)
        recip = (np.float32(1.0) / scale).astype(np.float32)
        q = (x * recip[..., None]).astype(np.float32)
        if fmt == "int8_per_token_head":
            q = np.where(q >= 0, q + np.float32(0.5), q - np.float32(0.5)).astype(np.float32)
            q = np.fmin(np.fmax(q, qmin), qmax)
            codes = np.trunc(q).astype(np.int8)
        else:
            q = np.fmin(np.fmax(q, qmin), qmax)
            codes = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes, scale


def dequantize(codes: np.ndarray, scale: np.ndarray, fmt: str) -> np.ndarray:
    """codes ``[..., D]`` and scales ``[...]`` -> float32 values (code * scale)."""
    if fmt == "int8_per_token_head":
        vals = codes.astype(np.int8).astype(np.float32)
    else:
        vals = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(all="ignore"):
        return (vals * scale[..., None].astype(np.float32)).astype(np.float32)


def page_bytes(fmt: str, num_layers: int, block_size: int, num_kv_heads: int, head_size: int) -> int:
    """vLLM's page size for these formats, over all layers: TritonAttentionBackend.customize_spec
    (triton_attn.py:317-319) gives state_content_bytes = (hs_k + hs_v) * dtype size + 2 * 4, and
    AttentionSpec.unpadded_page_size_bytes (kv_cache_interface.py:594) num_heads * num_states * that,
    num_states = block_size (one token per state)."""
    elem = 1  # torch.int8 / float8_e4m3fn
    content = (head_size + head_size) * elem + 2 * 4
    return num_layers * num_kv_heads * block_size * content
