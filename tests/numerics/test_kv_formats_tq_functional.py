"""TurboQuant through vLLM's functional forms and the torch ops, like every other format.

``reshape_and_cache_flash`` takes the slot cache as ``key_cache`` (``value_cache`` None or the same
cache) and writes the bytes of the independent NumPy twin (k8v4: exact; every preset: the bytes of
``turboquant_store``, itself held to the twin and to vLLM's kernels elsewhere);
``flash_attn_varlen_func(..., kv_cache_dtype=<TurboQuant>)`` and ``torch.ops.vtinfer.*`` read it within
the tolerance rule against the float64 oracle over the twin's dequantized cache. Arguments TurboQuant has
no meaning for are refused by name and nothing is written.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import tq_twin
from tests.numerics.test_attention_oracle import check_close
from tests.numerics.test_kv_formats_tq_attention import build

FORMATS = [("turboquant_k8v4", 80), ("turboquant_4bit_nc", 64), ("turboquant_k3v4_nc", 128),
           ("turboquant_3bit_nc", 64)]
NB, BS, H = 4, 16, 2


def _rows(rng, n, D):
    k = (rng.standard_normal((n, H, D)) * 2).astype(np.float32)
    v = rng.standard_normal((n, H, D)).astype(np.float32)
    return k, v


def _store(fmt, D, k, v, slots, same_cache):
    cache = np.full((NB, BS, H, vt.turboquant_slot_bytes(fmt, D)), 0x5A, np.uint8)
    vt.reshape_and_cache_flash(k, v, cache, cache if same_cache else None, slots, fmt, 1.0, 1.0)
    return cache


def test_k8v4_flash_store_bytes_equal_the_twin():
    fmt, D = "turboquant_k8v4", 64
    rng = np.random.default_rng(1)
    k, v = _rows(rng, 20, D)
    slots = rng.permutation(NB * BS)[:20].astype(np.int64)
    cache = _store(fmt, D, k, v, slots, True)
    want = tq_twin.store(fmt, k, v)
    got = cache.reshape(NB * BS, H, -1)[slots]
    lay = tq_twin.layout(fmt, D)
    np.testing.assert_array_equal(got[..., : lay["slot"]], want[..., : lay["slot"]])


@pytest.mark.parametrize("same_cache", [True, False])
@pytest.mark.parametrize("fmt,D", FORMATS)
def test_flash_store_is_turboquant_store(fmt, D, same_cache):
    rng = np.random.default_rng(D)
    k, v = _rows(rng, 25, D)
    slots = rng.permutation(NB * BS)[:25].astype(np.int64)
    slots[3] = -1  # skipped, as in every store
    cache = _store(fmt, D, k, v, slots, same_cache)
    want = np.full_like(cache, 0x5A)
    vt.turboquant_store(k, v, want, slots, fmt)
    np.testing.assert_array_equal(cache, want)


@pytest.mark.parametrize("v_is", ["k", "none"])
@pytest.mark.parametrize("fmt,D", FORMATS)
def test_flash_attention_matches_oracle(fmt, D, v_is):
    rng = np.random.default_rng(D + 3)
    q, cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[1, 6, 1], k_lens=[9, 40, 23], H=4, Hkv=2)
    out = np.full_like(q, np.nan)
    res, lse = vt.flash_attn_varlen_func(q, cache, cache if v_is == "k" else None, cu_seqlens_q=cu, seqused_k=sk,
                                         block_table=bt, kv_cache_dtype=fmt, out=out, return_softmax_lse=True,
                                         softcap=30.0, window_size=(17, 0))
    assert res is out
    check_close(out, lse, (q, K, V, cu, sk, bt), {"softcap": 30.0, "window_size": (17, 0)}, what=f"{fmt} D={D}")


@pytest.mark.parametrize("fmt,D", [FORMATS[0], FORMATS[1]])
def test_torch_ops_take_turboquant(fmt, D):
    torch = pytest.importorskip("torch")
    import vtinfer.torch  # noqa: F401  (registers torch.ops.vtinfer)

    rng = np.random.default_rng(D + 11)
    q, ref_cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[1, 5], k_lens=[30, 18], H=4, Hkv=2,
                                           q_dtype="bfloat16")
    cache = torch.from_numpy(ref_cache.copy())
    slots = torch.arange(3, dtype=torch.int64)
    k = torch.from_numpy(rng.standard_normal((3, 2, D)).astype(np.float32))
    one = torch.ones(1)
    probe = cache.clone()
    torch.ops.vtinfer.reshape_and_cache_flash(k, k, probe, probe, slots, fmt, one, one)
    want = ref_cache.copy()
    vt.turboquant_store(k.numpy(), k.numpy(), want, slots.numpy(), fmt)
    np.testing.assert_array_equal(probe.numpy(), want)
    qt = torch.from_numpy(q.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
    out, lse = torch.ops.vtinfer.flash_attn_varlen_func(qt, cache, cache, torch.from_numpy(cu), torch.from_numpy(sk),
                                                        torch.from_numpy(bt), kv_cache_dtype=fmt)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and tuple(out.shape) == q.shape
    ours = out.view(torch.int16).numpy().view(q.dtype)
    check_close(ours, lse.numpy(), (q, K, V, cu, sk, bt), {}, what=f"torch op {fmt}")


def _bad_store_cases():
    fmt, D = "turboquant_k8v4", 64
    base = dict(key=np.ones((2, H, D), np.float32), value=np.ones((2, H, D), np.float32),
                slot_mapping=np.arange(2, dtype=np.int64), kv_cache_dtype=fmt, k_scale=1.0, v_scale=1.0)
    return [
        ("other value cache", {"value_cache": "other"}, ValueError,
         r"reshape_and_cache_flash: value_cache must be None or key_cache itself for kv_cache_dtype "
         r"'turboquant_k8v4' \(one slot cache holds K and V\); got another array"),
        ("k_scale", {"k_scale": 0.5}, ValueError,
         r"reshape_and_cache_flash: k_scale must be 1.0 for kv_cache_dtype 'turboquant_k8v4' \(TurboQuant computes "
         r"its scales per slot\); got \[0.5\]"),
        ("v_scale per head", {"v_scale": np.array([1.0, 2.0])}, ValueError, r"v_scale must be 1.0 .*; got \[1.0, 2.0\]"),
        ("scale cache", {"k_scale_cache": np.zeros((NB, BS, H), np.float32)}, ValueError,
         r"k_scale_cache must be None for kv_cache_dtype 'turboquant_k8v4' \(TurboQuant keeps its scales inside "
         r"each slot\); got ndarray"),
        ("HND", {"layout": "HND"}, ValueError, r"layout must be None or 'NHD' for kv_cache_dtype 'turboquant_k8v4'"),
    ], base


@pytest.mark.parametrize("name", [c[0] for c in _bad_store_cases()[0]])
def test_store_refusals_name_the_argument_and_write_nothing(name):
    cases, base = _bad_store_cases()
    _, change, exc, msg = next(c for c in cases if c[0] == name)
    cache = np.zeros((NB, BS, H, vt.turboquant_slot_bytes("turboquant_k8v4", 64)), np.uint8)
    other = cache.copy()
    kw = {**base, "key_cache": cache, "value_cache": cache, **change}
    if change.get("value_cache") == "other":
        kw["value_cache"] = other
    with pytest.raises(exc, match=msg):
        vt.reshape_and_cache_flash(**kw)
    assert not cache.any() and not other.any()


@pytest.mark.parametrize("arg,value,msg", [
    ("k_descale", 1.0, r"k_descale must be None for kv_cache_dtype 'turboquant_4bit_nc' \(TurboQuant keeps"),
    ("v_scale_cache", np.ones((4, 16, 2), np.float32), r"v_scale_cache must be None"),
    ("q_dtype", "fp8", r"q_dtype must be None for kv_cache_dtype 'turboquant_4bit_nc' \(queries are float32"),
    ("v", "copy", r"flash_attn_varlen_func: v must be None or k itself for kv_cache_dtype 'turboquant_4bit_nc'"),
    ("out", "wrong", r"flash_attn_varlen_func: out must be an array of q's shape \(8, 4, 64\) and dtype float32"),
    ("window_size", (-3, 0), r"^flash_attn_varlen_func: window_size\[0\] must be in \[-1, "),
    ("softcap", -1.0, r"^flash_attn_varlen_func: softcap must be finite and >= 0"),
])
def test_read_refusals_name_the_argument(arg, value, msg):
    fmt, D = "turboquant_4bit_nc", 64
    rng = np.random.default_rng(0)
    q, cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[1, 7], k_lens=[9, 20], H=4, Hkv=2)
    kw = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt)
    v = cache
    if arg == "v":
        v = cache.copy()
    elif arg == "out":
        kw["out"] = np.zeros((8, 4, 32), np.float32)
    else:
        kw[arg] = value
    with pytest.raises(ValueError, match=msg):
        vt.flash_attn_varlen_func(q, cache, v, **kw)
    if arg == "out":
        assert not kw["out"].any()


def test_read_packed_form_is_refused():
    fmt, D = "turboquant_k8v4", 80
    rng = np.random.default_rng(2)
    q, cache, K, V, cu, sk, bt = build(rng, fmt, D, q_lens=[2], k_lens=[5], H=2, Hkv=2)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be None for kv_cache_dtype 'turboquant_k8v4' \(the "
                                         r"paged form only"):
        vt.flash_attn_varlen_func(q, cache, cache, cu_seqlens_q=cu, cu_seqlens_k=np.array([0, 5], np.int32),
                                  kv_cache_dtype=fmt)
