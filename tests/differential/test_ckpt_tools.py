"""kv_cache_dtype_skip_layers against vLLM's own block alignment, `vtinfer inspect`
per rank and per scale tensor, and `calibrate --per-head` as llm-compressor
writes (compressed-tensors' own parser accepts it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vtinfer as vt
from vtinfer.cli import main
from vtinfer.hf_config import ModelGeometry
from vtinfer.testing.checkpoints import make_modelopt_checkpoint


def geo(layers=4, kv=2, head_dim=16, dtype="bfloat16", **kw):
    return ModelGeometry.from_dict({"num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": kv,
                                    "head_dim": head_dim, "torch_dtype": dtype, **kw})


@pytest.mark.parametrize("block_size", [1, 16, 32, 48, 64])
@pytest.mark.parametrize("cache,model", [("fp8_e4m3", "bfloat16"), ("fp8_e4m3", "float32"), ("bfloat16", "bfloat16"),
                                         ("auto", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32")])
@pytest.mark.parametrize("kv,head_dim", [(1, 16), (2, 64), (8, 128)])
def test_skip_layer_block_alignment_equals_vllms(vllm_align, block_size, cache, model, kv, head_dim):
    g = geo(kv=kv, head_dim=head_dim, dtype=model)
    p = vt.plan_kv_cache(g, cache, block_size, num_blocks=4, kv_cache_dtype_skip_layers=["1"])
    want = vllm_align(block_size, "auto" if cache == "auto" else cache.replace("_e4m3", ""), model, kv, head_dim, ["1"])
    assert (p.vllm_block_size, p.skip_page_size_padded) == want
    assert p.skipped_layers == (1,) and p.layer_dtypes[1] == model


def test_skip_layer_alignment_refusal_equals_vllms(vllm_align):
    with pytest.raises(AssertionError, match="must not be smaller than the quantized primary"):
        vllm_align(16, "float32", "bfloat16", 2, 16, ["0"])
    with pytest.raises(ValueError, match="must not be smaller than the quantized primary"):
        vt.plan_kv_cache(geo(), "float32", 16, num_blocks=4, kv_cache_dtype_skip_layers=["0"])


def test_skip_layers_pages_per_layer():
    g = geo(layers=4, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8)
    p = vt.plan_kv_cache(g, "fp8", 16, kv_cache_memory=1 << 20, kv_cache_dtype_skip_layers=["3", "sliding_window"])
    assert p.skipped_layers == (0, 2, 3)
    assert p.layer_dtypes == ("bfloat16", "fp8_e4m3", "bfloat16", "bfloat16")
    fp8 = 2 * 16 * 2 * 16
    assert p.layer_page_bytes == (2 * fp8, fp8, 2 * fp8, 2 * fp8)
    assert p.bytes_per_block == 7 * fp8 and p.num_blocks == (1 << 20) // (7 * fp8)
    assert vt.plan_kv_cache(g, "fp8", 16, num_blocks=2, kv_cache_dtype_skip_layers=["9"]).skipped_layers == ()
    with pytest.raises(TypeError, match="kv_cache_dtype_skip_layers must be a list of str"):
        vt.plan_kv_cache(g, "fp8", 16, num_blocks=2, kv_cache_dtype_skip_layers=[0])


def test_from_checkpoint_skip_layers(tmp_path):
    d, _ = make_modelopt_checkpoint(tmp_path / "m")
    with pytest.raises(NotImplementedError, match=r"keeps layers \[0\] at bfloat16"):
        vt.PagedKVCache.from_checkpoint(d, num_blocks=2, kv_cache_dtype_skip_layers=["0"])
    # a bf16 cache: skipping changes nothing, and the scales are 1.0 (unquantized)
    c = vt.PagedKVCache.from_checkpoint(d, "bfloat16", num_blocks=2, kv_cache_dtype_skip_layers=["0"])
    assert np.all(c.k_scale == 1.0)


def test_inspect_tensor_parallel_table_and_scale_tensors(llmc_checkpoints, capsys):
    d = llmc_checkpoints["attn_head_attention"]
    assert main(["inspect", str(d), "--tensor-parallel-size", "4", "--kv-cache-memory", "1MiB"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("tensor parallel  4 ranks"):].splitlines()[2:]
    assert [ln.split()[:3] for ln in table] == [["0", "0-1", "0"], ["1", "2-3", "0"], ["2", "4-5", "1"],
                                                ["3", "6-7", "1"]]
    assert "x2" in table[0]
    # the scale-tensor lines fold the layers (inspect's folded form): both layers' k_zero_point in one line
    assert "ignored  model.layers.N.self_attn.k_zero_point F8_E4M3[2, 1, 1]  (layers 0-1; zero point" in out
    assert main(["inspect", str(d), "--tensor-parallel-size", "4", "--num-blocks", "8", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    one = vt.load_kv_scales(vt.Checkpoint(d).shards, 2, 2, per_head=True, num_heads=8)
    for r in j["ranks"]:
        assert r["k_scale"] == [[s.k_scale[r["kv_heads"][0]]] for s in one]
    acts = {e["tensor"].split(".")[-1]: e["action"] for e in j["scale_tensors"]}
    assert acts == {"k_scale": "remapped", "v_scale": "remapped", "q_scale": "remapped", "k_zero_point": "ignored",
                    "v_zero_point": "ignored", "q_zero_point": "ignored"}
    assert j["plan"]["num_kv_heads_per_rank"] == 1 and j["plan"]["tensor_parallel_size"] == 4


def test_inspect_explains_modelopt_tensors(tmp_path, capsys):
    d, written = make_modelopt_checkpoint(tmp_path / "m")
    assert main(["inspect", str(d), "--json", "--num-blocks", "2"]) == 0
    j = json.loads(capsys.readouterr().out)
    by = {e["tensor"]: e for e in j["scale_tensors"]}
    assert set(by) == set(written)
    assert by["model.layers.0.self_attn.v_proj.v_scale"]["target"] == "model.layers.0.self_attn.attn.v_scale"
    assert by["model.layers.0.self_attn.o_proj.weight_scale"]["action"] == "ignored"
    assert main(["inspect", str(d), "--json", "--num-blocks", "2", "--kv-cache-dtype", "bfloat16"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert {e["action"] for e in j["scale_tensors"]} == {"ignored"}


@pytest.mark.parametrize("per_head", [True, False])
def test_calibrate_writes_what_llmcompressor_writes(tmp_path, llmc_checkpoints, per_head):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig
    from safetensors.numpy import load_file

    from vtinfer.models import make_tiny_checkpoint, write_calibrated
    from vtinfer.models.calibrate import Calibration

    src = make_tiny_checkpoint(tmp_path / "tiny")
    g = vt.Checkpoint(src).geometry
    rng = np.random.default_rng(3)
    cal = Calibration(rng.uniform(0.1, 40, (g.num_layers, g.num_kv_heads)).astype(np.float32),
                      rng.uniform(0.1, 40, (g.num_layers, g.num_kv_heads)).astype(np.float32), 7)
    out = write_calibrated(src, tmp_path / "cal", cal, per_head=per_head, fmt="compressed-tensors")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    ref = json.loads((llmc_checkpoints["attn_head" if per_head else "tensor"] / "config.json").read_text())
    ref = ref["quantization_config"]
    assert qc["kv_cache_scheme"] == ref["kv_cache_scheme"]
    assert set(ref) <= set(qc)
    parsed = QuantizationConfig.model_validate(qc)  # compressed-tensors' own parser
    assert parsed.kv_cache_scheme == QuantizationArgs.model_validate(ref["kv_cache_scheme"])
    t = load_file(str(out / "kv_scales.safetensors"))
    ks, vs = cal.scales(per_head)
    sc = vt.load_kv_scales(vt.Checkpoint(out).shards, g.num_layers, g.num_kv_heads, per_head=per_head,
                           compressed_tensors=True, num_heads=g.num_heads)
    for i, s in enumerate(sc):
        k = t[f"model.layers.{i}.self_attn.k_scale"]
        assert k.shape == ((g.num_kv_heads, 1, 1) if per_head else (1,))  # llm-compressor's shapes
        assert k.tobytes() == np.asarray(ks[i], np.float32).tobytes()  # bit for bit in the file
        assert np.asarray(s.k_scale, np.float32).tobytes() == k.tobytes()  # and read back bit for bit
        assert np.asarray(s.v_scale, np.float32).tobytes() == np.asarray(vs[i], np.float32).tobytes()


def test_vllms_compressed_tensors_parser_accepts_calibrate_and_llmcompressor(tmp_path, llmc_checkpoints):
    """vLLM 0.33.0 pins compressed-tensors 0.17.0 (llm-compressor installs 0.19.0):
    its own parser, imported from the pinned wheel in a child process."""
    from vtinfer.models import make_tiny_checkpoint, write_calibrated
    from vtinfer.models.calibrate import Calibration
    from vtinfer.testing import checkpoints, upstream

    src = make_tiny_checkpoint(tmp_path / "tiny")
    a = np.full((2, 2), 4.0, np.float32)
    docs = {}
    for per_head in (True, False):
        out = write_calibrated(src, tmp_path / f"cal{per_head}", Calibration(a, a, 1), per_head=per_head,
                               fmt="compressed-tensors")
        docs[("calibrate", per_head)] = json.loads((out / "config.json").read_text())["quantization_config"]
    for r in ("tensor", "attn_head", "attn_head_attention"):
        docs[("llmc", r)] = json.loads((llmc_checkpoints[r] / "config.json").read_text())["quantization_config"]
    bad = dict(docs[("calibrate", True)], kv_cache_scheme=dict(docs[("calibrate", True)]["kv_cache_scheme"],
                                                               strategy="no_such_strategy"))
    try:
        results = checkpoints.parse_with_vllm_compressed_tensors([*docs.values(), bad])
    except checkpoints.ToolUnavailable as e:
        if upstream.require():
            pytest.fail(f"compressed-tensors {checkpoints.VLLM_COMPRESSED_TENSORS_PIN} required: {e}")
        pytest.skip(str(e))
    assert "ValidationError" in results[-1].get("error", "")  # the parser can refuse
    for key, got in zip(docs, results):
        assert got.get("version") == checkpoints.VLLM_COMPRESSED_TENSORS_PIN, (key, got)
        per_head = key in (("calibrate", True), ("llmc", "attn_head"), ("llmc", "attn_head_attention"))
        k = got["kv_cache_scheme"]
        assert k["strategy"] in (("attn_head", "QuantizationStrategy.ATTN_HEAD") if per_head else
                                 ("tensor", "QuantizationStrategy.TENSOR")), (key, got)
        assert (k["num_bits"], k["type"], k["symmetric"], k["dynamic"]) == ("8", "float", "True", "False"), key
