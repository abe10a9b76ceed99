"""vLLM's own CPU_ATTN through the harness: the scored positions are the demo's, vLLM's own CPU fp8
KV cache is a truncating e4m3 store, and with ``VTINFER_VLLM`` unset the backend is vLLM's own
(vtinfer's plugin entry point is still loaded: vLLM loads every installed plugin)."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

from . import _metrics as M
from ._decoder import e4m3_toward_zero
from .conftest import CPU_ATTN, FORMAT_MODEL_DTYPE, NOISE_SE, cpu_has_avx512, vtinfer_log_lines

CPU_ATTN_IMPL = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"


def _score(run):
    s = run["score"]
    return s["top_ids"], s["top_lps"]


def test_without_vtinfer_vllm_the_backend_is_vllms_own(engines, model_dir):
    group = engines["reference"]
    run = group.get("auto-bf16")
    assert run["backend"] == [CPU_ATTN]
    assert run["impl"] == [CPU_ATTN_IMPL]
    assert run["num_attention_layers"] == 30
    assert vtinfer_log_lines(group.log, model_dir) == []


def test_harness_positions_line_up_with_the_decoder(engines, decoder):
    """CPU_ATTN in a float32 model scores the demo's tokens as vtinfer's float32 decoder does: the
    positions, tokens and log-probabilities of the harness are the demo's (an off-by-one position or
    another tokenization moves log-probabilities by whole nats; float32 rounding by ~1e-5)."""
    ref = engines["reference"].get(f"auto-{FORMAT_MODEL_DTYPE}")
    assert ref["backend"] == [CPU_ATTN]
    mine = np.asarray(ref["score"]["actual"])
    theirs = decoder.actual_logprobs(decoder.ref_logits)
    assert mine.shape == theirs.shape == (len(decoder.tokens) - 1,)
    d = np.abs(mine - theirs)
    # two float32 implementations of one model agree to ~1e-5 (measured max 4.3e-5); a shifted position
    # or another token moves a log-probability by nats: 1e-3 lies > 20x from both
    assert d.max() <= 1e-3, d.max()
    top = np.array([ids[0] for ids in ref["score"]["top_ids"]])
    assert np.mean(top == decoder.ref_top[0][:, 0]) == 1.0


@pytest.mark.skipif(not cpu_has_avx512(), reason="vLLM's CPU fp8 KV cache needs AVX-512 or AMX "
                    "(NotImplementedError 'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.')")
def test_vllms_own_cpu_fp8_is_a_truncating_e4m3_store(engines, decoder):
    """vLLM's own CPU fp8 KV cache (CPU_ATTN, per-tensor scale 1.0) has the figures of an e4m3 store that
    rounds toward zero (UPSTREAM.md: the CPU path multiplies by the reciprocal and truncates), and not
    those of vLLM's CUDA store (nearest even), which is what vtinfer's fp8 through vLLM is held to in
    test_quantized_format_equals_the_decoders_figures[fp8]. Both models are the decoder's float32 KV
    cache with K and V put through the rounding, so the gap between the two backends' fp8 is the
    rounding rule: truncation's error spans a whole code step instead of half of one (4x the mean
    squared error; measured 3.5x the KL)."""
    base = engines["reference"].get(f"auto-{FORMAT_MODEL_DTYPE}")
    run = engines["reference"].get(f"fp8-{FORMAT_MODEL_DTYPE}")
    assert run["backend"] == [CPU_ATTN] and run["kv_cache"][1] == "torch.uint8"
    got = M.summary(*_score(base), *_score(run))
    trunc = decoder.figures_with_rounded_kv("e4m3-toward-zero", e4m3_toward_zero)
    nearest = decoder.figures_with_rounded_kv(
        "e4m3-nearest-even", lambda a: a.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    # the two rules are told apart on this text: the nearest-even KL lies > 4 se below truncation's
    assert trunc["kl"] - nearest["kl"] > 4 * trunc["kl_se"], (trunc, nearest)
    msg = f"vLLM CPU fp8 {got} vs truncation {trunc} (nearest even {nearest})"
    assert abs(got["top1"] - trunc["top1"]) <= NOISE_SE * trunc["top1_se"], msg
    assert abs(got["kl"] - trunc["kl"]) <= NOISE_SE * trunc["kl_se"], msg
