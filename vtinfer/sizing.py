"""Sizing a paged KV cache for a model: bytes per block, blocks, tokens."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from vtinfer.checkpoint import Checkpoint
from vtinfer.hf_config import ModelGeometry

FALLBACK_BLOCKS = 256
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20,
          "g": 1 << 30, "t": 1 << 40}


def parse_bytes(value: int | str) -> int:
    """``8GiB`` / ``512MB`` / ``1048576`` -> bytes (ValueError naming kv_cache_memory)."""
    if isinstance(value, bool):
        raise TypeError("plan_kv_cache: kv_cache_memory must be an int or a size string; got bool")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"plan_kv_cache: kv_cache_memory must be bytes or a size like '8GiB'; got {value!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"plan_kv_cache: kv_cache_memory must be > 0; got {value!r}")
    return n


@dataclass(frozen=True)
class KVCachePlan:
    """A cache plan.

    Attributes
    ----------
    dtype : str
        Storage dtype (vtinfer name).
    elem_bytes, block_size, num_layers : int
    bytes_per_block : int
        One block over all layers, K and V (per-layer specs summed).
    num_blocks : int
    tokens : int
        ``num_blocks * block_size``.
    total_bytes : int
    blocks_from : str
        ``num_blocks``, ``kv_cache_memory`` or ``fallback``.
    warnings : tuple of str
    """

    dtype: str
    elem_bytes: int
    block_size: int
    num_layers: int
    bytes_per_block: int
    num_blocks: int
    tokens: int
    total_bytes: int
    blocks_from: str
    warnings: tuple[str, ...]


def plan_kv_cache(checkpoint_or_geometry: Any, kv_cache_dtype: str = "auto", block_size: int = 16,
                  num_blocks: int | None = None, kv_cache_memory: int | str | None = None) -> KVCachePlan:
    """Size a paged KV cache.

    Parameters
    ----------
    checkpoint_or_geometry : path, Checkpoint or ModelGeometry
        A checkpoint's dtype comes from the resolver; a geometry's ``auto`` is
        its model dtype.
    kv_cache_dtype : str
    block_size : int
    num_blocks : int, optional
        Wins over ``kv_cache_memory``.
    kv_cache_memory : int or str, optional
        Bytes (``"8GiB"``); blocks = memory // bytes_per_block. Neither given:
        256 blocks and a warning.
    """
    from vtinfer import dtype_info
    from vtinfer.resolve import resolve_kv_cache_dtype

    if isinstance(checkpoint_or_geometry, ModelGeometry):
        geo = checkpoint_or_geometry
        if kv_cache_dtype == "auto":
            dtype = geo.dtype
        else:
            dtype = dtype_info(kv_cache_dtype).name
    else:
        ck = checkpoint_or_geometry if isinstance(checkpoint_or_geometry, Checkpoint) else Checkpoint(
            os.fspath(checkpoint_or_geometry))
        geo = ck.geometry
        res = resolve_kv_cache_dtype(kv_cache_dtype, ck)
        if res.dtype is None:
            raise NotImplementedError(f"plan_kv_cache: vtinfer cannot store kv_cache_dtype {res.cache_dtype!r}")
        dtype = res.dtype
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"plan_kv_cache: block_size must be a positive int; got {block_size!r}")
    info = dtype_info(dtype)
    elem = info.elem_bytes
    # per-token-head formats: each (token, KV head) also holds a float32 scale for K and one for V
    # (vLLM's TritonAttentionBackend.customize_spec; kv-formats.md)
    scale_bytes = 8 if info.scale_kind == "token_head" else 0
    per_block = sum(block_size * s.num_kv_heads * (2 * s.head_dim * elem + scale_bytes) for s in geo.layers)
    warnings: list[str] = []
    if num_blocks is not None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"plan_kv_cache: num_blocks must be a positive int; got {num_blocks!r}")
        n, src = num_blocks, "num_blocks"
    elif kv_cache_memory is not None:
        mem = parse_bytes(kv_cache_memory)
        n, src = mem // per_block, "kv_cache_memory"
        if n == 0:
            raise ValueError(f"plan_kv_cache: kv_cache_memory must hold one block of {per_block} bytes; got {mem}")
    else:
        n, src = FALLBACK_BLOCKS, "fallback"
        warnings.append(f"neither num_blocks nor kv_cache_memory given: using {FALLBACK_BLOCKS} blocks")
    return KVCachePlan(dtype, elem, block_size, geo.num_layers, per_block, n, n * block_size, n * per_block, src,
                       tuple(warnings))


def kv_cache_args(model: Any, kv_cache_dtype: str = "auto", block_size: int = 16, num_blocks: int | None = None,
                  kv_cache_memory: int | str | None = None) -> dict[str, Any]:
    """Everything ``PagedKVCache(...)`` needs for a checkpoint: the resolved
    dtype, the geometry, and the per-layer scales loaded as vLLM loads them
    (``k_scale`` / ``v_scale``: ``[num_layers]`` or ``[num_layers, H_kv]``).
    ``PagedKVCache.from_checkpoint`` (issue #3's type) is ``PagedKVCache(**kv_cache_args(...))``."""
    import numpy as np

    from vtinfer.resolve import resolve_kv_cache_dtype
    from vtinfer.scales import load_kv_scales

    ck = model if isinstance(model, Checkpoint) else Checkpoint(model)
    res = resolve_kv_cache_dtype(kv_cache_dtype, ck)
    plan = plan_kv_cache(ck, kv_cache_dtype, block_size, num_blocks, kv_cache_memory)
    geo = ck.geometry
    from vtinfer import dtype_info

    quantized = dtype_info(plan.dtype).is_fp8  # per-tensor scales: per-token-head formats compute theirs
    sc = load_kv_scales(ck.shards, geo.num_layers, geo.num_kv_heads, quantized=quantized,
                        per_head=res.per_head_scales, kv_cache_dtype=plan.dtype)
    def arr(vals: list) -> Any:
        if any(isinstance(v, tuple) for v in vals):
            return np.array([v if isinstance(v, tuple) else (v,) * geo.num_kv_heads for v in vals], np.float32)
        return np.array(vals, np.float32)

    return dict(num_layers=geo.num_layers, num_blocks=plan.num_blocks, block_size=block_size,
                num_kv_heads=geo.num_kv_heads, head_size=geo.head_dim, dtype=plan.dtype,
                k_scale=arr([s.k_scale for s in sc]), v_scale=arr([s.v_scale for s in sc]))
