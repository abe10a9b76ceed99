"""Attention numerics at the edges, on every ISA.

- A NaN in a query row gives NaN for that row's output and LSE (not 0 and
  -inf, which mean "no visible key"), and leaves every other row as it is.
- A logit multiplier (softmax_scale * k_descale) near float32's range must
  not turn a finite result into NaN: a logit beyond float32's range
  saturates at +-FLT_MAX. The reference is a float64 softmax (whose logits
  do not overflow) over inputs where exactly one key overflows float32, so
  the true answer is that key's V row.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

ISAS = ("scalar", "avx2", "avx512")
FLOAT = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _paged(k_len, H_kv, D, bs, rng, scale=1.0):
    nb = (k_len + bs - 1) // bs + 1
    k = rng.standard_normal((nb, bs, H_kv, D)).astype(np.float32) * scale
    v = rng.standard_normal((nb, bs, H_kv, D)).astype(np.float32)
    bt = np.arange(1, nb, dtype=np.int32)[None, :]
    return k, v, bt


def _run(q, k, v, bt, k_len, kv_cache_dtype="auto", **kw):
    T = q.shape[0]
    return vt.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=np.array([0, T], np.int32), seqused_k=np.array([k_len], np.int32),
        block_table=bt, return_lse=True, kv_cache_dtype=kv_cache_dtype, num_threads=1, **kw)


@pytest.mark.parametrize("q_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("nan_at", ["first", "last", "all"])
@pytest.mark.parametrize("G", [1, 4])
def test_nan_in_q_gives_nan_for_that_row(isa, G, nan_at, q_dtype):
    rng = np.random.default_rng(7)
    H_kv, D, bs, k_len, T = 2, 64, 16, 70, 3
    H = H_kv * G
    k, v, bt = _paged(k_len, H_kv, D, bs, rng)
    q = rng.standard_normal((T, H, D)).astype(getattr(ml_dtypes, q_dtype, None) or np.dtype(q_dtype))
    out_ok, lse_ok = _run(q, k, v, bt, k_len)
    assert np.isfinite(out_ok).all() and np.isfinite(lse_ok).all()
    bad = q.copy()
    d = {"first": [0], "last": [D - 1], "all": list(range(D))}[nan_at]
    bad[1, 0, d] = np.nan  # token 1, head 0
    out, lse = _run(bad, k, v, bt, k_len)
    assert np.isnan(out[1, 0]).all(), f"{isa}: the NaN row's output is {out[1, 0, :4]}"
    assert np.isnan(lse[0, 1]), f"{isa}: the NaN row's LSE is {lse[0, 1]}"
    keep = np.ones((T, H), bool)
    keep[1, 0] = False
    np.testing.assert_array_equal(out[keep], out_ok[keep])
    np.testing.assert_array_equal(lse.T[keep], lse_ok.T[keep])


def test_nan_in_q_of_a_row_with_no_visible_key_stays_empty(isa):
    """A row that sees no key reads no logit: out 0, LSE -inf whatever q holds."""
    rng = np.random.default_rng(8)
    k, v, bt = _paged(40, 1, 32, 16, rng)
    q = np.full((1, 1, 32), np.nan, np.float32)
    out, lse = _run(q, k, v, bt, 40, window_size=(-1, -1), causal=True)
    assert np.isnan(out).all() and np.isnan(lse).all()
    # the same row with the window excluding every key: nothing is read
    k0 = np.zeros((2, 16, 1, 32), np.float32)
    out, lse = vt.flash_attn_varlen_func(
        q, k0, k0, cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([0], np.int32),
        block_table=np.zeros((1, 1), np.int32), causal=False, return_lse=True, num_threads=1)
    assert (out == 0).all() and lse[0, 0] == -np.inf


def _one_key_overflows(D, k_len, rng):
    """q and K with q . K_0 = 4 and |q . K_j| <= 1 for j > 0 (j < k_len)."""
    q = np.zeros((1, 1, D), np.float32)
    q[0, 0, 0] = 1.0
    k = np.zeros((k_len, D), np.float32)
    k[:, 0] = rng.uniform(-1, 1, k_len).astype(np.float32)
    k[0, 0] = 4.0
    k[:, 1:] = rng.standard_normal((k_len, D - 1)).astype(np.float32)
    return q, k


def _paged_rows(kr, vr, bs):
    """kr, vr [k_len, D] as a one-KV-head paged cache [nb, bs, 1, D] whose key j sits in block 1 + j // bs
    (block 0 left zero, unread), with its block table [1, nb - 1]."""
    k_len, D = kr.shape
    nb = (k_len + bs - 1) // bs + 1
    kc = np.zeros((nb, bs, 1, D), np.float32)
    vc = np.zeros((nb, bs, 1, D), np.float32)
    for j in range(k_len):
        kc[1 + j // bs, j % bs, 0] = kr[j]
        vc[1 + j // bs, j % bs, 0] = vr[j]
    bt = np.arange(1, nb, dtype=np.int32)[None, :]
    return kc, vc, bt


@pytest.mark.parametrize("softmax_scale", [1e38, 3.4e38, -3.4e38])
@pytest.mark.parametrize("G", [1, 8])
def test_softmax_scale_near_float32_range_stays_finite(isa, softmax_scale, G):
    rng = np.random.default_rng(9)
    D, bs, k_len = 64, 16, 50
    q1, kr = _one_key_overflows(D, k_len, rng)
    if softmax_scale < 0:
        kr[:, 0] = -kr[:, 0]  # the overflowing logit stays the largest
    H = G
    vr = rng.standard_normal((k_len, D)).astype(np.float32)
    kc, vc, bt = _paged_rows(kr, vr, bs)
    q = np.repeat(q1, H, axis=1)
    out, lse = _run(q, kc, vc, bt, k_len, softmax_scale=softmax_scale)
    # float64 oracle: logits scale * (q . K_j) do not overflow in float64
    s = softmax_scale * (kr.astype(np.float64) @ q1[0, 0].astype(np.float64))
    w = np.exp(s - s.max())
    ref = (w[:, None] * vr).sum(0) / w.sum()
    assert np.isfinite(out).all(), f"{isa}: non-finite output {out[0, 0, :4]}"
    for h in range(H):
        np.testing.assert_allclose(out[0, h], ref, rtol=0, atol=1e-6)
    assert not np.isnan(lse).any()


def test_k_descale_times_scale_beyond_float32_stays_finite(isa):
    """softmax_scale and k_descale each finite, their product past FLT_MAX."""
    rng = np.random.default_rng(10)
    D, bs, k_len = 32, 16, 20
    q1, kr = _one_key_overflows(D, k_len, rng)
    vr = rng.standard_normal((k_len, D)).astype(np.float32)
    kc, vc, bt = _paged_rows(kr, vr, bs)
    codes_k = vt.fp8_quantize(kc, 1.0)
    codes_v = vt.fp8_quantize(vc, 1.0)
    kd = np.array([1e30], np.float32)
    out, lse = _run(q1, codes_k, codes_v, bt, k_len, kv_cache_dtype="fp8", softmax_scale=1e10,
                    k_descale=kd, v_descale=np.array([1.0], np.float32))
    kdec = vt.fp8_dequantize(codes_k).astype(np.float64)
    vdec = vt.fp8_dequantize(codes_v).astype(np.float64)
    kk = np.array([kdec[1 + j // bs, j % bs, 0] for j in range(k_len)])
    vv = np.array([vdec[1 + j // bs, j % bs, 0] for j in range(k_len)])
    s = 1e10 * 1e30 * (kk @ q1[0, 0].astype(np.float64))
    w = np.exp(s - s.max())
    ref = (w[:, None] * vv).sum(0) / w.sum()
    assert np.isfinite(out).all(), f"{isa}: non-finite output {out[0, 0, :4]}"
    np.testing.assert_allclose(out[0, 0], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_per_token_head"])
@pytest.mark.parametrize("code", [0x7F, 0xFF])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("G", [1, 2, 4, 16])
def test_e4m3_nan_code_in_a_visible_key_gives_nan_for_its_heads(isa, fmt, code, where, D, G):
    """An e4m3 NaN code (0x7F / 0xFF) in a visible key's K or V row is a NaN for the rows of that KV head
    (vLLM decodes it to NaN); the other KV head's rows equal the same cache without the NaN, exactly. 0x7F sits
    mid-row, 0xFF at the row's last element (past the last whole 32 codes when D is 80)."""
    rng = np.random.default_rng(D + code)
    bs, k_len, H_kv = 16, 37, 2
    kf, vf, bt = _paged(k_len, H_kv, D, bs, rng)
    k8 = vt.fp8_quantize(kf, 1.0, "e4m3").view(np.uint8)
    v8 = vt.fp8_quantize(vf, 1.0, "e4m3").view(np.uint8)
    kw = {}
    if fmt == "fp8_per_token_head":  # the same codes under per-token-head scales of 1
        kw = dict(k_scale_cache=np.ones(k8.shape[:3], np.float32), v_scale_cache=np.ones(k8.shape[:3], np.float32))
    q = rng.standard_normal((1, H_kv * G, D)).astype(ml_dtypes.bfloat16)  # G >= 4: the pair-dot tile where it exists
    clean, clean_lse = _run(q, k8, v8, bt, k_len, fmt, **kw)
    bad = (k8 if where == "k" else v8).copy()
    bad[bt[0, 1], 3, 1, D // 2 + 1 if code == 0x7F else D - 1] = code  # key 19 (visible), KV head 1, one element
    out, lse = _run(q, bad if where == "k" else k8, bad if where == "v" else v8, bt, k_len, fmt, **kw)
    assert np.isnan(out[0, G:]).all() if where == "k" else np.isnan(out[0, G:]).any(), \
        f"{isa}: KV head 1's rows are {out[0, G:, :4]}"
    np.testing.assert_array_equal(out[0, :G], clean[0, :G], err_msg=f"{isa}: KV head 0 changed")


@pytest.mark.parametrize("value", [np.inf, np.nan])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("G", [1, 4, 8])
def test_non_finite_in_a_key_a_row_does_not_see_leaves_that_row_alone(isa, value, where, kv, G):
    """A causal prefill whose last key holds an inf or a NaN in K or V (one element): only the last query sees
    that key, so every other query's rows equal the same cache without it (a zero weight adds no 0 . inf = NaN,
    whatever layout a tile keeps its rows in: prefill tiles of 16 rows or more run the AVX2 tile's lanes form); the last
    query's rows are non-finite where V holds it."""
    rng = np.random.default_rng(G + (where == "v"))
    bs, k_len, H_kv, D, T = 16, 45, 2, 64, 12
    kf, vf, bt = _paged(k_len, H_kv, D, bs, rng)
    k, v = kf.astype(FLOAT[kv]), vf.astype(FLOAT[kv])
    q = rng.standard_normal((T, H_kv * G, D)).astype(np.float32)
    clean, _ = _run(q, k, v, bt, k_len, causal=True)
    bad = (k if where == "k" else v).copy()
    last = k_len - 1
    bad[bt[0, last // bs], last % bs, 1, D // 3] = value
    out, _ = _run(q, bad if where == "k" else k, bad if where == "v" else v, bt, k_len, causal=True)
    assert np.isfinite(out[:-1]).all(), f"{isa}: rows that do not see the key are {out[:-1][~np.isfinite(out[:-1])][:4]}"
    np.testing.assert_allclose(out[:-1], clean[:-1], rtol=1e-5, atol=1e-6, err_msg=f"{isa}: unseen key changed a row")
    if where == "v":
        assert not np.isfinite(out[-1, G:]).all(), f"{isa}: the last query's KV head 1 rows stayed finite"
