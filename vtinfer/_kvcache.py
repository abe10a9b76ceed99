"""The paged KV cache and vLLM's store functions: thin wrappers over the C core.

One store kernel (``csrc/core/kv_store.c``) serves :meth:`PagedKVCache.store`,
:func:`reshape_and_cache_flash` and :func:`reshape_and_cache`. It checks every
argument and every slot before it writes a byte, so a refused call leaves the
caches unchanged, and it converts each head row with the codec row kernels, so
fp8 codes equal :func:`vtinfer.fp8_quantize` of the same row and scale, bit for
bit.
"""

from __future__ import annotations

import html
import operator
import re
from typing import Any

import numpy as np

from vtinfer import _C, _cuda_ops, _framework, _nvfp4, _tq_ops
from vtinfer._dtypes import OWN_PATH_DTYPES

__all__ = ["KVLayer", "PagedKVCache", "reshape_and_cache", "reshape_and_cache_flash"]


def _layer_index(layer: Any, num_layers: int, fn: str) -> int:
    """A layer number as an int: ints and NumPy integers (``__index__``), never bool."""
    if isinstance(layer, (bool, np.bool_)) or not hasattr(type(layer), "__index__"):
        raise TypeError(f"{fn}: layer must be an int; got {type(layer).__name__}")
    index = operator.index(layer)
    if not 0 <= index < num_layers:
        raise IndexError(f"{fn}: layer must be in [0, {num_layers}); got {layer!r}")
    return index


class KVLayer:
    """One layer of a :class:`PagedKVCache`: K and V views and a DLPack export.

    ``torch.from_dlpack(layer)`` sees ``[2, num_blocks, block_size, H_kv, D]``
    (NHD; ``[2, num_blocks, H_kv, block_size, D]`` for HND), K first, the same
    memory as the cache (uint8 for fp8 caches; for ``int4_per_token_head``
    uint8 with a last dimension of ``D / 2``, two codes per byte), as vLLM's
    FlashAttention backend lays out one layer's ``kv_cache``.
    """

    def __init__(self, cache: PagedKVCache, layer: int) -> None:
        layer = _layer_index(layer, cache.num_layers, "PagedKVCache.layer")
        self.cache = cache
        self.index = layer

    @property
    def key(self) -> np.ndarray:
        """Zero-copy view of this layer's K storage."""
        return self.cache.key_cache(self.index)

    @property
    def value(self) -> np.ndarray:
        """Zero-copy view of this layer's V storage."""
        return self.cache.value_cache(self.index)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None):
        if copy:
            raise BufferError("KVLayer.__dlpack__: copy must be None or False; got True")
        return self.cache._dlpack(self.index, -1, max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __repr__(self) -> str:
        return f"KVLayer({self.index} of {self.cache!r})"

    def _repr_html_(self) -> str:
        c = self.cache
        ks, vs = c.layer_scales(self.index)
        rows = [
            ("layer", f"{self.index} of {c.num_layers}"),
            ("dtype", c.dtype),
            ("layout", c.layout),
            ("K / V shape", " x ".join(map(str, c.key_cache(self.index).shape))),
            ("bytes (K + V)", f"{c.nbytes // c.num_layers:,}"),
            *_scale_rows(c.dtype, ks, vs),
        ]
        return _html_table("KVLayer", rows)


class PagedKVCache(_C.PagedKVCache):
    """A vLLM-compatible paged KV cache in CPU memory.

    Parameters
    ----------
    num_layers, num_blocks, block_size, num_kv_heads, head_size : int
        Geometry, each > 0. Sizes are computed in 64 bits; a product that
        overflows raises ValueError.
    dtype : str
        A storage dtype of the dtype table: ``"float32"``, ``"float16"``,
        ``"bfloat16"``, ``"fp8"``/``"fp8_e4m3"``, ``"fp8_e5m2"`` (or their
        NumPy names), a per-token-head format (``vt.PER_TOKEN_HEAD_DTYPES``:
        code planes plus float32 ``[num_blocks, block_size, H_kv]`` scale
        planes, :meth:`k_scale_cache` / :meth:`v_scale_cache`), or
        ``"auto"`` with ``model_dtype=``. ``"int4_per_token_head"`` packs
        two codes per byte: its K/V views are uint8 with a last dimension
        of ``D / 2``; ``head_size`` must be even, at most 4096, with a
        rotation block (largest power-of-two divisor) of at most 1024. A slot
        format (``vt.SLOT_DTYPES``: TurboQuant, UltraQuant, Octave, NVFP4) keeps K and
        V of a (token, KV head) in one uint8 slot: :meth:`key_cache` and
        :meth:`value_cache` are the same ``[num_blocks, block_size, H_kv,
        slot_bytes]`` view (vLLM's one slot cache per layer). An NVFP4 slot
        (``vt.NVFP4_DTYPES``) is ``[K codes D / 2 | K scales D / 16 | V codes
        D / 2 | V scales D / 16]``, the bytes vLLM's NVFP4 page holds per
        (token, KV head); its global scales are ``k_scale`` / ``v_scale``.
    layout : {"NHD", "HND"}
        ``NHD`` stores each layer's K (and V) as ``[num_blocks, block_size,
        H_kv, D]`` (vLLM's default); ``HND`` as ``[num_blocks, H_kv,
        block_size, D]``.
    k_scale, v_scale : float or array_like
        fp8 scales: a number, one per layer (``[num_layers]``) or one per
        layer and KV head (``[num_layers, num_kv_heads]``); finite and > 0
        (ValueError otherwise). Stored as float32; readable and settable as
        arrays through the attributes of the same names. NVFP4's global
        scales (the checkpoint's ``k_scale`` / ``v_scale``): a number or one
        per layer. Plain dtypes ignore them.
    model_dtype : str, optional
        The model's dtype, required when ``dtype="auto"``.
    rope_dim : int, optional
        The model's rotary dims, which size an Octave slot (a multiple of 64 in
        ``[0, head_size]``); default ``head_size`` (vLLM's answer without a
        ``partial_rotary_factor``). Other dtypes ignore it.

    Notes
    -----
    The storage is one 64-byte aligned, zero-filled allocation; each layer's
    K and V start on a 64-byte boundary. ``page_bytes`` (one block over all
    layers, K and V) is linear in the element size: an fp8 page is exactly
    half a bfloat16 page. While a view from :meth:`key_cache`,
    :meth:`value_cache` or a DLPack export is alive, :meth:`release` raises
    BufferError, as ``array.array`` does when resized under a view.
    """

    @classmethod
    def from_checkpoint(
        cls,
        model: Any,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_memory: int | str | None = None,
        *,
        tensor_parallel_size: int = 1,
        rank: int = 0,
        kv_cache_dtype_skip_layers: Any = None,
    ) -> PagedKVCache:
        """A cache for a checkpoint, as vLLM would build it.

        The KV dtype is resolved from ``kv_cache_dtype`` and the checkpoint
        (``vt.resolve_kv_cache_dtype``), the geometry read from its HF
        config, the number of blocks planned (``num_blocks`` wins, then
        ``kv_cache_memory`` bytes or a string such as ``"8GiB"``, else a
        fallback; see ``vt.plan_kv_cache``), and for fp8 the per-layer (or
        per-KV-head) ``k_scale``/``v_scale`` loaded from its safetensors
        as vLLM loads them (``vt.kv_cache_args``).

        Parameters
        ----------
        model : str, os.PathLike or vt.Checkpoint
            The checkpoint directory.
        tensor_parallel_size, rank : int
            The cache of one rank as vLLM shards it: its KV heads and its
            slice of per-head scales; ``kv_cache_memory`` is per GPU.
        kv_cache_dtype_skip_layers : list of str, optional
            vLLM's option; NotImplementedError when it leaves layers at
            different dtypes (one cache holds one dtype).
        """
        from vtinfer.sizing import kv_cache_args

        return cls(**kv_cache_args(model, kv_cache_dtype, block_size, num_blocks, kv_cache_memory,
                                   tensor_parallel_size=tensor_parallel_size, rank=rank,
                                   kv_cache_dtype_skip_layers=kv_cache_dtype_skip_layers))

    def layer(self, layer: int) -> KVLayer:
        """One layer as an object with ``.key``, ``.value`` and ``__dlpack__``."""
        return KVLayer(self, layer)

    def store(self, layer: int, key: Any, value: Any, slot_mapping: Any, *, num_threads: int | None = None) -> None:
        """Store tokens into one layer (vLLM's ``reshape_and_cache_flash`` semantics).

        Parameters
        ----------
        layer : int
            In ``[0, num_layers)`` (IndexError otherwise).
        key, value : array_like, shape (num_tokens, num_kv_heads, head_size)
            float32, float16 or bfloat16, both the same dtype; any strides
            with a contiguous last dimension (a NumPy array without one is
            copied; a DLPack tensor without one is refused).
        slot_mapping : array_like of int64, shape (n,)
            ``n <= num_tokens``; token ``t`` goes to block ``slot // block_size``
            at offset ``slot % block_size``; a negative slot skips the token;
            a slot ``>= num_blocks * block_size`` raises IndexError naming the
            token and nothing is written. When two tokens name one slot the
            later token's values are kept.
        num_threads : int, optional
            Threads to use; default ``VTINFER_NUM_THREADS`` or the CPU affinity.
            A slot format's slots hold the bytes :func:`vtinfer.turboquant_store`
            writes (the cache's own codebook and, for Octave, its ``rope_dim``).
        """
        return super().store(layer, key, value, slot_mapping, num_threads=num_threads)

    @_framework.follows("slots")
    def gather(self, layer: int, slots: Any, *, rotated: bool = False) -> tuple[Any, Any]:
        """Read slots of one layer back as float32 ``(k, v)``, each ``[n, H_kv, D]``.

        Torch tensors when ``slots`` is a torch tensor, NumPy arrays otherwise.
        Dequantized: fp8 codes times the layer's scale; per-token-head codes
        times their (token, head) scale. ``int4_per_token_head`` stores its
        codes in the Hadamard-rotated basis (vLLM's ``single_rht``): by
        default each row ``y = (code - zp) * scale`` is rotated back,
        ``s * (H_b y) / b`` per block of ``b`` (the largest power-of-two
        divisor of D), so the result approximates the stored K/V; the
        inverse butterfly runs in float32 (``log2(b)`` rounded additions per
        element, then an exact ``/ b``). ``rotated=True`` returns ``y``
        itself, the rotated values the read works on (ValueError for any
        other dtype). A slot format reads as :func:`vtinfer.turboquant_gather`
        (K in the basis its row names: rotated for TurboQuant's MSE presets and
        UltraQuant).
        """
        return super().gather(layer, slots, rotated=rotated)

    def layer_scales(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V scales of one layer: float32 of shape () or ``[num_kv_heads]``."""
        layer = _layer_index(layer, self.num_layers, "PagedKVCache.layer_scales")
        out = []
        for s in (self.k_scale, self.v_scale):
            out.append(np.asarray(s if s.ndim == 0 else s[layer], dtype=np.float32))
        return out[0], out[1]

    def attention(
        self,
        layer: int,
        q: Any,
        *,
        cu_seqlens_q: Any,
        seqused_k: Any,
        block_table: Any,
        **kwargs: Any,
    ) -> Any:
        """Paged attention of ``q`` over one layer: :func:`vtinfer.flash_attn_varlen_func`.

        The layer's K/V views are passed as the caches (an HND cache as the
        permuted ``[num_blocks, block_size, H_kv, D]`` view), with
        ``kv_cache_dtype`` set to the cache's dtype and, for fp8, the
        layer's scales as ``k_descale`` / ``v_descale`` (unless given); for
        a per-token-head dtype its scale planes as ``k_scale_cache`` /
        ``v_scale_cache`` (``int4_per_token_head``: the ``D / 2``-byte code
        views, queries rotated and the output rotated back by the read;
        ``causal=True`` only, as in vLLM); a slot format's one slot cache as
        both ``k`` and ``v`` (:func:`vtinfer.turboquant_attention`'s read).
        Other keyword arguments go to ``flash_attn_varlen_func`` unchanged.

        Parameters
        ----------
        layer : int
            In ``[0, num_layers)``.
        q : array, shape (total_q, H, D)
        cu_seqlens_q : int32 array, shape (B + 1,)
        seqused_k : int32 array, shape (B,)
        block_table : int32 array, shape (B, max_blocks)
        """
        from vtinfer import _attention  # the attention issue's module

        k, v = self.key_cache(layer), self.value_cache(layer)
        if self.layout == "HND":
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        from vtinfer import dtype_info

        kind = dtype_info(self.dtype).scale_kind
        if kind == "tensor":  # fp8: the layer's scales as descales
            ks, vs = self.layer_scales(layer)
            kwargs.setdefault("k_descale", ks)
            kwargs.setdefault("v_descale", vs)
            kwargs.setdefault("kv_cache_dtype", self.dtype)
        elif kind == "token_head":  # per-token-head: the layer's scale planes
            kwargs.setdefault("k_scale_cache", self.k_scale_cache(layer))
            kwargs.setdefault("v_scale_cache", self.v_scale_cache(layer))
            kwargs.setdefault("kv_cache_dtype", self.dtype)
        elif kind == "slot":  # one slot cache, K and V together
            v = k
            kwargs.setdefault("kv_cache_dtype", self.dtype)
            if dtype_info(self.dtype).global_scale:  # NVFP4: the layer's global scales
                ks, vs = self.layer_scales(layer)
                kwargs.setdefault("k_descale", ks)
                kwargs.setdefault("v_descale", vs)
        return _attention.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table, **kwargs
        )

    def __repr__(self) -> str:
        """The C repr with each tensor scale's values (or shape, min and max) beside its mode."""
        text = super().__repr__()
        m = re.search(r"k_scale=([\w-]+), v_scale=([\w-]+)", text)
        if m is None:  # per-token-head formats: the repr says where their scales are
            return text
        return text.replace(m.group(0), f"k_scale={_scale_text(self.k_scale)} ({m.group(1)}), "
                                        f"v_scale={_scale_text(self.v_scale)} ({m.group(2)})")

    def _repr_html_(self) -> str:
        rows = [
            ("dtype", self.dtype),
            ("layout", self.layout),
            ("layers x blocks x block_size", f"{self.num_layers} x {self.num_blocks} x {self.block_size}"),
            ("KV heads x head size", f"{self.num_kv_heads} x {self.head_size}"),
            ("page bytes", f"{self.page_bytes:,}"),
            ("total bytes", f"{self.nbytes:,}"),
            *_scale_rows(self.dtype, self.k_scale, self.v_scale),
        ]
        return _html_table("PagedKVCache", rows)


def _scale_rows(dtype: str, ks: np.ndarray, vs: np.ndarray) -> list[tuple[str, str]]:
    """The scale rows of a repr: the per-tensor scales, or where a per-token-head format keeps its own."""
    from vtinfer import dtype_info

    info = dtype_info(dtype)
    kind = info.scale_kind
    if kind == "slot" and info.global_scale:  # NVFP4: block scales in the slot, the layer's global scales here
        return [("scales", "e4m3 per 16 elements inside each (token, KV head) slot, times the global scale"),
                ("k_scale", _scale_summary(ks)), ("v_scale", _scale_summary(vs))]
    if kind == "slot":
        return [("scales", "inside each (token, KV head) slot, K and V in one slot cache per layer")]
    if kind != "token_head":
        return [("k_scale", _scale_summary(ks)), ("v_scale", _scale_summary(vs))]
    rows = [("scales", "per (token, KV head), float32 planes k_scale_cache / v_scale_cache, made at store")]
    if info.family == "int4_per_token_head":
        rows.append(("codes", "4-bit, two per byte, Hadamard-rotated; zero point in each scale's low 4 bits"))
    return rows


def _scale_text(a: Any) -> str:
    """A scale for a one-line repr: the value, up to 8 values, or shape, min and max."""
    a = np.asarray(a, np.float32)
    if a.ndim == 0:
        return f"{float(a):.6g}"
    if a.ndim == 1 and a.size <= 8:
        return "[" + ", ".join(f"{float(x):.6g}" for x in a) + "]"
    return f"<shape {list(a.shape)}, min {float(a.min()):.6g}, max {float(a.max()):.6g}>"


def _scale_summary(a: np.ndarray) -> str:
    """A scale array for a repr: the values when there are at most 8 per-layer
    scales, else (per-head scales, or many layers) shape, min and max."""
    a = np.asarray(a)
    if a.ndim <= 1 and a.size <= 8:
        return np.array2string(a)
    return f"shape {list(a.shape)}, min {float(a.min()):.6g}, max {float(a.max()):.6g}"


def _html_table(caption: str, rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table><caption>{html.escape(caption)}</caption>{body}</table>"


def reshape_and_cache_flash(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str,
    k_scale: Any,
    v_scale: Any,
    *,
    layout: str | None = None,
    num_threads: int | None = None,
    k_scale_cache: Any = None,
    v_scale_cache: Any = None,
) -> None:
    """vLLM's ``reshape_and_cache_flash`` on caller-owned arrays, same argument order.

    Parameters
    ----------
    key, value : array_like, shape (num_tokens, H_kv, D)
        float32, float16 or bfloat16, the same dtype; stride(0) is honoured
        (the last dimension must be contiguous; a NumPy array without one is
        copied).
    key_cache, value_cache : ndarray or DLPack tensor, shape (num_blocks, block_size, H_kv, D)
        Written in place, never copied. Any strides with a contiguous last
        dimension, so vLLM's HND tensors (this shape with permuted strides)
        work as they are. With ``layout="HND"`` the shape is instead
        ``(num_blocks, H_kv, block_size, D)``. dtype: key's dtype for
        ``"auto"``, the named dtype for ``"float32"``/``"float16"``/
        ``"bfloat16"``, uint8 or the matching ml_dtypes float8 for fp8.
    slot_mapping : array_like of int64, shape (n,)
        ``n <= num_tokens`` tokens are stored; a negative slot skips its
        token; a slot past the cache raises IndexError and nothing is
        written. Duplicate slots: the later token wins.
    kv_cache_dtype : str
        ``"auto"``, ``"float16"``, ``"bfloat16"``, ``"float32"``,
        ``"fp8"``/``"fp8_e4m3"`` (e4m3fn), ``"fp8_e5m2"``, or a
        per-token-head format (``vt.PER_TOKEN_HEAD_DTYPES``), or a TurboQuant
        format (``vt.TURBOQUANT_DTYPES``): then ``key_cache`` is the uint8 slot
        cache ``[num_blocks, block_size, H_kv, vt.turboquant_slot_bytes(...)]``,
        ``value_cache`` None or that same cache, ``k_scale`` / ``v_scale`` 1.0
        (the scales are in each slot), and :func:`vtinfer.turboquant_store`
        does the work.
    k_scale, v_scale : float or array_like
        One element or ``[H_kv]`` (per-head scales); used by fp8 caches only,
        where ``code = encode(x / scale)`` (vLLM's CUDA semantics); ignored
        by the per-token-head formats.
    layout : {None, "NHD", "HND"}
        How to read the caches' shape (not in vLLM's signature).
    num_threads : int, optional
        Threads to use.
    k_scale_cache, v_scale_cache : ndarray or DLPack tensor, shape (num_blocks, block_size, H_kv), optional
        float32, written in place, any strides: the per-(token, head) scales
        of a per-token-head format (required there, None otherwise), as
        vLLM's ``triton_reshape_and_cache_flash_per_token_head_quant`` takes
        them. The code caches are then int8 (``int8_per_token_head``) or
        uint8 / float8_e4m3fn (``fp8_per_token_head``), with a last
        dimension of D, or D + 4 as vLLM's padded views over its inline
        page (those 4 bytes, where vLLM's scale views point, are not
        written through the code caches).

    CUDA tensors (DLPack device type 2) are stored on the device by the
    CUDA arm (``vtinfer._cuda``), with the same checks and bytes.
    """
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype in OWN_PATH_DTYPES:
        if _nvfp4.is_pages(kv_cache_dtype, key_cache, value_cache):
            _nvfp4.store(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                         layout=layout, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
                         num_threads=num_threads)
        else:
            _tq_ops.store(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                          layout=layout, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)
        return
    if _cuda_ops.is_cuda(key):
        scales = {} if k_scale_cache is None and v_scale_cache is None else {
            "k_scale_cache": k_scale_cache, "v_scale_cache": v_scale_cache}
        _cuda_ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                          k_scale, v_scale, layout=layout, **scales)
        return
    _C.reshape_and_cache_flash(
        key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
        layout=layout, num_threads=num_threads, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
    )


def reshape_and_cache(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str,
    k_scale: Any,
    v_scale: Any,
    *,
    num_threads: int | None = None,
) -> None:
    """vLLM's ``reshape_and_cache`` for the x-split paged layout.

    Parameters
    ----------
    key, value : array_like, shape (num_tokens, H_kv, D)
        As in :func:`reshape_and_cache_flash`.
    key_cache : ndarray or DLPack tensor, shape (num_blocks, H_kv, D // x, block_size, x)
        ``x`` is read from the shape (vLLM uses ``16 // element_size``); its
        last dimension must be contiguous.
    value_cache : ndarray or DLPack tensor, shape (num_blocks, H_kv, D, block_size)
    slot_mapping, kv_cache_dtype, k_scale, v_scale, num_threads
        As in :func:`reshape_and_cache_flash`.
    """
    _C.reshape_and_cache(
        key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, num_threads=num_threads
    )
