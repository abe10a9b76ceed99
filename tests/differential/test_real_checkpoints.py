"""Checkpoints as llm-compressor (made in this run) and ModelOpt (its documented
layout) write them: resolution, scales equal to the file's bytes (read with
the safetensors library), and vLLM's reductions and tensor-parallel slices
(compressed-tensors' own ``_tp_aware_loader`` and ``KVCacheScaleParameter``
extracted from the pinned wheel)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vtinfer as vt
from vtinfer.scales import write_safetensors
from vtinfer.sizing import scale_load_options
from vtinfer.tensor_parallel import rank_heads
from vtinfer.testing.checkpoints import TINY_LLAMA, make_modelopt_checkpoint

H, HKV = TINY_LLAMA["num_attention_heads"], TINY_LLAMA["num_key_value_heads"]
LAYERS = TINY_LLAMA["num_hidden_layers"]
TPS = (1, 2, 4, 8)


def file_tensors(d) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint, by the safetensors library's own reader."""
    torch = pytest.importorskip("torch")
    from safetensors import safe_open

    out = {}
    for shard in vt.Checkpoint(d).shards:
        with safe_open(str(shard), "pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k).to(torch.float64).numpy()
    return out


def load(d, tp=1, rank=0, explain=None):
    ck = vt.Checkpoint(d)
    res = vt.resolve_kv_cache_dtype("auto", ck)
    geo = ck.geometry
    return vt.load_kv_scales(ck.shards, geo.num_layers, geo.num_kv_heads, tensor_parallel_size=tp, rank=rank,
                             explain=explain, **scale_load_options(res, geo, "test"))


@pytest.mark.parametrize("recipe", ["tensor", "attn_head", "attn_head_attention"])
def test_llmcompressor_checkpoints_resolve_as_vllm(llmc_checkpoints, recipe):
    res = vt.resolve_kv_cache_dtype("auto", llmc_checkpoints[recipe])
    # resolve_kv_cache_dtype_string keeps auto; the Attention layer makes it fp8
    assert (res.vllm_cache_dtype, res.cache_dtype, res.dtype) == ("auto", "fp8", "fp8_e4m3")
    assert res.source == "compressed-tensors kv_cache_scheme"
    assert res.per_head_scales is (recipe != "tensor")
    qc = json.loads((llmc_checkpoints[recipe] / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"]["strategy"] == ("tensor" if recipe == "tensor" else "attn_head")


@pytest.mark.parametrize("recipe", ["tensor", "attn_head", "attn_head_attention"])
def test_llmcompressor_scales_equal_the_file_and_vllms_loader(llmc_checkpoints, recipe, vllm_tp_loader):
    d = llmc_checkpoints[recipe]
    t = file_tensors(d)
    a = "model.layers.{}.self_attn.{}"
    if recipe != "tensor":
        assert t[a.format(0, "k_scale")].shape == (HKV, 1, 1)  # the shape that failed to load before
    if recipe == "attn_head_attention":
        assert t[a.format(0, "q_scale")].shape == (H, 1, 1) and a.format(0, "k_zero_point") in t
    for tp in TPS:
        for r in range(tp):
            sc = load(d, tp, r)
            for i, s in enumerate(sc):
                k, v = t[a.format(i, "k_scale")], t[a.format(i, "v_scale")]
                assert s.origin == "checkpoint" and s.k_tensor == a.format(i, "k_scale")
                if recipe == "tensor":
                    assert s.k_scale == k.item() and s.v_scale == v.item()
                    continue
                kw = dict(total_num_heads=H, total_num_kv_heads=HKV, tensor_parallel_size=tp, rank=r)
                assert np.array_equal(s.k_scale, vllm_tp_loader(k, "k", **kw))
                assert np.array_equal(s.v_scale, vllm_tp_loader(v, "v", **kw))
                if recipe == "attn_head_attention":
                    q = t[a.format(i, "q_scale")]
                    # llm-compressor 0.14 on a CPU leaves q_scale uncalibrated (0 or NaN): compared as loaded
                    assert np.array_equal(s.q_scale, vllm_tp_loader(q, "q", **kw), equal_nan=True)
                    assert vllm_tp_loader(t[a.format(i, "k_zero_point")], "k", param_type="zero_point", **kw) is None
                    assert set(s.zero_points) == {a.format(i, f"{x}_zero_point") for x in "qkv"}
                else:
                    assert s.q_scale == (1.0,) * rh(tp, r).num_kv_heads and s.q_tensor is None


def rh(tp, r):
    return rank_heads(H, HKV, tp, r)


@pytest.mark.parametrize("tp", TPS)
def test_rank_heads_partition_or_replicate(tp):
    ranks = [rh(tp, r) for r in range(tp)]
    assert sorted(h for x in ranks for h in x.heads) == list(range(H))  # query heads partition
    kv = [h for x in ranks for h in x.kv_heads]
    if tp <= HKV:
        assert sorted(kv) == list(range(HKV)) and all(x.kv_replicas == 1 for x in ranks)
    else:  # replicated: each KV head on tp // HKV ranks, one per rank, serving its own query heads
        assert all(x.num_kv_heads == 1 for x in ranks)
        assert [kv.count(h) for h in range(HKV)] == [tp // HKV] * HKV
    for x in ranks:  # every query head of a rank reads a KV head of that rank (GQA: head h -> h // (H / HKV))
        assert {h // (H // HKV) for h in x.heads} <= set(x.kv_heads)


@pytest.mark.parametrize("tp", TPS)
def test_per_rank_caches_are_slices_of_the_one_rank_cache(llmc_checkpoints, tp):
    d = llmc_checkpoints["attn_head"]
    full = vt.PagedKVCache.from_checkpoint(d, num_blocks=4)
    assert full.k_scale.shape == (LAYERS, HKV)
    for r in range(tp):
        c = vt.PagedKVCache.from_checkpoint(d, num_blocks=4, tensor_parallel_size=tp, rank=r)
        x = rh(tp, r)
        assert c.num_kv_heads == x.num_kv_heads
        assert np.array_equal(c.k_scale, full.k_scale[:, list(x.kv_heads)])
        assert np.array_equal(c.v_scale, full.v_scale[:, list(x.kv_heads)])
    p1 = vt.plan_kv_cache(d, kv_cache_memory="1MiB")
    pn = vt.plan_kv_cache(d, kv_cache_memory="1MiB", tensor_parallel_size=tp)
    assert pn.num_kv_heads == max(1, HKV // tp)
    assert pn.bytes_per_block * HKV == p1.bytes_per_block * pn.num_kv_heads
    assert pn.num_blocks == (1 << 20) // pn.bytes_per_block


@pytest.mark.parametrize("tp,rank,match", [
    (3, 0, r"Total number of attention heads \(8\) must be divisible by tensor parallel size \(3\)"),
    (16, 0, r"Total number of attention heads \(8\) must be divisible"),
    (4, 4, r"rank must be an int in \[0, 4\); got 4"),
    (2, -1, r"rank must be an int in \[0, 2\); got -1"),
    (0, 0, r"tensor_parallel_size must be a positive int; got 0"),
])
def test_bad_tensor_parallel_refused_by_name(tmp_path, tp, rank, match):
    d, _ = make_modelopt_checkpoint(tmp_path / "m")
    with pytest.raises(ValueError, match=match):
        vt.PagedKVCache.from_checkpoint(d, num_blocks=2, tensor_parallel_size=tp, rank=rank)


def test_kv_heads_not_divisible_refused(tmp_path):
    d, _ = make_modelopt_checkpoint(tmp_path / "m", num_heads=12, num_kv_heads=6)
    with pytest.raises(ValueError, match="total_num_kv_heads must be divisible by tensor_parallel_size"):
        vt.plan_kv_cache(d, num_blocks=2, tensor_parallel_size=4)
    d, _ = make_modelopt_checkpoint(tmp_path / "n", num_heads=12, num_kv_heads=3)
    with pytest.raises(ValueError, match="tensor_parallel_size must be divisible by total_num_kv_heads"):
        vt.plan_kv_cache(d, num_blocks=2, tensor_parallel_size=4)


@pytest.mark.parametrize("legacy", [False, True])
def test_modelopt_layout_resolves_and_loads(tmp_path, legacy, vllm_scalar_loader):
    d, written = make_modelopt_checkpoint(tmp_path / "m", legacy=legacy)
    res = vt.resolve_kv_cache_dtype("auto", d)
    assert res.vllm_cache_dtype == "fp8_e4m3" and res.dtype == "fp8_e4m3"
    assert res.source == ("hf_quant_config.json" if legacy else "config.json")
    t = file_tensors(d)
    explain: list = []
    for tp in TPS:
        sc = load(d, tp, 0, explain if tp == 1 else None)
        for i, s in enumerate(sc):
            k, v = f"model.layers.{i}.self_attn.k_proj.k_scale", f"model.layers.{i}.self_attn.v_proj.v_scale"
            assert (s.k_tensor, s.v_tensor, s.origin) == (k, v, "checkpoint")
            assert s.k_scale == vllm_scalar_loader(t[k]) == float(written[k])
            assert s.v_scale == vllm_scalar_loader(t[v]) == float(written[v])
            assert s.q_scale == 1.0
    by = {e["tensor"]: e for e in explain}
    assert set(by) == set(written)
    assert by["model.layers.0.self_attn.k_proj.k_scale"]["action"] == "remapped"
    assert by["model.layers.0.self_attn.k_proj.k_scale"]["target"] == "model.layers.0.self_attn.attn.k_scale"
    assert by["model.layers.1.self_attn.q_proj.weight_scale"]["action"] == "ignored"
    assert "not a KV-cache scale" in by["model.layers.1.self_attn.q_proj.input_scale"]["why"]


def _ct(tmp_path, tensors, strategy="attn_head", groups=True, extra=None):
    d = tmp_path / "ct"
    d.mkdir(exist_ok=True)
    qc = {"quant_method": "compressed-tensors", "kv_cache_scheme": {
        "num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}}
    if groups:
        qc["config_groups"] = {}
    qc.update(extra or {})
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "torch_dtype": "bfloat16", "quantization_config": qc}))
    write_safetensors(d / "model.safetensors", tensors)
    return d


def test_per_head_h11_scales_and_q_group_max(tmp_path, vllm_tp_loader):
    k = np.array([0.5, 0.25], np.float32).reshape(2, 1, 1)
    q = np.array([1, 3, 2, 0.5], np.float32).reshape(4, 1, 1)
    d = _ct(tmp_path, {"model.layers.0.self_attn.k_scale": k, "model.layers.0.self_attn.v_scale": k * 2,
                       "model.layers.0.self_attn.q_scale": q})
    (s,) = load(d)
    assert s.k_scale == (0.5, 0.25) and s.v_scale == (1.0, 0.5) and s.q_scale == (3.0, 2.0)
    assert np.array_equal(s.q_scale, vllm_tp_loader(q, "q", total_num_heads=4, total_num_kv_heads=2))
    c = vt.PagedKVCache.from_checkpoint(d, num_blocks=2)
    assert np.array_equal(c.k_scale, [[0.5, 0.25]])


def test_refusals_name_the_tensor(tmp_path, vllm_scalar_loader):
    # a per-head tensor for a per-tensor method (vLLM's KVCacheScaleParameter refuses it)
    d, _ = make_modelopt_checkpoint(tmp_path / "m", num_layers=1)
    write_safetensors(d / "model.safetensors", {"model.layers.0.self_attn.k_proj.k_scale": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="expects a scalar weight"):
        vllm_scalar_loader(np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_proj.k_scale must hold 1 element"):
        vt.PagedKVCache.from_checkpoint(d, num_blocks=2)
    # attn_head with the wrong number of heads
    d = _ct(tmp_path, {"model.layers.0.self_attn.k_scale": np.ones((3, 1, 1), np.float32)})
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_scale must hold 2 or 1 element"):
        vt.PagedKVCache.from_checkpoint(d, num_blocks=2)
    # attn_head without the head counts vLLM's TP-aware loader divides by
    d = _ct(tmp_path, {"model.layers.0.self_attn.k_scale": np.ones((2, 1, 1), np.float32)}, groups=False)
    with pytest.raises(ValueError, match="must have config_groups"):
        vt.PagedKVCache.from_checkpoint(d, num_blocks=2)


def test_compressed_tensors_missing_scale_stays_one(tmp_path):
    d = _ct(tmp_path, {"model.layers.0.self_attn.k_scale": np.array([0.5], np.float32)}, strategy="tensor")
    (s,) = load(d)
    # CompressedTensorsKVCacheMethod keeps its ones placeholder (no max rule)
    assert (s.k_scale, s.v_scale, s.origin) == (0.5, 1.0, "partial")
