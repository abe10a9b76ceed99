"""Calibration: amax against the independent forward pass, scale = amax / 448,
and the round trip through vtinfer's resolver and scale loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vtinfer as vt
from tests.model import refmodel
from vtinfer.models import Decoder, calibrate, calibrate_amax, write_calibrated


def _ref_amax(d, toks):
    cfg, w = refmodel.load(d)
    seen = {}

    def grab(x, layer, which):
        seen[(layer, which)] = np.abs(x).max(axis=(0, 2))
        return x

    refmodel.forward(cfg, w, toks, np.float64, kv_round=grab)
    L = cfg["num_hidden_layers"]
    return (np.array([seen[(i, "k")] for i in range(L)]), np.array([seen[(i, "v")] for i in range(L)]))


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_amax_matches_reference(tiny_dirs, model_type):
    d = tiny_dirs[model_type]
    toks = np.random.default_rng(1).integers(0, 256, 50)
    cal = calibrate_amax(Decoder.from_pretrained(d), toks, chunk=16, progress=False)
    k, v = _ref_amax(d, toks)
    assert np.allclose(cal.k_amax, k, rtol=1e-5) and np.allclose(cal.v_amax, v, rtol=1e-5)
    if model_type == "llama":  # anti-vacuity: heads differ, so per-head scales carry information
        assert np.all(cal.k_amax.max(1) > 1.5 * cal.k_amax.min(1))
    ks, vs = cal.scales(per_head=False)
    assert np.array_equal(ks, (cal.k_amax.max(1) / 448.0).astype(np.float32))
    ksh, vsh = cal.scales(per_head=True)
    assert ksh.shape == (2, 2) and np.array_equal(vsh, (cal.v_amax / 448.0).astype(np.float32))


@pytest.mark.parametrize("per_head,fmt", [(False, "modelopt"), (True, "modelopt"), (False, "compressed-tensors")])
def test_round_trip_resolve_and_load(tiny_dirs, tmp_path, per_head, fmt):
    d = tiny_dirs["llama"]
    out, cal = calibrate(d, tmp_path / "cal", per_head=per_head, max_tokens=64, progress=False, fmt=fmt)
    res = vt.resolve_kv_cache_dtype("auto", out)
    assert res.dtype == "fp8_e4m3" and res.declared_by_checkpoint
    ct = per_head or fmt == "compressed-tensors"
    assert res.source == ("compressed-tensors kv_cache_scheme" if ct else "config.json")
    assert res.per_head_scales is per_head
    ck = vt.Checkpoint(out)
    sc = vt.load_kv_scales(ck.shards, 2, 2, per_head=per_head)
    ks, vs = cal.scales(per_head)
    for i, s in enumerate(sc):
        assert s.origin == "checkpoint"
        assert np.array_equal(np.asarray(s.k_scale, np.float32), ks[i])
        assert np.array_equal(np.asarray(s.v_scale, np.float32), vs[i])
    args = vt.kv_cache_args(out, num_blocks=2)
    assert args["dtype"] == "fp8_e4m3" and np.array_equal(args["k_scale"], ks)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    if not ct:
        assert qc["producer"]["name"] == "modelopt" and qc["quantization"]["kv_cache_quant_algo"] == "FP8"
    else:
        assert qc["kv_cache_scheme"]["strategy"] == ("attn_head" if per_head else "tensor")
        assert qc["kv_cache_scheme"]["dynamic"] is False and qc["quant_method"] == "compressed-tensors"
        if per_head:
            assert (qc["total_num_heads"], qc["total_num_kv_heads"]) == (4, 2)
    # the original checkpoint is untouched and still resolves to its own dtype
    assert vt.resolve_kv_cache_dtype("auto", d).dtype == "float32"
    # the weights are the same tensors
    assert np.array_equal(Decoder.from_pretrained(out).score([3, 4, 5]), Decoder.from_pretrained(d).score([3, 4, 5]))


def test_calibrated_scales_used_by_the_cache(tiny_dirs, tmp_path):
    d = tiny_dirs["qwen2"]
    out, cal = calibrate(d, tmp_path / "c", max_tokens=64, progress=False)
    args = vt.kv_cache_args(out, num_blocks=1)
    s = Decoder.from_pretrained(out).session(args["dtype"], k_scale=args["k_scale"], v_scale=args["v_scale"])
    assert np.array_equal(s.cache.k_scale, cal.scales()[0])


def test_out_equal_to_source_refused(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    cal = calibrate_amax(m, [1, 2, 3], progress=False)
    with pytest.raises(ValueError, match="out must lie outside the model directory"):
        write_calibrated(tiny_dirs["llama"], tiny_dirs["llama"], cal)


def test_unknown_format_refused(tiny_dirs, tmp_path):
    with pytest.raises(ValueError, match="fmt must be one of"):
        calibrate(tiny_dirs["llama"], tmp_path / "o", fmt="gptq", max_tokens=8, progress=False)
    assert not (tmp_path / "o").exists()


def test_empty_tokens_refused(tiny_dirs):
    with pytest.raises(ValueError, match="tokens must not be empty"):
        calibrate_amax(Decoder.from_pretrained(tiny_dirs["llama"]), [], progress=False)


def _rescaled_checkpoint(src, dst, k_gain, v_gain):
    """The same function with K multiplied by k_gain (Q divided) and V by v_gain
    (O divided): float32 logits barely move, but K/V leave e4m3's normal
    range at scale 1.0 (saturation above 448, subnormals below 2^-6)."""
    from safetensors.numpy import load_file, save_file

    import shutil

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    for i in range(2):
        p = f"model.layers.{i}.self_attn."
        w[p + "k_proj.weight"] = w[p + "k_proj.weight"] * np.float32(k_gain)
        w[p + "q_proj.weight"] = w[p + "q_proj.weight"] / np.float32(k_gain)
        w[p + "v_proj.weight"] = w[p + "v_proj.weight"] * np.float32(v_gain)
        w[p + "o_proj.weight"] = w[p + "o_proj.weight"] / np.float32(v_gain)
    save_file(w, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("k_gain,v_gain", [(1.0, 1e-3), (300.0, 1.0), (300.0, 1e-3)])
def test_calibration_beats_scale_one_when_kv_leave_the_normal_range(tiny_dirs, tmp_path, k_gain, v_gain):
    from vtinfer.models import compare

    d = _rescaled_checkpoint(tiny_dirs["llama"], tmp_path / "m", k_gain, v_gain)
    m = Decoder.from_pretrained(d)
    rng = np.random.default_rng(4)
    cal = calibrate_amax(m, rng.integers(0, 256, 200), progress=False)
    toks = rng.integers(0, 256, 120)
    ref = m.score(toks, "float32")
    one = compare(ref, m.score(toks, "fp8_e4m3"))
    ks, vs = cal.scales()
    lay = compare(ref, m.score(toks, "fp8_e4m3", k_scale=ks, v_scale=vs))
    ksh, vsh = cal.scales(per_head=True)
    head = compare(ref, m.score(toks, "fp8_e4m3", k_scale=ksh, v_scale=vsh))
    assert lay["mean_kl"] < 0.2 * one["mean_kl"], (lay, one)
    assert head["mean_kl"] < 0.2 * one["mean_kl"], (head, one)
