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
from vtinfer._dtypes import VLLM_KV_CACHE_DTYPES
from vtinfer._tq_ops import _refuse_given, as_numpy

#: vLLM's NVFP4 page formats (nvfp4_ds_mla, its MLA latent entry, is not a per-head page).
NVFP4_DTYPES: tuple[str, ...] = tuple(n for n in VLLM_KV_CACHE_DTYPES if n.startswith("nvfp4")
                                      and not n.endswith("_ds_mla"))


def is_nvfp4(kv_cache_dtype: Any) -> bool:
    return isinstance(kv_cache_dtype, str) and kv_cache_dtype in NVFP4_DTYPES


class _Pages:
    """The data / scale views of one side of an NVFP4 cache, checked against vLLM's layout."""

    def __init__(self, cache: Any, fn: str, name: str, head_size: int | None):
        a = as_numpy(cache, name, fn)
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 4:
            raise ValueError(f"{fn}: {name} must be a uint8 array [num_blocks, block_size, H_kv, D / 2 + D / 16] "
                             f"(vLLM's NVFP4 page view); got {getattr(a, 'dtype', type(a).__name__)} with "
                             f"{getattr(a, 'ndim', 0)} dimensions")
        nb, bs, h, full = (int(x) for x in a.shape)
        if full % 9 or (full * 16 // 9) % 16:
            raise ValueError(f"{fn}: {name}'s last dimension must be D / 2 + D / 16 for a head size D that is a "
                             f"multiple of 16 (9, 18, 36, 72, 144, ...); got {full}")
        d = full * 16 // 9
        if head_size is not None and d != head_size:
            raise ValueError(f"{fn}: {name}'s last dimension {full} is D / 2 + D / 16 for D = {d}, but the rows "
                             f"have head size {head_size}")
        if d % 64 or bs % 4:
            raise ValueError(f"{fn}: NVFP4 pages need a head size that is a multiple of 64 and a block size that is "
                             f"a multiple of 4 (the V scales' 4-token swizzle); got head size {d}, block size {bs}")
        st = a.strides
        hnd = st[1:] == (full, bs * full, 1)
        if not hnd and st[1:] != (h * full, full, 1):
            raise ValueError(f"{fn}: {name} must be a dense NVFP4 side, HND strides (page, {full}, {bs * full}, 1) "
                             f"or NHD (page, {h * full}, {full}, 1); got {st}")
        side = h * bs * full
        if nb > 1 and st[0] < side:
            raise ValueError(f"{fn}: {name}'s page stride {st[0]} is below one side's {side} bytes")
        self.a, self.nb, self.bs, self.h, self.d, self.hnd, self.side = a, nb, bs, h, d, hnd, side
        ast = np.lib.stride_tricks.as_strided
        w = a.flags.writeable
        cut = h * bs * d // 2
        flat = ast(a, (nb, side), (st[0], 1), writeable=w)
        # views straight onto the caller's bytes (a reshape could silently copy)
        inner = lambda n: (bs * n, n) if hnd else (h * n, n)  # noqa: E731
        order = (nb, h, bs) if hnd else (nb, bs, h)
        self.data = ast(flat, order + (d // 2,), (st[0],) + inner(d // 2) + (1,), writeable=w)
        self.scales = ast(flat[:, cut:], order + (d // 16,), (st[0],) + inner(d // 16) + (1,), writeable=w)

    def at(self, b: Any, t: Any, h: Any) -> tuple:
        """Index tuple of (block, token, head) into a plane of this side's order."""
        return (b, h, t) if self.hnd else (b, t, h)

    def base(self) -> int:
        return int(self.a.__array_interface__["data"][0])


def _sides(key_cache: Any, value_cache: Any, fn: str, head_size: int | None) -> tuple[_Pages, _Pages]:
    k = _Pages(key_cache, fn, "key_cache", head_size)
    v = _Pages(value_cache, fn, "value_cache", head_size)
    if (k.a.shape, k.a.strides) != (v.a.shape, v.a.strides):
        raise ValueError(f"{fn}: value_cache must have key_cache's shape and strides (the two sides of one NVFP4 "
                         f"cache); got {v.a.shape} {v.a.strides} and {k.a.shape} {k.a.strides}")
    if k.nb:  # the sides of block b: [base, base + side) of each, pages st[0] apart
        dist, page = v.base() - k.base(), k.a.strides[0]
        d = dist % page if k.nb > 1 and page > 0 else abs(dist)
        if (k.nb > 1 and not (k.side <= d <= page - k.side)) or (k.nb == 1 and d < k.side):
            raise ValueError(f"{fn}: key_cache and value_cache overlap (their {k.side}-byte sides must be disjoint)")
    return k, v


def _swizzle(t: np.ndarray, s_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of V scale s of token t in the head's [block_size, S] scale matrix."""
    s = np.arange(s_count)
    g = s_count // 4
    return 4 * (t[:, None] // 4) + s[None, :] // g, (s[None, :] % g) * 4 + t[:, None] % 4


def _scale(x: Any, fn: str, name: str) -> float:
    from vtinfer._cache_ops import _scalar

    v = _scalar(x, fn, name)
    if v is None or not (float(np.float32(v)) > 0.0) or not np.isfinite(np.float32(v)):
        raise ValueError(f"{fn}: {name} must be finite and > 0 for an NVFP4 cache (the global scale is its "
                         f"reciprocal); got {x!r}")
    return float(v)


def store(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, kv_cache_dtype: str,
          k_scale: Any, v_scale: Any, *, layout: str | None, k_scale_cache: Any, v_scale_cache: Any) -> None:
    """``reshape_and_cache_flash`` for an NVFP4 ``kv_cache_dtype`` (see the module docstring)."""
    fn = "reshape_and_cache_flash"
    _refuse_given(fn, kv_cache_dtype, "NVFP4 keeps its block scales inside each page",
                  k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
    if layout is not None:
        raise ValueError(f"{fn}: layout must be None for kv_cache_dtype '{kv_cache_dtype}' (the views' strides say "
                         f"HND or NHD); got {layout!r}")
    kn, vn = as_numpy(key, "key", fn), as_numpy(value, "value", fn)
    for name, x in (("key", kn), ("value", vn)):
        if not isinstance(x, np.ndarray) or x.ndim != 3:
            raise ValueError(f"{fn}: {name} must have shape [num_tokens, H_kv, head_size]; got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if kn.shape != vn.shape:
        raise ValueError(f"{fn}: value must have key's shape {kn.shape}; got {vn.shape}")
    k, v = _sides(key_cache, value_cache, fn, int(kn.shape[2]))
    if kn.shape[1] != k.h:
        raise ValueError(f"{fn}: key has {kn.shape[1]} KV heads, key_cache {k.h}")
    ks, vs = _scale(k_scale, fn, "k_scale"), _scale(v_scale, fn, "v_scale")
    slots = np.asarray(as_numpy(slot_mapping, "slot_mapping", fn))
    if slots.ndim != 1 or slots.dtype != np.int64 or len(slots) > kn.shape[0]:
        raise ValueError(f"{fn}: slot_mapping must be int64 [n] with n <= num_tokens ({kn.shape[0]}); got "
                         f"{slots.dtype} {slots.shape}")
    if np.any(slots >= k.nb * k.bs):
        i = int(np.argmax(slots >= k.nb * k.bs))
        raise IndexError(f"{fn}: slot_mapping[{i}] must be < num_blocks * block_size = {k.nb * k.bs}; got "
                         f"{int(slots[i])}")
    tok = np.nonzero(slots >= 0)[0]
    if len(tok) == 0:
        return
    # the later token wins a duplicated slot
    last = len(tok) - 1 - np.unique(slots[tok][::-1], return_index=True)[1]
    tok = tok[np.sort(last)]
    four = kv_cache_dtype.endswith("4over6")
    kc, ksf = _C.nvfp4_quantize(np.ascontiguousarray(kn[tok]), ks, four_over_six=four)
    vc, vsf = _C.nvfp4_quantize(np.ascontiguousarray(vn[tok]), vs, four_over_six=four)
    b, t = slots[tok] // k.bs, slots[tok] % k.bs
    heads = np.arange(k.h)[None, :]
    k.data[k.at(b[:, None], t[:, None], heads)] = kc
    k.scales[k.at(b[:, None], t[:, None], heads)] = ksf
    v.data[v.at(b[:, None], t[:, None], heads)] = vc
    row, col = _swizzle(t, k.d // 16)  # [n, S]
    idx = (b[:, None, None], heads[:, :, None], row[:, None, :]) if v.hnd else \
        (b[:, None, None], row[:, None, :], heads[:, :, None])
    v.scales[idx + (col[:, None, :],)] = vsf


def read_blocks(key_cache: Any, value_cache: Any, blocks: Any, k_scale: Any, v_scale: Any,
                fn: str = "nvfp4_read_blocks") -> tuple[np.ndarray, np.ndarray]:
    """K and V of ``blocks`` (int array) dequantized: float32 ``[n, block_size, H_kv, D]`` each."""
    k, v = _sides(key_cache, value_cache, fn, None)
    ks, vs = _scale(k_scale, fn, "k_scale"), _scale(v_scale, fn, "v_scale")
    blocks = np.asarray(blocks, np.int64)
    if blocks.size and (blocks.min() < 0 or blocks.max() >= k.nb):
        raise IndexError(f"{fn}: blocks must be in [0, {k.nb}); got {int(blocks.min())} .. {int(blocks.max())}")
    S = k.d // 16

    def nhd(x: np.ndarray, side: _Pages) -> np.ndarray:
        return x.transpose(0, 2, 1, 3) if side.hnd else x

    kd, kscales = nhd(k.data[blocks], k), nhd(k.scales[blocks], k)
    vd, vsw = nhd(v.data[blocks], v), nhd(v.scales[blocks], v)  # [n, bs, H, .]
    row, col = _swizzle(np.arange(k.bs), S)  # [bs, S]
    vscales = vsw[:, row, :, col]  # [bs, S, n, H]: advanced indices first
    vscales = np.ascontiguousarray(vscales.transpose(2, 0, 3, 1))
    kout = _C.nvfp4_dequantize(np.ascontiguousarray(kd), np.ascontiguousarray(kscales), ks)
    vout = _C.nvfp4_dequantize(np.ascontiguousarray(vd), vscales, vs)
    return kout, vout


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
    side = _Pages(k, fn, "k", None)
    bt, read, used = referenced_blocks(as_numpy(block_table, "block_table", fn), as_numpy(seqused_k, "seqused_k", fn),
                                       side.nb, side.bs, fn)
    kf, vf = read_blocks(k, v, used, 1.0 if k_descale is None else k_descale,
                         1.0 if v_descale is None else v_descale, fn)
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
