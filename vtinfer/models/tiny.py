"""A small generated checkpoint (random weights, tiny geometry) for fast tests
and for the demo when the default model's package is not installed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from vtinfer.models.store import atomic_dir, cache_dir, save_safetensors, write_json

__all__ = ["make_tiny_checkpoint", "tiny_config", "default_tiny_dir"]


def tiny_config(model_type: str = "llama", **over: Any) -> dict[str, Any]:
    """config.json of a tiny decoder (byte vocabulary, 2 layers, GQA 2)."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[model_type]
    cfg: dict[str, Any] = {
        "architectures": [arch], "model_type": model_type, "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "max_position_embeddings": 4096, "tie_word_embeddings": model_type in ("llama", "qwen3"),
        "attention_bias": model_type == "qwen2", "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if model_type == "mistral":
        cfg["sliding_window"] = 24
    cfg.update(over)
    return cfg


def make_tiny_checkpoint(out_dir: str | os.PathLike, *, seed: int = 0, model_type: str = "llama",
                         **config_over: Any) -> Path:
    """Write ``config.json`` and ``model.safetensors`` with seeded random weights.

    The weights are scaled so activations stay O(1) through the layers, and a
    few K channels per KV head are made larger than the rest (as trained
    models have), so per-layer and per-head fp8 scales differ.
    """
    cfg = tiny_config(model_type, **config_over)
    rng = np.random.default_rng(seed)
    hid, inter, H, Hk, D = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                            cfg["num_key_value_heads"], cfg["head_dim"])

    def lin(o: int, i: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((o, i)) * gain / np.sqrt(i)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    emb_std = 0.25 if cfg["tie_word_embeddings"] else 1.0
    embed = (emb_std * rng.standard_normal((cfg["vocab_size"], hid))).astype(np.float32)
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": embed, "model.norm.weight": norm(hid)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = lin(cfg["vocab_size"], hid, 4.0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        wk = lin(Hk * D, hid, 2.0)
        # outlier channels: head h gets a K gain of 1 + 3 h in one channel pair
        for h in range(Hk):
            wk[h * D + 1] *= 1 + 3 * h + i
            wk[h * D + 1 + D // 2] *= 1 + 3 * h + i
        t.update({
            p + "input_layernorm.weight": norm(hid), p + "post_attention_layernorm.weight": norm(hid),
            p + "self_attn.q_proj.weight": lin(H * D, hid, 2.0), p + "self_attn.k_proj.weight": wk,
            p + "self_attn.v_proj.weight": lin(Hk * D, hid, 1.0 + i), p + "self_attn.o_proj.weight": lin(hid, H * D),
            p + "mlp.gate_proj.weight": lin(inter, hid), p + "mlp.up_proj.weight": lin(inter, hid),
            p + "mlp.down_proj.weight": lin(hid, inter),
        })
        if cfg["attention_bias"]:
            for n, rows in (("q", H * D), ("k", Hk * D), ("v", Hk * D)):
                t[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(rows)).astype(np.float32)
        if model_type == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(D)
            t[p + "self_attn.k_norm.weight"] = norm(D)
    with atomic_dir(out_dir) as tmp:
        save_safetensors(tmp / "model.safetensors", t, metadata={"format": "pt"})
        write_json(tmp / "config.json", cfg)
    return Path(out_dir)


def default_tiny_dir() -> Path:
    """The generated tiny checkpoint in the cache (generated on first use)."""
    out = cache_dir() / "models" / "tiny-llama-seed0"
    if not (out / "config.json").is_file():
        make_tiny_checkpoint(out)
    return out
