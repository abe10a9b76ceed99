"""The geometry a KV cache needs, from a Hugging Face config.json (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPE_NAMES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
                "bfloat16": "bfloat16", "fp16": "float16", "bf16": "bfloat16"}


# geometry far beyond any model is refused by name before any
# per-layer work (num_hidden_layers: 10**9 used to build 10**9 layer specs).
# The largest released models have ~130 layers, 128 heads, head_dim 256.
MAX_GEOMETRY = {"num_hidden_layers": 1 << 16, "n_layer": 1 << 16, "num_layers": 1 << 16,
                "num_attention_heads": 1 << 16, "n_head": 1 << 16, "num_key_value_heads": 1 << 16,
                "head_dim": 1 << 16, "hidden_size": 1 << 24, "n_embd": 1 << 24}


def _bounded(name: str, key: str, v: int) -> int:
    limit = MAX_GEOMETRY.get(key)
    if limit is not None and v > limit:
        raise ValueError(f"{name}: {key} must be at most {limit}; got {v}")
    return v


@dataclass(frozen=True)
class AttentionSpec:
    """One attention layer's cache needs.

    Attributes
    ----------
    layer : int
    num_kv_heads : int
    head_dim : int
    sliding_window : int or None
        Keys kept (None: full attention).
    kind : str
        ``"full_attention"`` or ``"sliding_attention"`` (from ``layer_types``).
    """

    layer: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None
    kind: str


@dataclass(frozen=True)
class ModelGeometry:
    """What the cache needs from a model config.

    Attributes
    ----------
    num_layers, num_heads, num_kv_heads, head_dim : int
        ``head_dim`` defaults to ``hidden_size // num_attention_heads``;
        ``num_kv_heads`` to ``num_attention_heads``.
    dtype : str
        ``torch_dtype`` / ``dtype`` as a vtinfer dtype name (default bfloat16... see
        ``dtype_declared``).
    sliding_window : int or None
    layer_types : tuple of str or None
    model_type : str or None
    partial_rotary_factor : float
        The share of each head's dims that RoPE rotates: ``partial_rotary_factor``
        or ``rope_parameters["partial_rotary_factor"]``, 1.0 where neither is
        given (vLLM's ``rope_dim_from_hf_config``); see :meth:`rope_dim`.
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_declared: bool
    sliding_window: int | None
    layer_types: tuple[str, ...] | None
    model_type: str | None
    layers: tuple[AttentionSpec, ...]
    partial_rotary_factor: float = 1.0

    def rope_dim(self, head_dim: int | None = None) -> int:
        """The rotary dims of a head of ``head_dim`` (default: the model's): ``int(head_dim *
        partial_rotary_factor)``, as vLLM 0.33's ``rope_dim_from_hf_config`` (Octave's K layout depends on it)."""
        return int((self.head_dim if head_dim is None else head_dim) * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], name: str = "config.json") -> "ModelGeometry":
        """Parse; multimodal configs are read through their ``text_config``.

        Raises
        ------
        ValueError
            A missing or non-positive field, naming it and the file.
        """
        if not isinstance(cfg, dict):
            raise ValueError(f"{name} must hold a JSON object; got {type(cfg).__name__}")
        text = cfg.get("text_config")
        src = text if isinstance(text, dict) and "num_hidden_layers" in text else cfg

        def need(key: str, alt: tuple[str, ...] = ()) -> int:
            for k in (key, *alt):
                v = src.get(k)
                if v is not None:
                    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                        raise ValueError(f"{name}: {k} must be a positive integer; got {v!r}")
                    return _bounded(name, k, v)
            raise ValueError(f"{name}: {key} must be present; got nothing")

        layers = need("num_hidden_layers", ("n_layer", "num_layers"))
        heads = need("num_attention_heads", ("n_head",))
        kv = src.get("num_key_value_heads")
        kv = heads if kv is None else kv
        if isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0 or heads % kv:
            raise ValueError(f"{name}: num_key_value_heads must be a positive divisor of {heads}; got {kv!r}")
        _bounded(name, "num_key_value_heads", kv)
        hd = src.get("head_dim")
        if hd is None:
            hd = need("hidden_size", ("n_embd",)) // heads
        if isinstance(hd, bool) or not isinstance(hd, int) or hd <= 0:
            raise ValueError(f"{name}: head_dim must be a positive integer; got {hd!r}")
        _bounded(name, "head_dim", hd)
        raw = src.get("torch_dtype", src.get("dtype", cfg.get("torch_dtype", cfg.get("dtype"))))
        dtype = _DTYPE_NAMES.get(str(raw).replace("torch.", "")) if raw is not None else None
        sw = src.get("sliding_window")
        if sw is not None and (isinstance(sw, bool) or not isinstance(sw, int) or sw <= 0):
            sw = None
        lt = src.get("layer_types")
        lt = tuple(str(x) for x in lt) if isinstance(lt, list) else None
        if lt is not None and len(lt) != layers:
            raise ValueError(f"{name}: layer_types must have num_hidden_layers={layers} entries; got {len(lt)}")
        specs = []
        for i in range(layers):
            kind = lt[i] if lt else ("sliding_attention" if sw else "full_attention")
            specs.append(AttentionSpec(i, kv, hd, sw if kind == "sliding_attention" else None, kind))
        factor = src.get("partial_rotary_factor")
        if factor is None:
            rp = src.get("rope_parameters")
            factor = rp.get("partial_rotary_factor", 1.0) if isinstance(rp, dict) else 1.0
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0.0 <= factor <= 1.0:
            raise ValueError(f"{name}: partial_rotary_factor must be a number in [0, 1]; got {factor!r}")
        return cls(layers, heads, kv, hd, dtype or "bfloat16", dtype is not None, sw, lt,
                   src.get("model_type", cfg.get("model_type")), tuple(specs), float(factor))
