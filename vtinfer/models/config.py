"""The Llama-family model configuration the decoder needs, parsed from config.json."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DecoderConfig"]

_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm", "smollm2")


@dataclass(frozen=True)
class DecoderConfig:
    """Geometry and numerics of a Llama-family decoder.

    Attributes
    ----------
    model_type : str
        ``llama``, ``mistral``, ``qwen2`` or ``qwen3`` (Qwen3 adds RMSNorm on
        each Q and K head before RoPE; Qwen2 has Q/K/V biases).
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim : int
    rms_norm_eps, rope_theta : float
    rope_scaling : dict or None
        ``linear`` and ``llama3`` types are supported.
    tie_word_embeddings, attention_bias, qk_norm : bool
    sliding_window : int or None
        Mistral's window (keys per query, the current one included).
    eos_token_ids : tuple of int
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    sliding_window: int | None
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> "DecoderConfig":
        if isinstance(cfg.get("text_config"), dict):
            cfg = {**cfg, **cfg["text_config"]}
        mt = str(cfg.get("model_type", "llama"))
        if mt not in _TYPES:
            raise NotImplementedError(f"DecoderConfig: model_type must be one of {_TYPES}; got {mt!r}")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise NotImplementedError(f"DecoderConfig: hidden_act must be 'silu'; got {act!r}")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        hd = cfg.get("head_dim")
        eos = cfg.get("eos_token_id")
        eos_t = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        rs = cfg.get("rope_scaling")
        if rs is not None:
            kind = rs.get("rope_type", rs.get("type"))
            if kind not in ("linear", "llama3", "default"):
                raise NotImplementedError(f"DecoderConfig: rope_scaling type must be linear or llama3; got {kind!r}")
        sw = cfg.get("sliding_window")
        use_sw = sw is not None and (mt == "mistral" or cfg.get("use_sliding_window", False))
        return cls(
            model_type=mt,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(hd) if hd else hidden // heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rope_scaling=rs,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", mt == "qwen2")),
            qk_norm=mt == "qwen3",
            sliding_window=int(sw) if use_sw else None,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            eos_token_ids=eos_t,
            bos_token_id=cfg.get("bos_token_id"),
        )

    @classmethod
    def from_dir(cls, path: str | os.PathLike) -> "DecoderConfig":
        """The configuration in ``path/config.json``, read as checkpoint discovery reads it: a regular file
        (never a FIFO or device) that resolves inside ``path``, at most ``MAX_JSON_BYTES``, one JSON object.
        FileNotFoundError without it; ConfigError (a ValueError) naming the file otherwise."""
        from vtinfer._C import ConfigError, json_loads
        from vtinfer._fileio import check_inside, display, read_regular

        root = Path(path)
        p = root / "config.json"
        if not root.is_dir() or not os.path.lexists(p):
            raise FileNotFoundError(
                f"DecoderConfig: path must be a checkpoint directory with config.json; got '{path}'")
        check_inside(p, root, f"DecoderConfig: {p}")
        cfg = json_loads(read_regular(p, what=f"DecoderConfig: {p}"), display(p))
        if not isinstance(cfg, dict):
            raise ConfigError(f"DecoderConfig: {p} must hold a JSON object; got {type(cfg).__name__}")
        try:
            return cls.from_dict(cfg)
        except KeyError as e:
            raise ValueError(f"DecoderConfig: {p} must have {e.args[0]}; it does not") from None
