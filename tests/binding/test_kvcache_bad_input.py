"""Bad input to the cache and the store: a clear exception naming the
argument, nothing written (the caches' bytes are compared before and after),
the process alive."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

NB, BS, H, D = 4, 4, 2, 16


def good():
    rng = np.random.default_rng(0)
    k = rng.standard_normal((5, H, D)).astype(np.float32)
    v = rng.standard_normal((5, H, D)).astype(np.float32)
    kc = np.zeros((NB, BS, H, D), np.uint8)
    vc = np.zeros((NB, BS, H, D), np.uint8)
    return dict(key=k, value=v, key_cache=kc, value_cache=vc, slot_mapping=np.array([0, 1, 2, 3, 4], np.int64),
                kv_cache_dtype="fp8", k_scale=0.5, v_scale=2.0)


def call(**over):
    a = good()
    a.update(over)
    kc, vc = a["key_cache"], a["value_cache"]
    before = (np.array(kc, copy=True), np.array(vc, copy=True)) if isinstance(kc, np.ndarray) else None
    try:
        vt.reshape_and_cache_flash(**a)
    finally:
        if before is not None:
            np.testing.assert_array_equal(kc, before[0])  # nothing written
            np.testing.assert_array_equal(vc, before[1])


def test_good_call_writes():
    a = good()
    vt.reshape_and_cache_flash(**a)
    assert a["key_cache"].any()


CASES = [
    ("slot_past_end", dict(slot_mapping=np.array([0, 1, 2, 3, NB * BS], np.int64)), IndexError, r"slot_mapping\[4\]"),
    ("slot_huge", dict(slot_mapping=np.array([2**62, 1, 2, 3, 4], np.int64)), IndexError, r"slot_mapping\[0\]"),
    ("slot_int32", dict(slot_mapping=np.arange(5, dtype=np.int32)), TypeError, "slot_mapping"),
    ("slot_2d", dict(slot_mapping=np.zeros((5, 1), np.int64)), ValueError, "slot_mapping"),
    ("slots_longer_than_key", dict(slot_mapping=np.arange(6, dtype=np.int64)), ValueError, "slot_mapping"),
    ("key_rank", dict(key=np.zeros((5, H * D), np.float32)), ValueError, "key"),
    # H_kv and D come from key: a key that disagrees is reported against value, then the caches
    ("key_shape", dict(key=np.zeros((5, H, D + 1), np.float32)), ValueError, "value must have shape"),
    ("key_value_vs_cache", dict(key=np.zeros((5, H, D + 1), np.float32), value=np.zeros((5, H, D + 1), np.float32)),
     ValueError, "key_cache must have shape"),
    ("value_shape", dict(value=np.zeros((5, H + 1, D), np.float32)), ValueError, "value"),
    ("value_tokens", dict(value=np.zeros((4, H, D), np.float32)), ValueError, "value"),
    ("key_value_dtypes", dict(value=np.zeros((5, H, D), np.float16)), TypeError, "value"),
    ("key_int", dict(key=np.zeros((5, H, D), np.int32), value=np.zeros((5, H, D), np.int32)), TypeError, "key"),
    ("key_float64", dict(key=np.zeros((5, H, D)), value=np.zeros((5, H, D))), TypeError, "key"),
    ("cache_rank", dict(key_cache=np.zeros((NB, BS, H * D), np.uint8)), ValueError, "key_cache"),
    ("cache_shape", dict(value_cache=np.zeros((NB, BS, H, D * 2), np.uint8)), ValueError, "value_cache"),
    ("cache_heads", dict(key_cache=np.zeros((NB, BS, H + 1, D), np.uint8)), ValueError, "key_cache"),
    ("cache_dtype_fp8", dict(key_cache=np.zeros((NB, BS, H, D), np.float16)), TypeError, "key_cache"),
    ("cache_wrong_fp8_kind", dict(key_cache=np.zeros((NB, BS, H, D), ml_dtypes.float8_e5m2)), TypeError, "key_cache"),
    ("cache_dtype_auto", dict(kv_cache_dtype="auto"), TypeError, "key_cache"),
    ("cache_readonly", dict(value_cache=np.broadcast_to(np.zeros((1, BS, H, D), np.uint8), (NB, BS, H, D))),
     ValueError, "value_cache"),
    ("cache_not_array", dict(key_cache=[[0]]), TypeError, "key_cache"),
    ("kv_cache_dtype_unknown", dict(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype"),
    ("scale_zero", dict(k_scale=0.0), ValueError, "k_scale"),
    ("scale_negative", dict(v_scale=-1.0), ValueError, "v_scale"),
    ("scale_nan", dict(k_scale=float("nan")), ValueError, "k_scale"),
    ("scale_inf", dict(v_scale=float("inf")), ValueError, "v_scale"),
    ("scale_length", dict(k_scale=np.ones(H + 1, np.float32)), ValueError, "k_scale"),
    ("scale_head_nan", dict(v_scale=np.array([1.0, np.nan], np.float32)), ValueError, "v_scale"),
    ("layout", dict(layout="NDH"), ValueError, "layout"),
]


@pytest.mark.parametrize("name,over,exc,match", CASES, ids=[c[0] for c in CASES])
def test_flash_bad_input(name, over, exc, match):
    with pytest.raises(exc, match=match):
        call(**over)


def test_refused_call_leaves_earlier_tokens_unwritten():
    """The last slot is bad: the first four tokens must not have been stored."""
    a = good()
    a["slot_mapping"] = np.array([0, 1, 2, 3, 999], np.int64)
    with pytest.raises(IndexError, match=r"slot_mapping\[4\] must be < num_blocks \* block_size = 16"):
        vt.reshape_and_cache_flash(**a)
    assert not a["key_cache"].any() and not a["value_cache"].any()


def test_x_split_bad_shapes():
    a = good()
    a["key_cache"] = np.zeros((NB, H, D // 16, BS, 16), np.uint8)
    a["value_cache"] = np.zeros((NB, H, D, BS), np.uint8)
    vt.reshape_and_cache(**a)
    with pytest.raises(ValueError, match="key_cache"):
        vt.reshape_and_cache(**{**a, "key_cache": np.zeros((NB, H, 3, BS, 16), np.uint8)})
    with pytest.raises(ValueError, match="value_cache"):
        vt.reshape_and_cache(**{**a, "value_cache": np.zeros((NB, H, BS, D), np.uint8)})
    with pytest.raises(IndexError, match="slot_mapping"):
        vt.reshape_and_cache(**{**a, "slot_mapping": np.array([0, 1, 2, 3, 16], np.int64)})


# ---- the cache ----

@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((0, 4, 4, 2, 16, "fp8"), ValueError, "num_layers"),
        ((1, -4, 4, 2, 16, "fp8"), ValueError, "num_blocks"),
        ((1, 4, 0, 2, 16, "fp8"), ValueError, "block_size"),
        ((1, 4, 4, 0, 16, "fp8"), ValueError, "num_kv_heads"),
        ((1, 4, 4, 2, -1, "fp8"), ValueError, "head_size"),
        ((2**20, 2**20, 2**20, 2**20, 16, "fp8"), ValueError, "64 bits"),
        ((2**62, 2**62, 1, 1, 1, "float32"), ValueError, "64 bits"),
        ((1, 4, 4, 2, 16, "int8"), ValueError, "dtype"),
        ((1, 4, 4, 2, 16, 3), TypeError, "dtype"),
    ],
)
def test_cache_bad_geometry(args, exc, match):
    with pytest.raises(exc, match=match):
        vt.PagedKVCache(*args)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(k_scale=0.0), "k_scale"),
        (dict(v_scale=-2.0), "v_scale"),
        (dict(k_scale=float("nan")), "k_scale"),
        (dict(k_scale=[1.0, 1.0, 1.0]), "k_scale"),  # neither [L] nor [L, H]
        (dict(v_scale=np.ones((2, 3))), "v_scale"),
        (dict(k_scale=[1.0, float("inf")]), "k_scale"),
        (dict(layout="NDH"), "layout"),
    ],
)
def test_cache_bad_scales_and_layout(kw, match):
    with pytest.raises(ValueError, match=match):
        vt.PagedKVCache(2, 4, 4, 2, 16, "fp8", **kw)


def test_cache_store_bad_input_writes_nothing():
    c = vt.PagedKVCache(2, NB, BS, H, D, "fp8_e4m3")
    a = good()
    k, v = a["key"], a["value"]
    s = a["slot_mapping"]
    with pytest.raises(IndexError, match="layer"):
        c.store(2, k, v, s)
    with pytest.raises(IndexError, match="layer"):
        c.store(-1, k, v, s)
    with pytest.raises(IndexError, match=r"slot_mapping\[1\]"):
        c.store(0, k, v, np.array([0, 16, 1, 2, 3], np.int64))
    with pytest.raises(ValueError, match="key"):
        c.store(0, np.zeros((5, H + 1, D), np.float32), v, s)
    with pytest.raises(TypeError, match="key"):
        c.store(0, k.astype(np.int64), v, s)
    with pytest.raises(TypeError, match="value"):
        c.store(0, k, v.astype(ml_dtypes.bfloat16), s)
    with pytest.raises(IndexError, match="slots"):
        c.gather(0, [NB * BS])
    with pytest.raises(IndexError, match="slots"):
        c.gather(0, [-1])
    with pytest.raises(IndexError, match="layer"):
        c.key_cache(5)
    with pytest.raises(TypeError, match="layer"):
        c.value_cache("0")
    for layer in range(2):
        assert not c.key_cache(layer).any() and not c.value_cache(layer).any()


def test_readonly_cache_via_dlpack_is_refused():
    torch = pytest.importorskip("torch")
    a = good()
    kc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
    a["key_cache"] = kc
    a["kv_cache_dtype"] = "fp8"
    a["value_cache"] = torch.zeros(NB, BS, H, D, dtype=torch.float16)  # wrong dtype through DLPack
    with pytest.raises(TypeError, match="value_cache"):
        vt.reshape_and_cache_flash(**a)
    assert not kc.any()
