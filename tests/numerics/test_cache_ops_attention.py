"""The attention side of vLLM's surface: fp8 queries with
q_descale, non-paged varlen (cu_seqlens_k), return_softmax_lse, and a
prefix/suffix split merged with merge_attn_states equal to one call. All
against the float64 oracle of tests/numerics/test_attention_oracle.py
(written from UPSTREAM.md), with FlashAttention's 2x rule, on every ISA."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import attention_ref, check_close, make_case

E4M3 = ml_dtypes.float8_e4m3fn
FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def per_token_descale(qd, cu, H, Hkv):
    """q_descale [B, H_kv] expanded to [total_q, H, 1] (head h reads KV head h // (H / H_kv))."""
    rows = np.concatenate([np.repeat(qd[b : b + 1], cu[b + 1] - cu[b], 0) for b in range(len(cu) - 1)])
    return np.repeat(rows, H // Hkv, axis=1)[:, :, None].astype(np.float64)


def check_fp8_query(out, q_ref, rest, kw, what):
    """The 2x rule with the naive float32 result rounded to bfloat16 (fp8 q gives a bfloat16 out)."""
    assert out.dtype == ml_dtypes.bfloat16, what
    ref, _ = attention_ref(q_ref, *rest, **kw, dt=np.float64)
    naive, _ = attention_ref(q_ref.astype(np.float32), *rest, **kw, dt=np.float32)
    naive = naive.astype(ml_dtypes.bfloat16).astype(np.float64)
    floor = 16 * 2.0**-24 * max(np.abs(ref).max(initial=0.0), 1e-30)
    err = np.abs(out.astype(np.float64) - ref).max(initial=0.0)
    err_naive = np.abs(naive - ref).max(initial=0.0)
    assert np.isfinite(err), what
    assert err <= 2 * err_naive + floor, f"{what}: {err:.3g} > 2 x {err_naive:.3g} + {floor:.3g}"


OPTIONS = {
    "plain": {},
    "window_softcap": dict(window_size=(40, 0), softcap=30.0),
    "sinks": dict(s_aux=np.array([0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0], np.float32)),
}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("shape", ["decode", "prefill"])
@pytest.mark.parametrize("opt", sorted(OPTIONS))
@pytest.mark.parametrize("qfmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_query_with_q_descale_matches_float64_oracle(isa, kv_cache_dtype, shape, opt, qfmt):
    rng = np.random.default_rng(11)
    H, Hkv, D = 8, 2, 128
    q_lens, k_lens = ([1, 1, 1], [300, 77, 1]) if shape == "decode" else ([37, 5, 64], [100, 5, 64])
    q, k, v, cu, sk, bt = make_case(rng, q_lens=q_lens, k_lens=k_lens, H=H, Hkv=Hkv, D=D, block_size=16,
                                    kv_cache_dtype=kv_cache_dtype, kv_float="bfloat16")
    q8 = (q * 3).astype(FP8[qfmt])  # codes of values up to ~12
    qd = rng.uniform(0.2, 0.6, (len(q_lens), Hkv)).astype(np.float32)
    kd = rng.uniform(0.5, 2.0, (len(q_lens), Hkv)).astype(np.float32) if kv_cache_dtype != "auto" else None
    kw = dict(OPTIONS[opt])
    if kd is not None:
        kw.update(k_descale=kd, kv_cache_dtype=kv_cache_dtype)
    out = vt.flash_attn_varlen_func(q8, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, q_descale=qd, **kw)
    q_ref = q8.astype(np.float64) * per_token_descale(qd, cu, H, Hkv)
    check_fp8_query(out, q_ref, (k, v, cu, sk, bt), kw, f"{isa} {shape} {opt} {qfmt} {kv_cache_dtype}")


def test_fp8_query_codes_uint8_torch_and_out_dtype():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    q, k, v, cu, sk, bt = make_case(rng, q_lens=[2, 1], k_lens=[40, 9], H=4, Hkv=4, D=64, block_size=16,
                                    kv_cache_dtype="fp8_e4m3")
    codes = q.astype(E4M3).view(np.uint8)
    qd = np.array([[0.5, 1, 2, 4], [1, 1, 1, 1]], np.float32)
    args = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype="fp8_e4m3", q_descale=qd)
    a = vt.flash_attn_varlen_func(codes, k, v, **args)  # uint8 q: the fp8 kv_cache_dtype names the format
    b = vt.flash_attn_varlen_func(codes, k, v, q_dtype="fp8_e4m3", **args)
    t = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    c = vt.flash_attn_varlen_func(t, k, v, **{**args, "q_descale": torch.from_numpy(qd)})
    out = np.zeros(q.shape, ml_dtypes.bfloat16)
    vt.flash_attn_varlen_func(q.astype(E4M3), k, v, out=out, **args)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16  # torch in, torch out
    assert np.array_equal(a.view(np.uint16), c.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(a.view(np.uint16), out.view(np.uint16))
    q_ref = codes.view(E4M3).astype(np.float64) * per_token_descale(qd, cu, 4, 4)
    check_fp8_query(a, q_ref, (k, v, cu, sk, bt), dict(kv_cache_dtype="fp8_e4m3"), "uint8 codes")


def test_q_descale_ignored_for_float_queries():
    """FlashAttention-3 applies q_descale only to fp8 q; vLLM's backends pass ones for bf16 q."""
    rng = np.random.default_rng(13)
    q, k, v, cu, sk, bt = make_case(rng, q_lens=[3], k_lens=[20], H=2, Hkv=1, D=32, block_size=16)
    a = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt)
    b = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, q_descale=np.full((1, 1), 3.0))
    assert np.array_equal(a, b)


def packed(rng, q_lens, k_lens, H, Hkv, D, dtype=np.float32):
    q = rng.standard_normal((sum(q_lens), H, D)).astype(dtype)
    k = rng.standard_normal((sum(k_lens), Hkv, D)).astype(dtype)
    v = rng.standard_normal((sum(k_lens), Hkv, D)).astype(dtype)
    cuq = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cuk = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    return q, k, v, cuq, cuk


def as_paged(k, v, cuk):
    """Packed K/V as the oracle's paged inputs (block size 1, identity table)."""
    lens = np.diff(cuk).astype(np.int32)
    bt = np.zeros((len(lens), max(lens.max(), 1)), np.int32)
    for b in range(len(lens)):
        bt[b, : lens[b]] = np.arange(cuk[b], cuk[b + 1])
    return k[:, None], v[:, None], lens, bt


@pytest.mark.parametrize("causal", [True, False])
def test_non_paged_varlen_matches_float64_oracle(isa, causal):
    rng = np.random.default_rng(14)
    q_lens, k_lens = [5, 1, 33, 0], [5, 40, 33, 3]
    q, k, v, cuq, cuk = packed(rng, q_lens, k_lens, 8, 2, 80)
    kw = dict(causal=causal, softcap=20.0)
    out, lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cuq, cu_seqlens_k=cuk, max_seqlen_q=33,
                                         max_seqlen_k=40, return_softmax_lse=True, **kw)
    kp, vp, lens, bt = as_paged(k, v, cuk)
    check_close(out, lse, (q, kp, vp, cuq, lens, bt), kw, what=f"packed causal={causal}")


def test_prefix_suffix_split_merged_equals_one_call(isa):
    """vLLM's chunked-prefill/cascade split: context keys (non-causal, paged) and the new tokens'
    own keys (causal, packed), merged with merge_attn_states, equal one causal call over all keys."""
    rng = np.random.default_rng(15)
    H, Hkv, D, BS = 8, 4, 64, 16
    ctx, new = [32, 48, 16], [7, 1, 20]  # context lengths a multiple of the block size
    full = [c + n for c, n in zip(ctx, new)]
    q, k, v, cu, sk, bt = make_case(rng, q_lens=new, k_lens=full, H=H, Hkv=Hkv, D=D, block_size=BS)
    one, lse_one = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                             return_softmax_lse=True)
    pre, lse_pre = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=np.array(ctx, np.int32),
                                             block_table=bt, causal=False, return_softmax_lse=True)
    # the new tokens' keys, packed: gathered out of the paged cache with cp_gather_cache
    cuk = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    kn = np.zeros((int(cuk[-1]), Hkv, D), np.float32)
    vn = np.zeros_like(kn)
    starts = np.array(ctx, np.int32)
    vt.cp_gather_cache(k, kn, bt, cuk, len(new), starts)
    vt.cp_gather_cache(v, vn, bt, cuk, len(new), starts)
    suf, lse_suf = vt.flash_attn_varlen_func(q, kn, vn, cu_seqlens_q=cu, cu_seqlens_k=cuk, causal=True,
                                             return_softmax_lse=True)
    out = np.zeros_like(one)
    lse = np.zeros_like(lse_one)
    vt.merge_attn_states(out, pre, lse_pre, suf, lse_suf, lse)
    check_close(out, lse, (q, k, v, cu, sk, bt), {}, what="merged")
    np.testing.assert_allclose(out, one, rtol=0, atol=4e-6)
    np.testing.assert_allclose(lse, lse_one, rtol=0, atol=4e-6)
