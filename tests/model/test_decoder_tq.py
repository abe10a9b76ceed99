"""The decoder over TurboQuant KV caches (vt.turboquant_store / turboquant_attention) against the
float64 reference forward with K / V round-tripped through the NumPy twin (tests/numerics/tq_twin.py:
its store and read; MSE keys taken back to the model basis by an explicit float64 Hadamard)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model import refmodel
from tests.numerics import tq_twin
from tests.numerics.test_kv_formats_tq_store import twin_store
from vtinfer.models import Decoder


def _tq_round(fmt):
    def rnd(x, layer, which):
        x32 = np.asarray(x, np.float32)
        D = x32.shape[-1]
        kb = tq_twin.PRESETS[fmt][0]
        z = np.zeros_like(x32)
        slots = twin_store(fmt, x32, z) if which == "k" else twin_store(fmt, z, x32)
        from tests.numerics.test_kv_formats_tq_store import twin_codebook
        k, v = tq_twin.dequantize(fmt, slots, D, None if kb == 8 else twin_codebook(D, kb)[0])
        if which == "v":
            return v.astype(np.float64)
        k = k.astype(np.float64)
        return k if kb == 8 else k @ tq_twin.hadamard(D).astype(np.float64)
    return rnd


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("fmt", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc"])
def test_turboquant_kv_matches_reference_with_same_rounding(tiny_dirs, model_type, fmt):
    cfg, w = refmodel.load(tiny_dirs[model_type])
    toks = np.random.default_rng(7).integers(0, cfg["vocab_size"], 33)
    ref = refmodel.forward(cfg, w, toks, np.float64, kv_round=_tq_round(fmt))
    ref_plain = refmodel.forward(cfg, w, toks, np.float64)
    # the tiny models have 2 layers: vLLM's boundary rule would keep both unquantized
    ours = Decoder.from_pretrained(tiny_dirs[model_type]).score(toks, fmt, chunk=10, turboquant_boundary=False)
    refmodel.assert_matches_rounded(ours, ref, ref_plain)


def test_boundary_layers_stay_unquantized(tiny_dirs):
    """Two layers: vLLM's boundary rule keeps both, so the run equals the float32 run exactly."""
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    toks = np.random.default_rng(3).integers(0, 100, 20)
    np.testing.assert_array_equal(m.score(toks, "turboquant_3bit_nc", chunk=7), m.score(toks, "float32", chunk=7))
