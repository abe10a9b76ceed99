"""Every integer argument of the public surface is range-checked by name
before it is converted: a value past 64 bits, past the argument's range,
a bool or a float is refused with "<function>: <argument> must ...; got
..." (never a bare OverflowError from a C conversion), nothing written; a
NumPy integer is accepted wherever an int is (``__index__``).

Also here: refusals name the argument the caller passed, not one vtinfer
derived from it (the packed form's seqused_k, an fp8 q's q_descale folded
into k_descale), and turboquant_attention reads only the block-table
entries it needs, as flash_attn_varlen_func does."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.binding import test_cache_ops_bad_input as co
from tests.binding.test_attention_bad_input import base as attn_base

HUGE = [2**63, 2**64 - 1, 2**70, -(2**63) - 1]


def cache(**kw):
    return vt.PagedKVCache(**{**dict(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=1, head_size=16,
                                     dtype="fp8_e4m3"), **kw})


def _swap(v):
    vt.swap_blocks(**{**co.swap_args(), "block_size_in_bytes": v})


def _gather(v):
    vt.gather_and_maybe_dequant_cache(**{**co.gather_args(), "num_tokens": v})


def _cp(v):
    vt.cp_gather_cache(**{**co.cp_args(), "batch_size": v})


def _merge(v):
    vt.merge_attn_states(**{**co.merge_args(), "prefill_tokens_with_context": v})


def _attn(**kw):
    def call(v):
        a = attn_base()
        for k, f in kw.items():
            a[k] = f(v)
        vt.flash_attn_varlen_func(**a, causal=False)
    return call


def _cache_dim(name):
    return lambda v: cache(**{name: v})


def _slot_bytes(v):
    vt.turboquant_slot_bytes("turboquant_4bit_nc", v)


# (function as the message names it, argument as named, the call, a good value)
INTS = [
    ("swap_blocks", "block_size_in_bytes", _swap, co.BS * co.H * co.D),
    ("gather_and_maybe_dequant_cache", "num_tokens", _gather, 7),
    ("cp_gather_cache", "batch_size", _cp, 2),
    ("merge_attn_states", "prefill_tokens_with_context", _merge, 5),
    ("flash_attn_varlen_func", r"window_size\[0\]", _attn(window_size=lambda v: (v, -1)), 4),
    ("flash_attn_varlen_func", r"window_size\[1\]", _attn(window_size=lambda v: (-1, v)), 4),
    ("flash_attn_varlen_func", "max_seqlen_q", _attn(max_seqlen_q=lambda v: v), 3),
    ("flash_attn_varlen_func", "max_seqlen_k", _attn(max_seqlen_k=lambda v: v), 20),
    ("flash_attn_varlen_func", "num_threads", _attn(num_threads=lambda v: v), 1),
    ("swap_blocks", "num_threads", lambda v: vt.swap_blocks(**co.swap_args(), num_threads=v), 1),
    ("PagedKVCache", "num_layers", _cache_dim("num_layers"), 2),
    ("PagedKVCache", "num_blocks", _cache_dim("num_blocks"), 4),
    ("PagedKVCache", "block_size", _cache_dim("block_size"), 16),
    ("PagedKVCache", "num_kv_heads", _cache_dim("num_kv_heads"), 1),
    ("PagedKVCache", "head_size", _cache_dim("head_size"), 16),
    ("turboquant_slot_bytes", "head_size", _slot_bytes, 64),
]
IDS = [f"{fn}-{arg.replace(chr(92), '')}" for fn, arg, _, _ in INTS]


@pytest.mark.parametrize("fn,arg,call,good", INTS, ids=IDS)
@pytest.mark.parametrize("value", HUGE, ids=["2**63", "2**64-1", "2**70", "-2**63-1"])
def test_an_integer_out_of_range_is_refused_by_name(fn, arg, call, good, value):
    with pytest.raises(ValueError, match=rf"^{fn}: {arg} must (be|fit)") as e:
        call(value)
    assert str(value) in str(e.value)


@pytest.mark.parametrize("fn,arg,call,good", INTS, ids=IDS)
@pytest.mark.parametrize("value", [True, 2.0], ids=["bool", "float"])
def test_a_bool_or_float_is_refused_by_name(fn, arg, call, good, value):
    with pytest.raises(TypeError, match=rf"^{fn}: {arg} must be an int"):
        call(value)


@pytest.mark.parametrize("fn,arg,call,good", INTS, ids=IDS)
def test_a_numpy_integer_is_accepted(fn, arg, call, good):
    call(np.int64(good))
    call(np.int32(good))


@pytest.mark.parametrize("method", ["layer", "key_cache", "value_cache", "layer_scales"])
def test_a_layer_number_accepts_numpy_integers_and_refuses_bool(method):
    c = cache()
    getattr(c, method)(np.int64(1))
    getattr(c, method)(np.uint8(0))
    with pytest.raises(TypeError, match=r"layer must be an int; got bool"):
        getattr(c, method)(True)
    with pytest.raises(IndexError, match=r"layer must be in \[0, 2\); got 1180591620717411303424"):
        getattr(c, method)(2**70)


def test_store_layer_accepts_numpy_integers_and_refuses_bool():
    c = cache()
    k = np.ones((1, 1, 16), np.float32)
    c.store(np.int64(1), k, k, np.array([3], np.int64))
    before = np.array(c.key_cache(0), copy=True)
    with pytest.raises(TypeError, match=r"PagedKVCache.store: layer must be an int; got bool"):
        c.store(False, k, k, np.array([3], np.int64))
    assert np.array_equal(c.key_cache(0), before)


# ------------------------------------------------------- the caller's names


def _packed(**kw):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 2, 16)).astype(np.float32)
    k = rng.standard_normal((4, 2, 16)).astype(np.float32)
    return dict(q=q, k=k, v=k.copy(), cu_seqlens_q=np.array([0, 3, 5], np.int32), **kw)


@pytest.mark.parametrize("kw", [dict(cu_seqlens_k=np.array([0, 2, 4], np.int32)),
                                dict(cu_seqlens_k=np.array([0, 3, 4], np.int32), max_seqlen_k=1, causal=False)],
                         ids=["causal_fewer_keys", "max_seqlen_k_short"])
def test_a_packed_call_is_told_about_cu_seqlens_k(kw):
    with pytest.raises(ValueError) as e:
        vt.flash_attn_varlen_func(**_packed(**kw))
    assert "cu_seqlens_k" in str(e.value) and "seqused_k" not in str(e.value) and "block_table" not in str(e.value)


def test_fp8_q_descale_over_a_per_token_head_cache_blames_q_descale():
    import ml_dtypes

    rng = np.random.default_rng(0)
    kc = rng.integers(-100, 100, (4, 16, 2, 16)).astype(np.int8)
    sc = np.ones((4, 16, 2), np.float32)
    with pytest.raises(ValueError) as e:
        vt.flash_attn_varlen_func(np.zeros((3, 2, 16), ml_dtypes.float8_e4m3fn), kc, kc.copy(),
                                  cu_seqlens_q=np.array([0, 1, 3], np.int32), seqused_k=np.array([5, 4], np.int32),
                                  block_table=np.array([[0, 1], [2, 3]], np.int32), kv_cache_dtype="int8_per_token_head",
                                  k_scale_cache=sc, v_scale_cache=sc, q_descale=np.float32(2))
    assert str(e.value).startswith("flash_attn_varlen_func: q_descale must be None") and "k_descale" not in str(e.value)


# ------------------------------------------ turboquant reads what it attends


def _tq_case():
    rng = np.random.default_rng(3)
    fmt, H, D, NB, BS = "turboquant_4bit_nc", 2, 64, 6, 16
    cache_ = np.zeros((NB, BS, H, vt.turboquant_slot_bytes(fmt, D)), np.uint8)
    T = NB * BS
    vt.turboquant_store(rng.standard_normal((T, H, D)).astype(np.float32),
                        rng.standard_normal((T, H, D)).astype(np.float32), cache_,
                        np.arange(T, dtype=np.int64), fmt)
    q = rng.standard_normal((3, 4, D)).astype(np.float32)
    return dict(q=q, kv_cache=cache_, cu_seqlens_q=np.array([0, 1, 3], np.int32),
                seqused_k=np.array([20, 9], np.int32), kv_cache_dtype=fmt)


def test_turboquant_attention_ignores_block_table_entries_it_never_reads():
    a = _tq_case()
    padded = np.array([[4, 1, -1, -1], [2, -1, 99, -7]], np.int32)  # row 0 reads 2 blocks, row 1 one
    clean = np.where(padded >= 0, padded, 0)
    clean[1, 2] = 0
    got = vt.turboquant_attention(**a, block_table=padded)
    want = vt.turboquant_attention(**a, block_table=clean)
    assert np.array_equal(got, want)
    fa = vt.flash_attn_varlen_func(np.zeros((3, 4, 64), np.float32), np.zeros((6, 16, 2, 64), np.float32),
                                   np.zeros((6, 16, 2, 64), np.float32), cu_seqlens_q=a["cu_seqlens_q"],
                                   seqused_k=a["seqused_k"], block_table=padded)  # the rule it mirrors
    assert fa.shape == (3, 4, 64)


def test_turboquant_attention_refuses_a_bad_entry_it_reads_by_its_index():
    a = _tq_case()
    with pytest.raises(IndexError, match=r"turboquant_attention: block_table\[0, 1\] must be in \[0, 6\)"):
        vt.turboquant_attention(**a, block_table=np.array([[4, -1, 0], [2, 0, 0]], np.int32))
