"""Strings the resolver hands back keep what Python's json would give:
a lone surrogate in quant_method survives (vLLM lower-cases it as is)."""

from __future__ import annotations

import json

import vtinfer as vt


def test_quant_method_with_a_lone_surrogate_round_trips(tmp_path):
    (tmp_path / "config.json").write_text('{"quantization_config": {"quant_method": "\\ud800X"}}')
    want = json.loads((tmp_path / "config.json").read_text())["quantization_config"]["quant_method"].lower()
    r = vt.resolve_kv_cache_dtype("auto", tmp_path)
    assert want == "\ud800x"
    assert r.quant_method == want
