"""An independent float64 (or float32) NumPy Llama-family forward pass: dense
causal attention over the whole sequence, no paging, no vtinfer code.

``kv_round`` (optional) maps K or V ``[n, H_kv, D]`` plus the layer index and
``"k"``/``"v"`` to what a KV cache would hand back (bf16 rounding, fp8
quantize/dequantize with a scale), so the same oracle covers every KV dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def load(model_dir):
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    w = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        w.update(load_file(str(f)))
    return cfg, w


def forward(cfg, w, tokens, dtype=np.float64, kv_round=None):
    f = lambda a: np.asarray(a, dtype=dtype)  # noqa: E731
    H, Hk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    n = len(tokens)

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f(g)

    pos = np.arange(n, dtype=np.float64)
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = f(np.cos(ang))[:, None, :], f(np.sin(ang))[:, None, :]

    def rope(x):  # rotate-half pairs (i, i + D/2)
        a, b = x[..., : D // 2], x[..., D // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    x = f(w["model.embed_tokens.weight"])[np.asarray(tokens)]
    mask = np.tril(np.ones((n, n), bool))
    sw = cfg.get("sliding_window") if cfg.get("model_type") == "mistral" else None
    if sw:
        mask &= ~np.tril(np.ones((n, n), bool), -sw)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        proj = {}
        for nm in "qkv":
            y = h @ f(w[p + f"self_attn.{nm}_proj.weight"]).T
            if p + f"self_attn.{nm}_proj.bias" in w:
                y = y + f(w[p + f"self_attn.{nm}_proj.bias"])
            proj[nm] = y
        q = proj["q"].reshape(n, H, D)
        k = proj["k"].reshape(n, Hk, D)
        v = proj["v"].reshape(n, Hk, D)
        if p + "self_attn.q_norm.weight" in w:
            q = norm(q, w[p + "self_attn.q_norm.weight"])
            k = norm(k, w[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        if kv_round is not None:
            k, v = f(kv_round(k, i, "k")), f(kv_round(v, i, "v"))
        g = H // Hk
        o = np.empty((n, H, D), dtype)
        for hh in range(H):
            s = (q[:, hh] @ k[:, hh // g].T) / np.sqrt(D)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // g]
        x = x + o.reshape(n, H * D) @ f(w[p + "self_attn.o_proj.weight"]).T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gt = h @ f(w[p + "mlp.gate_proj.weight"]).T
        up = h @ f(w[p + "mlp.up_proj.weight"]).T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ f(w[p + "mlp.down_proj.weight"]).T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    if cfg.get("tie_word_embeddings"):
        head = w["model.embed_tokens.weight"]
    return norm(x, w["model.norm.weight"]) @ f(head).T


def assert_matches_rounded(ours, ref, ref_plain):
    """Our logits against the float64 forward with the same K / V rounding (``ref``): the RMS distance must be
    a small fraction of what the rounding itself does (``ref`` against the unrounded ``ref_plain``). A
    float32-vs-float64 difference can flip the rounding of a rare K / V element on a rounding boundary, which
    moves a few logits by ~1e-3; a swapped, dropped or misrouted scale changes the rounding everywhere."""
    rms = lambda a, b: float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)))  # noqa: E731
    effect = rms(ref_plain, ref)
    assert effect > 2e-5 * np.abs(ref).max(), "anti-vacuity: the KV rounding must move the logits beyond round-off"
    assert rms(ours, ref) <= 0.1 * effect, (rms(ours, ref), effect)
