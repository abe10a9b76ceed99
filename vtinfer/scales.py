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
MAX_HEADER = 100 << 20

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


def remap_kv_scale_name(name: str, params: Any, messages: list[str] | None = None) -> str | None:
    """vLLM's ``maybe_remap_kv_scale_name``: the model parameter a checkpoint
    tensor name loads into, None when the remapped name is not in ``params``
    (anything supporting ``in`` and iteration), or ``name`` unchanged."""
    log = messages if messages is not None else []
    if name in params:
        return name
    if name.endswith(".kv_scale"):
        if KV_SCALE_DEPRECATED not in log:
            log.append(KV_SCALE_DEPRECATED)
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
    """The k/v scale parameters of a decoder with ``num_layers`` attention
    layers, whatever the module path (``model.layers.N....attn.k_scale``)."""

    _re = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?attn\.([kv])_scale$")

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers

    def __contains__(self, name: object) -> bool:
        m = self._re.search(str(name))
        return bool(m) and int(m.group(1)) < self.num_layers

    def __iter__(self):
        return iter(())

    def layer_of(self, name: str) -> tuple[int, str] | None:
        m = self._re.search(name)
        return (int(m.group(1)), m.group(2)) if m and int(m.group(1)) < self.num_layers else None


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
    from vtinfer import ConfigError

    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ConfigError(f"{p}: safetensors header length must be 8 bytes; got {len(head)}")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or n > size - 8:
            raise ConfigError(f"{p}: safetensors header length must be at most {min(MAX_HEADER, size - 8)}; got {n}")
        hdr = _C.json_loads(f.read(n), str(p))
    if not isinstance(hdr, dict):
        raise ConfigError(f"{p}: safetensors header must be a JSON object; got {type(hdr).__name__}")
    data = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or t.get("dtype") not in _ST_DTYPES:
            raise ConfigError(f"{p}: tensor {name} must have a known dtype; got {t!r:.80}")
        shape, offs = t.get("shape"), t.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                or not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise ConfigError(f"{p}: tensor {name} must have an integer shape and data_offsets [begin, end]")
        b, e = offs
        item = np.dtype(_ST_DTYPES[t["dtype"]] if not isinstance(_ST_DTYPES[t["dtype"]], str)
                        else _ml(_ST_DTYPES[t["dtype"]])).itemsize
        if not (0 <= b <= e <= data):
            raise ConfigError(f"{p}: tensor {name} data_offsets must lie in [0, {data}]; got {offs}")
        if e - b != math.prod(shape) * item:
            raise ConfigError(f"{p}: tensor {name} must span {math.prod(shape) * item} bytes for shape {shape}; "
                              f"got {e - b}")
        out[name] = TensorInfo(name, t["dtype"], tuple(shape), b, e, p)
    spans = sorted((ti.begin, ti.end, ti.name) for ti in out.values() if ti.end > ti.begin)
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ConfigError(f"{p}: tensors {n0} and {n1} must not overlap; got [{b0}, {e0}) and [{b1}, ...)")
    return out


def _ml(name: str) -> Any:
    import ml_dtypes

    return getattr(ml_dtypes, name)


def read_tensor(ti: TensorInfo) -> np.ndarray:
    """The tensor's values as float64 (scale tensors are tiny)."""
    with open(ti.file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n + ti.begin)
        raw = f.read(ti.end - ti.begin)
    dt = _ST_DTYPES[ti.dtype]
    arr = np.frombuffer(raw, dtype=np.dtype(_ml(dt) if isinstance(dt, str) else dt))
    return arr.astype(np.float64).reshape(ti.shape)


@dataclass(frozen=True)
class LayerScales:
    """One attention layer's scales after vLLM's defaults.

    Attributes
    ----------
    k_scale, v_scale : float or tuple of float
        Per tensor, or ``[num_kv_heads]`` for per-head checkpoints.
    origin : str
        ``checkpoint`` (both loaded), ``one-sided`` (one loaded, max copied),
        ``kv_scale`` (deprecated fused scale, copied), ``default`` (1.0),
        ``ignored`` (unquantized cache: loaded scales are not used).
    k_tensor, v_tensor : str or None
        The checkpoint tensor names that were read.
    """

    layer: int
    k_scale: float | tuple[float, ...]
    v_scale: float | tuple[float, ...]
    origin: str
    k_tensor: str | None
    v_tensor: str | None

    @property
    def is_one(self) -> bool:
        return np.all(np.asarray(self.k_scale) == 1.0) and bool(np.all(np.asarray(self.v_scale) == 1.0))


def load_kv_scales(shards: Iterable[str | os.PathLike], num_layers: int, num_kv_heads: int, *,
                   quantized: bool = True, per_head: bool = False, kv_cache_dtype: str = "fp8_e4m3",
                   messages: list[str] | None = None) -> tuple[LayerScales, ...]:
    """Per-layer K/V scales from safetensors shards.

    Parameters
    ----------
    shards : iterable of paths
    num_layers, num_kv_heads : int
    quantized : bool
        False for an unquantized cache: scales are 1.0 whatever is loaded.
    per_head : bool
        compressed-tensors ``attn_head``: scales must have shape ``[num_kv_heads]``.
    messages : list, optional
        Receives what vLLM would log.

    Raises
    ------
    ValueError
        A non-finite or non-positive scale, or a scale of the wrong shape
        (the tensor named).
    TypeError
        A scale tensor of a non-float dtype (the tensor named).
    vtinfer.ConfigError
        A bad safetensors header.
    """
    log = messages if messages is not None else []
    params = AttentionParams(num_layers)
    found: dict[tuple[int, str], tuple[str, Any, bool]] = {}
    for shard in shards:
        for name, ti in read_safetensors_header(shard).items():
            if not (name.endswith(_SUFFIXES) or name.endswith(".kv_scale")):
                continue
            target = remap_kv_scale_name(name, params, log)
            if target is None:
                continue
            lk = params.layer_of(target)
            if lk is None:
                continue
            if ti.dtype not in _FLOAT_ST:
                raise TypeError(f"load_kv_scales: {name} must be a float tensor; got {ti.dtype}")
            want = (num_kv_heads,) if per_head else None
            if not (ti.shape in ((), (1,)) or (want and ti.shape == want)):
                raise ValueError(f"load_kv_scales: {name} must have shape [] or [1]"
                                 f"{f' or [{num_kv_heads}]' if per_head else ''}; got {list(ti.shape)}")
            vals = read_tensor(ti).reshape(-1)
            if not np.all(np.isfinite(vals)) or not np.all(vals > 0):
                raise ValueError(f"load_kv_scales: {name} must be finite and > 0; got {vals.tolist()}")
            val: Any = float(vals[0]) if ti.shape in ((), (1,)) else tuple(float(x) for x in vals)
            found[lk] = (name, val, name.endswith(".kv_scale"))
    out = []
    any_one = False
    for i in range(num_layers):
        k, v = found.get((i, "k")), found.get((i, "v"))
        if not quantized:
            out.append(LayerScales(i, 1.0, 1.0, "ignored", k[0] if k else None, v[0] if v else None))
            continue
        if k and v:
            ks, vs, origin = k[1], v[1], "checkpoint"
        elif k or v:
            one = k or v
            assert one is not None
            ks = vs = one[1]
            # vLLM: max(k_scale, v_scale) with the missing one at -1.0 -> the loaded one
            origin = "kv_scale" if (k and v is None and k[2]) else "one-sided"
        else:
            ks, vs, origin = 1.0, 1.0, "default"
        ls = LayerScales(i, ks, vs, origin, k[0] if k else None, v[0] if v else None)
        any_one |= bool(ls.is_one)
        out.append(ls)
    if quantized and any_one and "e5m2" not in kv_cache_dtype:
        log.append(ONE_WARNING)
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
