"""Gaps found by the mutation runner (tests/mutation/mutations.toml), closed
here against vLLM 0.33.0's documented behaviour (/work/shared/UPSTREAM.md:
the modelopt marker is producer.name == "modelopt" or a `quantization` dict
holding the KEY modelopt_quant_config; nothing else)."""

from __future__ import annotations

import json

import pytest

import vtinfer as vt


@pytest.mark.parametrize("nested, outer, want_method", [
    # a nested quant_method (even "modelopt") is not the marker: quant_method stays the outer one
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8", "fp8"),
    # not the marker, so an algo vLLM does not know is never looked at (no "Unknown ModelOpt quant algo")
    ({"quant_method": "gptq", "quant_algo": "W4A16"}, "gptq", "gptq"),
])
def test_nested_quant_method_is_not_the_modelopt_marker(tmp_path, nested, outer, want_method):
    cfg = {"quantization_config": {"quant_method": outer, "quantization": nested, "kv_cache_quant_algo": "FP8"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = vt.resolve_kv_cache_dtype("auto", tmp_path)
    assert r.quant_method == want_method
    assert r.cache_dtype == "auto"
    assert not r.declared_by_checkpoint
