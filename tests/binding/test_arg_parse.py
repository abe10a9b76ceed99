"""The table-driven argument parse of the store and attention bindings
(csrc/binding/common/signature.c): positional arguments by position,
keywords by name (interned names compared by pointer, any other equal
string by value), and CPython's own wording for a call that does not fit.

Each parameter is passed by a keyword built at run time (so not the
interned object the table holds) with a value its own check refuses: the
error must name that parameter, which shows the keyword reached its own
field and no other. The extension vtinfer._cuda compiles the same parser
and tables: its refusals of calls that do not fit are checked too when it
is built from this tree (its tensor checks want device tensors, so the
field-by-field check runs on vtinfer._C)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from vtinfer import _C

H, D, BS, NB = 2, 16, 4, 4  # D = 16: one 16-byte x-group of fp8 codes in reshape_and_cache's key cache


def _dyn(name: str) -> str:
    """An equal str that is not the interned object."""
    s = "".join(list(name))
    assert s == name
    return s


def _store_args(xsplit: bool) -> dict:
    """Good reshape_and_cache(_flash) arguments on an fp8 cache (so the scales are read)."""
    k = np.ones((1, H, D), np.float32)
    if xsplit:
        kc, vc = np.zeros((NB, H, D // 16, BS, 16), np.uint8), np.zeros((NB, H, D, BS), np.uint8)
    else:
        kc, vc = np.zeros((NB, BS, H, D), np.uint8), np.zeros((NB, BS, H, D), np.uint8)
    return dict(key=k, value=k.copy(), key_cache=kc, value_cache=vc, slot_mapping=np.array([1], np.int64),
                kv_cache_dtype="fp8_e4m3", k_scale=1.0, v_scale=1.0)


def _attn_args() -> dict:
    q = np.ones((1, H, D), np.float32)
    kc = np.zeros((NB, BS, H, D), np.float32)
    return dict(q=q, k=kc, v=kc.copy(), cu_seqlens_q=np.array([0, 1], np.int32),
                seqused_k=np.array([3], np.int32), block_table=np.zeros((1, NB), np.int32))


def _modules():
    mods = [_C]
    try:
        from vtinfer import _cuda
    except ImportError:
        return mods
    import os

    if os.path.dirname(_cuda.__file__) == os.path.dirname(_C.__file__):
        mods.append(_cuda)
    return mods


TRUTH = {"causal", "return_lse"}  # read as truth values, so no object is refused
CALLS = [("reshape_and_cache_flash", lambda: _store_args(False)), ("reshape_and_cache", lambda: _store_args(True)),
         ("flash_attn_varlen_func", _attn_args)]


@pytest.mark.parametrize("fn,good", CALLS, ids=[c[0] for c in CALLS])
def test_every_keyword_reaches_its_own_field(fn, good):
    f = getattr(_C, fn)
    base = good()
    names = list(inspect.signature(f).parameters)
    assert set(base) <= set(names)
    checked = 0
    for name in names:
        if name in TRUTH:
            continue  # any object is a truth value: checked by effect below
        kw = {_dyn(n): v for n, v in base.items()}
        kw[_dyn(name)] = object()
        with pytest.raises((TypeError, ValueError)) as ei:
            f(**kw)
        assert name in str(ei.value), (fn, name, str(ei.value))
        checked += 1
    assert checked >= len(base)


def test_truth_keywords_by_value():
    base = _attn_args()
    base["q"] = np.random.default_rng(1).standard_normal((2, H, D)).astype(np.float32)
    base["cu_seqlens_q"] = np.array([0, 2], np.int32)
    base["k"][:] = np.random.default_rng(2).standard_normal(base["k"].shape)
    base["v"][:] = np.random.default_rng(4).standard_normal(base["v"].shape)
    out = _C.flash_attn_varlen_func(**base)
    assert isinstance(out, np.ndarray)
    got = _C.flash_attn_varlen_func(**{_dyn(n): v for n, v in base.items()}, **{_dyn("return_lse"): True})
    assert isinstance(got, tuple) and np.array_equal(got[0], out)
    full = _C.flash_attn_varlen_func(**base, **{_dyn("causal"): False})
    assert np.array_equal(full[1], out[1]) and not np.array_equal(full[0], out[0])  # the first query sees one more key


@pytest.mark.parametrize("mod", _modules(), ids=lambda m: m.__name__)
def test_calls_that_do_not_fit_the_table(mod):
    a = _store_args(False)
    pos = list(a.values())
    f = mod.reshape_and_cache_flash
    with pytest.raises(TypeError, match=r"^reshape_and_cache_flash\(\) takes at most 8 positional arguments \(9 given\)$"):
        f(*pos, None)
    with pytest.raises(TypeError, match=r"^reshape_and_cache_flash\(\) missing required argument 'v_scale' \(pos 8\)$"):
        f(*pos[:7])
    with pytest.raises(TypeError, match=r"^'bogus' is an invalid keyword argument for reshape_and_cache_flash\(\)$"):
        f(*pos, bogus=1)
    with pytest.raises(TypeError, match=r"given by name \('key'\) and position \(1\)$"):
        f(*pos, **{_dyn("key"): a["key"]})
    if hasattr(mod, "reshape_and_cache"):  # vtinfer._cuda has only the flash layout
        with pytest.raises(TypeError, match=r"^'layout' is an invalid keyword argument for reshape_and_cache\(\)$"):
            mod.reshape_and_cache(*_store_args(True).values(), layout="NHD")
    t = _attn_args()
    with pytest.raises(TypeError, match=r"^flash_attn_varlen_func: cu_seqlens_q is required$"):
        mod.flash_attn_varlen_func(t["q"], t["k"], t["v"], seqused_k=t["seqused_k"], block_table=t["block_table"])
    with pytest.raises(TypeError, match=r"at most 3 positional arguments \(4 given\)$"):
        mod.flash_attn_varlen_func(t["q"], t["k"], t["v"], t["cu_seqlens_q"])
    assert not a["key_cache"].any() and not a["value_cache"].any()  # nothing written by any of these


def test_keywords_by_value_store_the_same_bytes():
    a = _store_args(False)
    rng = np.random.default_rng(3)
    a["key"] = rng.standard_normal((1, H, D)).astype(np.float32)
    a["value"] = rng.standard_normal((1, H, D)).astype(np.float32)
    b = {n: (v.copy() if isinstance(v, np.ndarray) else v) for n, v in a.items()}
    _C.reshape_and_cache_flash(*a.values(), layout="NHD", num_threads=1)
    _C.reshape_and_cache_flash(**{_dyn(n): v for n, v in b.items()}, **{_dyn("layout"): "NHD", _dyn("num_threads"): 1})
    assert a["key_cache"].any() and np.array_equal(a["key_cache"], b["key_cache"])
    assert np.array_equal(a["value_cache"], b["value_cache"])
