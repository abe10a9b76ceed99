"""TurboQuant through vLLM's functional forms: ``reshape_and_cache_flash`` and ``flash_attn_varlen_func``.

A TurboQuant page holds K and V of one (token, KV head) together in one uint8
slot (``vt.turboquant_slot_bytes``), so these forms take that slot cache as
``key_cache`` (``k``) and either the same cache or None as ``value_cache``
(``v``): vLLM's TurboQuant backend hands its one cache tensor to both. The
work is done by :func:`vtinfer.turboquant_store` and
:func:`vtinfer.turboquant_attention`; this module maps the arguments, refuses
the ones TurboQuant has no meaning for (scales live inside each slot) by
name, and brings torch tensors to NumPy and back.
"""

from __future__ import annotations

import re

from typing import Any

import ml_dtypes
import numpy as np

from vtinfer import _framework
from vtinfer._dtypes import SLOT_DTYPES, dtype_info


def is_turboquant(kv_cache_dtype: Any) -> bool:
    """Whether a ``kv_cache_dtype`` argument names a slot format (TurboQuant or UltraQuant: the table's slots)."""
    return isinstance(kv_cache_dtype, str) and kv_cache_dtype in SLOT_DTYPES


def _same_cache(a: Any, b: Any) -> bool:
    """``b`` is ``a`` or another view of exactly the same elements (pointer, shape, strides)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        ia, ib = a.__array_interface__, b.__array_interface__
        return (ia["data"][0], a.shape, a.strides, a.dtype) == (ib["data"][0], b.shape, b.strides, b.dtype)
    if hasattr(a, "data_ptr") and hasattr(b, "data_ptr"):
        return (a.data_ptr(), tuple(a.shape), tuple(a.stride()), a.dtype) == \
            (b.data_ptr(), tuple(b.shape), tuple(b.stride()), b.dtype)
    return False


def _value_cache_is_key_cache(key_cache: Any, value_cache: Any, fn: str, k_name: str, v_name: str,
                              kv_cache_dtype: str) -> None:
    if value_cache is not None and not _same_cache(key_cache, value_cache):
        raise ValueError(f"{fn}: {v_name} must be None or {k_name} itself for kv_cache_dtype '{kv_cache_dtype}' "
                         f"(one slot cache holds K and V); got another array")


def _unit_scale(x: Any, name: str, fn: str, kv_cache_dtype: str) -> None:
    """K/V scales have no meaning for TurboQuant (each slot carries its own): only 1.0 is accepted."""
    if x is None:
        return
    try:
        a = np.asarray(x.detach().float().cpu() if hasattr(x, "detach") else x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{fn}: {name} must be a number; got {type(x).__name__}") from e
    if a.size == 0 or not np.all(a == 1.0):
        shown = a.reshape(-1)[:4].tolist() if a.size else "an empty array"
        raise ValueError(f"{fn}: {name} must be 1.0 for kv_cache_dtype '{kv_cache_dtype}' (TurboQuant computes its "
                         f"scales per slot); got {shown}")


SCALES_IN_SLOT = "TurboQuant keeps its scales inside each slot"


def _refuse_given(fn: str, kv_cache_dtype: str, why: str, **given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{fn}: {name} must be None for kv_cache_dtype '{kv_cache_dtype}' ({why}); got "
                             f"{type(value).__name__}")


def as_numpy(x: Any, name: str, fn: str) -> Any:
    """A torch CPU tensor as a NumPy array on the same memory (bfloat16 as ml_dtypes); others unchanged."""
    torch = _framework.torch_of(x)
    if torch is None:
        return x
    if x.device.type != "cpu":
        raise ValueError(f"{fn}: {name} must be a CPU tensor for a TurboQuant kv_cache_dtype; got {x.device}")
    x = x.detach()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def store(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_cache_dtype: str,
          k_scale: Any, v_scale: Any, *, layout: str | None, k_scale_cache: Any, v_scale_cache: Any) -> None:
    """``reshape_and_cache_flash`` for a TurboQuant ``kv_cache_dtype`` (see the module docstring)."""
    from vtinfer._turboquant import turboquant_store

    fn = "reshape_and_cache_flash"
    _value_cache_is_key_cache(key_cache, value_cache, fn, "key_cache", "value_cache", kv_cache_dtype)
    if layout not in (None, "NHD"):
        raise ValueError(f"{fn}: layout must be None or 'NHD' for kv_cache_dtype '{kv_cache_dtype}' (slots are "
                         f"[num_blocks, block_size, H_kv, slot_bytes]); got {layout!r}")
    _refuse_given(fn, kv_cache_dtype, SCALES_IN_SLOT, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    if dtype_info(kv_cache_dtype).global_scale:  # NVFP4: k_scale / v_scale are the global scales
        from vtinfer._cache_ops import _scalar

        turboquant_store(key, value, key_cache, slot_mapping, kv_cache_dtype,
                         k_scale=_scalar(k_scale, fn, "k_scale"), v_scale=_scalar(v_scale, fn, "v_scale"))
        return
    _unit_scale(k_scale, "k_scale", fn, kv_cache_dtype)
    _unit_scale(v_scale, "v_scale", fn, kv_cache_dtype)
    turboquant_store(key, value, key_cache, slot_mapping, kv_cache_dtype)


def attention(q: Any, k: Any, v: Any, *, cu_seqlens_q: Any, seqused_k: Any, block_table: Any,
              softmax_scale: float | None, causal: bool, window_size: Any, softcap: float, alibi_slopes: Any,
              s_aux: Any, kv_cache_dtype: str, out: Any, return_lse: bool, num_threads: int | None,
              cu_seqlens_k: Any, q_dtype: Any, **scales: Any) -> Any:
    """``flash_attn_varlen_func`` for a TurboQuant ``kv_cache_dtype`` (see the module docstring).

    ``scales`` (descales, scale caches): arguments TurboQuant has no meaning for, refused by name when
    given, as are the packed form (``cu_seqlens_k``) and fp8 queries (``q_dtype``).
    """
    from vtinfer._turboquant import turboquant_attention

    fn = "flash_attn_varlen_func"
    _value_cache_is_key_cache(k, v, fn, "k", "v", kv_cache_dtype)
    _refuse_given(fn, kv_cache_dtype, "the paged form only: seqused_k and block_table", cu_seqlens_k=cu_seqlens_k)
    _refuse_given(fn, kv_cache_dtype, "queries are float32, float16 or bfloat16", q_dtype=q_dtype)
    global_scales = {}
    if dtype_info(kv_cache_dtype).global_scale:  # NVFP4: k_descale / v_descale are the layer's global scales
        global_scales = {"k_scale": scales.pop("k_descale", None), "v_scale": scales.pop("v_descale", None)}
    _refuse_given(fn, kv_cache_dtype, SCALES_IN_SLOT, **scales)
    if block_table is None or seqused_k is None:
        raise TypeError(f"{fn}: block_table and seqused_k must be given for kv_cache_dtype '{kv_cache_dtype}' (the "
                        f"paged form); got {'block_table' if block_table is None else 'seqused_k'} None")
    qn = as_numpy(q, "q", fn)
    dst = None
    if out is not None:
        dst = as_numpy(out, "out", fn)
        qd = getattr(qn, "dtype", None)
        if not isinstance(dst, np.ndarray) or dst.shape != getattr(qn, "shape", None) or dst.dtype != qd:
            raise ValueError(f"{fn}: out must be an array of q's shape {tuple(getattr(qn, 'shape', ()))} and dtype "
                             f"{qd}; got {getattr(dst, 'shape', None)} {getattr(dst, 'dtype', type(dst).__name__)}")
    try:
        res = turboquant_attention(
            qn, as_numpy(k, "k", fn), cu_seqlens_q=as_numpy(cu_seqlens_q, "cu_seqlens_q", fn),
            seqused_k=as_numpy(seqused_k, "seqused_k", fn), block_table=as_numpy(block_table, "block_table", fn),
            kv_cache_dtype=kv_cache_dtype, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, alibi_slopes=as_numpy(alibi_slopes, "alibi_slopes", fn),
            s_aux=as_numpy(s_aux, "s_aux", fn), return_lse=return_lse, num_threads=num_threads,
            **{n: as_numpy(x, n, fn) for n, x in global_scales.items()})
    except (ValueError, TypeError, IndexError, NotImplementedError) as e:  # in the caller's names: fn, k
        msg = re.sub(r"(?<!\w)kv_cache(?!\w)", "k", str(e).replace("turboquant_attention:", f"{fn}:", 1))
        if global_scales:  # NVFP4's global scales are this function's k_descale / v_descale
            msg = re.sub(r"(?<!\w)([kv])_scale(?!\w)", r"\1_descale", msg)
        raise type(e)(msg) from None
    o, lse = res if return_lse else (res, None)
    if dst is not None:
        np.copyto(dst, o)
        o = out
    return (o, lse) if return_lse else o
