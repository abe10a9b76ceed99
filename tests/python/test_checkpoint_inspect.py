"""`vtinfer inspect`: the decision, per-layer scales and the plan, human and --json."""

from __future__ import annotations

import json

import numpy as np

from vtinfer.cli import main
from vtinfer.scales import write_safetensors


def test_inspect(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
        "torch_dtype": "bfloat16"}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    write_safetensors(tmp_path / "model.safetensors", {"model.layers.0.self_attn.k_proj.k_scale": np.array(0.5, np.float32)})
    assert main(["inspect", str(tmp_path), "--json", "--kv-cache-memory", "1MiB"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["quant_config"]["read"] == "hf_quant_config.json"
    assert d["decision"]["vllm_cache_dtype"] == "fp8_e4m3" and d["decision"]["source"] == "hf_quant_config.json"
    assert [(r["k_scale"], r["v_scale"], r["origin"]) for r in d["scales"]["layers"]] == [
        (0.5, 0.5, "one-sided"), (1.0, 1.0, "default")]
    assert d["plan"]["bytes_per_block"] == 2 * 2 * 16 * 2 * 16 and d["plan"]["num_blocks"] == (1 << 20) // 2048
    assert main(["inspect", str(tmp_path), "--kv-cache-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "ignored (unquantized cache)" in out and "checkpoint declares" not in out
    # a per-token-head format: named as stored, its scales said to be made at store, its page vLLM's
    # (2 layers x 16 slots x 2 KV heads x (D / 2 + 4) bytes x K and V, D = 16)
    assert main(["inspect", str(tmp_path), "--kv-cache-dtype", "int4_per_token_head", "--num-blocks", "4"]) == 0
    out = capsys.readouterr().out
    assert "stored as int4_per_token_head" in out and "per (token, KV head), computed at store" in out
    assert "1536 B/block" in out
