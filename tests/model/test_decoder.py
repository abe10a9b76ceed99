"""The decoder (vtinfer's paged cache + attention) against an independent
float64 NumPy forward pass of the same math, for every KV dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.model import refmodel
from tests.model.conftest import MODEL_TYPES
from tests.numerics import int4_twin, pth_twin
from vtinfer.models import Decoder


def _err(a, ref):
    return float(np.max(np.abs(np.asarray(a, np.float64) - ref)))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_f32_logits_match_float64_reference(tiny_dirs, model_type, chunk):
    # FlashAttention's rule: our error vs the fp64 oracle is at most 2x that of
    # a naive float32 implementation of the same math.
    cfg, w = refmodel.load(tiny_dirs[model_type])
    toks = np.random.default_rng(100 + chunk).integers(0, cfg["vocab_size"], 40)
    ref64 = refmodel.forward(cfg, w, toks, np.float64)
    ref32 = refmodel.forward(cfg, w, toks, np.float32)
    ours = Decoder.from_pretrained(tiny_dirs[model_type]).score(toks, "float32", chunk=chunk)
    assert ours.shape == ref64.shape
    # The rule on the RMS error (the max of 10k round-off draws is too noisy a
    # statistic: its ratio ranged 0.45-3.0 across this grid while RMS stayed <= 1.6).
    rms = lambda a: float(np.sqrt(np.mean((np.asarray(a, np.float64) - ref64) ** 2)))  # noqa: E731
    assert rms(ours) <= 2 * rms(ref32), (rms(ours), rms(ref32))
    assert _err(ours, ref64) <= 4 * _err(ref32, ref64)


def _kv_round_fn(kind, ks=None, vs=None):
    def scale_of(s, layer, shape):
        s = np.asarray(s, np.float64)
        s = s if s.ndim == 0 else s[layer]
        return s.reshape(1, -1, 1) if s.ndim == 1 else s

    def rnd(x, layer, which):
        x32 = np.asarray(x, np.float32)
        if kind == "bfloat16":
            return x32.astype(ml_dtypes.bfloat16).astype(np.float64)
        if kind == "float16":
            return x32.astype(np.float16).astype(np.float64)
        if kind == "int4_per_token_head":  # the twin's rotated codes, rotated back in float64 (the read's
            # rotation of q and of the output is that inverse, up to float32 rounding)
            from tests.numerics.test_kv_formats_int4_cache import inverse_rotation_f64
            return inverse_rotation_f64(int4_twin.dequantize(*int4_twin.quantize(x32)))
        if kind in pth_twin.QUANT:  # per-token-head: the NumPy twin's store and read
            return pth_twin.dequantize(*pth_twin.quantize(x32, kind), kind).astype(np.float64)
        s = scale_of(ks if which == "k" else vs, layer, x.shape).astype(np.float32)
        fmt, mx = (ml_dtypes.float8_e4m3fn, 448.0) if kind == "fp8_e4m3" else (ml_dtypes.float8_e5m2, 57344.0)
        y = np.clip(x32 / s, -mx, mx).astype(fmt).astype(np.float64)
        return y * s.astype(np.float64)
    return rnd


SCALES = {
    "one": (1.0, 1.0),
    "per-layer": (np.array([0.02, 0.05], np.float32), np.array([0.011, 0.007], np.float32)),
    "per-head": (np.array([[0.02, 0.09], [0.04, 0.03]], np.float32),
                 np.array([[0.005, 0.013], [0.021, 0.008]], np.float32)),
}


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
@pytest.mark.parametrize("kind,scales", [("bfloat16", "one"), ("float16", "one"), ("fp8_e4m3", "one"),
                                         ("fp8_e4m3", "per-layer"), ("fp8_e4m3", "per-head"),
                                         ("fp8_e5m2", "per-layer"), ("int8_per_token_head", "one"),
                                         ("fp8_per_token_head", "one"), ("int4_per_token_head", "one")])
def test_quantized_kv_matches_reference_with_same_rounding(tiny_dirs, model_type, kind, scales):
    # The oracle rounds K/V exactly as the cache stores them (ml_dtypes, x/scale,
    # saturating), so a dropped, swapped or misrouted scale shows up as a large error.
    cfg, w = refmodel.load(tiny_dirs[model_type])
    toks = np.random.default_rng(7).integers(0, cfg["vocab_size"], 33)
    ks, vs = SCALES[scales]
    ref = refmodel.forward(cfg, w, toks, np.float64, kv_round=_kv_round_fn(kind, ks, vs))
    ref_plain = refmodel.forward(cfg, w, toks, np.float64)
    ours = Decoder.from_pretrained(tiny_dirs[model_type]).score(toks, kind, chunk=10, k_scale=ks, v_scale=vs)
    refmodel.assert_matches_rounded(ours, ref, ref_plain)


def test_greedy_generation_follows_reference_argmax(tiny_dirs):
    d = tiny_dirs["qwen2"]
    cfg, w = refmodel.load(d)
    m = Decoder.from_pretrained(d)
    prompt = [5, 17, 99, 3]
    g = m.generate(prompt, 8, "float32", stop_at_eos=False)
    seq = list(prompt)
    for _ in range(8):
        seq.append(int(np.argmax(refmodel.forward(cfg, w, seq)[-1])))
    assert g.tokens == seq[len(prompt):]
    assert g.decode_steps == 7


def test_decode_equals_prefill_logits(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["mistral"])
    toks = np.random.default_rng(3).integers(0, 256, 30)
    # float32 KV: with bf16/fp8 a last-bit difference between the [30, h] and
    # [1, h] matmuls can flip a KV rounding and move a logit by ~1e-3.
    full = m.score(toks, "float32", chunk=30)
    s = m.session("float32", max_tokens=30)
    s.prefill(toks[:20])
    rows = [s.decode(int(t)) for t in toks[20:]]
    assert np.allclose(np.stack(rows), full[20:], rtol=0, atol=1e-4 * np.abs(full).max())
    assert s.length == 30


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_repr_says_what_the_model_and_session_hold(tiny_dirs, model_type):
    """The counts in the reprs come from the checkpoint's own tensors (safetensors), not from the decoder."""
    from safetensors.numpy import load_file

    d = tiny_dirs[model_type]
    tensors = load_file(str(d / "model.safetensors"))
    m = Decoder.from_pretrained(d)
    c = m.config
    want = sum(a.size for name, a in tensors.items()
               if not (name == "lm_head.weight" and c.tie_word_embeddings) and name.startswith(("model.", "lm_head")))
    assert m.num_parameters() == want
    r = repr(m)
    assert r.startswith(f"Decoder({d.name!r}: {model_type}, {c.num_layers} layers, {c.num_heads} query heads / "
                        f"{c.num_kv_heads} KV heads of {c.head_dim}, vocab {c.vocab_size}, {want:,} float32 "), r
    assert f"tokenizer {type(m.tokenizer).__name__})" in r
    s = m.session("fp8_e4m3", max_tokens=40, block_size=16, k_scale=0.1, v_scale=0.1)
    s.prefill(np.arange(7))
    assert repr(s) == f"Session({d.name!r}, kv_cache_dtype='fp8_e4m3', sequence 0: 7 of 48 tokens, num_threads=None)"


def test_bad_tokens_raise_index_error_and_write_nothing(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    s = m.session("float32", max_tokens=16)
    with pytest.raises(IndexError, match="tokens"):
        s.prefill([1, 2, 300])
    assert s.length == 0


@pytest.mark.parametrize("model_type,kind,scales", [("llama", "float32", "one"), ("mistral", "float32", "one"),
                                                    ("qwen2", "fp8_e4m3", "per-head"),
                                                    ("qwen3", "bfloat16", "one")])
def test_batched_sequences_match_reference_per_sequence(tiny_dirs, model_type, kind, scales):
    # three sequences of different lengths share one cache; chunk 9 makes the
    # batch mix prefill continuations and sequences that have finished
    d = tiny_dirs[model_type]
    cfg, w = refmodel.load(d)
    rng = np.random.default_rng(21)
    seqs = [rng.integers(0, 256, n) for n in (23, 5, 40)]
    ks, vs = SCALES[scales]
    got = Decoder.from_pretrained(d).score_batch(seqs, kind, chunk=9, k_scale=ks, v_scale=vs)
    for s, g in zip(seqs, got):
        ref = refmodel.forward(cfg, w, s, np.float64,
                               kv_round=None if kind == "float32" else _kv_round_fn(kind, ks, vs))
        assert g.shape == ref.shape
        if kind == "float32":
            assert _err(g, ref) <= 2e-4 * np.abs(ref).max()
        else:  # see test_quantized_kv_matches_reference_with_same_rounding
            plain = refmodel.forward(cfg, w, s, np.float64)
            rms = lambda a, b: float(np.sqrt(np.mean((np.asarray(a, np.float64) - b) ** 2)))  # noqa: E731
            assert rms(g, ref) <= 0.1 * rms(plain, ref)


def test_batch_refused_whole_when_the_cache_is_full(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    s = m.session("float32", max_tokens=32, block_size=16)
    s.forward_batch([("a", [1, 2, 3])])
    with pytest.raises(MemoryError, match="free blocks"):
        s.forward_batch([("a", [4] * 13), ("b", [5] * 17)])  # a fits, b needs 2 more blocks
    assert s.alloc.length("a") == 3 and "b" not in s.alloc
    with pytest.raises(ValueError, match="each sequence once"):
        s.forward_batch([("a", [1]), ("a", [2])])
    assert s.alloc.length("a") == 3


@pytest.mark.parametrize("kind", ["float32", "fp8_e4m3"])
def test_batched_generation_equals_one_by_one(tiny_dirs, kind):
    m = Decoder.from_pretrained(tiny_dirs["qwen2"])
    prompts = [[5, 17, 99, 3], [200], list(range(40, 60))]
    singles = [m.generate(p, 7, kind, stop_at_eos=False).tokens for p in prompts]
    batch = m.generate_batch(prompts, 7, kind, stop_at_eos=False)
    assert [g.tokens for g in batch] == singles
    assert all(len(g.tokens) == 7 for g in batch) and batch[0].decode_steps == 6
    if kind == "float32":  # and the reference's argmax loop for the one-token prompt
        cfg, w = refmodel.load(tiny_dirs["qwen2"])
        seq = list(prompts[1])
        for _ in range(7):
            seq.append(int(np.argmax(refmodel.forward(cfg, w, seq)[-1])))
        assert batch[1].tokens == seq[1:]


def test_batched_generation_stops_each_sequence_at_eos(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["qwen2"])
    free = m.generate_batch([[5, 17, 99, 3], [200]], 6, stop_at_eos=False)
    m.config = type(m.config)(**{**m.config.__dict__, "eos_token_ids": (free[0].tokens[2],)})
    got = m.generate_batch([[5, 17, 99, 3], [200]], 6)
    assert got[0].tokens == free[0].tokens[:3]
    cut = next((i for i, t in enumerate(free[1].tokens) if t == free[0].tokens[2]), None)
    assert got[1].tokens == (free[1].tokens if cut is None else free[1].tokens[:cut + 1])
    with pytest.raises(ValueError, match="at least one token"):
        m.generate_batch([[1], []], 3)
