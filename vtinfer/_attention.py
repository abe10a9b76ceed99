"""Paged attention on the CPU: a thin wrapper that documents the C function."""

from __future__ import annotations

from typing import Any

import numpy as np

from vtinfer import _C, _cuda_ops, _framework


def _f32(x: Any, name: str) -> np.ndarray | None:
    """Small float arguments (scales, slopes, sinks) as float32 arrays."""
    if x is None:
        return None
    try:
        if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
            x = np.from_dlpack(x.detach().float() if hasattr(x, "detach") else x)
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"flash_attn_varlen_func: {name} must be real numbers; got {type(x).__name__}") from e


@_framework.follows("q")
def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    *,
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    s_aux: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    kv_cache_dtype: str = "auto",
    out: Any = None,
    return_lse: bool = False,
    num_threads: int | None = None,
) -> Any:
    """Paged attention with the meaning of vLLM's FlashAttention backend.

    For sequence ``b`` with ``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]``
    queries and ``k_len = seqused_k[b]`` keys, query ``i`` sits at key
    position ``p = k_len - q_len + i`` (bottom-right alignment). Head ``h``
    reads KV head ``h // (H // H_kv)``. The logit of key ``j`` is
    ``(q . K_j) * softmax_scale * k_descale``, then ``softcap *
    tanh(s / softcap)`` when ``softcap > 0``, then ``- alibi_slopes[h] *
    |j - p|`` (equal to ``slope * (j - p)`` on every causally visible key).
    Keys outside the causal mask or ``window_size`` are dropped. A sink
    ``s_aux[h]`` joins the softmax denominator and carries no value. The
    weighted sum of V is multiplied by ``v_descale``. Accumulation is
    float32; ``out`` is rounded (nearest even) to q's dtype.

    Parameters
    ----------
    q : array, shape (total_q, H, D)
        float32, float16 or bfloat16 (NumPy or DLPack). A non-contiguous
        NumPy array is copied first.
    k, v : array, shape (num_blocks, block_size, H_kv, D)
        Paged caches, never copied: NHD, or HND given as a permuted view
        (any strides with a contiguous D). float32/float16/bfloat16, or fp8
        codes (uint8 or ml_dtypes float8) with ``kv_cache_dtype`` naming
        the format.
    cu_seqlens_q : int32 array, shape (B + 1,)
        Non-decreasing, ``cu_seqlens_q[0] >= 0``, ``cu_seqlens_q[B] <= total_q``.
    seqused_k : int32 array, shape (B,)
        Keys of each sequence; at most ``max_blocks * block_size``.
    block_table : int32 array, shape (B, max_blocks)
        Block ids in ``[0, num_blocks)`` (only the first
        ``ceil(seqused_k[b] / block_size)`` of a row are read).
    max_seqlen_q, max_seqlen_k : int, optional
        Accepted for vLLM compatibility; when given, must be at least the
        real maxima.
    softmax_scale : float, optional
        Default ``1 / sqrt(D)``.
    causal : bool
        Bottom-right causal mask (then a sequence needs ``k_len >= q_len``).
    window_size : (int, int)
        ``(left, right)``, -1 meaning unlimited; ``(w - 1, 0)`` keeps w keys.
    softcap : float
        0 disables.
    alibi_slopes : array, shape (H,), optional
    s_aux : array, shape (H,), optional
        Sink logits.
    k_descale, v_descale : float or array, shape (), (H_kv,) or (B, H_kv), optional
        Finite, > 0; converted to float32.
    kv_cache_dtype : {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", ...}
        Must name the fp8 format for a code cache ("auto" is refused: it
        would read codes as numbers).
    out : array, shape (total_q, H, D), optional
        Written in place; q's dtype, contiguous D, no overlap with q/k/v.
        Rows outside the sequences are not touched.
    return_lse : bool
        Also return the log-sum-exp, float32 shape (H, total_q)
        (FlashAttention's layout; the sink is included; ``-inf`` for a row
        with nothing to attend to).
    num_threads : int, optional
        Default ``VTINFER_NUM_THREADS`` or the CPU affinity count.

    Returns
    -------
    out, or (out, lse) when ``return_lse``.

    CUDA tensors (DLPack device type 2, e.g. torch CUDA tensors) run on the
    device through the CUDA arm (``vtinfer._cuda``; ``num_threads`` is
    ignored there).
    """
    if _cuda_ops.is_cuda(q):
        return _cuda_ops.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, s_aux=s_aux, k_descale=k_descale,
            v_descale=v_descale, kv_cache_dtype=kv_cache_dtype, out=out, return_lse=return_lse,
        )
    return _C.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q=cu_seqlens_q,
        seqused_k=seqused_k,
        block_table=block_table,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=_f32(alibi_slopes, "alibi_slopes"),
        s_aux=_f32(s_aux, "s_aux"),
        k_descale=_f32(k_descale, "k_descale"),
        v_descale=_f32(v_descale, "v_descale"),
        kv_cache_dtype=kv_cache_dtype,
        out=out,
        return_lse=return_lse,
        num_threads=num_threads,
    )
