"""``resolve_kv_cache_dtype``: the fp8 KV-cache dtype decision, as vLLM makes it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from vtinfer import _C
from vtinfer._dtypes import KV_CACHE_DTYPES
from vtinfer.checkpoint import Checkpoint


@dataclass(frozen=True)
class Resolution:
    """What vLLM would do with a ``--kv-cache-dtype`` on a checkpoint.

    Attributes
    ----------
    vllm_cache_dtype : str
        Exactly what vLLM's ``resolve_kv_cache_dtype_string`` returns after
        normalization.
    cache_dtype : str
        After the per-layer compressed-tensors rule (``"fp8"`` for a scheme).
    dtype : str or None
        The storage dtype vtinfer uses (``auto`` -> the model's dtype); None
        when vLLM accepts the value but vtinfer cannot store it (nvfp4, ...).
    source : str
        ``flag``, ``config.json``, ``hf_quant_config.json``,
        ``compressed-tensors kv_cache_scheme`` or ``default``.
    declared_by_checkpoint : bool
    per_head_scales : bool
        compressed-tensors ``strategy: attn_head``: scales ``[num_kv_heads]``.
    fp8_checkpoint : bool
        vLLM loads k/v scales for this checkpoint's attention layers.
    quant_config_file : str or None
    quant_method : str or None
        The normalized ``quant_method``.
    quant_config : dict or None
        The normalized quantization config (as vLLM mutates it).
    rule : str
        The rule that fired, in words.
    messages : tuple of str
        What vLLM would log, in order.
    """

    vllm_cache_dtype: str
    cache_dtype: str
    dtype: str | None
    source: str
    declared_by_checkpoint: bool
    per_head_scales: bool
    fp8_checkpoint: bool
    quant_config_file: str | None
    quant_method: str | None
    quant_config: Any
    rule: str
    messages: tuple[str, ...]


def _check_flag(flag: object) -> None:
    """An unknown flag: the values vtinfer stores (from the dtype table), then vLLM's other names with why."""
    if not isinstance(flag, str):
        return  # the C resolver's TypeError
    vllm = _C.vllm_kv_cache_dtypes()
    if flag in vllm or flag in KV_CACHE_DTYPES:
        return
    others = [x for x in vllm if x not in KV_CACHE_DTYPES]
    raise ValueError(f"resolve_kv_cache_dtype: kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (what "
                     f"vtinfer stores); got {flag[:64]!r}. vLLM also accepts {', '.join(others)}: vtinfer resolves "
                     "them as vLLM does but does not store them (vtinfer.KV_CACHE_DTYPES_NOT_STORED says why, "
                     "per value)")


def resolve_kv_cache_dtype(kv_cache_dtype: str, model: str | os.PathLike | Checkpoint) -> Resolution:
    """Resolve ``kv_cache_dtype`` against a checkpoint as vLLM does.

    Parameters
    ----------
    kv_cache_dtype : str
        A vLLM ``--kv-cache-dtype`` value (``"auto"``, ``"fp8"``, ...).
    model : str, os.PathLike or Checkpoint
        The checkpoint directory.

    Raises
    ------
    ValueError
        An unknown flag (the accepted values listed), an unknown ModelOpt
        quant algo, fp8_e5m2 with an fp8 checkpoint.
    TypeError
        Where vLLM raises AttributeError (a non-string quant_method, a
        non-dict quantization_config / producer / quantization).
    NotImplementedError
        A compressed-tensors kv_cache_scheme vLLM refuses.
    vtinfer.ConfigError
        Malformed JSON (file, line, column).
    FileNotFoundError
        No config.json.
    """
    _check_flag(kv_cache_dtype)
    ck = model if isinstance(model, Checkpoint) else Checkpoint(model)
    hq = str(ck.hf_quant_config_path) if ck.hf_quant_config_path else None
    r = _C.resolve_kv_cache_dtype(kv_cache_dtype, str(ck.config_path), hq)
    dtype = r["dtype"]
    if dtype == "auto":
        dtype = ck.geometry.dtype if _has_geometry(ck) else "bfloat16"
    elif dtype == "unsupported":
        dtype = None
    return Resolution(r["vllm_cache_dtype"], r["cache_dtype"], dtype, r["source"], r["declared_by_checkpoint"],
                      r["per_head_scales"], r["fp8_checkpoint"], r["quant_config_file"], r["quant_method"],
                      r["quant_config"], r["rule"], tuple(r["messages"]))


def _has_geometry(ck: Checkpoint) -> bool:
    try:
        ck.geometry
    except ValueError:
        return False
    return True
