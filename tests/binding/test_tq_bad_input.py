"""Bad input for the TurboQuant slot-cache functions (vt.turboquant_store / turboquant_gather) and the
refusals of the paths that do not take these formats: each names the argument, nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt

NB, BS, H, D, T = 2, 16, 2, 64, 5
FMT = "turboquant_4bit_nc"


def args(fmt=FMT, d=D):
    rng = np.random.default_rng(0)
    k = rng.standard_normal((T, H, d)).astype(np.float32)
    v = rng.standard_normal((T, H, d)).astype(np.float32)
    cache = np.full((NB, BS, H, vt.turboquant_slot_bytes(fmt, d)), 0x5A, np.uint8)
    return dict(key=k, value=v, kv_cache=cache, slot_mapping=np.arange(T, dtype=np.int64), kv_cache_dtype=fmt)


def _with(**kw):
    def f(a):
        a.update(kw)
        return a
    return f


STORE_CASES = [
    ("flag vLLM does not know", _with(kv_cache_dtype="turboquant_2bit"), ValueError,
     r"turboquant_store: kv_cache_dtype must be one of turboquant_k8v4, .*; got 'turboquant_2bit'"),
    ("not a TurboQuant flag", _with(kv_cache_dtype="fp8"), ValueError, r"kv_cache_dtype must be one of turboquant_"),
    ("cache dtype", lambda a: {**a, "kv_cache": a["kv_cache"].view(np.int8)}, TypeError,
     r"turboquant_store: kv_cache must be uint8; got int8"),
    ("cache slot size", lambda a: {**a, "kv_cache": a["kv_cache"][..., :-2]}, ValueError,
     r"kv_cache must have shape \[num_blocks, block_size, 2, 70\] \(num_kv_heads and slot_size_aligned of "
     r"kv_cache_dtype 'turboquant_4bit_nc' at head_size 64\); got \[2, 16, 2, 68\]"),
    ("cache heads", lambda a: {**a, "kv_cache": a["kv_cache"][:, :, :1]}, ValueError,
     r"kv_cache must have shape \[num_blocks, block_size, 2, 70\] .*; got \[2, 16, 1, 70\]"),
    ("cache rank", lambda a: {**a, "kv_cache": a["kv_cache"].reshape(NB * BS, H, -1)}, ValueError,
     r"kv_cache must have shape \[num_blocks, block_size, num_kv_heads, slot_bytes\]; got 3 dimensions"),
    ("cache slots not contiguous", lambda a: {**a, "kv_cache": np.full((NB, BS, H, 2 * 70), 0x5A, np.uint8)[..., ::2]},
     ValueError, r"kv_cache must have contiguous slots"),
    ("cache read-only", lambda a: {**a, "kv_cache": _readonly(a["kv_cache"])}, ValueError, r"kv_cache"),
    ("cache broadcast", lambda a: {**a, "kv_cache": np.broadcast_to(a["kv_cache"][:1], a["kv_cache"].shape)},
     ValueError, r"kv_cache"),
    ("key dtype", lambda a: {**a, "key": a["key"].astype(np.float64), "value": a["value"].astype(np.float64)},
     TypeError, r"turboquant_store: key must be float32, float16 or bfloat16; got float64"),
    ("value dtype differs", lambda a: {**a, "value": a["value"].astype(np.float16)}, TypeError,
     r"value must have key's dtype float32; got float16"),
    ("value shape", lambda a: {**a, "value": a["value"][:, :1]}, ValueError, r"value must have key's shape \[5, 2, 64\]"),
    ("key rank", lambda a: {**a, "key": a["key"].reshape(T, -1)}, ValueError,
     r"key must have shape \[num_tokens, num_kv_heads, head_size\]; got 2 dimensions"),
    ("head size not a power of two", lambda a: {**args(d=48), "kv_cache_dtype": FMT,
                                                "kv_cache": np.zeros((NB, BS, H, vt.turboquant_slot_bytes(FMT, 48)),
                                                                     np.uint8)},
     ValueError, r"turboquant_store: head_size must be a power of two, at most 4096 \(one Hadamard rotation of the whole "
                 r"row\) for kv_cache_dtype 'turboquant_4bit_nc'; got 48"),
    ("odd head size", lambda a: {**args("turboquant_k8v4", 5), "kv_cache": np.zeros(
        (NB, BS, H, vt.turboquant_slot_bytes("turboquant_k8v4", 5)), np.uint8)}, ValueError,
     r"head_size must be even and at most 4096 for kv_cache_dtype 'turboquant_k8v4'; got 5"),
    ("slot out of range", lambda a: {**a, "slot_mapping": np.array([0, 1, 2, 3, NB * BS], np.int64)}, IndexError,
     r"turboquant_store: slot_mapping\[4\] must be < num_blocks \* block_size = 32 \(or negative to skip\); got 32"),
    ("slot dtype", lambda a: {**a, "slot_mapping": a["slot_mapping"].astype(np.int32)}, TypeError,
     r"slot_mapping must be int64; got int32"),
    ("slot count", lambda a: {**a, "slot_mapping": a["slot_mapping"][:4]}, ValueError,
     r"slot_mapping must have shape \[5\] \(key's num_tokens\); got \[4\]"),
    ("key inside the cache", lambda a: {**a, "key": a["kv_cache"].reshape(-1)[: T * H * D * 4].view(np.float32)
                                        .reshape(T, H, D)}, ValueError, r"kv_cache must not share memory with key"),
]


def _readonly(a):
    a = a.copy()
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("name,fn,exc,match", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_refusals_write_nothing(name, fn, exc, match):
    a = fn(args())
    before = np.array(a["kv_cache"], copy=True)
    with pytest.raises(exc, match=match):
        vt.turboquant_store(**a)
    np.testing.assert_array_equal(np.asarray(a["kv_cache"]), before)


def test_gather_refusals():
    a = args()
    vt.turboquant_store(**a)
    c = a["kv_cache"]
    with pytest.raises(IndexError, match=r"turboquant_gather: slots\[1\] must be in \[0, num_blocks \* block_size = "
                                         r"32\); got -1"):
        vt.turboquant_gather(c, np.array([0, -1], np.int64), FMT, D)
    with pytest.raises(ValueError, match=r"turboquant_gather: kv_cache must have shape \[num_blocks, block_size, 2, "
                                         r"62\]"):
        vt.turboquant_gather(c, np.array([0], np.int64), "turboquant_k3v4_nc", D)
    with pytest.raises(ValueError, match=r"turboquant_gather: head_size must be a positive int; got 0"):
        vt.turboquant_gather(c, np.array([0], np.int64), FMT, 0)
    with pytest.raises(ValueError, match=r"turboquant_gather: kv_cache_dtype must be one of .*; got 'int4_per_token_head'"):
        vt.turboquant_gather(c, np.array([0], np.int64), "int4_per_token_head", D)


def test_other_paths_refuse_the_formats():
    # The functional forms route TurboQuant to its own store and read (test_kv_formats_tq_functional.py), and so
    # does PagedKVCache (test_kv_formats_slot_cache.py); the C dense store and attention beneath the functional
    # forms refuse the slot formats. The paged cache's C store takes every TurboQuant preset (it holds the MSE
    # presets' codebook): the same bytes as turboquant_store.
    from vtinfer import _C

    a = args()
    kc = np.zeros((NB, BS, H, D), np.uint8)
    with pytest.raises(NotImplementedError, match=r"reshape_and_cache_flash: kv_cache_dtype 'turboquant_4bit_nc' "
                                                  r"packs K and V into one slot cache; store it with turboquant_store"):
        _C.reshape_and_cache_flash(a["key"], a["value"], kc, kc.copy(), a["slot_mapping"], FMT, 1.0, 1.0)
    assert not kc.any()
    for fmt in vt.TURBOQUANT_DTYPES:
        cache = vt.PagedKVCache(1, NB, BS, H, D, fmt)
        _C.PagedKVCache.store(cache, 0, a["key"], a["value"], a["slot_mapping"])
        ref = np.zeros_like(cache.key_cache(0))
        vt.turboquant_store(a["key"], a["value"], ref, a["slot_mapping"], fmt)
        assert cache.key_cache(0).any() and np.array_equal(cache.key_cache(0), ref), fmt
    # The C attention reads a slot cache passed as both k and v (turboquant_attention's path): k's width must
    # be the format's slot bytes and v must be k; nothing is written on a refusal.
    q = np.zeros((1, 4, D), np.float32)
    idx = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([1], np.int32),
               block_table=np.zeros((1, 1), np.int32), kv_cache_dtype="turboquant_k8v4")
    with pytest.raises(ValueError, match=r"^flash_attn_varlen_func: k must have shape \[num_blocks, block_size, "
                                         r"num_kv_heads, slot_bytes\] \(the slot bytes of 'turboquant_k8v4' at head "
                                         r"size 64\); got \[2, 16, 2, 64\]"):
        _C.flash_attn_varlen_func(q, kc, kc, **idx)
    sc = np.zeros((NB, BS, H, vt.turboquant_slot_bytes("turboquant_k8v4", D)), np.uint8)
    out = np.full((1, 4, D), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"^flash_attn_varlen_func: v must be k \(the same slot cache"):
        _C.flash_attn_varlen_func(q, sc, sc.copy(), out=out, **idx)
    with pytest.raises(TypeError, match=r"^flash_attn_varlen_func: k must be the uint8 slot cache for kv_cache_dtype "
                                        r"'turboquant_k8v4'; got int8"):
        _C.flash_attn_varlen_func(q, sc.view(np.int8), sc.view(np.int8), out=out, **idx)
    with pytest.raises(ValueError, match=r"^flash_attn_varlen_func: k_descale, v_descale, k_scale_cache and "
                                         r"v_scale_cache must be None for kv_cache_dtype 'turboquant_k8v4'"):
        _C.flash_attn_varlen_func(q, sc, sc, out=out, k_descale=np.ones(1, np.float32), **idx)
    assert (out == 7.0).all()
    # turboquant_attention says the same in its own names: the slot cache is its kv_cache (the C read's k)
    with pytest.raises(ValueError, match=r"^turboquant_attention: q must have a head count divisible by kv_cache's "
                                         r"num_kv_heads; got 3 and 2"):
        vt.turboquant_attention(q[:, :3], sc, **idx)