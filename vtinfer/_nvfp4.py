"""NVFP4 KV pages (``nvfp4`` / ``nvfp4_4over6``) through vLLM's functional forms.

vLLM 0.33 keeps an NVFP4 layer's cache as one uint8 tensor ``[num_blocks, 2 * H_kv, block_size,
full_dim]`` with ``full_dim = D / 2 + D / 16``: per page ``[K data | K scales | V data | V scales]``.
Each side (K or V) is ``H_kv * block_size * full_dim`` dense bytes: first the packed E2M1 codes
(``D / 2`` bytes per token and head), then the e4m3 block scales (``D / 16`` per token and head),
both in the side's order, head-major (HND) or token-major (NHD). The K scales are linear; the V
scales are in the 4-token swizzle of vLLM's SM100 store kernel: within a head's ``[block_size,
S]`` scale matrix (``S = D / 16``), scale ``s`` of token ``t`` sits at row
``4 * (t // 4) + s // (S / 4)``, column ``(s % (S / 4)) * 4 + t % 4``. vLLM hands its store the two
sides as views ``[num_blocks, block_size, H_kv, full_dim]`` (``kv_cache.transpose(1, 2)`` split
at ``H_kv``); so do these functions: ``key_cache`` / ``value_cache`` are those views (NumPy or CPU
torch, uint8), HND or NHD strides, read from their strides.

The codes are :func:`vtinfer.nvfp4_quantize`'s with the checkpoint's ``k_scale`` / ``v_scale``
(vLLM's global scale is their reciprocal). The read dequantizes the referenced blocks to float32
(``E2M1 * block scale * k_scale``) and runs the float32 attention over them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vtinfer import _C
from vtinfer._dtypes import NVFP4_DTYPES
from vtinfer._tq_ops import _refuse_given, as_numpy



def is_nvfp4(kv_cache_dtype: Any) -> bool:
    return isinstance(kv_cache_dtype, str) and kv_cache_dtype in NVFP4_DTYPES


def is_pages(kv_cache_dtype: Any, key_cache: Any, value_cache: Any) -> bool:
    """An NVFP4 call on vLLM's two page side views (this module), not on one slot cache (``value_cache`` None or
    ``key_cache`` itself: the slot formats' path, as ``PagedKVCache`` holds NVFP4)."""
    from vtinfer._tq_ops import _same_cache

    return is_nvfp4(kv_cache_dtype) and value_cache is not None and not _same_cache(key_cache, value_cache)


def _scale(x: Any, fn: str, name: str) -> float:
    from vtinfer._cache_ops import _scalar

    v = _scalar(x, fn, name)
    if v is None or not (float(np.float32(v)) > 0.0) or not np.isfinite(np.float32(v)):
        raise ValueError(f"{fn}: {name} must be finite and > 0 for an NVFP4 cache (the global scale is its "
                         f"reciprocal); got {x!r}")
    return float(v)


def store(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_cache_dtype: str,
          k_scale: Any, v_scale: Any, *, layout: str | None, k_scale_cache: Any, v_scale_cache: Any,
          num_threads: int | None = None) -> None:
    """``reshape_and_cache_flash`` for an NVFP4 ``kv_cache_dtype`` (see the module docstring)."""
    fn = "reshape_and_cache_flash"
    _refuse_given(fn, kv_cache_dtype, "NVFP4 keeps its block scales inside each page",
                  k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    if layout is not None:
        raise ValueError(f"{fn}: layout must be None for kv_cache_dtype '{kv_cache_dtype}' (the views' strides say "
                         f"HND or NHD); got {layout!r}")
    _C.nvfp4_store(key, value, key_cache, value_cache, slot_mapping, _scale(k_scale, fn, "k_scale"),
                   _scale(v_scale, fn, "v_scale"), four_over_six=kv_cache_dtype.endswith("4over6"),
                   num_threads=num_threads)


def read_blocks(key_cache: Any, value_cache: Any, blocks: Any, k_scale: Any, v_scale: Any, *,
                num_threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """K and V of ``blocks`` dequantized: float32 ``[n, block_size, H_kv, D]`` each."""
    return _C.nvfp4_read_pages(key_cache, value_cache, np.ascontiguousarray(blocks, np.int64), k_scale, v_scale,
                               num_threads=num_threads)


def attention(q: Any, k: Any, v: Any, *, cu_seqlens_q: Any, seqused_k: Any, block_table: Any,
              k_descale: Any, v_descale: Any, kv_cache_dtype: str, out: Any, return_lse: bool,
              num_threads: int | None, cu_seqlens_k: Any, q_dtype: Any, **kw: Any) -> Any:
    """``flash_attn_varlen_func`` for an NVFP4 ``kv_cache_dtype``: ``k`` / ``v`` the two side views,
    ``k_descale`` / ``v_descale`` the checkpoint's k_scale / v_scale (default 1.0); the referenced
    blocks are dequantized to float32 and read by the float32 attention."""
    from vtinfer._turboquant import referenced_blocks

    fn = "flash_attn_varlen_func"
    _refuse_given(fn, kv_cache_dtype, "the paged form only: seqused_k and block_table", cu_seqlens_k=cu_seqlens_k)
    _refuse_given(fn, kv_cache_dtype, "queries are float32, float16 or bfloat16", q_dtype=q_dtype,
                  q_descale=kw.pop("q_descale", None))
    _refuse_given(fn, kv_cache_dtype, "NVFP4 keeps its block scales inside each page",
                  k_scale_cache=kw.pop("k_scale_cache", None), v_scale_cache=kw.pop("v_scale_cache", None))
    if block_table is None or seqused_k is None:
        raise TypeError(f"{fn}: block_table and seqused_k must be given for kv_cache_dtype '{kv_cache_dtype}' (the "
                        f"paged form)")
    shape = tuple(getattr(k, "shape", ()))
    if len(shape) != 4:
        raise ValueError(f"{fn}: k must be an NVFP4 side view [num_blocks, block_size, H_kv, D / 2 + D / 16]; got "
                         f"{len(shape)} dimensions")
    bt, read, used = referenced_blocks(as_numpy(block_table, "block_table", fn), as_numpy(seqused_k, "seqused_k", fn),
                                       int(shape[0]), int(shape[1]), fn)
    kf, vf = read_blocks(k, v, used, _scale(1.0 if k_descale is None else k_descale, fn, "k_descale"),
                         _scale(1.0 if v_descale is None else v_descale, fn, "v_descale"), num_threads=num_threads)
    qn = as_numpy(q, "q", fn)
    res = _C.flash_attn_varlen_func(
        np.ascontiguousarray(np.asarray(qn, np.float32)), kf, vf, cu_seqlens_q=as_numpy(cu_seqlens_q, "cu_seqlens_q", fn),
        seqused_k=as_numpy(seqused_k, "seqused_k", fn),
        block_table=np.where(read, np.searchsorted(used, bt), 0).astype(np.int32), return_lse=return_lse,
        num_threads=num_threads, **{n: (as_numpy(x, n, fn) if n in ("alibi_slopes", "s_aux") else x)
                                    for n, x in kw.items()})
    o, lse = res if return_lse else (res, None)
    o = np.asarray(o).astype(np.asarray(qn).dtype)
    if out is not None:
        dst = as_numpy(out, "out", fn)
        if not isinstance(dst, np.ndarray) or dst.shape != o.shape or dst.dtype != o.dtype:
            raise ValueError(f"{fn}: out must be an array of q's shape {o.shape} and dtype {o.dtype}; got "
                             f"{getattr(dst, 'shape', None)} {getattr(dst, 'dtype', type(dst).__name__)}")
        np.copyto(dst, o)
        o = out
    return (o, lse) if return_lse else o
