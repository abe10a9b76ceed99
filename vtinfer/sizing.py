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
    tensor_parallel_size: int = 1
    num_kv_heads: int = 0
    layer_dtypes: tuple[str, ...] = ()
    layer_page_bytes: tuple[int, ...] = ()
    skipped_layers: tuple[int, ...] = ()
    vllm_block_size: int = 0
    skip_page_size_padded: int | None = None


#: FlashAttention's smallest kernel block (``MultipleOf(16)`` in the pinned
#: vLLM's ``get_supported_kernel_block_sizes`` on CUDA).
FLASH_ATTN_KERNEL_BLOCK = 16


def skipped_layers(geo: ModelGeometry, skip: Any, who: str = "plan_kv_cache") -> tuple[int, ...]:
    """The layers vLLM 0.33's ``Attention.__init__`` keeps unquantized for
    ``kv_cache_dtype_skip_layers``: ``str(layer) in skip``, or ``"sliding_window"
    in skip`` and the layer has a sliding window."""
    if skip is None:
        return ()
    if isinstance(skip, str) or not all(isinstance(x, str) for x in skip):
        raise TypeError(f"{who}: kv_cache_dtype_skip_layers must be a list of str (layer indices such as '0', or "
                        f"'sliding_window'); got {skip!r}")
    names = set(skip)  # a set: the list may name every one of 65536 layers
    return tuple(s.layer for s in geo.layers
                 if str(s.layer) in names or (s.sliding_window is not None and "sliding_window" in names))


def _heterogeneous_alignment(block_size: int, primary_token: int, skip_token: int) -> tuple[int, int | None]:
    """vLLM's ``_align_heterogeneous_kv_block_size`` (FlashAttention kernel
    blocks): (the primary block size, ``skip_page_size_padded``)."""
    if skip_token < primary_token:
        raise ValueError(f"plan_kv_cache: padded-spec per-token page ({skip_token}B) < primary ({primary_token}B); "
                         "a higher-precision padded spec must not be smaller than the quantized primary.")
    if skip_token == primary_token:
        return block_size, None
    kb = FLASH_ATTN_KERNEL_BLOCK
    align = max(kb, block_size)
    need = skip_token * kb
    primary_block = align * -(-need // (align * primary_token))
    bs = max(block_size, primary_block)
    return bs, bs * primary_token


def plan_kv_cache(checkpoint_or_geometry: Any, kv_cache_dtype: str = "auto", block_size: int = 16,
                  num_blocks: int | None = None, kv_cache_memory: int | str | None = None, *,
                  tensor_parallel_size: int = 1, kv_cache_dtype_skip_layers: Any = None) -> KVCachePlan:
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
        Bytes (``"8GiB"``) per GPU; blocks = memory // bytes_per_block. Neither
        given: 256 blocks and a warning.
    tensor_parallel_size : int
        The plan is one rank's: ``max(1, H_kv // N)`` KV heads (vLLM's
        ``get_num_kv_heads``); vLLM's refusals for ``N`` (heads not divisible,
        ...) are raised as ValueError.
    kv_cache_dtype_skip_layers : list of str, optional
        vLLM 0.33's ``CacheConfig.kv_cache_dtype_skip_layers``: layer indices
        (``"0"``) or ``"sliding_window"``; those layers keep the model dtype,
        so ``layer_page_bytes`` differ. A ``turboquant_*`` dtype adds vLLM's
        boundary layers (the first and last 2 of a dense model) to the list. ``vllm_block_size`` and
        ``skip_page_size_padded`` are what vLLM's block alignment
        (``_align_heterogeneous_kv_block_size``, FlashAttention's 16-token
        kernel block) sets when the list is non-empty.
    """
    from vtinfer.tensor_parallel import rank_heads
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
            from vtinfer._dtypes import KV_CACHE_DTYPES_NOT_STORED

            why = KV_CACHE_DTYPES_NOT_STORED.get(res.cache_dtype)
            raise NotImplementedError(f"plan_kv_cache: vtinfer cannot store kv_cache_dtype {res.cache_dtype!r}"
                                      + (f": {why}" if why else ""))
        dtype = res.dtype
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"plan_kv_cache: block_size must be a positive int; got {block_size!r}")
    info = dtype_info(dtype)
    elem = info.elem_bytes
    kv_rank = rank_heads(geo.num_heads, geo.num_kv_heads, tensor_parallel_size, 0).num_kv_heads
    if info.boundary_layers:
        # vLLM 0.33 EngineArgs: a turboquant_* or ultraquant_4bit cache keeps the first / last 2 attention layers
        # at the model dtype (TurboQuantConfig.get_boundary_skip_layers, dense models), added to the skip list
        from vtinfer._turboquant import boundary_skip_layers

        if kv_cache_dtype_skip_layers is not None:
            skipped_layers(geo, kv_cache_dtype_skip_layers)  # its type check
        kv_cache_dtype_skip_layers = sorted(set(kv_cache_dtype_skip_layers or ()) | set(
            boundary_skip_layers(geo.num_layers, info.boundary_layers)))
    skipped = skipped_layers(geo, kv_cache_dtype_skip_layers)
    skipped_set = set(skipped)
    layer_dtypes = tuple(geo.dtype if s.layer in skipped_set else dtype for s in geo.layers)

    def token_bytes(d: str, kv: int, head_dim: int) -> int:
        # per-token-head formats: each (token, KV head) also holds a float32 scale for K and one for V
        # (vLLM's TritonAttentionBackend.customize_spec; kv-formats.md)
        # slot formats: one slot per (token, KV head), K and V together (TurboQuant's slot_size_aligned,
        # UltraQuant's slot_size, Octave's slot_bytes at the model's rotary dims: vLLM's rope_dim_from_hf_config)
        di = dtype_info(d)
        if di.page_layout == "slots":
            from vtinfer import _C

            return kv * _C.dtype_slot_bytes(di.name, head_dim, geo.rope_dim(head_dim) if di.rope_block else None)
        return kv * (2 * head_dim * di.elem_bits // 8 + (8 if di.scale_kind == "token_head" else 0))

    pages = tuple(block_size * token_bytes(d, kv_rank if s.num_kv_heads == geo.num_kv_heads else
                                           max(1, s.num_kv_heads // tensor_parallel_size), s.head_dim)
                  for s, d in zip(geo.layers, layer_dtypes))
    per_block = sum(pages)
    vbs, padded = block_size, None
    if kv_cache_dtype_skip_layers:
        vbs, padded = _heterogeneous_alignment(block_size, token_bytes(dtype, kv_rank, geo.head_dim),
                                               token_bytes(geo.dtype, kv_rank, geo.head_dim))
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
                       tuple(warnings), int(tensor_parallel_size), kv_rank, layer_dtypes, pages, skipped, vbs, padded)


def ct_head_counts(res: Any, geo: ModelGeometry) -> tuple[int | None, int | None]:
    """``(total_num_heads, total_num_kv_heads)`` as compressed-tensors' attn_head
    loader sees them: vLLM's ``get_quant_config`` writes the model's head
    counts into a compressed-tensors config that has ``config_groups``;
    otherwise the config's own ``total_num_heads`` / ``total_num_kv_heads``
    (None when absent: vLLM's loader then fails on per-head scales)."""
    qc = res.quant_config if isinstance(res.quant_config, dict) else {}
    if "config_groups" in qc:
        return geo.num_heads, geo.num_kv_heads
    h, kv = qc.get("total_num_heads"), qc.get("total_num_kv_heads")
    return (h if isinstance(h, int) else None), (kv if isinstance(kv, int) else None)


def is_compressed_tensors_kv(res: Any) -> bool:
    """The attention layers use compressed-tensors' KV method (a ``kv_cache_scheme``)."""
    qc = res.quant_config if isinstance(res.quant_config, dict) else {}
    return res.quant_method == "compressed-tensors" and qc.get("kv_cache_scheme") is not None


def scale_load_options(res: Any, geo: ModelGeometry, who: str) -> dict[str, Any]:
    """The keyword arguments :func:`vtinfer.load_kv_scales` needs for a resolution.

    Raises
    ------
    ValueError
        An ``attn_head`` checkpoint whose head counts vLLM cannot learn
        (neither ``config_groups`` nor ``total_num_heads`` in its config).
    """
    ct = is_compressed_tensors_kv(res)
    heads: int | None = geo.num_heads
    if res.per_head_scales:
        heads, kv = ct_head_counts(res, geo)
        if heads is None or kv is None:
            raise ValueError(f"{who}: a compressed-tensors attn_head quantization_config must have config_groups "
                             "(vLLM then adds total_num_heads / total_num_kv_heads) or both total_num_heads and "
                             "total_num_kv_heads; got neither")
    return dict(per_head=res.per_head_scales, compressed_tensors=ct, num_heads=heads)


def kv_cache_args(model: Any, kv_cache_dtype: str = "auto", block_size: int = 16, num_blocks: int | None = None,
                  kv_cache_memory: int | str | None = None, *, tensor_parallel_size: int = 1, rank: int = 0,
                  kv_cache_dtype_skip_layers: Any = None) -> dict[str, Any]:
    """Everything ``PagedKVCache(...)`` needs for a checkpoint on one
    tensor-parallel rank: the resolved dtype, the rank's geometry
    (``max(1, H_kv // N)`` KV heads), the planned blocks for a per-GPU
    ``kv_cache_memory``, and the rank's K/V scales loaded as vLLM loads them
    (``k_scale`` / ``v_scale``: ``[num_layers]`` or ``[num_layers, H_kv_rank]``).
    ``PagedKVCache.from_checkpoint`` is ``PagedKVCache(**kv_cache_args(...))``.

    Raises
    ------
    NotImplementedError
        ``kv_cache_dtype_skip_layers`` leaves some layers at another dtype than
        the rest: a ``PagedKVCache`` holds one dtype (``plan_kv_cache`` sizes it).
    """
    import numpy as np

    from vtinfer.resolve import resolve_kv_cache_dtype
    from vtinfer.scales import load_kv_scales

    ck = model if isinstance(model, Checkpoint) else Checkpoint(model)
    res = resolve_kv_cache_dtype(kv_cache_dtype, ck)
    plan = plan_kv_cache(ck, kv_cache_dtype, block_size, num_blocks, kv_cache_memory,
                         tensor_parallel_size=tensor_parallel_size,
                         kv_cache_dtype_skip_layers=kv_cache_dtype_skip_layers)
    if len(set(plan.layer_dtypes)) > 1:
        raise NotImplementedError(
            f"kv_cache_args: kv_cache_dtype_skip_layers keeps layers {list(plan.skipped_layers)} at "
            f"{plan.layer_dtypes[plan.skipped_layers[0]]} while the others are {plan.dtype}; a PagedKVCache holds "
            "one dtype for all layers (vt.plan_kv_cache sizes the mixed cache)")
    geo = ck.geometry
    from vtinfer import dtype_info

    quantized = dtype_info(plan.dtype).is_fp8  # per-tensor scales: per-token-head formats compute theirs
    opts = scale_load_options(res, geo, "kv_cache_args")
    sc = load_kv_scales(ck.shards, geo.num_layers, geo.num_kv_heads, quantized=quantized,
                        kv_cache_dtype=plan.dtype, tensor_parallel_size=tensor_parallel_size, rank=rank,
                        unquantized_layers=plan.skipped_layers, **opts)
    kv = plan.num_kv_heads

    def arr(vals: list) -> Any:
        if any(isinstance(v, tuple) for v in vals):
            return np.array([v if isinstance(v, tuple) else (v,) * kv for v in vals], np.float32)
        return np.array(vals, np.float32)

    return dict(num_layers=geo.num_layers, num_blocks=plan.num_blocks, block_size=block_size,
                num_kv_heads=kv, head_size=geo.head_dim, dtype=plan.dtype,
                k_scale=arr([s.k_scale for s in sc]), v_scale=arr([s.v_scale for s in sc]),
                rope_dim=geo.rope_dim())  # Octave's slot (the config's rotary share); other dtypes ignore it
