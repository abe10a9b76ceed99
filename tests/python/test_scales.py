"""Scales from safetensors: vLLM's name remapping and defaults, bad headers."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import vtinfer as vt
from vtinfer.scales import ONE_WARNING, load_kv_scales, read_safetensors_header, write_safetensors


def test_defaults_per_layer(tmp_path):
    f = tmp_path / "m.safetensors"
    write_safetensors(f, {
        "model.layers.0.self_attn.k_proj.k_scale": np.array(0.5, np.float32),   # modelopt
        "model.layers.0.self_attn.v_proj.v_scale": np.array([0.25], np.float32),
        "model.layers.1.self_attn.qkv_proj.k_scale": np.array(2.0, np.float32),  # fused, one-sided
        "model.layers.2.self_attn.kv_scale": np.array(3.0, np.float32),          # deprecated
        "model.layers.0.mlp.down_proj.weight_scale": np.array(9.0, np.float32),  # not KV
    })
    msgs: list[str] = []
    s = load_kv_scales([f], 4, 2, messages=msgs)
    assert [(x.k_scale, x.v_scale, x.origin) for x in s] == [
        (0.5, 0.25, "checkpoint"), (2.0, 2.0, "one-sided"), (3.0, 3.0, "kv_scale"), (1.0, 1.0, "default")]
    assert ONE_WARNING in msgs
    s = load_kv_scales([f], 4, 2, quantized=False)
    assert all(x.k_scale == 1.0 and x.origin == "ignored" for x in s)


def test_bad_scales(tmp_path):
    f = tmp_path / "m.safetensors"
    write_safetensors(f, {"model.layers.0.self_attn.k_scale": np.array(-1.0, np.float32)})
    with pytest.raises(ValueError, match="model.layers.0.self_attn.k_scale must be finite and > 0"):
        load_kv_scales([f], 1, 2)
    write_safetensors(f, {"model.layers.0.self_attn.k_scale": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"k_scale must hold 2 or 1 element\(s\) .*; got shape \[3\]"):
        load_kv_scales([f], 1, 2, per_head=True)
    write_safetensors(f, {"model.layers.0.self_attn.k_scale": np.ones(1, np.int32)})
    with pytest.raises(TypeError, match="must be a float tensor"):
        load_kv_scales([f], 1, 2)


def _raw(tmp_path, header: dict, data: bytes = b"") -> str:
    h = json.dumps(header).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return str(p)


@pytest.mark.parametrize("header,data,match", [
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4, "must lie in"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, "must span 8 bytes"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8, "must not overlap"),
    ({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "known dtype"),
])
def test_bad_headers(tmp_path, header, data, match):
    with pytest.raises(vt.ConfigError, match=match):
        read_safetensors_header(_raw(tmp_path, header, data))


def test_header_length_past_file(tmp_path):
    p = tmp_path / "t.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(vt.ConfigError, match="header length"):
        read_safetensors_header(p)
