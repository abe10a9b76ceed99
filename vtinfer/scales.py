"""Per-layer K/V scales from safetensors headers, as vLLM loads them.

Mirrors ``maybe_remap_kv_scale_name`` (checkpoint names -> ``...attn.k_scale``)
and the defaults of ``BaseKVCacheMethod.process_weights_after_loading``: both
scales loaded -> used; one -> both become the max; none -> 1.0 with vLLM's
warning. The safetensors header is parsed here (8-byte little-endian length,
a JSON header read by vtinfer's C reader, offsets checked); only the scale
tensors' bytes are read.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from vtinfer import _C

ONE_WARNING = ("Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale "
               "scaling factors are properly set in the checkpoint.")
KV_SCALE_DEPRECATED = ("DEPRECATED. Found kv_scale in the checkpoint. This format is deprecated in favor of separate "
                       "k_scale and v_scale tensors and will be removed in a future release. Functionally, we will "
                       "remap kv_scale to k_scale and duplicate k_scale to v_scale")
MAX_HEADER = 100_000_000  # the safetensors library's limit (vtinfer/_stheader.py)

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bfloat16",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_FLOAT_ST = {"F64", "F32", "F16", "BF16"}

_SUFFIXES = (".k_scale", ".v_scale", ".q_scale", ".k_zero_point", ".v_zero_point", ".q_zero_point", ".q.scale",
             ".k_cache.scale", ".v_cache.scale")


def _patterns(attn_str: str) -> list[tuple[str, str]]:
    return [
        (r"\.self_attn\.([kv])_proj\.([kv])_scale$", rf".self_attn.{attn_str}.\2_scale"),
        (r"\.self_attn\.qkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
        (r"\.self_attn\.qkqkv_proj\.([kv])_scale$", r".self_attn.attn.\1_scale"),
        (r"\.mixer\.[kv]_proj\.([kv])_scale$", r".mixer.attn.\1_scale"),
        (r"\.self_attn\.q\.scale$", r".self_attn.attn.q_scale"),
        (r"\.self_attn\.([kv])_cache\.scale$", r".self_attn.attn.\1_scale"),
        (r"\.([qkv])_scale$", r".attn.\1_scale"),
        (r"\.([qkv])_zero_point$", r".attn.\1_zero_point"),
    ]


def remap_kv_scale_name(name: str, params: Any, messages: list[str] | None = None, *,
                        logged: set[str] | None = None) -> str | None:
    """vLLM's ``maybe_remap_kv_scale_name``: the model parameter a checkpoint
    tensor name loads into, None when the remapped name is not in ``params``
    (anything supporting ``in`` and iteration), or ``name`` unchanged.
    ``logged``: the messages already in ``messages`` (kept up to date), so a
    caller remapping every tensor of a checkpoint asks in O(1) whether the
    once-only deprecation line is there, not by scanning a growing log."""
    log = messages if messages is not None else []
    if name in params:
        return name
    if name.endswith(".kv_scale"):
        if KV_SCALE_DEPRECATED not in (logged if logged is not None else log):
            log.append(KV_SCALE_DEPRECATED)
            if logged is not None:
                logged.add(KV_SCALE_DEPRECATED)
        remapped = name.replace(".kv_scale", ".attn.k_scale")
        if remapped not in params:
            log.append(f"Found kv_scale in the checkpoint (e.g. {name}), but not found the expected name in the "
                       f"model (e.g. {remapped}). kv_scale is not loaded.")
            return None
        return remapped
    attn_str = "mla_attn.mla_attn" if any("mla_attn" in k for k in params) else "attn"
    if name.endswith(_SUFFIXES):
        for pat, rep in _patterns(attn_str):
            if re.search(pat, name):
                remapped = re.sub(pat, rep, name)
                if remapped not in params:
                    kind = name.split(".")[-1]
                    log.append(f"Found {kind} in the checkpoint (e.g. {name}), but not found the expected name in "
                               f"the model (e.g. {remapped}). {kind} is not loaded.")
                    return None
                return remapped
    return name


class AttentionParams:
    """The scale parameters of a decoder with ``num_layers`` attention
    layers, whatever the module path (``model.layers.N....attn.k_scale``):
    ``q_scale``, ``k_scale``, ``v_scale`` (every KV-cache quant method), and
    the zero points when ``zero_points`` (compressed-tensors creates them so
    llm-compressor's checkpoints load)."""

    # a layer index as vLLM's parameter names write it (ASCII digits,
    # no leading zero): "layers.01." or "layers.\u0661." names no parameter
    _re = re.compile(r"(?:^|\.)layers\.(0|[1-9][0-9]*)\.(?:.*\.)?attn\.([qkv])_(scale|zero_point)$")

    def __init__(self, num_layers: int, zero_points: bool = False) -> None:
        self.num_layers = num_layers
        self.zero_points = zero_points

    def _match(self, name: str) -> tuple[int, str, str] | None:
        m = self._re.search(name)
        if not m or int(m.group(1)) >= self.num_layers or (m.group(3) == "zero_point" and not self.zero_points):
            return None
        return int(m.group(1)), m.group(2), m.group(3)

    def __contains__(self, name: object) -> bool:
        return self._match(str(name)) is not None

    def __iter__(self):
        return iter(())

    def layer_of(self, name: str) -> tuple[int, str] | None:
        m = self._match(name)
        return (m[0], m[1] if m[2] == "scale" else f"{m[1]}_zero_point") if m else None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    file: Path


def read_safetensors_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Tensors of one safetensors file, with offsets checked.

    Raises
    ------
    vtinfer.ConfigError
        A bad header: length past the file, not a JSON object, an unknown
        dtype, offsets out of range or overlapping, or sizes that disagree
        with the shape (the tensor named).
    """
    from vtinfer._fileio import open_regular
    from vtinfer._stheader import parse_header

    p = Path(path)
    # a regular file only, and exactly the headers the safetensors library accepts
    with open_regular(p) as f:
        entries = parse_header(f, str(p))
    return {name: TensorInfo(name, dt, shape, b, e, p) for name, (dt, shape, b, e) in entries.items()}


def _ml(name: str) -> Any:
    import ml_dtypes

    return getattr(ml_dtypes, name)


def read_tensor(ti: TensorInfo) -> np.ndarray:
    """The tensor's values as float64 (scale tensors are tiny)."""
    from vtinfer._fileio import open_regular

    if ti.dtype not in _ST_DTYPES:
        raise TypeError(f"read_tensor: {ti.name} must have a dtype vtinfer reads ({', '.join(_ST_DTYPES)}); "
                        f"got {ti.dtype}")
    with open_regular(ti.file) as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n + ti.begin)
        raw = f.read(ti.end - ti.begin)
    dt = _ST_DTYPES[ti.dtype]
    arr = np.frombuffer(raw, dtype=np.dtype(_ml(dt) if isinstance(dt, str) else dt))
    with np.errstate(invalid="ignore"):  # NaN payloads convert to NaN
        return arr.astype(np.float64).reshape(ti.shape)


@dataclass(frozen=True)
class LayerScales:
    """One attention layer's scales after vLLM's reductions and defaults.

    Attributes
    ----------
    k_scale, v_scale : float or tuple of float
        Per tensor, or one per KV head of this rank for compressed-tensors
        ``attn_head`` checkpoints (``[H_kv, 1, 1]`` in the file, flattened).
    origin : str
        ``checkpoint`` (both loaded), ``one-sided`` (one loaded, max copied;
        vLLM's base KV method), ``partial`` (one loaded, the other 1.0;
        compressed-tensors), ``kv_scale`` (deprecated fused scale, copied),
        ``default`` (1.0), ``ignored`` (unquantized cache or a skipped layer:
        loaded scales are not used).
    k_tensor, v_tensor : str or None
        The checkpoint tensor names that were read.
    q_scale : float or tuple of float
        The query scale the fp8-query attention path uses: loaded, else 1.0;
        for ``attn_head`` reduced from ``[H, 1, 1]`` by the max over each GQA
        group to one per KV head, then sliced per rank like K/V.
    q_tensor : str or None
    zero_points : tuple of str
        Zero-point tensors found for this layer (vLLM ignores them).
    """

    layer: int
    k_scale: float | tuple[float, ...]
    v_scale: float | tuple[float, ...]
    origin: str
    k_tensor: str | None
    v_tensor: str | None
    q_scale: float | tuple[float, ...] = 1.0
    q_tensor: str | None = None
    zero_points: tuple[str, ...] = ()

    @property
    def is_one(self) -> bool:
        return np.all(np.asarray(self.k_scale) == 1.0) and bool(np.all(np.asarray(self.v_scale) == 1.0))


Q_WARNING = ("Checkpoint does not provide a q scaling factor. Setting it to k_scale. This only matters for FP8 "
             "Attention backends (flash-attn or flashinfer).")
ZERO_POINT_WHY = "zero point: vLLM supports only symmetric KV-cache quantization and ignores zero points"
NOT_KV_WHY = "not a KV-cache scale (weight/activation quantization): loaded by its linear layer, not the KV cache"


def is_scale_tensor(name: str) -> bool:
    """A tensor ``inspect`` explains: ``*_scale``, ``*.scale`` or ``*zero_point``."""
    return name.endswith(("_scale", ".scale", "zero_point"))


def _vals(name: str, ti: TensorInfo, want: tuple[int, ...], what: str) -> np.ndarray:
    if ti.dtype not in _FLOAT_ST:
        raise TypeError(f"load_kv_scales: {name} must be a float tensor; got {ti.dtype}")
    n = math.prod(ti.shape)
    if n not in want:
        raise ValueError(f"load_kv_scales: {name} must hold {' or '.join(map(str, want))} element(s) ({what}); "
                         f"got shape {list(ti.shape)}")
    vals = read_tensor(ti).reshape(-1)
    # vLLM loads scales into float32 parameters: an F64 scale that
    # overflows to inf or underflows to 0 in float32 is refused, the rest rounded
    with np.errstate(over="ignore", under="ignore"):
        f32 = vals.astype(np.float32)
    lost = np.isfinite(vals) & (vals > 0) & ~(np.isfinite(f32) & (f32 > 0))
    if np.any(lost):
        raise ValueError(f"load_kv_scales: {name} must be representable as a positive finite float32 "
                         f"(vLLM loads scales as float32); got {vals.tolist()} from {ti.dtype}")
    return f32.astype(np.float64)


def load_kv_scales(shards: Iterable[str | os.PathLike], num_layers: int, num_kv_heads: int, *,
                   quantized: bool = True, per_head: bool = False, kv_cache_dtype: str = "fp8_e4m3",
                   messages: list[str] | None = None, num_heads: int | None = None,
                   compressed_tensors: bool | None = None, tensor_parallel_size: int = 1, rank: int = 0,
                   unquantized_layers: Iterable[int] = (),
                   explain: list[dict[str, Any]] | None = None) -> tuple[LayerScales, ...]:
    """Per-layer Q/K/V scales from safetensors shards, as vLLM loads them.

    Parameters
    ----------
    shards : iterable of paths
    num_layers, num_kv_heads : int
        ``num_kv_heads`` is the model's total (before tensor parallelism).
    quantized : bool
        False for an unquantized cache: scales are 1.0 whatever is loaded.
    per_head : bool
        compressed-tensors ``attn_head``: K/V scales hold ``num_kv_heads``
        elements (``[H_kv]`` or llm-compressor's ``[H_kv, 1, 1]``, flattened);
        ``q_scale`` holds ``num_heads`` and is reduced by the max over each GQA
        group (``_tp_aware_loader``). Otherwise every scale holds one element
        (``KVCacheScaleParameter.weight_loader``).
    num_heads : int, optional
        The model's total query heads; needed to reduce a per-head ``q_scale``.
    compressed_tensors : bool, optional
        The layer's KV method is compressed-tensors' (default: ``per_head``):
        missing scales stay 1.0 (its placeholders) instead of vLLM's base
        rule (one loaded -> both the max; none -> 1.0 with a warning), and
        zero points are parameters (loaded, then ignored).
    tensor_parallel_size, rank : int
        Per-head scales are sliced to the KV heads of ``rank``
        (:func:`vtinfer.tensor_parallel.rank_heads`); per-tensor ones are
        replicated.
    unquantized_layers : iterable of int
        Layers ``kv_cache_dtype_skip_layers`` keeps unquantized (scales 1.0).
    messages : list, optional
        Receives what vLLM would log.
    explain : list, optional
        Receives one dict per ``*_scale`` / ``*zero_point`` tensor: ``tensor``,
        ``shard``, ``dtype``, ``shape``, ``action`` (``loaded``, ``remapped``,
        ``ignored``), ``target`` and ``why``.

    Raises
    ------
    ValueError
        A non-finite or non-positive K/V scale, a scale
        with the wrong number of elements (the tensor named), or bad
        ``tensor_parallel_size`` / ``rank``.
    TypeError
        A scale tensor of a non-float dtype (the tensor named).
    vtinfer.ConfigError
        A bad safetensors header.
    """
    from vtinfer.tensor_parallel import check_tensor_parallel, rank_heads

    log = messages if messages is not None else []
    ct = per_head if compressed_tensors is None else bool(compressed_tensors)
    skipped = {int(i) for i in unquantized_layers}
    check_tensor_parallel(num_heads if num_heads is not None else num_kv_heads * tensor_parallel_size, num_kv_heads,
                          tensor_parallel_size, rank, who="load_kv_scales")
    rh = rank_heads(num_kv_heads * tensor_parallel_size if num_heads is None else num_heads, num_kv_heads,
                    tensor_parallel_size, rank)
    params = AttentionParams(num_layers, zero_points=ct)
    found: dict[tuple[int, str], tuple[str, Any, bool]] = {}
    zps: dict[int, list[str]] = {}

    def note(name: str, ti: TensorInfo, action: str, target: str | None, why: str) -> None:
        if explain is not None:
            explain.append({"tensor": name, "shard": ti.file.name, "dtype": ti.dtype, "shape": list(ti.shape),
                            "action": action, "target": target, "why": why})

    logged = set(log)
    for shard in shards:
        for name, ti in read_safetensors_header(shard).items():
            if not (name.endswith(_SUFFIXES) or name.endswith(".kv_scale")):
                if is_scale_tensor(name):
                    note(name, ti, "ignored", None, NOT_KV_WHY)
                continue
            before = len(log)
            target = remap_kv_scale_name(name, params, log, logged=logged)
            if target is None:
                note(name, ti, "ignored", None, log[-1] if len(log) > before else "not a parameter of the model")
                continue
            lk = params.layer_of(target)
            if lk is None:
                note(name, ti, "ignored", None, "not an attention layer's KV-cache scale")
                continue
            layer, kind = lk
            if kind.endswith("zero_point"):
                zps.setdefault(layer, []).append(name)
                note(name, ti, "ignored", target, ZERO_POINT_WHY)
                continue
            if kind == "q":
                want = ((num_heads,) if num_heads is not None else ()) if per_head else (1,)
                if per_head and num_heads is None:
                    raise ValueError(f"load_kv_scales: num_heads must be given to reduce {name} per GQA group; "
                                     f"got None")
                vals = _vals(name, ti, want, "q_scale: one per query head for attn_head" if per_head else
                             "a per-tensor q_scale")
                if not np.all(np.isfinite(vals) & (vals > 0)):
                    # vLLM loads it as is (llm-compressor 0.14 on a CPU leaves q_scale uncalibrated)
                    log.append(f"{name} holds non-finite or non-positive values {vals.tolist()}: vLLM loads "
                               "q_scale as is; only an fp8-query attention path uses it")
                val: Any = (tuple(float(x) for x in vals.reshape(num_kv_heads, -1).max(axis=1))
                            if per_head else float(vals[0]))
            else:
                want = (num_kv_heads, 1) if per_head else (1,)
                vals = _vals(name, ti, want, f"[{num_kv_heads}] or [{num_kv_heads}, 1, 1] for attn_head"
                             if per_head else "vLLM: KV-cache scale expects a scalar weight")
                if not np.all(np.isfinite(vals)) or not np.all(vals > 0):
                    raise ValueError(f"load_kv_scales: {name} must be finite and > 0; got {vals.tolist()}")
                val = (tuple(float(x) for x in np.broadcast_to(vals, (num_kv_heads,))) if per_head
                       else float(vals[0]))
            found[(layer, kind)] = (name, val, name.endswith(".kv_scale"))
            if not quantized or layer in skipped:
                why = ("unquantized cache: vLLM uses 1.0 whatever is loaded" if not quantized else
                       "layer skipped by kv_cache_dtype_skip_layers: unquantized, scales 1.0")
                note(name, ti, "ignored", target, why)
            else:
                note(name, ti, "loaded" if target == name else "remapped", target,
                     f"{kind}_scale of layer {layer}" + (f" (reduced from {math.prod(ti.shape)} query heads by the max "
                                                         f"over each GQA group)" if kind == "q" and per_head else ""))

    def sl(v: Any) -> Any:
        return tuple(float(x) for x in np.asarray(v)[list(rh.kv_heads)]) if isinstance(v, tuple) else v

    out = []
    any_one = q_missing = False
    for i in range(num_layers):
        k, v, q = found.get((i, "k")), found.get((i, "v")), found.get((i, "q"))
        zp = tuple(zps.get(i, ()))
        kt, vt_, qt = (k[0] if k else None), (v[0] if v else None), (q[0] if q else None)
        if not quantized or i in skipped:
            out.append(LayerScales(i, 1.0, 1.0, "ignored", kt, vt_, 1.0, qt, zp))
            continue
        one: Any = 1.0
        if k and v:
            ks, vs, origin = k[1], v[1], "checkpoint"
        elif ct:
            ks, vs = (k[1] if k else one), (v[1] if v else one)
            origin = "partial" if (k or v) else "default"
        elif k or v:
            got = k or v
            assert got is not None
            ks = vs = got[1]
            # vLLM: max(k_scale, v_scale) with the missing one at -1.0 -> the loaded one
            origin = "kv_scale" if (k and v is None and k[2]) else "one-sided"
        else:
            ks, vs, origin = 1.0, 1.0, "default"
        if per_head:
            ks, vs = (ks if isinstance(ks, tuple) else (ks,) * num_kv_heads), (
                vs if isinstance(vs, tuple) else (vs,) * num_kv_heads)
        if q is not None and (ct or (q[1] if not isinstance(q[1], tuple) else min(q[1])) > 0):
            qs = q[1]
        else:
            qs = 1.0
            q_missing |= q is None
        if per_head and not isinstance(qs, tuple):
            qs = (qs,) * num_kv_heads
        ls = LayerScales(i, sl(ks), sl(vs), origin, kt, vt_, sl(qs), qt, zp)
        if not ct:
            any_one |= bool(ls.is_one)
        out.append(ls)
    if quantized and any_one and "e5m2" not in kv_cache_dtype:
        log.append(ONE_WARNING)
    if quantized and q_missing and not ct:
        log.append(Q_WARNING)
    return tuple(out)


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> None:
    """Write a small safetensors file (float32/float16/bfloat16; for tests and tools)."""
    import json

    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(_ml("bfloat16")): "BF16",
             np.dtype(np.float64): "F64", np.dtype(np.int32): "I32"}
    hdr: dict[str, Any] = {}
    blobs = []
    off = 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        hdr[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
