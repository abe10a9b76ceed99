"""The decoder over vLLM's NVFP4 pages (vt.reshape_and_cache_flash / flash_attn_varlen_func) against the
float64 reference forward with K / V round-tripped through the NumPy twin of the NVFP4 group rule
(tests/numerics/nvfp4_twin.py), on tiny checkpoints with head_dim 64 (the pages' smallest)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model import refmodel
from tests.numerics import nvfp4_twin
from vtinfer.models import Decoder
from vtinfer.models.tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny64")
    return {mt: make_tiny_checkpoint(root / mt, seed=5, model_type=mt, head_dim=64) for mt in ("llama", "qwen3")}


def _nv_round(fmt, scale):
    def rnd(x, layer, which):
        x32 = np.ascontiguousarray(np.asarray(x, np.float32))
        c, s = nvfp4_twin.quantize(x32, scale, fmt.endswith("4over6"))
        return nvfp4_twin.dequantize(c, s, scale).astype(np.float64)
    return rnd


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("fmt, scale", [("nvfp4", 1.0), ("nvfp4_4over6", 1.0), ("nvfp4", 0.03)])
def test_nvfp4_kv_matches_reference_with_same_rounding(tiny64, model_type, fmt, scale):
    cfg, w = refmodel.load(tiny64[model_type])
    toks = np.random.default_rng(7).integers(0, cfg["vocab_size"], 33)
    ref = refmodel.forward(cfg, w, toks, np.float64, kv_round=_nv_round(fmt, scale))
    ref_plain = refmodel.forward(cfg, w, toks, np.float64)
    ours = Decoder.from_pretrained(tiny64[model_type]).score(toks, fmt, chunk=10, k_scale=scale, v_scale=scale)
    refmodel.assert_matches_rounded(ours, ref, ref_plain)


def test_nvfp4_needs_one_scale_per_tensor(tiny64):
    m = Decoder.from_pretrained(tiny64["llama"])
    with pytest.raises(ValueError, match="k_scale must be one number"):
        m.score(np.arange(5), "nvfp4", k_scale=np.ones(2, np.float32))


def test_demo_rows_for_nvfp4(tiny64, tmp_path, monkeypatch):
    from vtinfer.models.demo import format_report, run_demo

    monkeypatch.setenv("VTINFER_CACHE", str(tmp_path))
    r = run_demo(str(tiny64["llama"]), eval_tokens=96, gen_tokens=3, calib_tokens=32, quiet=True)
    rows = {x["kv_cache_dtype"]: x for x in r["runs"] if x["kv_cache_dtype"].startswith("nvfp4")}
    assert set(rows) == {"nvfp4", "nvfp4_4over6"}
    for x in rows.values():
        # 2 layers x (K and V) x 2 KV heads x (32 code bytes + 4 scale bytes) per token
        assert x["kv_bytes_per_token"] == 2 * 2 * 2 * 36 and x["scales"] == "1.0"
        assert 0 < x["mean_kl"] and 0 < x["ppl_se"]
    assert sum(line.startswith("nvfp4") for line in format_report(r).splitlines()) == 4
