"""Paged attention on the CPU: a thin wrapper that documents the C function."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vtinfer import _C, _cuda_ops, _framework, _nvfp4, _tq_ops
from vtinfer._dtypes import OWN_PATH_DTYPES


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
    seqused_k: Any = None,
    block_table: Any = None,
    cu_seqlens_k: Any = None,
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
    q_descale: Any = None,
    q_dtype: str | None = None,
    return_softmax_lse: bool = False,
    k_scale_cache: Any = None,
    v_scale_cache: Any = None,
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
    cu_seqlens_k : int32 array, shape (B + 1,), optional
        Non-paged varlen (vLLM's prefill form): with neither ``block_table``
        nor ``seqused_k``, ``k``/``v`` are packed ``(total_k, H_kv, D)`` and
        sequence ``b`` reads rows ``cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1``
        (no copy: the packed arrays are read as a paged cache of block size
        1 with the identity block table).
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
        would read codes as numbers). A TurboQuant format
        (``vt.TURBOQUANT_DTYPES``) takes its uint8 slot cache as ``k`` and
        None or the same cache as ``v``, and runs
        :func:`vtinfer.turboquant_attention` (no descales or scale caches).
    out : array, shape (total_q, H, D), optional
        Written in place; q's dtype, contiguous D, no overlap with q/k/v.
        Rows outside the sequences are not touched.
    return_lse : bool
        Also return the log-sum-exp, float32 shape (H, total_q)
        (FlashAttention's layout; the sink is included; ``-inf`` for a row
        with nothing to attend to).
    num_threads : int, optional
        Default ``VTINFER_NUM_THREADS`` or the CPU affinity count.
    q_descale : float or array, shape (), (H_kv,) or (B, H_kv), optional
        fp8 queries only (ignored otherwise, as FlashAttention-3 ignores
        it): the logits are computed from ``decode(q) * q_descale[b, g]``.
    q_dtype : {"fp8", "fp8_e4m3", "fp8_e5m2"}, optional
        Names the format of uint8 query codes (default: the fp8
        ``kv_cache_dtype``). float8 q (ml_dtypes or torch) needs neither.
        An fp8 q (FlashAttention-3's rule) gives a bfloat16 ``out``.
    return_softmax_lse : bool
        vLLM's name for ``return_lse``.
    k_scale_cache, v_scale_cache : array, float32 (num_blocks, block_size, H_kv), optional
        Required for ``kv_cache_dtype="int8_per_token_head"`` (k, v int8
        codes) or ``"fp8_per_token_head"`` (uint8 / float8_e4m3fn codes), None
        otherwise: the per-(token, KV head) scales as vLLM passes them (any
        strides; ``PagedKVCache.k_scale_cache(layer)``). Key j's K scale
        multiplies its logit, its V scale its softmax weight;
        ``k_descale``/``v_descale`` must be None then.

    Returns
    -------
    out, or (out, lse) when ``return_lse``.

    CUDA tensors (DLPack device type 2, e.g. torch CUDA tensors) run on the
    device through the CUDA arm (``vtinfer._cuda``; ``num_threads`` is
    ignored there).
    """
    fn = "flash_attn_varlen_func"
    return_lse = bool(return_lse or return_softmax_lse)
    # the formats with their own front doors (their own modules): slot caches (read in place), NVFP4 on vLLM's two
    # page side views (a copy); NVFP4 on one slot cache (v None or k itself) is a slot format like any other
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in OWN_PATH_DTYPES:
        own = _nvfp4 if _nvfp4.is_pages(kv_cache_dtype, k, v) else _tq_ops
        return own.attention(
            q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            alibi_slopes=alibi_slopes, s_aux=s_aux, kv_cache_dtype=kv_cache_dtype, out=out, return_lse=return_lse,
            num_threads=num_threads, cu_seqlens_k=cu_seqlens_k, q_dtype=q_dtype, k_descale=k_descale,
            v_descale=v_descale, q_descale=q_descale, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    if cu_seqlens_k is not None or (block_table is None and seqused_k is None):
        if seqused_k is not None or block_table is not None:
            raise ValueError(
                f"{fn}: cu_seqlens_k must not be combined with seqused_k/block_table (vLLM's rule: the paged form "
                "takes seqused_k and block_table, the packed form cu_seqlens_k); got both"
            )
        if cu_seqlens_k is None:
            raise TypeError(f"{fn}: seqused_k and block_table (paged) or cu_seqlens_k (packed) must be given; got none")
    elif block_table is None or seqused_k is None:
        missing = "block_table" if block_table is None else "seqused_k"
        raise TypeError(f"{fn}: block_table and seqused_k must be given together (the paged form); {missing} missing")
    fp8_q = _fp8_query_format(q, q_dtype, kv_cache_dtype, fn)
    if _cuda_ops.is_cuda(q) and (cu_seqlens_k is not None or fp8_q is not None):
        raise NotImplementedError(f"{fn}: cu_seqlens_k and fp8 queries are not supported on CUDA tensors yet")
    # Arguments derived here from others the caller passed: a refusal that names a derived one is reworded
    # to name the caller's (the packed form's seqused_k is cu_seqlens_k's lengths; an fp8 q's q_descale is
    # folded into k_descale).
    renames: dict[str, str] = {}
    if cu_seqlens_k is not None:
        k, v, seqused_k, block_table = _packed_as_paged(k, v, cu_seqlens_q, cu_seqlens_k, fn)
        renames.update({"seqused_k": "cu_seqlens_k's sequence lengths", "block_table": "cu_seqlens_k"})
    if fp8_q is not None:
        if q_descale is not None and k_descale is None and v_descale is None:
            renames.update({"k_descale and v_descale": "q_descale", "k_descale": "q_descale"})
        q, k_descale = _dequantize_query(q, fp8_q, q_descale, k_descale, cu_seqlens_q, k, fn)
    if _cuda_ops.is_cuda(q):
        return _cuda_ops.flash_attn_varlen_func(q, k, v, **_paged_args(locals()))
    try:
        return _C.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, softcap=softcap, alibi_slopes=_f32(alibi_slopes, "alibi_slopes"),
            s_aux=_f32(s_aux, "s_aux"), k_descale=_f32(k_descale, "k_descale"), v_descale=_f32(v_descale, "v_descale"),
            kv_cache_dtype=kv_cache_dtype, out=out, return_lse=return_lse, num_threads=num_threads,
            k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    except (ValueError, TypeError, IndexError) as e:
        renamed = _in_the_callers_words(e, renames)
        if renamed is None:
            raise
        raise renamed from None


def _paged_args(scope: dict[str, Any]) -> dict[str, Any]:
    """The CUDA arm's keyword arguments: the paged form's, taken from the caller's resolved locals."""
    return {name: scope[name] for name in _PAGED_ARGS}


_PAGED_ARGS = ("cu_seqlens_q", "seqused_k", "block_table", "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal",
               "window_size", "softcap", "alibi_slopes", "s_aux", "k_descale", "v_descale", "kv_cache_dtype", "out",
               "return_lse", "num_threads", "k_scale_cache", "v_scale_cache")


def _in_the_callers_words(e: Exception, renames: dict[str, str]) -> Exception | None:
    """A refusal whose message names an argument derived from the caller's, reworded with the caller's name;
    None when it names none."""
    msg = str(e)
    new = msg
    for old in sorted(renames, key=len, reverse=True):
        new = re.sub(rf"(?<!\w){re.escape(old)}\b", renames[old], new)
    return None if new == msg else type(e)(new)


_FP8_Q_NAMES = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def _dtype_name(x: Any) -> str:
    d = getattr(x, "dtype", None)
    return str(d).removeprefix("torch.") if d is not None else ""


def _fp8_query_format(q: Any, q_dtype: str | None, kv_cache_dtype: str, fn: str) -> str | None:
    """'e4m3'/'e5m2' for an fp8 query (float8 dtype, or uint8 codes), else None."""
    if q_dtype is None and getattr(getattr(q, "dtype", None), "itemsize", 1) > 1:
        return None  # the common case, decided without formatting the dtype's name
    name = _dtype_name(q)
    implied = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(name)
    if q_dtype is not None and q_dtype not in _FP8_Q_NAMES:
        raise ValueError(f"{fn}: q_dtype must be 'fp8', 'fp8_e4m3' or 'fp8_e5m2'; got {q_dtype!r}")
    if implied is not None:
        if q_dtype is not None and _FP8_Q_NAMES[q_dtype] != implied:
            raise TypeError(f"{fn}: q of dtype {name} must be read with q_dtype 'fp8_{implied}'; got {q_dtype!r}")
        return implied
    if name == "uint8":
        if q_dtype is not None:
            return _FP8_Q_NAMES[q_dtype]
        if kv_cache_dtype in _FP8_Q_NAMES:
            return _FP8_Q_NAMES[kv_cache_dtype]
        raise TypeError(
            f"{fn}: q of uint8 codes must have q_dtype (or an fp8 kv_cache_dtype) naming the format; got neither"
        )
    if q_dtype is not None:
        raise TypeError(f"{fn}: q must hold fp8 codes (uint8 or float8) when q_dtype is given; got {name or type(q).__name__}")
    return None


def _index_array(x: Any, name: str, fn: str) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype != np.int32 or a.ndim != 1:
        raise TypeError(f"{fn}: {name} must be a 1-D int32 array; got {a.ndim}-D {a.dtype}")
    return a


def _packed_as_paged(k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, fn: str) -> tuple[Any, Any, Any, Any]:
    """Packed (total_k, H_kv, D) K/V as a paged cache of block size 1."""
    cu_k = _index_array(cu_seqlens_k, "cu_seqlens_k", fn)
    n_q = len(cu_seqlens_q)
    if len(cu_k) != n_q:
        raise ValueError(f"{fn}: cu_seqlens_k must have len(cu_seqlens_q) = {n_q} elements; got {len(cu_k)}")
    for name, x in (("k", k), ("v", v)):
        if len(getattr(x, "shape", ())) != 3:
            raise ValueError(f"{fn}: {name} must have 3 dimensions (total_k, H_kv, D) with cu_seqlens_k; got shape "
                             f"{tuple(getattr(x, 'shape', ()))}")
    total_k = int(k.shape[0])
    if tuple(v.shape[:1]) != (total_k,):
        raise ValueError(f"{fn}: v must have k's {total_k} rows; got {int(v.shape[0])}")
    if len(cu_k) and (cu_k[0] < 0 or np.any(np.diff(cu_k) < 0) or cu_k[-1] > total_k):
        raise ValueError(
            f"{fn}: cu_seqlens_k must be non-decreasing from >= 0 and end <= total_k = {total_k}; got {cu_k.tolist()}"
        )
    if total_k == 0:
        raise ValueError(f"{fn}: k must have at least one row with cu_seqlens_k; got 0")
    lens = np.diff(cu_k).astype(np.int32)
    width = max(int(lens.max()) if len(lens) else 1, 1)
    table = np.zeros((len(lens), width), np.int32)
    for b, (start, n) in enumerate(zip(cu_k[:-1].tolist(), lens.tolist())):
        table[b, :n] = np.arange(start, start + n, dtype=np.int32)
    return k[:, None], v[:, None], np.ascontiguousarray(lens), table


def _dequantize_query(
    q: Any, fmt: str, q_descale: Any, k_descale: Any, cu_seqlens_q: Any, k: Any, fn: str
) -> tuple[np.ndarray, Any]:
    """fp8 q decoded exactly to bfloat16; q_descale folded into k_descale (both scale the logits)."""
    import ml_dtypes

    if hasattr(q, "detach"):
        q = q.detach().contiguous()
    codes = _C.fp8_dequantize(q, 1.0, fmt, dtype=ml_dtypes.bfloat16, num_threads=1)  # q is tiny: no pool wake-up
    if q_descale is None:
        return codes, k_descale
    batch = len(cu_seqlens_q) - 1
    h_kv = int(k.shape[2])
    qd = _f32(q_descale, "q_descale")
    assert qd is not None
    if qd.shape not in ((), (1,), (h_kv,), (batch, h_kv)):
        raise ValueError(
            f"{fn}: q_descale must have shape (), ({h_kv},) or ({batch}, {h_kv}) (num_seqs, num_kv_heads); got {qd.shape}"
        )
    if not np.all(np.isfinite(qd) & (qd > 0)):
        raise ValueError(f"{fn}: q_descale must be finite and > 0; got {qd.ravel()[:8].tolist()}")
    kd = np.float32(1.0) if k_descale is None else _f32(k_descale, "k_descale")
    try:
        merged = np.broadcast_to(np.asarray(kd, np.float32), (batch, h_kv)) * np.broadcast_to(qd, (batch, h_kv))
    except ValueError as e:
        raise ValueError(f"{fn}: k_descale must have shape (), ({h_kv},) or ({batch}, {h_kv}); got {np.shape(kd)}") from e
    return codes, np.ascontiguousarray(merged, np.float32)
