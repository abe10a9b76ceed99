"""flash_attn_varlen_func refuses bad input before any work: the right
exception, the argument named, `out` untouched, the process alive."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import make_case


def base():
    rng = np.random.default_rng(0)
    q, k, v, cu, sk, bt = make_case(rng, q_lens=[1, 3], k_lens=[20, 10], H=4, Hkv=2, D=64, block_size=16,
                                    extra_blocks=1)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt)


def fp8_base():
    rng = np.random.default_rng(0)
    q, k, v, cu, sk, bt = make_case(rng, q_lens=[1, 3], k_lens=[20, 10], H=4, Hkv=2, D=64, block_size=16,
                                    kv_cache_dtype="fp8_e4m3")
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt)


def mod(**changes):
    def f():
        a = base()
        for key, fn in changes.items():
            a[key] = fn(a)
        return a

    return f


CASES = {
    "heads_not_divisible": (mod(q=lambda a: np.zeros((4, 3, 64), np.float32)), ValueError, "q"),
    "head_size_differs": (mod(q=lambda a: np.zeros((4, 4, 32), np.float32)), ValueError, "k"),
    "v_shape_differs": (mod(v=lambda a: a["v"][:, :8]), ValueError, "v"),
    "seqused_k_beyond_table": (mod(seqused_k=lambda a: np.array([20, 10 ** 4], np.int32)), ValueError, "seqused_k"),
    "seqused_k_negative": (mod(seqused_k=lambda a: np.array([20, -1], np.int32)), ValueError, "seqused_k"),
    "block_id_too_big": (mod(block_table=lambda a: np.where(np.arange(a["block_table"].shape[1]) == 0,
                                                            a["k"].shape[0], a["block_table"]).astype(np.int32)),
                         IndexError, "block_table"),
    "block_id_negative": (mod(block_table=lambda a: np.full_like(a["block_table"], -1)), IndexError, "block_table"),
    "cu_decreasing": (mod(cu_seqlens_q=lambda a: np.array([0, 3, 1], np.int32)), ValueError, "cu_seqlens_q"),
    "cu_past_q": (mod(cu_seqlens_q=lambda a: np.array([0, 1, 9], np.int32)), ValueError, "cu_seqlens_q"),
    "cu_negative_start": (mod(cu_seqlens_q=lambda a: np.array([-1, 1, 4], np.int32)), ValueError, "cu_seqlens_q"),
    "more_queries_than_keys": (mod(seqused_k=lambda a: np.array([20, 2], np.int32)), ValueError, "seqused_k"),
    "cu_int64": (mod(cu_seqlens_q=lambda a: a["cu_seqlens_q"].astype(np.int64)), TypeError, "cu_seqlens_q"),
    "seqused_float": (mod(seqused_k=lambda a: a["seqused_k"].astype(np.float32)), TypeError, "seqused_k"),
    "block_table_int64": (mod(block_table=lambda a: a["block_table"].astype(np.int64)), TypeError, "block_table"),
    "block_table_1d": (mod(block_table=lambda a: a["block_table"][0]), ValueError, "block_table"),
    "seqused_wrong_batch": (mod(seqused_k=lambda a: np.array([20], np.int32)), ValueError, "seqused_k"),
    "q_float64": (mod(q=lambda a: a["q"].astype(np.float64)), TypeError, "q"),
    "k_int32": (mod(k=lambda a: np.zeros(a["k"].shape, np.int32)), TypeError, "k"),
    "kv_dtypes_differ": (mod(v=lambda a: a["v"].astype(np.float16)), TypeError, "v"),
    "k_last_dim_strided": (mod(k=lambda a: np.zeros(a["k"].shape[:3] + (128,), np.float32)[..., ::2]), ValueError,
                           "k"),
}


def run_case(a, out=None, **kw):
    q = a.pop("q")
    k = a.pop("k")
    v = a.pop("v")
    return vt.flash_attn_varlen_func(q, k, v, **a, out=out, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_refused_naming_argument(name):
    make, exc, arg = CASES[name]
    a = make()
    out = np.full(a["q"].shape, 5.0, np.float32)
    kw = {}
    if a["q"].dtype != np.float32:
        out = None
    with pytest.raises(exc, match=arg):
        run_case(a, out=out, **kw)
    if out is not None:
        assert (out == 5.0).all()


@pytest.mark.parametrize(
    "kw,exc,arg",
    [
        ({"kv_cache_dtype": "auto"}, TypeError, "kv_cache_dtype"),
        ({"kv_cache_dtype": "fp8_e5m2", "typed": True}, TypeError, "kv_cache_dtype"),
        ({"kv_cache_dtype": "int8"}, ValueError, "kv_cache_dtype"),
    ],
)
def test_fp8_cache_needs_its_format(kw, exc, arg):
    import ml_dtypes

    a = fp8_base()
    if kw.pop("typed", False):
        a["k"] = a["k"].view(ml_dtypes.float8_e4m3fn)
        a["v"] = a["v"].view(ml_dtypes.float8_e4m3fn)
    out = np.full(a["q"].shape, 5.0, np.float32)
    with pytest.raises(exc, match=arg):
        run_case(a, out=out, **kw)
    assert (out == 5.0).all()


def test_float_cache_with_fp8_flag_refused():
    with pytest.raises(TypeError, match="kv_cache_dtype"):
        run_case(base(), kv_cache_dtype="fp8")


@pytest.mark.parametrize(
    "kw,exc,arg",
    [
        ({"k_descale": np.float32(0.0)}, ValueError, "k_descale"),
        ({"v_descale": np.float32(np.inf)}, ValueError, "v_descale"),
        ({"k_descale": np.ones(3, np.float32)}, ValueError, "k_descale"),
        ({"v_descale": np.ones((3, 2), np.float32)}, ValueError, "v_descale"),
        ({"alibi_slopes": np.ones(3, np.float32)}, ValueError, "alibi_slopes"),
        ({"s_aux": np.array([1, 2, np.nan, 4], np.float32)}, ValueError, "s_aux"),
        ({"softcap": -1.0}, ValueError, "softcap"),
        ({"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
        ({"window_size": (-2, 0)}, ValueError, "window_size"),
        ({"window_size": 3}, TypeError, "window_size"),
        ({"max_seqlen_q": 2}, ValueError, "max_seqlen_q"),
        ({"max_seqlen_k": 5}, ValueError, "max_seqlen_k"),
        ({"num_threads": 0}, ValueError, "num_threads"),
        ({"k_descale": "x"}, TypeError, "k_descale"),
    ],
)
def test_bad_options(kw, exc, arg):
    a = base()
    out = np.full(a["q"].shape, 5.0, np.float32)
    with pytest.raises(exc, match=arg):
        run_case(a, out=out, **kw)
    assert (out == 5.0).all()


@pytest.mark.parametrize(
    "make_out",
    [
        lambda q: np.zeros(q.shape, np.float16),
        lambda q: np.zeros((q.shape[0] + 1,) + q.shape[1:], np.float32),
        lambda q: np.zeros(q.shape, np.float32)[:, :, :],
        lambda q: np.zeros(q.shape[:2], np.float32),
    ][:2] + [lambda q: np.zeros(q.shape[:2], np.float32)],
)
def test_bad_out(make_out):
    a = base()
    out = make_out(a["q"])
    out[...] = 3
    with pytest.raises((ValueError, TypeError), match="out"):
        run_case(a, out=out)
    assert (out == 3).all()


def test_out_overlapping_q_refused():
    a = base()
    with pytest.raises(ValueError, match="out"):
        run_case(dict(a), out=a["q"])


def test_missing_required_and_readonly_out():
    a = base()
    a.pop("block_table")
    with pytest.raises(TypeError, match="block_table"):
        run_case(a)
    a = base()
    out = np.zeros(a["q"].shape, np.float32)
    out.flags.writeable = False
    with pytest.raises((ValueError, TypeError, BufferError), match="out"):
        run_case(a, out=out)
