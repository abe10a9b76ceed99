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
    ("int8 codes read as int4", lambda c: {**good(c), "kv_cache_dtype": "int4_per_token_head"}, ValueError,
     r"k must have shape \[num_blocks, block_size, num_kv_heads, 32 or D / 2 \+ 4\] \(q's head size / 2\)"),
    ("format vLLM does not know", lambda c: {**good(c), "kv_cache_dtype": "int8_per_tensor"}, ValueError,
     r"kv_cache_dtype must be one of .*; got 'int8_per_tensor'"),
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


# ---- the functional store on caller-owned caches (reshape_and_cache_flash with scale caches)

T = 5


def store_args(fmt="int8_per_token_head"):
    """Good arguments: int8 (or uint8) code caches [NB, BS, HKV, D + 4] (vLLM's padded views, pads 0x5A)
    and contiguous float32 scale caches [NB, BS, HKV]."""
    rng = np.random.default_rng(3)
    code = np.int8 if fmt == "int8_per_token_head" else np.uint8
    page = np.full((NB, BS, HKV, 2 * (D + 4)), 0x5A, np.uint8).view(code)
    return dict(key=rng.standard_normal((T, HKV, D)).astype(np.float32),
                value=rng.standard_normal((T, HKV, D)).astype(np.float32),
                key_cache=page[..., : D + 4], value_cache=page[..., D + 4:], slot_mapping=np.arange(T),
                kv_cache_dtype=fmt, k_scale=1.0, v_scale=1.0,
                k_scale_cache=np.ones((NB, BS, HKV), np.float32), v_scale_cache=np.ones((NB, BS, HKV), np.float32))


def _shares_codes(a):
    a["k_scale_cache"] = a["key_cache"].view(np.uint8)[..., 4:8].view(np.float32)[..., 0]  # codes 4..7
    return a


def _broadcast(a):
    a["v_scale_cache"] = np.lib.stride_tricks.as_strided(np.ones(1, np.float32), (NB, BS, HKV), (0, 0, 0))
    return a


def _readonly(a):
    a["k_scale_cache"].flags.writeable = False
    return a


def _cuda_scale(a):
    from tests.binding.dlpack_fake import FakeTensor
    a["k_scale_cache"] = FakeTensor((NB, BS, HKV), device_type=2)
    return a


STORE_CASES = [
    ("k_scale_cache missing", lambda a: {**a, "k_scale_cache": None}, ValueError,
     r"reshape_and_cache_flash: k_scale_cache and v_scale_cache must be given for kv_cache_dtype "
     r"'int8_per_token_head'"),
    ("v_scale_cache shape", lambda a: {**a, "v_scale_cache": np.ones((NB, BS, HKV + 1), np.float32)}, ValueError,
     r"reshape_and_cache_flash: v_scale_cache must have shape \[3, 16, 2\] .*; got \[3, 16, 3\]"),
    ("k_scale_cache rank", lambda a: {**a, "k_scale_cache": np.ones((NB, BS), np.float32)}, ValueError,
     r"reshape_and_cache_flash: k_scale_cache must have 3 dimensions; got 2"),
    ("k_scale_cache float64", lambda a: {**a, "k_scale_cache": np.ones((NB, BS, HKV))}, TypeError,
     r"reshape_and_cache_flash: k_scale_cache must have dtype float32; got float64"),
    ("v_scale_cache int32", lambda a: {**a, "v_scale_cache": np.ones((NB, BS, HKV), np.int32)}, TypeError,
     r"reshape_and_cache_flash: v_scale_cache must have dtype float32; got int32"),
    ("k_scale_cache read-only", _readonly, ValueError, r"k_scale_cache must be writable"),
    ("k_scale_cache on a CUDA device", _cuda_scale, ValueError,
     r"reshape_and_cache_flash: k_scale_cache must be in CPU memory; got DLPack device type 2"),
    ("scale caches for a plain dtype", lambda a: {**a, "kv_cache_dtype": "float32",
                                                  "key_cache": np.zeros((NB, BS, HKV, D), np.float32),
                                                  "value_cache": np.zeros((NB, BS, HKV, D), np.float32)},
     ValueError, r"k_scale_cache and v_scale_cache must be None unless kv_cache_dtype is a per-token-head format; "
                 r"got kv_cache_dtype 'float32'"),
    ("int8 codes read as fp8", lambda a: {**a, "kv_cache_dtype": "fp8_per_token_head"}, TypeError,
     r"reshape_and_cache_flash: key_cache must hold uint8 or float8_e4m3fn codes for kv_cache_dtype "
     r"'fp8_per_token_head'; got int8"),
    ("int8 codes without the format", lambda a: {**a, "kv_cache_dtype": "auto", "k_scale_cache": None,
                                                 "v_scale_cache": None, "key_cache": np.zeros((NB, BS, HKV, D), np.int8),
                                                 "value_cache": np.zeros((NB, BS, HKV, D), np.int8)}, TypeError,
     r"reshape_and_cache_flash: key_cache must have dtype float32 for kv_cache_dtype 'auto'"),
    ("last dimension D + 8", lambda a: {**a, "key_cache": np.zeros((NB, BS, HKV, D + 8), np.int8)}, ValueError,
     r"key_cache must have shape \[num_blocks, block_size, H_kv, D\] = \[3, 16, 2, 64\] \(H_kv and D from key; "
     r"or D \+ 4 as vLLM's per-token-head views\)"),
    ("scale cache inside the codes", _shares_codes, ValueError,
     r"reshape_and_cache_flash: k_scale_cache must not share memory with key_cache"),
    ("one scale cache for K and V", lambda a: {**a, "v_scale_cache": a["k_scale_cache"]}, ValueError,
     r"reshape_and_cache_flash: k_scale_cache must not share memory with v_scale_cache"),
    ("broadcast scale cache", _broadcast, ValueError, r"reshape_and_cache_flash: v_scale_cache must not alias itself"),
    ("unknown format", lambda a: {**a, "kv_cache_dtype": "int8_per_tensor"}, ValueError,
     r"reshape_and_cache_flash: kv_cache_dtype must be one of .*; got 'int8_per_tensor'"),
]


@pytest.mark.parametrize("name,kw_fn,exc,match", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_refusals_write_nothing(name, kw_fn, exc, match):
    a = kw_fn(store_args())
    before = {k: np.array(a[k], copy=True) for k in ("key_cache", "value_cache", "k_scale_cache", "v_scale_cache")
              if isinstance(a.get(k), np.ndarray)}
    with pytest.raises(exc, match=match):
        vt.reshape_and_cache_flash(**a)
    for k, arr in before.items():
        np.testing.assert_array_equal(np.asarray(a[k]), arr, err_msg=k)


def test_paged_layout_store_refuses_per_token_head():
    """vLLM has no x-split per-token-head store: reshape_and_cache refuses the formats."""
    x = 8
    kc = np.zeros((NB, HKV, D // x, BS, x), np.int8)
    vc = np.zeros((NB, HKV, D, BS), np.int8)
    k = np.ones((T, HKV, D), np.float32)
    with pytest.raises(ValueError, match=r"reshape_and_cache: kv_cache_dtype must not be 'int8_per_token_head' "
                                         r"\(vLLM stores per-token-head formats in the flash layout"):
        vt.reshape_and_cache(k, k, kc, vc, np.arange(T), "int8_per_token_head", 1.0, 1.0)
    assert not kc.any() and not vc.any()


# ---- int4_per_token_head in PagedKVCache: construction, store, gather and the cache's read

I4 = "int4_per_token_head"


def int4_setup():
    c, q, kw = setup(I4)
    return c, q, kw


def _attention_not_causal(c, q, kw, out):
    c.attention(0, q, causal=False, out=out, **kw)


INT4_CACHE_CASES = [
    ("odd head size", lambda c, q, kw, out: vt.PagedKVCache(1, NB, BS, HKV, 63, I4), ValueError,
     r"PagedKVCache: head_size must be even and at most 4096, with a largest power-of-two divisor of at most 1024 \(two codes per byte; the rotation block\) for dtype 'int4_per_token_head'; got 63"),
    ("rotation block over 1024", lambda c, q, kw, out: vt.PagedKVCache(1, NB, BS, HKV, 2048, I4), ValueError,
     r"PagedKVCache: head_size must be even .*divisor of at most 1024 .* got 2048"),
    ("head size over 4096", lambda c, q, kw, out: vt.PagedKVCache(1, NB, BS, HKV, 6144, I4), ValueError,
     r"PagedKVCache: head_size must be even and at most 4096, .*; got 6144"),
    ("store of another head size", lambda c, q, kw, out: c.store(0, np.ones((2, HKV, D // 2), np.float32),
                                                                 np.ones((2, HKV, D // 2), np.float32), np.arange(2)),
     ValueError, r"PagedKVCache.store: key must have shape \[num_tokens, 2, 64\]"),
    ("store of int8 rows", lambda c, q, kw, out: c.store(0, np.ones((2, HKV, D), np.int8),
                                                         np.ones((2, HKV, D), np.int8), np.arange(2)),
     TypeError, r"PagedKVCache.store: key must have dtype float32, float16, or bfloat16; got int8"),
    ("gather rotated not a bool", lambda c, q, kw, out: c.gather(0, np.arange(2), rotated=1), TypeError,
     r"PagedKVCache.gather: rotated must be a bool; got int"),
    ("gather rotated of an 8-bit format", lambda c, q, kw, out: setup()[0].gather(0, np.arange(2), rotated=True),
     ValueError, r"PagedKVCache.gather: rotated must be False for dtype 'int8_per_token_head' \(only "
                 r"int4_per_token_head stores rotated codes\); got True"),
    ("attention not causal", _attention_not_causal, ValueError,
     r"causal must be True for kv_cache_dtype 'int4_per_token_head'"),
]


@pytest.mark.parametrize("name,call,exc,match", INT4_CACHE_CASES, ids=[c[0] for c in INT4_CACHE_CASES])
def test_int4_cache_refusals_write_nothing(name, call, exc, match):
    c, q, kw = int4_setup()
    out = np.full((1, H, D), 7.0, np.float32)
    before = [a.copy() for a in (c.key_cache(0), c.value_cache(0), c.k_scale_cache(0), c.v_scale_cache(0))]
    with pytest.raises(exc, match=match):
        call(c, q, kw, out)
    assert (out == 7.0).all()
    for a, b in zip((c.key_cache(0), c.value_cache(0), c.k_scale_cache(0), c.v_scale_cache(0)), before):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
