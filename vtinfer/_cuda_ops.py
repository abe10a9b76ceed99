"""The CUDA arm's Python side: defaults of vLLM's signatures, then vtinfer._cuda.

Arrays are CUDA tensors through DLPack (torch CUDA tensors); nothing here
imports torch. ``out`` and ``lse`` are allocated with the tensor's own
``new_empty`` when not given.
"""

from __future__ import annotations

import math
from typing import Any


def is_cuda(x: Any) -> bool:
    """True when ``x`` lives on a CUDA device (DLPack device type 2)."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) == 2
    except Exception:  # noqa: BLE001 - a producer that cannot say is not CUDA
        return False


def _cuda():
    try:
        from vtinfer import _cuda
    except ImportError as e:
        raise NotImplementedError("vtinfer was built without the CUDA arm (VTINFER_CUDA=1 needs nvcc)") from e
    return _cuda


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            *, layout=None, k_scale_cache=None, v_scale_cache=None) -> None:
    """vLLM's store on CUDA tensors; same contract as vtinfer.reshape_and_cache_flash
    (the per-token-head formats are refused: no CUDA kernel yet)."""
    scales = {} if k_scale_cache is None and v_scale_cache is None else {
        "k_scale_cache": k_scale_cache, "v_scale_cache": v_scale_cache}
    _cuda().reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                    k_scale, v_scale, layout=layout, **scales)


def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, seqused_k, block_table, max_seqlen_q=None, max_seqlen_k=None,
                           softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           s_aux=None, k_descale=None, v_descale=None, kv_cache_dtype="auto", out=None,
                           return_lse=False, validate=True):
    """Paged attention on CUDA tensors; same contract as vtinfer.flash_attn_varlen_func.

    ``max_seqlen_q`` / ``max_seqlen_k`` size the grid (as FlashAttention);
    when omitted they are read from the index arrays (a device-to-host
    copy). ``validate=False`` skips the host-side checks of the index
    arrays (vLLM's behaviour; the benchmark's kernel timing).
    """
    if max_seqlen_q is None:
        cq = cu_seqlens_q.tolist()
        max_seqlen_q = max((b - a for a, b in zip(cq, cq[1:])), default=0)
    if max_seqlen_k is None:
        max_seqlen_k = max(seqused_k.tolist(), default=0)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = q.new_empty(q.shape)
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=_f32_of(q)) if return_lse else None
    _cuda().flash_attn_varlen_func(q, k, v, cu_seqlens_q, seqused_k, block_table, out, lse, int(max_seqlen_q),
                                   int(max_seqlen_k), float(softmax_scale), bool(causal), int(window_size[0]),
                                   int(window_size[1]), float(softcap), alibi_slopes, s_aux, k_descale, v_descale,
                                   kv_cache_dtype, bool(validate))
    return (out, lse) if return_lse else out


def _f32_of(t):
    import sys

    torch = sys.modules.get("torch")  # the tensor's own library, already imported by the caller
    return torch.float32 if torch is not None else "float32"
