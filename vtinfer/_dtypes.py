"""Dtype lists derived from the C dtype table (never kept by hand)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from vtinfer import _C


@dataclass(frozen=True)
class DtypeInfo:
    """One row of vtinfer's C dtype table.

    Attributes
    ----------
    name : str
        Canonical vtinfer name (``"float32"``, ``"fp8_e4m3"``, ...).
    numpy_name : str
        NumPy / ml_dtypes name (``"bfloat16"``, ``"float8_e4m3fn"``).
    flags : tuple of str
        vLLM ``--kv-cache-dtype`` spellings that name this dtype.
    elem_bytes : int
        Bytes per element.
    is_fp8 : bool
        Whether this is a float8 storage format.
    max_finite : float
        Largest finite value.
    elem_bits : int
        Bits of one stored element.
    is_int : bool
        Elements are two's-complement integer codes (``int8_per_token_head``).
    code_dtype : str or None
        The dtype whose codes are stored (itself; ``"fp8_e4m3"`` for
        ``fp8_per_token_head``; None for integer codes).
    scale_kind : str
        ``"none"`` (plain values), ``"tensor"`` (codes times a given per-tensor /
        per-layer / per-head scale: fp8) or ``"token_head"`` (codes times a float32
        scale computed at store, one per (token, KV head)).
    quant_max, quant_min : float
        Per-token-head: the range scaled values are clamped to (0 otherwise).
    page_layout : str
        ``"dense"``, ``"scale_planes"`` (a float32 ``[num_blocks, block_size,
        H_kv]`` plane each for K and V beside the codes) or ``"slots"``
        (the slot formats, TurboQuant and UltraQuant: one uint8 ``[num_blocks,
        block_size, H_kv, slot_bytes]`` cache holding K, V and their scales: TurboQuant, UltraQuant, Octave,
        NVFP4; ``vt.turboquant_slot_bytes``).
    key_bits, value_bits : int
        Slot formats only (0 otherwise): key bits (TurboQuant: 8 = fp8 e4m3 keys,
        3 / 4 = Lloyd-Max indices of the rotated key; UltraQuant: 4, FP4 E2M1 of the
        rotated key) and value code bits.
    norm_correction : bool
        TurboQuant: the read renormalises the key's centroids (``_nc`` presets).
    family : str
        The format family (one C file each): ``"plain"``, ``"fp8"``,
        ``"per_token_head"``, ``"int4_per_token_head"``, ``"turboquant"``,
        ``"ultraquant"``, ``"octave"``, ``"nvfp4"``.
    query_dtype : str
        The dtype the read rounds the (rotated) query to before its dot
        products: ``"fp8_e4m3"`` for ``ultraquant_4bit`` (vLLM's UltraQuant
        read), ``"float32"`` (the query as given) for every other format.
    needs_codebook : bool
        Slot formats: the store and read index a Lloyd-Max codebook the caller
        gives (TurboQuant's MSE key presets; the row's slot codec answers).
    rope_block : int
        > 0 where the slot layout depends on the model's rotary dims
        (``rope_dim``, a multiple of it in ``[0, head_size]``; Octave: 64);
        0 otherwise.
    key_basis : str
        Slot formats: the basis the read returns K in, ``"model"`` or
        ``"hadamard"`` (rotated by the orthonormal Sylvester Hadamard H: the
        query is read as ``q @ H``; TurboQuant's MSE presets, UltraQuant).
    boundary_layers : int
        vLLM keeps the first and last ``min(n, num_layers // 2)`` attention
        layers at the model dtype with this format (TurboQuant, UltraQuant: 2);
        0: every layer takes it.
    pair_dot : bool
        Every value a code decodes to (``int4_per_token_head``: minus its zero
        point) is a bfloat16 value, so on CPUs with AVX512-BF16 the pair-dot
        tile reads the pages (bf16 queries, >= 4 query rows per KV head).
    causal_only : bool
        vLLM reads the format under a causal mask only
        (``int4_per_token_head``); a non-causal read is refused.
    global_scale : bool
        A slot format whose codes are also scaled by the layer's K / V scale
        (NVFP4's global scale: the checkpoint's ``k_scale`` / ``v_scale``, one
        per tensor or layer); False where the slot holds every scale.
    """

    id: int
    name: str
    numpy_name: str
    flags: tuple[str, ...]
    elem_bytes: int
    is_fp8: bool
    max_finite: float
    exponent_bits: int
    mantissa_bits: int
    elem_bits: int
    is_int: bool
    code_dtype: str | None
    scale_kind: str
    quant_max: float
    quant_min: float
    page_layout: str
    key_bits: int
    value_bits: int
    norm_correction: bool
    family: str
    query_dtype: str
    needs_codebook: bool
    rope_block: int
    key_basis: str
    boundary_layers: int
    pair_dot: bool
    causal_only: bool
    global_scale: bool

    def head_size_error(self, head_size: int) -> str | None:
        """None when this format stores head rows of ``head_size`` elements, else its one geometry rule's message
        (the C table's check: the message every store and read raises)."""
        return _C.dtype_head_size_error(self.name, head_size)

    @property
    def numpy_dtype(self) -> np.dtype:
        """The NumPy dtype of values of this dtype (ml_dtypes for bf16 / fp8)."""
        if self.numpy_name in ("float32", "float16", "int8", "uint8"):
            return np.dtype(self.numpy_name)
        return np.dtype(getattr(ml_dtypes, self.numpy_name))


DTYPES: tuple[DtypeInfo, ...] = tuple(DtypeInfo(**row) for row in _C.dtype_table())
KV_CACHE_DTYPES: tuple[str, ...] = _C.kv_cache_flags()
FP8_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.is_fp8)
PER_TOKEN_HEAD_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.scale_kind == "token_head")
TURBOQUANT_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.family == "turboquant")
#: The slot formats (TurboQuant, UltraQuant, Octave): K and V of a (token, KV head) in one uint8 slot.
SLOT_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.page_layout == "slots")
#: vLLM 0.33's ``--kv-cache-dtype`` values (``CacheDType``), in vLLM's order.
VLLM_KV_CACHE_DTYPES: tuple[str, ...] = _C.vllm_kv_cache_dtypes()
#: vLLM's NVFP4 formats (the table's family "nvfp4"): slot formats in PagedKVCache, and through the functional
#: forms on vLLM's own NVFP4 page views (``[K codes | K scales | V codes | V scales]`` per page).
NVFP4_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.family == "nvfp4")
#: The formats the functional forms store and read through their own modules (the slot formats; NVFP4 on vLLM's
#: page views): one set lookup keeps the element formats' small calls off both tests.
OWN_PATH_DTYPES: frozenset[str] = frozenset(SLOT_DTYPES)


def _not_stored_reason(name: str, what: str) -> str:
    """What the format is, then what vLLM 0.33's CPU build answers for it (``vllm/platforms/cpu.py``)."""
    cpu = f"vLLM on a CPU: '--kv-cache-dtype {name} is not supported by the CPU attention backend on this host.'"
    if name.endswith("_ds_mla"):
        cpu += f" (an MLA model: '--kv-cache-dtype {name} is not supported by MLA attention on CPU.')"
    return f"{what}. {cpu}"


#: Each of vLLM's values vtinfer does not store -> why: what the format is, where vLLM runs it, and
#: the error vLLM's own CPU build raises for it. ``VLLM_KV_CACHE_DTYPES`` is ``KV_CACHE_DTYPES``'
#: vLLM names plus these keys.
KV_CACHE_DTYPES_NOT_STORED: dict[str, str] = {
    name: _not_stored_reason(name, what) for name, what in _C.vllm_kv_cache_dtypes_unstored().items()
}


def dtype_info(name: str) -> DtypeInfo:
    """Look up a dtype by canonical name, NumPy name or vLLM flag spelling.

    Raises
    ------
    ValueError
        If ``name`` names no dtype (``"auto"`` included: it names none by itself).
    """
    for d in DTYPES:
        if name == d.name or name == d.numpy_name or name in d.flags:
            return d
    raise ValueError(
        f"dtype_info: name must be one of {', '.join(n for n in KV_CACHE_DTYPES if n != 'auto')}; got {name!r}"
    )
