"""vtinfer.scales.remap_kv_scale_name against vLLM's maybe_remap_kv_scale_name."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vtinfer.scales import AttentionParams, remap_kv_scale_name

seg = st.sampled_from(["model", "layers", "0", "1", "self_attn", "mixer", "k_proj", "v_proj", "qkv_proj",
                       "qkqkv_proj", "attn", "mla_attn", "q", "k_cache", "v_cache", "mlp", "kv_scale", "k_scale",
                       "v_scale", "q_scale", "scale", "k_zero_point", "weight_scale", "input_scale", "x"])
names = st.lists(seg, min_size=1, max_size=7).map(".".join)
params_sets = st.sets(names, max_size=6)


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(name=names, params=params_sets)
def test_remap_generated(vllm_remap, name, params):
    assert remap_kv_scale_name(name, params) == vllm_remap(name, params)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(name=names)
def test_remap_against_model_params(vllm_remap, name):
    want = {f"model.layers.{i}.self_attn.attn.{k}_scale" for i in range(2) for k in "kv"}
    got = remap_kv_scale_name(name, want)
    assert got == vllm_remap(name, want)
    p = AttentionParams(2)
    assert (got in want) == (got is not None and got in p and got.startswith("model.layers.")) or got not in want
