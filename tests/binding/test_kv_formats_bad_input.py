"""Bad input for the per-token-head formats: each refusal names the argument
and writes nothing (out= and the caches are compared before and after)."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt

NB, BS, HKV, H, D = 3, 16, 2, 4, 64


def setup(fmt="int8_per_token_head"):
    c = vt.PagedKVCache(1, NB, BS, HKV, D, fmt)
    rng = np.random.default_rng(0)
    c.store(0, rng.standard_normal((20, HKV, D)).astype(np.float32),
            rng.standard_normal((20, HKV, D)).astype(np.float32), np.arange(20))
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    kw = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([20], np.int32),
              block_table=np.array([[0, 1, 2]], np.int32))
    return c, q, kw


def good(c):
    return {"kv_cache_dtype": c.dtype, "k_scale_cache": c.k_scale_cache(0), "v_scale_cache": c.v_scale_cache(0)}


CASES = [
    ("k_scale_cache missing", lambda c: {**good(c), "k_scale_cache": None}, ValueError,
     r"k_scale_cache and v_scale_cache must be given for kv_cache_dtype 'int8_per_token_head'"),
    ("wrong scale shape", lambda c: {**good(c), "v_scale_cache": np.ones((NB, BS, HKV + 1), np.float32)}, ValueError,
     r"v_scale_cache must have shape \[3, 16, 2\]"),
    ("scale rank", lambda c: {**good(c), "k_scale_cache": np.ones((NB, BS), np.float32)}, ValueError,
     r"k_scale_cache"),
    ("scale dtype float64", lambda c: {**good(c), "k_scale_cache": np.ones((NB, BS, HKV))}, TypeError,
     r"k_scale_cache must have dtype float32"),
    ("scale dtype float16", lambda c: {**good(c), "v_scale_cache": np.ones((NB, BS, HKV), np.float16)}, TypeError,
     r"v_scale_cache must have dtype float32"),
    ("unknown format", lambda c: {**good(c), "kv_cache_dtype": "int8"}, ValueError,
     r"kv_cache_dtype must be one of .*int8_per_token_head.*; got 'int8'"),
    ("int4 not stored", lambda c: {**good(c), "kv_cache_dtype": "int4_per_token_head"}, ValueError,
     r"kv_cache_dtype must be one of"),
    ("codes read as fp8", lambda c: {**good(c), "kv_cache_dtype": "fp8_per_token_head"}, TypeError,
     r"k must hold uint8 or float8_e4m3fn codes for kv_cache_dtype 'fp8_per_token_head'; got int8"),
    ("int8 codes without the format", lambda c: {"kv_cache_dtype": "auto"}, TypeError,
     r"kv_cache_dtype must be 'int8_per_token_head' for a cache of int8 codes"),
    ("scale caches for another dtype", lambda c: {**good(c), "kv_cache_dtype": "fp8"}, ValueError,
     r"k_scale_cache and v_scale_cache must be None unless kv_cache_dtype is a per-token-head format"),
    ("descale with per-token-head", lambda c: {**good(c), "k_descale": np.float32(2.0)}, ValueError,
     r"k_descale and v_descale must be None for kv_cache_dtype 'int8_per_token_head'"),
]


@pytest.mark.parametrize("name,kw_fn,exc,match", CASES, ids=[c[0] for c in CASES])
def test_attention_refusals_write_nothing(name, kw_fn, exc, match):
    c, q, kw = setup()
    out = np.full((1, H, D), 7.0, np.float32)
    before = (c.key_cache(0).copy(), c.k_scale_cache(0).copy())
    with pytest.raises(exc, match=match):
        vt.flash_attn_varlen_func(q, c.key_cache(0), c.value_cache(0), out=out, **kw, **kw_fn(c))
    assert (out == 7.0).all()
    np.testing.assert_array_equal(c.key_cache(0), before[0])
    np.testing.assert_array_equal(c.k_scale_cache(0), before[1])


def test_cache_refusals():
    with pytest.raises(ValueError, match=r"PagedKVCache: dtype must be one of .*; got 'int8'"):
        vt.PagedKVCache(1, NB, BS, HKV, D, "int8")
    c = vt.PagedKVCache(1, NB, BS, HKV, D, "bfloat16")
    with pytest.raises(ValueError, match=r"PagedKVCache.v_scale_cache: the cache must have a per-token-head dtype"):
        c.v_scale_cache(0)
    c, _, _ = setup()
    with pytest.raises(IndexError):
        c.k_scale_cache(1)
    before = c.key_cache(0).copy(), c.k_scale_cache(0).copy()
    with pytest.raises(IndexError, match=r"slot_mapping\[1\] must be < num_blocks \* block_size = 48"):
        c.store(0, np.ones((2, HKV, D), np.float32), np.ones((2, HKV, D), np.float32), np.array([0, 48]))
    np.testing.assert_array_equal(c.key_cache(0), before[0])
    np.testing.assert_array_equal(c.k_scale_cache(0), before[1])
