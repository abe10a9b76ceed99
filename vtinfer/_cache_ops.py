"""vLLM's cache ops on the CPU: thin wrappers that document the C functions.

Names, argument order and meaning follow ``vllm/_custom_ops.py`` of the
pinned vLLM release (0.33.0). Every function checks all of its arguments
(and every index) before it writes anything; a refused call raises an
exception naming the argument and leaves the outputs unchanged. Arrays are
NumPy arrays (ml_dtypes for bfloat16/float8) or CPU torch tensors (DLPack),
never copied except where a docstring says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vtinfer import _C

__all__ = ["concat_and_cache_mla", "convert_fp8", "cp_gather_cache", "gather_and_maybe_dequant_cache",
           "mask_empty_context_lse", "merge_attn_states", "swap_blocks"]


def _scalar(x: Any, fn: str, name: str) -> Any:
    """A one-element tensor/array scale as a Python float (numbers pass through)."""
    if x is None or isinstance(x, (bool, int, float)):
        return x
    try:
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"{fn}: {name} must be a real number or a one-element array; got {type(x).__name__}") from e
    if a.size != 1 or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(
            f"{fn}: {name} must be a real number or a one-element array; got shape {a.shape} of {a.dtype}"
        )
    return float(a.reshape(()))


def _extent(x: Any) -> int | None:
    """Bytes of x's allocation from x's first element onwards (None: unknown)."""
    if isinstance(x, np.ndarray):
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        try:
            _, hi = np.lib.array_utils.byte_bounds(root) if hasattr(np.lib, "array_utils") else np.byte_bounds(root)
        except (AttributeError, TypeError, ValueError):
            return None
        return int(hi - x.__array_interface__["data"][0])
    if hasattr(x, "untyped_storage") and hasattr(x, "storage_offset"):
        try:
            return int(x.untyped_storage().nbytes() - x.storage_offset() * x.element_size())
        except (RuntimeError, TypeError):
            return None
    return None


def swap_blocks(src: Any, dst: Any, block_size_in_bytes: int, block_mapping: Any, *, num_threads: int | None = None) -> None:
    """Copy blocks of bytes from ``src`` to ``dst`` (vLLM's ``swap_blocks``).

    For each row ``(s, d)`` of ``block_mapping``, in order, the
    ``block_size_in_bytes`` bytes starting ``s * src.stride(0)`` bytes
    (times the element size) after ``src``'s first element are copied to
    the bytes starting ``d * dst.stride(0)`` bytes after ``dst``'s, as
    vLLM's kernel addresses blocks. So the V half ``kv[:, 1]`` of a
    ``(num_blocks, 2, ...)`` cache with ``block_size_in_bytes`` of one V
    block moves V blocks only, and ``kv[:, 0]`` with
    ``kv.element_size() * kv.stride(0)`` moves K and V.

    Parameters
    ----------
    src, dst : array or CPU tensor, shape (num_blocks, ...)
        Any dtype; ``dst`` writable. Refused (ValueError naming it): a 0-d
        view, ``block_size_in_bytes`` past its block stride, blocks whose
        elements do not fill one run of bytes (e.g. ``x[:, ::2]``), a
        negative stride. A block id must be below ``shape[0]`` and the
        copied bytes must lie inside the allocation it views (IndexError
        naming ``block_mapping[i][0]`` / ``[1]``, nothing copied).
    block_size_in_bytes : int
        > 0; vLLM passes ``src.element_size() * src.stride(0)``.
    block_mapping : int64 array, shape (num_pairs, 2)
        ``(src block, dst block)`` pairs.
    num_threads : int, optional
        Default ``VTINFER_NUM_THREADS`` or the CPU affinity count.
    """
    return _C.swap_blocks(
        src, dst, block_size_in_bytes, block_mapping, src_extent=_extent(src), dst_extent=_extent(dst),
        num_threads=num_threads,
    )


def convert_fp8(
    output: Any, input: Any, scale: float = 1.0, kv_dtype: str = "fp8", *, num_threads: int | None = None
) -> None:
    """Quantize to fp8 codes or dequantize them (vLLM's ``convert_fp8``).

    The direction follows the dtypes: float32/float16/bfloat16 ``input``
    into a code ``output`` stores ``encode(x / scale)`` (round to nearest
    even, saturating, as :func:`vtinfer.fp8_quantize`); a code ``input``
    into a float ``output`` stores ``decode(code) * scale``. Two float
    arrays are converted plainly (``kv_dtype="auto"``).

    Parameters
    ----------
    output : array or CPU tensor, shape (...)
        Written; C-contiguous; uint8 or ml_dtypes/torch float8 for codes.
    input : array or CPU tensor, shape (...) (output's shape)
        Read; a non-contiguous NumPy array is copied first.
    scale : float
        Finite, > 0 (one-element arrays and tensors are accepted).
    kv_dtype : {"fp8", "fp8_e4m3", "fp8_e5m2", "auto"}
        The code format (``"fp8"`` is e4m3); a float8 array must match it.
    """
    return _C.convert_fp8(output, input, _scalar(scale, "convert_fp8", "scale"), kv_dtype, num_threads=num_threads)


def gather_and_maybe_dequant_cache(
    src_cache: Any,
    dst: Any,
    block_table: Any,
    cu_seq_lens: Any,
    token_to_seq: Any,
    num_tokens: int,
    kv_cache_dtype: str,
    scale: Any,
    seq_starts: Any = None,
    *,
    num_threads: int | None = None,
) -> None:
    """Gather a batch's paged cache entries into contiguous rows, dequantizing fp8.

    Token ``t < num_tokens`` belongs to sequence ``b = token_to_seq[t]`` at
    position ``pos = t - cu_seq_lens[b] + seq_starts[b]`` (``seq_starts``
    0 when None) and ``dst[t] = src_cache[block_table[b, pos // block_size],
    pos % block_size]``, decoded times ``scale`` for an fp8 cache. A token
    with ``t >= cu_seq_lens[b + 1]`` is skipped (its row untouched).

    Parameters
    ----------
    src_cache : array, shape (num_blocks, block_size, *entry)
        fp8 codes (uint8/float8, ``kv_cache_dtype`` naming the format) or,
        with ``"auto"``, dst's dtype. The entry dimensions must collapse to
        rows of a contiguous last dimension (NHD ``[H, D]``, an HND view,
        MLA ``[576]``).
    dst : array, shape (tokens, *entry)
        float32/float16/bfloat16 for fp8; written.
    block_table : int32 array, shape (batch, max_blocks)
    cu_seq_lens : int32 array, shape (batch + 1,)
    token_to_seq : int32 array, shape (>= num_tokens,)
    num_tokens : int
    kv_cache_dtype : {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
    scale : float or one-element array
        Dequantization scale (ignored for ``"auto"``).
    seq_starts : int32 array, shape (batch,), optional
    """
    fn = "gather_and_maybe_dequant_cache"
    return _C.gather_and_maybe_dequant_cache(
        src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype,
        _scalar(scale, fn, "scale"), seq_starts, num_threads=num_threads,
    )


def cp_gather_cache(
    src_cache: Any,
    dst: Any,
    block_table: Any,
    cu_seq_lens: Any,
    batch_size: int,
    seq_starts: Any = None,
    *,
    num_threads: int | None = None,
) -> None:
    """Gather a batch's paged cache entries into contiguous rows (vLLM's ``cp_gather_cache``).

    For each sequence ``b < batch_size`` and ``i < cu_seq_lens[b+1] -
    cu_seq_lens[b]``: ``dst[cu_seq_lens[b] + i] = src_cache[block_table[b,
    p // block_size], p % block_size]`` with ``p = i + seq_starts[b]``
    (``seq_starts`` may be any offset, not only a block multiple). The
    bytes are copied: ``dst`` has ``src_cache``'s dtype (fp8 codes stay codes).

    Parameters
    ----------
    src_cache : array, shape (num_blocks, block_size, *entry)
    dst : array, shape (>= cu_seq_lens[batch_size], *entry)
    block_table : int32 array, shape (>= batch_size, max_blocks)
    cu_seq_lens : int32 array, shape (>= batch_size + 1,)
    batch_size : int
    seq_starts : int32 array, shape (>= batch_size,), optional
    """
    return _C.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts,
                              num_threads=num_threads)


def merge_attn_states(
    output: Any,
    prefix_output: Any,
    prefix_lse: Any,
    suffix_output: Any,
    suffix_lse: Any,
    output_lse: Any = None,
    prefill_tokens_with_context: int | None = None,
    output_scale: Any = None,
    *,
    num_threads: int | None = None,
) -> None:
    """Merge two partial attention results by their log-sum-exps (vLLM's ``merge_attn_states``).

    Per token ``t`` and head ``h``, with ``p = prefix_lse[h, t]`` and ``s =
    suffix_lse[h, t]``, each ``+inf`` read as ``-inf`` (FlashAttention-2's
    value for an empty row), ``m = max(p, s)``::

        out     = prefix_output * e^(p-m) / z + suffix_output * e^(s-m) / z,  z = e^(p-m) + e^(s-m)
        out_lse = log(z) + m

    A row with both sides empty (``m = -inf``) gets ``out = 0`` and
    ``out_lse = -inf``; tokens ``t >= prefill_tokens_with_context`` copy the
    suffix (``out_lse = suffix_lse`` as given). Computed in float32.

    Parameters
    ----------
    output : array, shape (num_tokens, num_heads, head_size)
        Written: float32/float16/bfloat16, or float8 (e4m3fn/e5m2) with
        ``output_scale`` (``encode(out / output_scale)``, saturating).
    prefix_output, suffix_output : array, shape (num_tokens, num_heads, head_size)
        One float dtype; any token/head strides with a contiguous last dim.
    prefix_lse, suffix_lse : float32 array, shape (num_heads, num_tokens)
        Any strides (a transposed ``[num_tokens, num_heads]`` array works).
    output_lse : float32 array, shape (num_heads, num_tokens), optional
        Written.
    prefill_tokens_with_context : int, optional
        Default num_tokens (every token merges).
    output_scale : float or one-element array, optional
    """
    fn = "merge_attn_states"
    return _C.merge_attn_states(
        output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse, prefill_tokens_with_context,
        _scalar(output_scale, fn, "output_scale"), num_threads=num_threads,
    )


def concat_and_cache_mla(
    kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any, kv_cache_dtype: str, scale: Any, skip_scale: bool = False
) -> None:
    """Store MLA latents and rope keys into a paged cache (vLLM's ``concat_and_cache_mla``).

    For token ``t`` with slot ``s = slot_mapping[t]`` (negative: skipped),
    the entry ``e = kv_cache[s // block_size, s % block_size]`` becomes:

    - ``"auto"``: ``kv_c[t]`` then ``k_pe[t]`` (``kv_cache`` has their dtype);
    - ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"``: the codes of
      ``(kv_c[t] ++ k_pe[t]) / scale`` (round to nearest even, saturating);
    - ``"fp8_ds_mla"`` (DeepSeek's 656-byte entry; ``kv_lora_rank`` 512,
      ``pe_dim`` 64, float16/bfloat16 input): per tile ``j`` of 128
      ``kv_c`` elements ``s_j = max(max|x| / 448, FLT_MIN)`` in float32,
      bytes ``[128j, 128j + 128)`` the e4m3 codes of ``x / s_j``, bytes
      ``[512, 528)`` the four ``s_j`` as float32, bytes ``[528, 656)``
      ``k_pe``'s 64 16-bit values unchanged (``scale`` is not used).

    Tokens are stored in order (a repeated slot keeps the last token).
    Everything is checked before the first byte is written.

    Parameters
    ----------
    kv_c : array, shape (>= num_tokens, kv_lora_rank)
        float32/float16/bfloat16, a contiguous last dimension.
    k_pe : array, shape (>= num_tokens, pe_dim)
        ``kv_c``'s dtype.
    kv_cache : array, shape (num_blocks, block_size, entry)
        Written. ``entry`` is ``kv_lora_rank + pe_dim`` elements (``"auto"``:
        kv_c's dtype; fp8: uint8 or the matching float8) or 656 uint8 bytes
        (``"fp8_ds_mla"``).
    slot_mapping : int64 array, shape (num_tokens,)
    kv_cache_dtype : {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"}
    scale : float or one-element array
        Finite, > 0.
    skip_scale : bool
        Store fp8 codes of the values themselves (``scale`` read as 1), as
        vLLM asks when the layer's scale is exactly 1.0.
    """
    return _C.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
                                   _scalar(scale, "concat_and_cache_mla", "scale"), skip_scale)


def mask_empty_context_lse(lse: Any, query_start_loc: Any, context_start_loc: Any) -> None:
    """Set the LSE of queries whose context chunk is empty to ``-inf`` (vLLM's ``mask_empty_context_lse``).

    For each request ``r`` with ``context_start_loc[r] ==
    context_start_loc[r + 1]``, ``lse[:, query_start_loc[r]:query_start_loc[r
    + 1]] = -inf``; other entries are untouched. A chunked-prefill context
    pass leaves such rows undefined; ``-inf`` makes :func:`merge_attn_states`
    take the suffix alone.

    Parameters
    ----------
    lse : float32 array, shape (num_heads, num_tokens)
        Written in place; any strides.
    query_start_loc : int32 array, shape (num_reqs + 1,)
        Non-decreasing, from >= 0, at most ``num_tokens``.
    context_start_loc : int32 array, shape (num_reqs + 1,)
    """
    return _C.mask_empty_context_lse(lse, query_start_loc, context_start_loc)
