"""vt.turboquant_attention against the float64 oracle of test_attention_oracle.py over the cache
dequantized by the NumPy twin (tests/numerics/tq_twin.py), with FlashAttention's 2x rule.

The twin's K of an MSE preset is in the rotated basis; the oracle gets the model-basis key
``K_rot @ H`` (float64, H the orthonormal Sylvester Hadamard), so the query rotation
vtinfer does (vLLM's ``q_rot = q @ H``) is checked, not assumed. Slots no sequence uses hold
the 0x5A fill, and the twin's read of those is replaced by NaN in the oracle's cache: a read of
a wrong slot / block turns the oracle NaN where ours is finite (or the reverse)."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import tq_twin
from tests.numerics.test_attention_oracle import FLOATS, check_close, shuffled_block_table
from tests.numerics.test_kv_formats_tq_store import twin_codebook


def build(rng, fmt, D, *, q_lens, k_lens, H, Hkv, bs=16, q_dtype="float32"):
    B = len(q_lens)
    NB, bt = shuffled_block_table(rng, k_lens, bs, extra_blocks=2)
    cache = np.full((NB, bs, Hkv, vt.turboquant_slot_bytes(fmt, D)), 0x5A, np.uint8)
    used = np.zeros(NB * bs, bool)
    for b in range(B):
        j = np.arange(k_lens[b])
        slots = (bt[b, j // bs].astype(np.int64) * bs + j % bs)
        k = (rng.standard_normal((len(j), Hkv, D)) * rng.uniform(0.5, 3)).astype(np.float32)
        v = rng.standard_normal((len(j), Hkv, D)).astype(np.float32)
        vt.turboquant_store(k, v, cache, slots, fmt)
        used[slots] = True
    kb = tq_twin.PRESETS[fmt][0]
    K, V = tq_twin.dequantize(fmt, cache.reshape(NB * bs, Hkv, -1), D, None if kb == 8 else twin_codebook(D, kb)[0])
    K, V = K.astype(np.float64), V.astype(np.float64)
    if kb != 8:
        K = K @ tq_twin.hadamard(D).astype(np.float64)  # the model basis
    K[~used], V[~used] = np.nan, np.nan
    q = rng.standard_normal((int(sum(q_lens)), H, D)).astype(np.float32).astype(FLOATS[q_dtype])
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return q, cache, K.reshape(NB, bs, Hkv, D), V.reshape(NB, bs, Hkv, D), cu, np.asarray(k_lens, np.int32), bt


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("Hkv,H", [(2, 2), (2, 8)])
@pytest.mark.parametrize("fmt,D", [("turboquant_k8v4", 80), ("turboquant_4bit_nc", 64), ("turboquant_k3v4_nc", 128),
                                   ("turboquant_3bit_nc", 64)])
def test_attention_matches_oracle_over_dequantized_cache(fmt, D, Hkv, H, q_dtype):
    rng = np.random.default_rng(D + H)
    q, cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[1, 7, 1, 12], k_lens=[1, 33, 70, 41], H=H, Hkv=Hkv,
                                       q_dtype=q_dtype)
    out, lse = vt.turboquant_attention(q, cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt,
                                       return_lse=True, num_threads=2)
    assert out.dtype == q.dtype and out.shape == q.shape
    # the oracle in float64 over the twin's dequantized cache (q widened exactly; the naive twin rounds its
    # output to q's dtype as ours is rounded)
    check_close(out, lse, (q, K, V, cu, sk, bt), {}, what=f"{fmt} D={D} GQA {H // Hkv}")


def test_attention_options_match_oracle():
    fmt, D = "turboquant_4bit_nc", 64
    rng = np.random.default_rng(5)
    q, cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[6, 1], k_lens=[30, 45], H=4, Hkv=2)
    kw = dict(softcap=20.0, window_size=(5, 0), s_aux=np.array([0.5, -1.0, 0.0, 2.0], np.float32),
              alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4], np.float32), softmax_scale=0.3)
    out = vt.turboquant_attention(q, cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt, **kw)
    check_close(out, None, (q, K, V, cu, sk, bt), kw, what="options")
