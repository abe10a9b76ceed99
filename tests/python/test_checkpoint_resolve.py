"""Checkpoint discovery and resolve_kv_cache_dtype through real files."""

from __future__ import annotations

import json

import pytest

import vtinfer as vt

GEO = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
       "torch_dtype": "bfloat16"}
LEGACY = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


def make(tmp_path, config, hf_quant=None, raw_config=None):
    (tmp_path / "config.json").write_bytes(raw_config if raw_config is not None else json.dumps(config).encode())
    if hf_quant is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return tmp_path


def test_legacy_file_route(tmp_path):
    r = vt.resolve_kv_cache_dtype("auto", make(tmp_path, GEO, LEGACY))
    assert (r.vllm_cache_dtype, r.dtype, r.source, r.declared_by_checkpoint) == (
        "fp8_e4m3", "fp8_e4m3", "hf_quant_config.json", True)
    assert any(m.startswith("checkpoint declares") for m in r.messages)
    assert r.quant_config["quant_method"] == "modelopt"


def test_inline_wins_and_flag_never_declares(tmp_path):
    cfg = dict(GEO, quantization_config={"quant_method": "fp8"})
    r = vt.resolve_kv_cache_dtype("auto", make(tmp_path, cfg, LEGACY))
    assert (r.vllm_cache_dtype, r.dtype, r.source, r.quant_config_file) == ("auto", "bfloat16", "default", "config.json")
    r = vt.resolve_kv_cache_dtype("fp8", vt.Checkpoint(tmp_path))
    assert r.source == "flag" and not r.declared_by_checkpoint
    assert not any(m.startswith("checkpoint declares") for m in r.messages)


def test_compressed_tensors_per_head(tmp_path):
    cfg = dict(GEO, quantization_config={"quant_method": "compressed-tensors", "kv_cache_scheme": {
        "num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True, "dynamic": False}})
    r = vt.resolve_kv_cache_dtype("auto", make(tmp_path, cfg))
    assert (r.vllm_cache_dtype, r.cache_dtype, r.dtype, r.source, r.per_head_scales) == (
        "auto", "fp8", "fp8_e4m3", "compressed-tensors kv_cache_scheme", True)
    with pytest.raises(ValueError, match="fp8_e5m2 kv-cache is not supported with fp8 checkpoints"):
        vt.resolve_kv_cache_dtype("fp8_e5m2", tmp_path)


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        vt.Checkpoint(tmp_path)
    make(tmp_path, None, LEGACY, raw_config=b'{"quantization_config": {')
    with pytest.raises(vt.ConfigError, match=r"config.json:1:\d+"):
        vt.resolve_kv_cache_dtype("auto", tmp_path)  # never a fall back to the legacy file
    make(tmp_path, None, raw_config=b"[" * 100000)
    with pytest.raises(vt.ConfigError, match="nesting"):
        vt.Checkpoint(tmp_path)
    make(tmp_path, None, raw_config=b'{"a": "\xff"}')
    with pytest.raises(vt.ConfigError, match="UTF-8"):
        vt.Checkpoint(tmp_path)
    make(tmp_path, dict(GEO, quantization_config="fp8"))
    with pytest.raises(TypeError, match="quantization_config must be a JSON object"):
        vt.resolve_kv_cache_dtype("auto", tmp_path)
    make(tmp_path, GEO)
    with pytest.raises(ValueError, match=r"fp8_e4m3, fp8_e5m2, .* \(what vtinfer stores\)"):
        vt.resolve_kv_cache_dtype("fp9", tmp_path)


def test_geometry(tmp_path):
    cfg = {"text_config": dict(GEO, layer_types=["sliding_attention", "full_attention"], sliding_window=128)}
    g = vt.Checkpoint(make(tmp_path, cfg)).geometry
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.dtype) == (2, 2, 16, "bfloat16")
    assert [s.sliding_window for s in g.layers] == [128, None]
