"""Attention over per-token-head caches on every ISA against the float64
oracle of tests/numerics/test_attention_oracle.py run over the dequantized
cache (code * scale, from the NumPy twin's rule), with the 2x tolerance rule.
Slots no sequence uses hold a NaN scale, so a read through a wrong block,
slot or head turns the output NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import pth_twin
from tests.numerics.test_attention_oracle import check_close, shuffled_block_table

FORMATS = ("int8_per_token_head", "fp8_per_token_head")


def build(rng, fmt, *, q_lens, k_lens, H, Hkv, D, bs, layout="NHD", q_dtype=np.float32):
    B = len(q_lens)
    NB, bt = shuffled_block_table(rng, k_lens, bs, extra_blocks=2)
    cache = vt.PagedKVCache(1, NB, bs, Hkv, D, fmt, layout=layout)
    cache.k_scale_cache(0)[:] = np.nan  # poison: only stored slots get a real scale
    cache.v_scale_cache(0)[:] = np.nan
    used = []
    for b in range(B):
        j = np.arange(k_lens[b])
        slots = (bt[b, j // bs].astype(np.int64) * bs + j % bs)
        mag = 2.0 ** rng.integers(-3, 4, size=(len(j), Hkv, 1))  # scales differ per (token, head)
        cache.store(0, (rng.standard_normal((len(j), Hkv, D)) * mag).astype(np.float32),
                    (rng.standard_normal((len(j), Hkv, D)) * mag[::-1]).astype(np.float32), slots)
        used.append(slots)
    # the dequantized cache, from the stored codes and scales by the twin's rule
    kc, vc = cache.key_cache(0), cache.value_cache(0)
    if layout == "HND":
        kc, vc = kc.transpose(0, 2, 1, 3), vc.transpose(0, 2, 1, 3)
    kdq = pth_twin.dequantize(kc, cache.k_scale_cache(0), fmt)
    vdq = pth_twin.dequantize(vc, cache.v_scale_cache(0), fmt)
    q = rng.standard_normal((int(sum(q_lens)), H, D)).astype(np.float32).astype(q_dtype)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return cache, q, kdq, vdq, cu, np.asarray(k_lens, np.int32), bt


OPTIONS = {
    "plain": {},
    "softcap": {"softcap": 3.0},
    "window+sink": {"window_size": (5, 0), "s_aux": np.linspace(-1, 1, 8).astype(np.float32)},
    "alibi": {"alibi_slopes": np.linspace(0.05, 0.4, 8).astype(np.float32)},
}


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_matches_oracle_over_dequantized_cache(isa, fmt, heads, layout):
    H, Hkv = heads
    rng = np.random.default_rng(H * 10 + Hkv)
    cache, q, kdq, vdq, cu, sk, bt = build(rng, fmt, q_lens=[1, 7, 1, 20], k_lens=[1, 33, 300, 41], H=H, Hkv=Hkv,
                                           D=64, bs=16, layout=layout)
    out = cache.attention(0, q, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, num_threads=2)
    check_close(np.asarray(out), None, (q, kdq, vdq, cu, sk, bt), {}, what=f"{fmt} {heads} {layout}")


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("D", [80, 128])
@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_options_and_head_sizes(isa, fmt, D, name):
    rng = np.random.default_rng(D)
    cache, q, kdq, vdq, cu, sk, bt = build(rng, fmt, q_lens=[3, 1], k_lens=[40, 70], H=8, Hkv=2, D=D, bs=16)
    kw = OPTIONS[name]
    out, lse = vt.flash_attn_varlen_func(q, cache.key_cache(0), cache.value_cache(0), cu_seqlens_q=cu, seqused_k=sk,
                                         block_table=bt, kv_cache_dtype=fmt, k_scale_cache=cache.k_scale_cache(0),
                                         v_scale_cache=cache.v_scale_cache(0), return_lse=True, **kw)
    check_close(np.asarray(out), np.asarray(lse), (q, kdq, vdq, cu, sk, bt), kw, what=f"{fmt} D{D} {name}")


@pytest.mark.parametrize("name", ["plain", "softcap", "alibi"])
@pytest.mark.parametrize("heads", [(4, 2), (8, 2), (16, 2)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_queries(isa, fmt, heads, name):
    """bf16 q: with >= 4 rows per KV head (GQA 4 / 8 decode, any prefill tile) the AVX-512 ISA
    runs the AVX512-BF16 pair-dot tile where the CPU has it (the scales folded per key)."""
    import ml_dtypes
    H, Hkv = heads
    rng = np.random.default_rng(H)
    cache, q, kdq, vdq, cu, sk, bt = build(rng, fmt, q_lens=[1, 5, 1], k_lens=[50, 20, 300], H=H, Hkv=Hkv, D=128,
                                           bs=16, q_dtype=ml_dtypes.bfloat16)
    kw = {"alibi_slopes": np.linspace(0.05, 0.4, H).astype(np.float32)} if name == "alibi" else OPTIONS[name]
    out = vt.flash_attn_varlen_func(q, cache.key_cache(0), cache.value_cache(0), cu_seqlens_q=cu, seqused_k=sk,
                                    block_table=bt, kv_cache_dtype=fmt, k_scale_cache=cache.k_scale_cache(0),
                                    v_scale_cache=cache.v_scale_cache(0), **kw)
    check_close(np.asarray(out), None, (q, kdq, vdq, cu, sk, bt), kw, what=f"{fmt} bf16 q {heads} {name}")


def test_scale_caches_are_read_with_vllms_strides():
    """vLLM's scale caches are strided views into its page (not contiguous): give them so."""
    rng = np.random.default_rng(2)
    fmt = "int8_per_token_head"
    cache, q, kdq, vdq, cu, sk, bt = build(rng, fmt, q_lens=[2], k_lens=[37], H=4, Hkv=2, D=64, bs=16)
    ks, vs = cache.k_scale_cache(0), cache.v_scale_cache(0)
    big = np.full(ks.shape[:2] + (ks.shape[2], 3), np.nan, np.float32)  # [NB, BS, H, 3]: stride 12 bytes per head
    big[..., 1] = ks
    bigv = big.copy()
    bigv[..., 1] = vs
    out = vt.flash_attn_varlen_func(q, cache.key_cache(0), cache.value_cache(0), cu_seqlens_q=cu, seqused_k=sk,
                                    block_table=bt, kv_cache_dtype=fmt, k_scale_cache=big[..., 1],
                                    v_scale_cache=bigv[..., 1])
    check_close(np.asarray(out), None, (q, kdq, vdq, cu, sk, bt), {}, what="strided scales")


@pytest.mark.parametrize("D", [64, 80])
@pytest.mark.parametrize("fmt", FORMATS)
def test_simd_tiles_agree_with_the_scalar_twin(fmt, D):
    """Each SIMD tile (AVX2, AVX-512 where the CPU has them) against the
    scalar twin on one cache: the same folding of the per-key scales, so the
    outputs differ only by float32 summation order (and each also passes the
    oracle above). D 80 takes the tiles' zero-padded last chunk; 4 queries x GQA 4 the AVX2 lanes form."""
    from tests.conftest import available_isas, forced_isa
    rng = np.random.default_rng(D + 7)
    cache, q, kdq, vdq, cu, sk, bt = build(rng, fmt, q_lens=[1, 9, 4], k_lens=[70, 45, 130], H=8, Hkv=2, D=D,
                                           bs=16)
    outs = {}
    for name in available_isas():
        with forced_isa(name):
            outs[name] = np.asarray(cache.attention(0, q, cu_seqlens_q=cu, seqused_k=sk, block_table=bt))
    ref = outs.pop("scalar")
    assert outs, "no SIMD ISA on this CPU"
    for name, out in outs.items():
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max(), err_msg=name)
