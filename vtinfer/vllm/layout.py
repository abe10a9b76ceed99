"""Where vtinfer's backend finds K, V and their scales inside the page vLLM allocates.

vLLM 0.32 gives every layer a logical ``[num_blocks, H_kv, block_size, C]``
view of its page (typed as the spec's dtype, C elements per (head, token)),
with physical strides from the resolved KV cache layout. The backend asks for
``LBNHC`` (token-major, the GPU backends' NHD), so ``kv_cache.transpose(1, 2)``
is ``[num_blocks, block_size, H_kv, C]`` with unit stride in C, and:

- plain and per-tensor fp8 (``auto``, ``float16``, ``bfloat16``, ``fp8*``):
  ``C = 2 * D``; K is ``[..., :D]``, V is ``[..., D:]`` (vLLM's Triton and
  FlashAttention backends split the same way);
- per-token-head (``int8`` / ``fp8`` / ``int4_per_token_head``): the Triton
  backend's page, ``C = 2 * (d + 4 / elem)`` with ``d = D`` (``D / 2`` for
  int4): ``[K codes (d) | K scale (fp32) | V codes (d) | V scale (fp32)]``;
  the code views are ``[..., :d + 4]`` / ``[..., d + 4:]`` (vtinfer's ops take
  the padded views) and the scale caches are float32 views over the pads,
  ``[num_blocks, block_size, H_kv]``;
- the slot formats (``turboquant_*``, ``ultraquant_4bit``, ``nvfp4*``): one slot of
  ``vt.turboquant_slot_bytes`` bytes per (head, token), K and V packed inside (vLLM's TurboQuant and
  UltraQuant page; for NVFP4 the bytes of vLLM's page, ``2 * (D / 2 + D / 16)`` per (head, token), in
  vtinfer's slot order: vLLM's FlashInfer layout is read by no one but the backend that writes it).

Functions here take and return torch tensors; torch is imported by the caller.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import vtinfer as vt


def family(kv_cache_dtype: str) -> str:
    """``"plain"``, ``"fp8"``, ``"per_token_head"`` or ``"turboquant"``, from vtinfer's dtype table.

    Raises NotImplementedError naming vtinfer for a vLLM dtype vtinfer does
    not store (``fp8_inc``, MLA formats).
    """
    if kv_cache_dtype == "auto":
        return "plain"
    if kv_cache_dtype not in vt.KV_CACHE_DTYPES:
        why = vt.KV_CACHE_DTYPES_NOT_STORED.get(kv_cache_dtype)
        raise NotImplementedError(
            f"vtinfer attention backend: kv_cache_dtype must be one of {', '.join(supported_kv_cache_dtypes())}; "
            f"got {kv_cache_dtype!r} (vtinfer has no kernels for it{': ' + why if why else ''}; unset VTINFER_VLLM "
            "to use vLLM's own backend)")
    info = vt.dtype_info(kv_cache_dtype)
    if kv_cache_dtype in vt.SLOT_DTYPES:  # TurboQuant, UltraQuant, NVFP4: one slot cache, vt.turboquant_*
        return "turboquant"
    if kv_cache_dtype in vt.PER_TOKEN_HEAD_DTYPES:
        return "per_token_head"
    return "fp8" if info.is_fp8 else "plain"


def supported_kv_cache_dtypes() -> list[str]:
    """The ``--kv-cache-dtype`` values vLLM 0.32 names and vtinfer stores, in vLLM's order."""
    from vllm.config.cache import CacheDType
    from typing import get_args

    return [d for d in get_args(CacheDType) if d == "auto" or d in vt.KV_CACHE_DTYPES]


def content_bytes(kv_cache_dtype: str, head_size: int, head_size_v: int, elem_size: int) -> int | None:
    """C in bytes of one (head, token) cell when it is not vLLM's dense ``(D + D_v) * elem``; else None."""
    fam = family(kv_cache_dtype)
    if fam == "per_token_head":
        hk, hv = head_size, head_size_v
        if vt.dtype_info(kv_cache_dtype).elem_bits == 4:
            hk, hv = hk // 2, hv // 2
        return (hk + hv) * elem_size + 2 * 4
    if fam == "turboquant":
        if head_size_v != head_size:
            raise NotImplementedError(
                f"vtinfer attention backend: TurboQuant needs head_size_v == head_size; got {head_size_v} and "
                f"{head_size}")
        return vt.turboquant_slot_bytes(kv_cache_dtype, head_size)
    return None


class KVViews(NamedTuple):
    """One layer's cache as vtinfer's ops take it (all views of vLLM's page, never copies)."""

    key_cache: Any  # [num_blocks, block_size, H_kv, D | d + 4]; TurboQuant: the slot cache
    value_cache: Any  # same; TurboQuant: the same slot cache
    k_scale_cache: Any  # float32 [num_blocks, block_size, H_kv] (per-token-head only)
    v_scale_cache: Any


def kv_views(kv_cache: Any, kv_cache_dtype: str, head_size: int) -> KVViews:
    """Split vLLM's logical ``[num_blocks, H_kv, block_size, C]`` layer view (see the module docstring)."""
    torch = __import__("torch")
    fam = family(kv_cache_dtype)
    nhd = kv_cache.transpose(1, 2)
    if fam == "turboquant":  # one slot cache holds K and V; vtinfer's functional forms take it as both
        return KVViews(nhd, nhd, None, None)
    if fam != "per_token_head":
        return KVViews(nhd[..., :head_size], nhd[..., head_size:], None, None)
    half = nhd.shape[-1] // 2
    d_bytes = (half - 4 // nhd.element_size()) * nhd.element_size()
    if d_bytes % 4 or nhd.stride(-1) != 1:
        raise NotImplementedError(
            f"vtinfer attention backend: {kv_cache_dtype} needs the row bytes of a head ({d_bytes}) to be a multiple "
            f"of 4 (the fp32 scale after it must be aligned); head_size {head_size} is not supported")
    f32 = nhd.view(torch.uint8).view(torch.float32)  # [nb, bs, H, C_bytes / 4]
    return KVViews(nhd[..., :half], nhd[..., half:], f32[..., d_bytes // 4], f32[..., (half * nhd.element_size() + d_bytes) // 4])
