"""PagedKVCache.from_checkpoint: the resolved dtype, the HF geometry, the
planned blocks and the per-layer scales written in the checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import vtinfer as vt

LAYERS, H, KV, D = 3, 8, 2, 32


def write_checkpoint(path, quant: dict | None, scales: dict[str, np.ndarray]) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": LAYERS, "num_attention_heads": H, "num_key_value_heads": KV,
           "hidden_size": H * D, "torch_dtype": "bfloat16"}
    if quant is not None:
        cfg["quantization_config"] = quant
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = {"model.embed_tokens.weight": np.zeros((4, H * D), np.float32), **scales}
    save_file(tensors, str(path / "model.safetensors"))


def test_modelopt_fp8_checkpoint_gives_an_fp8_cache_with_its_scales(tmp_path):
    k = np.array([0.5, 0.25, 2.0], np.float32)
    v = np.array([0.125, 4.0, 0.75], np.float32)
    scales = {}
    for i in range(LAYERS):
        scales[f"model.layers.{i}.self_attn.k_proj.k_scale"] = k[i : i + 1].reshape(())
        scales[f"model.layers.{i}.self_attn.v_proj.v_scale"] = v[i : i + 1].reshape(())
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    write_checkpoint(tmp_path, quant, scales)
    cache = vt.PagedKVCache.from_checkpoint(tmp_path, kv_cache_memory="1MiB")
    assert cache.dtype == "fp8_e4m3"
    assert (cache.num_layers, cache.num_kv_heads, cache.head_size, cache.block_size) == (LAYERS, KV, D, 16)
    assert np.array_equal(np.asarray(cache.k_scale).reshape(-1), k)
    assert np.array_equal(np.asarray(cache.v_scale).reshape(-1), v)
    plan = vt.plan_kv_cache(tmp_path, kv_cache_memory="1MiB")
    assert cache.num_blocks == plan.num_blocks and cache.page_bytes == plan.bytes_per_block


def test_unquantized_checkpoint_gives_the_model_dtype_and_unit_scales(tmp_path):
    write_checkpoint(tmp_path, None, {})
    cache = vt.PagedKVCache.from_checkpoint(tmp_path, num_blocks=5)
    assert cache.dtype == "bfloat16" and cache.num_blocks == 5
    assert np.all(np.asarray(cache.k_scale) == 1.0)


def test_flag_wins_and_e5m2_with_an_fp8_checkpoint_is_refused(tmp_path):
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    write_checkpoint(tmp_path, quant, {})
    assert vt.PagedKVCache.from_checkpoint(tmp_path, "bfloat16", num_blocks=2).dtype == "bfloat16"
    with pytest.raises(ValueError, match="e5m2"):
        vt.PagedKVCache.from_checkpoint(tmp_path, "fp8_e5m2", num_blocks=2)
