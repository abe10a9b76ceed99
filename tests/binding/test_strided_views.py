"""Every op that takes an array honours the strides of the view it is given
or refuses it naming the argument: called with a strided view (every
dimension in turn doubled, reversed, or bumped to a stride that is not a
multiple of the element size), an op either writes exactly what it writes
for a C-contiguous copy of the same values, or raises ValueError naming the
argument and writes nothing. The reference is the op on contiguous arrays,
whose own results the numerics tests hold against NumPy/float64 oracles;
swap_blocks' view semantics (vLLM's block stride) are checked against a
NumPy reference in tests/numerics/test_cache_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.binding import test_cache_ops_bad_input as co
from tests.binding import test_kvcache_bad_input as kvb
from tests.binding import test_tq_bad_input as tqb
from tests.binding.test_attention_bad_input import base as attn_base


def attn_args():
    a = attn_base()
    a["out"] = np.zeros(a["q"].shape, np.float32)
    return a


def store_args():
    return kvb.good()


def tq_store_args():
    return tqb.args()


def codec_args():
    return dict(x=np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6), out=np.zeros((4, 6), np.uint8))


def codec_quantize(x, out):
    vt.fp8_quantize(x, scale=0.5, out=out)


# (op, argument maker, outputs compared)
OPS = {**co.FNS,
       "attention": (vt.flash_attn_varlen_func, attn_args, ("out",)),
       "store": (vt.reshape_and_cache_flash, store_args, ("key_cache", "value_cache")),
       "tq_store": (vt.turboquant_store, tq_store_args, ("kv_cache",)),
       "quantize": (codec_quantize, codec_args, ("out",))}


def doubled(a, dim):
    """The values of `a` in a view whose dimension `dim` has twice its stride."""
    shape = list(a.shape)
    shape[dim] *= 2
    big = np.zeros(shape, a.dtype)
    sl = [slice(None)] * a.ndim
    sl[dim] = slice(None, None, 2)
    v = big[tuple(sl)]
    v[...] = a
    return v


def reversed_(a, dim):
    """The values of `a` in a view whose dimension `dim` has a negative stride."""
    sl = [slice(None)] * a.ndim
    sl[dim] = slice(None, None, -1)
    return np.ascontiguousarray(a[tuple(sl)])[tuple(sl)]


def odd_bytes(a, dim):
    """The values of `a` in a view whose dimension `dim` has a stride one byte past a multiple of the element
    size (elements of more than one byte)."""
    strides, span = [0] * a.ndim, a.itemsize
    for i in range(a.ndim - 1, -1, -1):
        strides[i] = span + (1 if i == dim else 0)
        span = strides[i] * a.shape[i] + a.itemsize
    v = np.ndarray(a.shape, a.dtype, buffer=np.zeros(span + 8, np.uint8), strides=strides)
    v[...] = a
    return v


KINDS = {"doubled": doubled, "reversed": reversed_, "odd_bytes": odd_bytes}


def cases():
    for key, (_, make, _) in OPS.items():
        for arg, val in make().items():
            if not isinstance(val, np.ndarray) or val.ndim == 0:
                continue
            for dim in range(val.ndim):
                if val.shape[dim] < 2:
                    continue
                for kind in KINDS:
                    if kind != "odd_bytes" or val.itemsize > 1:  # 1-byte elements have no such stride
                        yield key, arg, dim, kind


CASES = list(cases())


def _bytes(x):
    return np.ascontiguousarray(x).view(np.uint8).copy()


@pytest.mark.parametrize("key,arg,dim,kind", CASES, ids=[f"{k}-{a}-d{d}-{kd}" for k, a, d, kd in CASES])
def test_a_view_is_honoured_or_refused_by_name(key, arg, dim, kind):
    fn, make, outs = OPS[key]
    a = make()
    a[arg] = KINDS[kind](a[arg], dim)
    ref = make()
    fn(**ref)
    before = {o: _bytes(a[o]) for o in outs}
    try:
        fn(**a)
    except ValueError as e:
        assert arg in str(e), f"refused without naming {arg}: {e}"
        for o in outs:
            assert np.array_equal(_bytes(a[o]), before[o]), f"{o} was written by a refused call"
        return
    for o in outs:
        assert np.array_equal(_bytes(a[o]), _bytes(ref[o])), f"{o} differs from the contiguous call's"


@pytest.mark.parametrize("arg", ["key", "value", "slot_mapping"])
def test_turboquant_refuses_odd_byte_strides_as_every_op_does(arg):
    # The TurboQuant binding pins its tensors with the common check: a stride one byte past a multiple
    # of the element size is refused by name (reading such a view is a misaligned load, which
    # UndefinedBehaviorSanitizer stops), and nothing is written.
    a = tq_store_args()
    a[arg] = odd_bytes(a[arg], 0)
    before = _bytes(a["kv_cache"])
    with pytest.raises(ValueError, match=rf"turboquant_store: {arg} must have strides that are multiples of its "
                                         r"element size \(\d+ bytes\); got \d+ bytes in dimension 0"):
        vt.turboquant_store(**a)
    assert np.array_equal(_bytes(a["kv_cache"]), before)
