"""Routing gates (each compares against the float64 oracle, never against a
second fp8 run) and exact scale invariance of fp8 reads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import check_close, make_case

KV = ["fp8_e4m3", "fp8_e5m2"]


def run(args, **kw):
    q, k, v, cu, sk, bt = args
    return vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True, **kw)


@pytest.mark.parametrize("kv", KV)
def test_gate_v_is_read_from_the_v_page(isa, kv):
    """K and V hold different data: a read of V from the K page is wrong."""
    args = make_case(np.random.default_rng(11), q_lens=[1, 2], k_lens=[37, 64], H=8, Hkv=2, D=64, block_size=16,
                     kv_cache_dtype=kv)
    out, lse = run(args, kv_cache_dtype=kv)
    check_close(out, lse, args, {"kv_cache_dtype": kv}, what="v page")


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("block_size", [16, 32])
def test_gate_in_page_token_offset(isa, kv, block_size):
    """Every token of a page differs: dropping the in-page offset is wrong."""
    args = make_case(np.random.default_rng(block_size), q_lens=[1, 1], k_lens=[block_size * 3 - 1, 5], H=4, Hkv=4,
                     D=64, block_size=block_size, kv_cache_dtype=kv)
    out, lse = run(args, kv_cache_dtype=kv)
    check_close(out, lse, args, {"kv_cache_dtype": kv}, what="offset")


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("shape", ["tensor", "head", "batch"])
def test_gate_scales_routed(isa, kv, shape):
    """Distinct K and V descales per head and per sequence: swapping K/V,
    dropping one or taking another head's or sequence's is wrong."""
    args = make_case(np.random.default_rng(3), q_lens=[1, 4], k_lens=[50, 21], H=8, Hkv=2, D=64, block_size=16,
                     kv_cache_dtype=kv)
    kd = {"tensor": np.float32(0.25), "head": np.array([0.25, 2.0], np.float32),
          "batch": np.array([[0.25, 2.0], [4.0, 0.5]], np.float32)}[shape]
    vd = {"tensor": np.float32(8.0), "head": np.array([8.0, 0.125], np.float32),
          "batch": np.array([[8.0, 0.125], [0.5, 3.0]], np.float32)}[shape]
    kw = {"kv_cache_dtype": kv, "k_descale": kd, "v_descale": vd}
    out, lse = run(args, **kw)
    check_close(out, lse, args, kw, what=f"scales {shape}")


PAIRS = [(1.0, 1.0), (2.0, 0.5), (0.25, 4.0), (8.0, 0.125)]


def layer_data(rng, layer, n, Hkv, D):
    """float32 K/V whose |x / s| lies in [2^-5, 2^7] for every scale s of
    PAIRS: normal and unsaturated in e4m3 (min normal 2^-6, max 448)."""
    mag = 2.0 ** rng.uniform(-2, 4, size=(2, n, Hkv, D))
    sign = rng.choice([-1.0, 1.0], size=mag.shape)
    return (mag * sign * (1 + 0.1 * layer)).astype(np.float32)


def test_scale_invariance_is_exact_in_every_layer(isa):
    """Power-of-two (k_scale, v_scale) pairs: codes shift by whole exponents,
    so out and lse are bit-identical across pairs in every layer."""
    rng = np.random.default_rng(2024)
    layers, NB, bs, Hkv, D, H = 3, 6, 16, 2, 64, 8
    kl = NB * bs - 5
    j = np.arange(kl)
    bt = rng.permutation(NB).astype(np.int32)[None]
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    cu, sk = np.array([0, 1], np.int32), np.array([kl], np.int32)
    for layer in range(layers):
        kv = layer_data(rng, layer, kl, Hkv, D)
        results = []
        for ks, vs in PAIRS:
            scaled = np.stack([kv[0] / np.float32(ks), kv[1] / np.float32(vs)])
            a = np.abs(scaled)
            assert a.min() >= 2.0**-6 and a.max() < 448, f"layer {layer}: precondition broken"
            codes = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            k = np.zeros((NB, bs, Hkv, D), np.uint8)
            v = np.zeros((NB, bs, Hkv, D), np.uint8)
            k[bt[0, j // bs], j % bs] = codes[0]
            v[bt[0, j // bs], j % bs] = codes[1]
            out, lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                                 kv_cache_dtype="fp8", k_descale=ks, v_descale=vs, return_lse=True)
            results.append((out, lse))
        for (o, l), pair in zip(results[1:], PAIRS[1:]):
            assert np.array_equal(o.view(np.uint32), results[0][0].view(np.uint32)), f"layer {layer} out {pair}"
            assert np.array_equal(l.view(np.uint32), results[0][1].view(np.uint32)), f"layer {layer} lse {pair}"
