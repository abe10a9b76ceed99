"""The CUDA arm's Python side: defaults of vLLM's signatures, then vtinfer._cuda.

Arrays are CUDA tensors through DLPack (torch CUDA tensors); nothing here
imports torch. vtinfer._cuda allocates ``out`` (when not given) and ``lse``
after its checks through ``_new_zeros`` (the tensor's own ``new_zeros``).
"""

from __future__ import annotations

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
        raise NotImplementedError("vtinfer was built without the CUDA arm (it is built where a GPU is present, or with VTINFER_CUDA=1; both need nvcc)") from e
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
                           return_lse=False, num_threads=None, k_scale_cache=None, v_scale_cache=None, validate=True):
    """Paged attention on CUDA tensors; same contract as vtinfer.flash_attn_varlen_func.

    Every argument is checked as on the CPU (one argument layer, the same
    exceptions and messages). ``max_seqlen_q`` / ``max_seqlen_k`` size the
    grid (as FlashAttention); when omitted they are read from the index
    arrays (a device-to-host copy). ``validate=False`` skips the host-side
    checks of the index arrays' values (vLLM's behaviour; the benchmark's
    kernel timing). ``num_threads`` is unused.
    """
    return _cuda().flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes, s_aux=s_aux, k_descale=k_descale, v_descale=v_descale,
        kv_cache_dtype=kv_cache_dtype, out=out, return_lse=return_lse, num_threads=num_threads,
        k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache, validate=validate)


def _new_zeros(like, shape, float32: bool):
    """Zeros on ``like``'s device made by its own library (``new_zeros``):
    the CUDA arm's ``out`` (like's dtype) and ``lse`` (float32), allocated
    after every argument check."""
    if not float32:
        return like.new_zeros(shape)
    import sys

    torch = sys.modules.get("torch")  # the tensor's own library, already imported by the caller
    return like.new_zeros(shape, dtype=torch.float32 if torch is not None else "float32")
