"""vLLM 0.33's slot KV formats (TurboQuant, UltraQuant and Octave) on a caller-owned slot cache.

``turboquant_k8v4``, ``turboquant_4bit_nc``, ``turboquant_k3v4_nc``,
``turboquant_3bit_nc``, ``ultraquant_4bit``, ``octave_k3v4``, ``octave_k3v3``
and ``octave_k3v3_compact`` (``vt.SLOT_DTYPES``) keep K and V of one (token,
KV head) in one uint8 slot (``turboquant_slot_bytes``): the store
(``turboquant_store``) and the dequantized read (``turboquant_gather``) are C
(csrc/core/kv_slots.c with each format's codec, kv_store_tq.c, kv_store_uq.c
and kv_store_octave.c); the Lloyd-Max codebook TurboQuant's MSE presets index is
computed here, once per (head_size, bits), as vLLM computes it (float64, then
float32). The rules with vLLM's sources: .agents/specs/kv-formats.md.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from typing import Any

import numpy as np

from vtinfer import _C
from vtinfer._dtypes import SLOT_DTYPES, dtype_info


def _tq_info(kv_cache_dtype: Any, fn: str):
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in SLOT_DTYPES:
        raise ValueError(f"{fn}: kv_cache_dtype must be one of {', '.join(SLOT_DTYPES)}; got {kv_cache_dtype!r}")
    return dtype_info(kv_cache_dtype)


def _global_scales(k_scale: Any, v_scale: Any, fn: str) -> dict[str, Any]:
    """NVFP4's global scales for the binding: a number, or a one-element array / tensor, as a Python float (the
    binding checks the value, and refuses either for the rows without a global scale)."""
    from vtinfer._cache_ops import _scalar

    return {"k_scale": _scalar(k_scale, fn, "k_scale"), "v_scale": _scalar(v_scale, fn, "v_scale")}


def _head_size(head_size: Any, fn: str) -> int:
    """head_size as an int in [1, 65536] (NumPy integers accepted; bool and float refused)."""
    if isinstance(head_size, (bool, np.bool_)) or not hasattr(type(head_size), "__index__"):
        raise TypeError(f"{fn}: head_size must be an int; got {type(head_size).__name__}")
    d = operator.index(head_size)
    if d < 1:
        raise ValueError(f"{fn}: head_size must be a positive int; got {d}")
    if d > 65536:
        raise ValueError(f"{fn}: head_size must be <= 65536; got {d}")
    return d


def turboquant_slot_bytes(kv_cache_dtype: str, head_size: int, rope_dim: int | None = None) -> int:
    """Bytes of one (token, KV head) slot, as vLLM sizes it.

    TurboQuant (``TurboQuantConfig.slot_size_aligned``): ``[key part | value
    codes | fp16 value scale | fp16 value zero]`` rounded up to even; the key
    part is ``head_size`` e4m3 bytes (``turboquant_k8v4``) or
    ``ceil(head_size * key_bits / 8)`` index bytes and an fp16 norm.
    ``ultraquant_4bit``: ``head_size + 2 * head_size / 32`` (K codes, K
    scales, V codes, V scales; vLLM's ``ultraquant.format.slot_size``).
    Octave (``OctaveFormat.slot_bytes``): ``[K rotary codes rope_dim / 2 |
    K other codes (head_size - rope_dim) * 3 / 8 | V codes | fp16 scales]``,
    padded to 8 bytes (``octave_k3v3_compact``: no rotary part, padded to 4).

    ``rope_dim`` (the model's rotary dims, a multiple of 64 in ``[0,
    head_size]``) is read by the Octave formats only; None means
    ``head_size``, vLLM's answer for a config without a
    ``partial_rotary_factor``. The store and read take the rotary dims from
    the cache's slot width, which names them.
    """
    _tq_info(kv_cache_dtype, "turboquant_slot_bytes")
    return _C.dtype_slot_bytes(kv_cache_dtype, _head_size(head_size, "turboquant_slot_bytes"), rope_dim)


@functools.lru_cache(maxsize=32)
def _codebook(kv_cache_dtype: str, head_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids [2^bits], midpoints [2^bits - 1]) float32, read-only, for N(0, 1/head_size): vLLM's
    Lloyd-Max solve (centroids.py) as the C core runs it (``vt_tq_codebook``, the same one the paged cache
    holds; float64, the operations in the solve's order)."""
    cen, mids = _C.turboquant_codebook(kv_cache_dtype, head_size)
    cen.setflags(write=False)
    mids.setflags(write=False)
    return cen, mids


def turboquant_codebook(kv_cache_dtype: str, head_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The Lloyd-Max ``(centroids, midpoints)`` (float32, read-only) an MSE preset's keys index;
    ``turboquant_k8v4`` (fp8 keys) and ``ultraquant_4bit`` (FP4 codes) have none: ``(None, None)``."""
    info = _tq_info(kv_cache_dtype, "turboquant_codebook")
    if not info.needs_codebook:
        return None, None  # type: ignore[return-value]
    return _codebook(info.name, int(head_size))


def turboquant_store(key: Any, value: Any, kv_cache: Any, slot_mapping: Any, kv_cache_dtype: str, *,
                     k_scale: float | None = None, v_scale: float | None = None) -> None:
    """Store tokens into a slot cache as vLLM 0.33 stores them (TurboQuant's
    ``triton_turboquant_store``, UltraQuant's ``ultraquant_store``, Octave's
    ``reference_quantize``).

    Parameters
    ----------
    key, value : array ``[num_tokens, num_kv_heads, head_size]``
        float32, float16 or bfloat16 (NumPy or DLPack), last dimension
        contiguous; widened to float32. ``head_size`` even; a power of two for
        the MSE presets (the Hadamard rotation); for ``ultraquant_4bit`` a power
        of two from 32 (groups of 32, the rotation); for Octave a multiple of 64
        (``octave_k3v3_compact``: a power of two from 64).
    kv_cache : uint8 array ``[num_blocks, block_size, num_kv_heads, slot_bytes]``
        Written in place; ``slot_bytes = turboquant_slot_bytes(kv_cache_dtype,
        head_size)`` (Octave: ``turboquant_slot_bytes(kv_cache_dtype, head_size,
        rope_dim)``, and the width names the rotary dims); any strides with
        contiguous slots (vLLM's ``kv_cache.transpose(1, 2)`` view of its page
        works as it is, as does the ``[num_blocks, H_kv, block_size, slot]``
        page of vLLM's Octave backend after ``.transpose(1, 2)``).
    slot_mapping : int64 array ``[num_tokens]``
        ``block * block_size + offset``; negative skips the token.
    kv_cache_dtype : str
        One of ``vt.SLOT_DTYPES``.
    k_scale, v_scale : float, optional
        NVFP4 only (``vt.NVFP4_DTYPES``, the rows with ``global_scale``): the
        global K / V scales (the checkpoint's; default 1.0). Refused for the
        other formats, whose scales are in each slot.

    TurboQuant: each (token, head) slot gets ``[key | value codes | fp16 scale | fp16 zero]``:
    k8v4 keys as e4m3 (nearest even, saturating); MSE keys as the Lloyd-Max
    indices of ``(k / (||k|| + 1e-8)) H`` (H the Sylvester Hadamard / sqrt(D))
    and the fp16 norm; values by min / max at 4 or 3 bits. Bytes no rule writes
    (the even-rounding pad, a 3-bit tail) keep their contents. UltraQuant:
    ``[K codes | K scales | V codes | V scales]``, FP4 E2M1 codes with one
    UE8M0 scale per group of 32 (``s = 2^floor(log2(0.156 absmax) + 0.5)``),
    K first rotated by the store kernel's float32 Walsh-Hadamard butterflies.
    Octave: ``[K codes | V codes | fp16 scales]``, rows sign-flipped and
    Walsh-Hadamard rotated (K per 64 dims, or whole for the compact format),
    Lloyd-Max codes (4-bit on the rotary K dims, else 3-bit; V 4 or 3) with a
    scale per block that keeps ``x . x_hat = |x|^2``. Single-threaded.
    Every argument and slot is checked first: a refused call writes nothing.
    """
    info = _tq_info(kv_cache_dtype, "turboquant_store")
    mids = None
    if info.needs_codebook:
        D = getattr(key, "shape", (0,))[-1] if getattr(key, "ndim", 0) == 3 else 0
        if isinstance(D, int) and D > 0 and D % 2 == 0 and D & (D - 1) == 0 and D <= 4096:
            mids = _codebook(info.name, D)[1]
        else:  # the C checks name the argument (head_size / shape)
            mids = np.zeros((1 << info.key_bits) - 1, np.float32)
    _C.turboquant_store(key, value, kv_cache, slot_mapping, kv_cache_dtype, mids,
                        **_global_scales(k_scale, v_scale, "turboquant_store"))


def turboquant_gather(kv_cache: Any, slots: Any, kv_cache_dtype: str, head_size: int, *,
                      num_threads: int | None = None, k_scale: float | None = None,
                      v_scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dequantize slots of a slot cache: vLLM's ``_tq_full_dequant_kv`` (TurboQuant) and
    ``ultraquant_dequant`` (UltraQuant) in float32.

    Parameters
    ----------
    kv_cache : uint8 array ``[num_blocks, block_size, num_kv_heads, slot_bytes]``
    slots : int64 array ``[n]``
        ``block * block_size + offset``, each in ``[0, num_blocks * block_size)``.
    kv_cache_dtype : str
    head_size : int
    num_threads : int, optional
        Default ``VTINFER_NUM_THREADS`` or the CPU affinity count; the slots are
        split evenly, so the result never depends on it.
    k_scale, v_scale : float, optional
        NVFP4 only: the global scales the slots were stored with (default 1.0).

    Returns
    -------
    (K, V) : float32 ndarrays ``[n, num_kv_heads, head_size]``
        ``V = code * scale + zero`` (the fp16 scale and zero widened). K: the
        e4m3 value (k8v4), or for the MSE presets the key **in the rotated
        basis**, ``norm * c[index]`` (``_nc``: c first scaled by
        ``1 / sqrt(sum c^2 + 1e-16)``), as vLLM's read uses it (its queries are
        rotated instead); the model-basis key is ``K @ H`` with H the
        orthonormal Sylvester Hadamard (its own inverse). UltraQuant: the E2M1
        value times ``2^(byte - 127)`` (byte 0 reads 0); K in the rotated basis.
        Octave: ``LUT[code] * scale / 64`` rotated back, K and V in the model's
        basis (vLLM's ``reference_dequantize``).
    """
    info = _tq_info(kv_cache_dtype, "turboquant_gather")
    head_size = _head_size(head_size, "turboquant_gather")
    n = int(np.asarray(slots).shape[0]) if np.ndim(slots) == 1 else -1
    if n < 0:
        raise ValueError(f"turboquant_gather: slots must have shape [n]; got {np.ndim(slots)} dimensions")
    H = int(getattr(kv_cache, "shape", (0, 0, 0))[2]) if len(getattr(kv_cache, "shape", ())) == 4 else 1
    k = np.empty((n, H, head_size), np.float32)
    v = np.empty((n, H, head_size), np.float32)
    cen = None
    if info.needs_codebook:
        D = head_size
        cen = _codebook(info.name, D)[0] if D % 2 == 0 and D & (D - 1) == 0 and D <= 4096 else np.zeros(
            1 << info.key_bits, np.float32)
    _C.turboquant_gather(kv_cache, slots, kv_cache_dtype, cen, k, v, num_threads=num_threads,
                         **_global_scales(k_scale, v_scale, "turboquant_gather"))
    return k, v


def boundary_skip_layers(num_layers: int, n: int = 2) -> list[str]:
    """vLLM 0.33's ``TurboQuantConfig.get_boundary_skip_layers`` for a dense model: the first and
    last ``min(n, num_layers // 2)`` layers, as sorted strings (they stay at the model dtype)."""
    if n <= 0 or num_layers <= 0:
        return []
    n = min(n, num_layers // 2)
    return [str(i) for i in sorted(set(range(n)) | set(range(num_layers - n, num_layers)))]


def hadamard(head_size: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard vLLM rotates MSE keys and queries with: float32
    ``[head_size, head_size]``, entries ``+-1 / sqrt(head_size)`` (its own inverse)."""
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < head_size:
        h = np.concatenate([np.concatenate([h, h], 1), np.concatenate([h, -h], 1)], 0)
    return (h / np.float32(math.sqrt(head_size))).astype(np.float32)


def referenced_blocks(block_table: Any, seqused_k: Any, num_blocks: int, block_size: int, fn: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The block table as int32, which of its entries attention reads (the first
    ``ceil(seqused_k[b] / block_size)`` of row b: only those must name a block, as
    flash_attn_varlen_func requires; vLLM pads the rest with -1 or stale ids), and the sorted
    distinct blocks they name. IndexError (naming the entry) when a read entry is out of range."""
    bt = np.asarray(block_table)
    if bt.ndim != 2 or bt.dtype != np.int32:
        raise ValueError(f"{fn}: block_table must be int32 [batch, max_blocks]; got {bt.dtype} "
                         f"with {bt.ndim} dimensions")
    sk = np.asarray(seqused_k.detach().cpu() if hasattr(seqused_k, "detach") else seqused_k)
    read = np.zeros(bt.shape, bool)
    if sk.ndim == 1 and sk.dtype == np.int32 and len(sk) <= bt.shape[0] and block_size > 0:
        need = np.clip((sk.astype(np.int64) + block_size - 1) // block_size, 0, bt.shape[1])
        read[: len(sk)] = np.arange(bt.shape[1]) < need[:, None]
    else:
        read[...] = True  # flash_attn_varlen_func refuses the seqused_k; every entry is checked meanwhile
    bad = read & ((bt < 0) | (bt >= num_blocks))
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])
        raise IndexError(f"{fn}: block_table[{b}, {j}] must be in [0, {num_blocks}) (a block the "
                         f"sequence's seqused_k reads); got {bt[b, j]}")
    used = np.unique(bt[read]) if read.any() else np.zeros(1, np.int32)
    return bt, read, used


def turboquant_attention(q: Any, kv_cache: Any, *, cu_seqlens_q: Any, seqused_k: Any, block_table: Any,
                         kv_cache_dtype: str, softmax_scale: float | None = None, causal: bool = True,
                         window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
                         s_aux: Any = None, return_lse: bool = False, num_threads: int | None = None,
                         k_scale: Any = None, v_scale: Any = None) -> Any:
    """Paged attention over a slot cache (the meaning of vLLM 0.33's TurboQuant, UltraQuant, Octave and NVFP4 decode).

    The read decodes the slots a chunk of keys at a time (the format's
    codec, as ``turboquant_gather`` decodes them) into float32 rows that the
    float32 attention tile reads while they are in cache, and merges the
    chunks' softmax states: the same meaning as attention over a dequantized
    float32 copy, without the copy. MSE presets keep keys in the rotated
    basis, so the read rotates each query row as vLLM's decode does,
    ``q_rot = float32(q) @ H`` (``q . k = q_rot . k_rot``; the butterflies in
    float64, rounded once to float32); k8v4 queries are widened to float32. UltraQuant's queries are rotated the
    same way and then rounded to float8 e4m3fn (scale 1), as vLLM's launcher
    and reference (``reference_ultraquant_attention``) do. V is never
    rotated. Octave's read gives K and V in the model's basis, as vLLM's
    ``reference_attention`` reads them (its kernels rotate q instead: the same
    scores up to float32 rounding); the query is widened to float32. The output is rounded (nearest even) to q's dtype.

    Parameters
    ----------
    q : ndarray ``[total_q, H, head_size]``
        float32, float16 or bfloat16 (NumPy / ml_dtypes).
    kv_cache : uint8 ndarray ``[num_blocks, block_size, H_kv, slot_bytes]``
    cu_seqlens_q, seqused_k, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, s_aux,
    return_lse, num_threads
        As ``vt.flash_attn_varlen_func`` (``softmax_scale`` defaults to ``1 / sqrt(head_size)``).
    kv_cache_dtype : str
        One of ``vt.SLOT_DTYPES``.
    k_scale, v_scale : float, optional
        NVFP4 only (the rows with ``global_scale``): the global K / V scales
        the slots were stored with (default 1.0); the read decodes
        ``E2M1 * block scale * k_scale``. Refused for the other formats.

    Returns
    -------
    out : ndarray ``[total_q, H, head_size]`` of q's dtype (and lse ``[H, total_q]`` float32 with
    ``return_lse``).

    Every key is read from the cache: vLLM's first-chunk prefill attends to the
    chunk's own unquantized keys instead (not mirrored: kv-formats.md).
    Scratch: ~256 KB of decoded rows per thread, nothing per cached block.
    """
    from vtinfer._attention import _f32

    fn = "turboquant_attention"
    info = _tq_info(kv_cache_dtype, fn)
    scales = {"k_descale": k_scale, "v_descale": v_scale}
    if not info.global_scale:
        given = [n for n, x in (("k_scale", k_scale), ("v_scale", v_scale)) if x is not None]
        if given:
            raise ValueError(f"{fn}: {given[0]} must be None for kv_cache_dtype '{kv_cache_dtype}' (its scales are "
                             f"in each slot); got {type(k_scale if given[0] == 'k_scale' else v_scale).__name__}")
        scales = {}
    q = np.asarray(q)
    if q.ndim != 3:
        raise ValueError(f"{fn}: q must have shape [total_q, H, head_size]; got {q.ndim} dimensions")
    if q.dtype.name not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"{fn}: q must be float32, float16 or bfloat16; got {q.dtype}")
    shape = getattr(kv_cache, "shape", ())
    if len(shape) != 4:
        raise ValueError(f"{fn}: kv_cache must have shape [num_blocks, block_size, H_kv, slot_bytes]; "
                         f"got {len(shape)} dimensions")
    referenced_blocks(block_table, seqused_k, int(shape[0]), int(shape[1]), fn)  # names a bad entry first
    try:  # the read puts q in the key basis and rounds it as the format's row says
        res = _C.flash_attn_varlen_func(
            q, kv_cache, kv_cache, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            alibi_slopes=_f32(alibi_slopes, "alibi_slopes"), s_aux=_f32(s_aux, "s_aux"),
            kv_cache_dtype=kv_cache_dtype, return_lse=return_lse, num_threads=num_threads,
            **{n: (None if x is None else _f32(x, n)) for n, x in scales.items()})
    except (ValueError, TypeError, IndexError, NotImplementedError) as e:
        raise type(e)(_in_our_words(str(e))) from None
    out, lse = (res if return_lse else (res, None))
    out = np.asarray(out)
    return (out, lse) if return_lse else out


def _in_our_words(msg: str) -> str:
    """A refusal of the attention call, in turboquant_attention's names (the slot cache is its k and v)."""
    msg = msg.replace("flash_attn_varlen_func:", "turboquant_attention:", 1)
    msg = msg.replace("k_descale", "k_scale").replace("v_descale", "v_scale")  # NVFP4's global scales: ours
    return re.sub(r"(?<!\w)k(?= must|'s )", "kv_cache", msg)
