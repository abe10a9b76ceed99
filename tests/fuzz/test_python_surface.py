"""Hypothesis harness for the Python surface.

Random, often hostile arguments for every public entry point: arrays of
any dtype, rank and shape (zero-size, non-contiguous, read-only), indices
anywhere in the int64/int32 range, scales drawn from all float32 bit
patterns, random bytes as config.json.  Properties: the call returns or
raises one of the documented exception types (never another type, never a
crash), and a refused call writes nothing (caches, out arrays and scales
are compared byte for byte).  Deterministic (derandomize) so CI is
repeatable; VT_FUZZ_EXAMPLES raises the example count for a local run.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vtinfer as vt
from vtinfer import _C

EXAMPLES = int(os.environ.get("VT_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
DOCUMENTED = (ValueError, TypeError, IndexError, MemoryError, NotImplementedError, BufferError, OverflowError)

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.uint8, np.int32, np.int64, np.float64,
          ml_dtypes.float8_e4m3fn, np.bool_]
f32_bits = st.integers(0, 2**32 - 1).map(lambda b: float(np.array([b], np.uint32).view(np.float32)[0]))
scales = st.one_of(f32_bits, st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e-45, 1.0, 448.0]))


@st.composite
def arrays(draw, max_dims=4, max_side=5, dtypes=DTYPES):
    dt = draw(st.sampled_from(dtypes))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side))
    a = np.zeros(shape, np.float32)
    if a.size:
        a = draw(hnp.arrays(np.float32, shape, elements=st.floats(-1e3, 1e3, width=32)))
    a = a.astype(dt)
    if a.ndim and draw(st.booleans()):
        a = a[..., ::-1] if draw(st.booleans()) else np.swapaxes(a, 0, -1)
    if draw(st.booleans()):
        a = a.copy()
        a.flags.writeable = False
    return a


def _ok_or_documented(call):
    try:
        call()
    except DOCUMENTED:
        return False
    return True


@SETTINGS
@given(x=arrays(), scale=scales, fmt=st.sampled_from(["e4m3", "e5m2", "fp8", "bogus", ""]))
def test_fp8_quantize_surface(x, scale, fmt):
    _ok_or_documented(lambda: vt.fp8_quantize(x, scale=scale, fmt=fmt))


@SETTINGS
@given(c=arrays(), scale=scales, dtype=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, np.int8]))
def test_fp8_dequantize_surface(c, scale, dtype):
    _ok_or_documented(lambda: vt.fp8_dequantize(c, scale=scale, dtype=dtype))


def _cache_bytes(c):
    parts = [np.asarray(c.k_scale).tobytes(), np.asarray(c.v_scale).tobytes()]
    for layer in range(c.num_layers):
        parts += [c.key_cache(layer).tobytes(), c.value_cache(layer).tobytes()]
    return b"".join(parts)


CACHE = vt.PagedKVCache(num_layers=2, num_blocks=4, block_size=4, num_kv_heads=2, head_size=8, dtype="fp8_e4m3",
                        k_scale=np.array([0.5, 2.0], np.float32), v_scale=1.5)


@SETTINGS
@given(layer=st.integers(-2**63, 2**63 - 1) | st.integers(-2, 3),
       key=arrays(max_dims=4, max_side=4), same=st.booleans(),
       slots=st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-2, 20), max_size=6),
       slot_dtype=st.sampled_from([np.int64, np.int32, np.float64, np.uint64]))
def test_store_surface_refusal_writes_nothing(layer, key, same, slots, slot_dtype):
    before = _cache_bytes(CACHE)
    value = key if same else key.copy()
    try:
        sm = np.array(slots).astype(slot_dtype)
    except (OverflowError, ValueError):
        sm = np.array(slots, dtype=object)
    ok = _ok_or_documented(lambda: CACHE.store(layer, key, value, sm, num_threads=1))
    if not ok:
        assert _cache_bytes(CACHE) == before


@SETTINGS
@given(k_scale=scales, v_scale=scales, per_head=st.booleans(), kv=st.sampled_from(["fp8_e4m3", "fp8_e5m2", "auto",
                                                                                     "bfloat16", "fp9"]),
       slots=st.lists(st.integers(-3, 20), min_size=0, max_size=3), cache_dt=st.sampled_from([np.uint8, np.float32]))
def test_reshape_and_cache_flash_surface(k_scale, v_scale, per_head, kv, slots, cache_dt):
    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    kc, vc = np.zeros((4, 4, 2, 8), cache_dt), np.zeros((4, 4, 2, 8), cache_dt)
    ks = np.full(2, k_scale, np.float32) if per_head else np.float32(k_scale)
    vs = np.full(2, v_scale, np.float32) if per_head else np.float32(v_scale)
    sm = np.array(slots, np.int64)
    ok = _ok_or_documented(lambda: vt.reshape_and_cache_flash(k, k, kc, vc, sm, kv, ks, vs, num_threads=1))
    if not ok:
        assert not kc.any() and not vc.any()


i32 = st.integers(-2**31, 2**31 - 1) | st.integers(-2, 12)


@SETTINGS
@given(cu=st.lists(i32, min_size=0, max_size=4), sk=st.lists(i32, min_size=0, max_size=3),
       bt=st.lists(i32, min_size=0, max_size=6), width=st.integers(0, 3),
       kd=scales, vd=scales, causal=st.booleans(), window=st.tuples(st.integers(-3, 5), st.integers(-3, 5)),
       softcap=scales, H=st.integers(1, 5), kv=st.sampled_from(["auto", "fp8_e4m3", "fp8_e5m2", "fp9"]))
def test_flash_attn_surface_refusal_writes_nothing(cu, sk, bt, width, kd, vd, causal, window, softcap, H, kv):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, H, 8)).astype(np.float32)
    cache_dt = np.float32 if kv == "auto" else np.uint8
    k = (rng.standard_normal((4, 4, 2, 8)) * 10).astype(cache_dt)
    out = np.full_like(q, 7.0)
    rows = len(bt) // width if width else 0
    table = np.array(bt[:rows * width], np.int32).reshape(rows, width)
    kw = dict(cu_seqlens_q=np.array(cu, np.int32), seqused_k=np.array(sk, np.int32), block_table=table,
              causal=causal, window_size=window, softcap=softcap if softcap == softcap and softcap >= 0 else 0.0,
              kv_cache_dtype=kv, out=out, num_threads=1)
    if kv != "auto":
        kw.update(k_descale=np.float32(kd), v_descale=np.float32(vd))
    ok = _ok_or_documented(lambda: vt.flash_attn_varlen_func(q, k, k, **kw))
    if not ok:
        assert (out == 7.0).all()


json_text = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda ch: st.lists(ch, max_size=4) | st.dictionaries(
        st.sampled_from(["quantization_config", "quant_method", "producer", "name", "quantization", "quant_algo",
                         "kv_cache_quant_algo", "kv_cache_scheme", "dynamic", "num_bits", "type", "strategy",
                         "modelopt_quant_config", "x"]), ch, max_size=5),
    max_leaves=12).map(lambda v: __import__("json").dumps(v).encode())


@SETTINGS
@given(cfg=json_text | st.binary(max_size=64), hq=st.none() | json_text | st.binary(max_size=32),
       flag=st.sampled_from(["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "nvfp4", "bogus"]))
def test_resolver_surface(cfg, hq, flag):
    try:
        r = _C.resolve_kv_cache_dtype(flag, cfg, hq)
    except DOCUMENTED:
        return
    assert isinstance(r, dict) and isinstance(r["vllm_cache_dtype"], str)
