"""Per-token-head KV formats (int8_per_token_head, fp8_per_token_head): the store
byte for byte against the independent NumPy twin (tests/numerics/pth_twin.py)
on every ISA, random and adversarial rows; gather; page bytes against vLLM's
rule; the dtype table rows and the resolver naming the storage.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import pth_twin

FORMATS = ("int8_per_token_head", "fp8_per_token_head")
L, NB, BS, H = 2, 5, 16, 3


def nhd(a: np.ndarray, layout: str) -> np.ndarray:
    return a.transpose(0, 2, 1, 3) if layout == "HND" else a


def stored(cache: vt.PagedKVCache, layer: int, slots: np.ndarray):
    """(K codes, V codes, K scales, V scales) of `slots`, read from the zero-copy views."""
    b, o = slots // cache.block_size, slots % cache.block_size
    kc = nhd(cache.key_cache(layer), cache.layout)[b, o]
    vc = nhd(cache.value_cache(layer), cache.layout)[b, o]
    return kc, vc, cache.k_scale_cache(layer)[b, o], cache.v_scale_cache(layer)[b, o]


def check_bytes(cache, layer, k, v, slots, fmt):
    kc, vc, ks, vs = stored(cache, layer, slots)
    want_kc, want_ks = pth_twin.quantize(k, fmt)
    want_vc, want_vs = pth_twin.quantize(v, fmt)
    view = np.int8 if fmt == "int8_per_token_head" else np.uint8
    np.testing.assert_array_equal(kc.view(view), want_kc.view(view))
    np.testing.assert_array_equal(vc.view(view), want_vc.view(view))
    np.testing.assert_array_equal(ks.view(np.uint32), want_ks.view(np.uint32))
    np.testing.assert_array_equal(vs.view(np.uint32), want_vs.view(np.uint32))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("D", [64, 80, 576])
@pytest.mark.parametrize("fmt", FORMATS)
def test_store_bytes_equal_numpy_twin(isa, fmt, D, src, layout):
    rng = np.random.default_rng(D + len(src))
    cache = vt.PagedKVCache(L, NB, BS, H, D, fmt, layout=layout)
    dt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[src]
    for layer in range(L):
        n = 23
        slots = rng.permutation(NB * BS)[:n].astype(np.int64)
        # rows of very different magnitudes: scales differ per (token, head)
        mag = 2.0 ** rng.integers(-12, 12, size=(n, H, 1))
        k = (rng.standard_normal((n, H, D)) * mag).astype(dt)
        v = (rng.standard_normal((n, H, D)) * mag[::-1] * 3).astype(dt)
        cache.store(layer, k, v, slots)
        check_bytes(cache, layer, k, v, slots, fmt)


def adversarial_rows(D: int, fmt: str) -> np.ndarray:
    """Rows that probe one rule each."""
    qmax = pth_twin.QUANT[fmt][0]
    rows = []
    rows.append(np.zeros(D))                                  # all zero: scale floor 1e-6, codes 0
    r = np.full(D, 1e-3); r[5] = 1e30; rows.append(r)         # one huge element
    r = np.full(D, -1e-3); r[0] = -3e38; rows.append(r)       # huge negative near float32 max
    # scale exactly 1 (absmax = QUANT_MAX): x * 1 is x, so the midpoints are exact
    r = np.zeros(D); r[0] = qmax
    if fmt == "int8_per_token_head":
        mids = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.49999997, -0.49999997, 3.4999998, 127.0]
    else:  # e4m3 midpoints: 17 (16|18), 19 (18|20), 9 (8|9: exact), 0.0068359375 (subnormal mid), 416 (384|448 half)
        mids = [17.0, 19.0, -17.0, 9.0, 0.0068359375, -0.0068359375, 0.005859375, 440.0, 432.0, -432.0, 2 ** -10]
    r[1:1 + len(mids)] = mids; rows.append(r)
    r = np.zeros(D); r[0] = qmax / 2; r[1:7] = [0.25, 0.75, -0.25, 63.25, -63.75, 31.5]; rows.append(r)  # scale 0.5
    r = np.full(D, 0.3); r[3] = np.nan; rows.append(r)       # NaN: ignored by absmax, clamped to QUANT_MIN
    r = np.full(D, 0.3); r[D // 8 * 8 - 1] = np.nan; r[-1] = np.nan; rows.append(r)  # NaN in the last vector and the tail
    r = np.full(D, np.nan); rows.append(r)                    # all NaN
    r = np.full(D, 0.3); r[2] = np.inf; rows.append(r)       # +inf: scale inf, others 0, inf -> NaN -> QUANT_MIN
    r = np.full(D, -0.7); r[4] = -np.inf; r[6] = -0.0; rows.append(r)
    r = np.full(D, 1e-40); r[1] = -1e-41; rows.append(r)     # subnormals: scale floor
    r = np.full(D, 1e-38); r[7] = 1.17e-38 * 0.5; rows.append(r)  # near the normal/subnormal edge
    r = np.full(D, -0.0); rows.append(r)                      # negative zeros
    r = np.linspace(-1, 1, D) * 127e-6; rows.append(r)        # absmax/QUANT_MAX right at the 1e-6 floor
    r = np.linspace(-3, 5, D) * 1.000001; rows.append(r)
    return np.asarray(rows, np.float64)


@pytest.mark.parametrize("D", [16, 64, 130])
@pytest.mark.parametrize("fmt", FORMATS)
def test_store_adversarial_rows_equal_numpy_twin(isa, fmt, D):
    with np.errstate(all="ignore"):
        rows = adversarial_rows(D, fmt).astype(np.float32)
    n = len(rows)
    cache = vt.PagedKVCache(1, 2, 16, 1, D, fmt)
    slots = np.arange(n, dtype=np.int64)
    cache.store(0, rows[:, None, :], rows[::-1, None, :].copy(), slots)
    check_bytes(cache, 0, rows[:, None, :], rows[::-1, None, :], slots, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_twin_rules_by_hand(fmt):
    """The twin itself on hand-computed rows (so a wrong twin cannot vouch for a wrong store)."""
    if fmt == "int8_per_token_head":
        x = np.array([127.0, 2.5, -2.5, 0.5, -0.5, 0.49999997, 126.5, 0.0], np.float32)
        codes, s = pth_twin.quantize(x, fmt)
        assert s == np.float32(1.0)
        # half away from zero; 0.49999997 + 0.5 rounds to 1.0 in float32 before the truncation
        assert codes.tolist() == [127, 3, -3, 1, -1, 1, 127, 0]
        codes, s = pth_twin.quantize(np.array([0.0, np.nan, 1.0], np.float32), fmt)
        assert s == np.float32(1.0) / np.float32(127.0) and codes.tolist() == [0, -128, 127]
    else:
        x = np.array([448.0, 17.0, 19.0, -17.0, 0.0068359375], np.float32)
        codes, s = pth_twin.quantize(x, fmt)
        assert s == np.float32(1.0)
        vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        assert vals.tolist() == [448.0, 16.0, 20.0, -16.0, 0.0078125]  # nearest even
    codes, s = pth_twin.quantize(np.zeros(4, np.float32), fmt)
    assert s == np.float32(1e-6) and not codes.any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_negative_slots_skip_and_duplicates_keep_the_last(isa, fmt):
    rng = np.random.default_rng(3)
    cache = vt.PagedKVCache(1, 4, 16, 2, 64, fmt)
    k = rng.standard_normal((6, 2, 64)).astype(np.float32)
    slots = np.array([5, -1, 9, 5, -7, 40], np.int64)
    before_k = cache.key_cache(0).copy()
    cache.store(0, k, k * 2, slots, num_threads=2)
    kc, vc, ks, vs = stored(cache, 0, np.array([5, 9, 40]))
    want, wants = pth_twin.quantize(k[[3, 2, 5]], fmt)
    np.testing.assert_array_equal(kc.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(ks, wants)
    untouched = np.ones(64, bool)
    untouched[[5, 9, 40]] = False
    np.testing.assert_array_equal(cache.key_cache(0).reshape(64, 2, 64)[untouched],
                                  before_k.reshape(64, 2, 64)[untouched])
    assert (cache.k_scale_cache(0).reshape(64, 2)[untouched] == 1.0).all()  # vLLM fills its scale caches with 1


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_is_codes_times_scale(isa, fmt, layout):
    rng = np.random.default_rng(5)
    cache = vt.PagedKVCache(2, 3, 16, 2, 48, fmt, layout=layout)
    slots = rng.permutation(48)[:20].astype(np.int64)
    k = (rng.standard_normal((20, 2, 48)) * 7).astype(np.float32)
    v = (rng.standard_normal((20, 2, 48)) / 7).astype(np.float32)
    cache.store(1, k, v, slots)
    gk, gv = cache.gather(1, slots)
    for got, x in ((gk, k), (gv, v)):
        codes, s = pth_twin.quantize(x, fmt)
        np.testing.assert_array_equal(got, pth_twin.dequantize(codes, s, fmt))
    # and the round trip is as close as the format allows: half a code step of each row's scale
    step = {"int8_per_token_head": 0.5, "fp8_per_token_head": 448 / 16}[fmt]
    _, s = pth_twin.quantize(k, fmt)
    assert (np.abs(gk - k) <= step * s[..., None] * (1 + 1e-6)).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("geom", [(1, 16, 8, 64), (30, 16, 3, 128), (2, 32, 1, 80), (4, 1, 5, 256)])
def test_page_bytes_equal_vllm(fmt, geom):
    layers, bs, heads, d = geom
    cache = vt.PagedKVCache(layers, 2, bs, heads, d, fmt)
    assert cache.page_bytes == pth_twin.page_bytes(fmt, layers, bs, heads, d)
    bf16 = vt.PagedKVCache(layers, 2, bs, heads, d, "bfloat16")
    assert cache.page_bytes == bf16.page_bytes // 2 + 8 * layers * bs * heads
    assert cache.nbytes >= 2 * cache.page_bytes


def test_dtype_table_rows():
    i8, f8 = vt.dtype_info("int8_per_token_head"), vt.dtype_info("fp8_per_token_head")
    assert (i8.scale_kind, i8.is_int, i8.elem_bits, i8.quant_max, i8.quant_min, i8.page_layout) == (
        "token_head", True, 8, 127.0, -128.0, "scale_planes")
    assert (f8.scale_kind, f8.code_dtype, f8.quant_max, f8.quant_min) == ("token_head", "fp8_e4m3", 448.0, -448.0)
    assert vt.PER_TOKEN_HEAD_DTYPES == ("int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
    assert "int8_per_token_head" in vt.KV_CACHE_DTYPES and "fp8_per_token_head" in vt.KV_CACHE_DTYPES
    assert not f8.is_fp8 and "fp8_per_token_head" not in vt.FP8_DTYPES  # no per-tensor fp8 path takes it
    assert i8.numpy_dtype == np.int8 and f8.numpy_dtype == ml_dtypes.float8_e4m3fn


GEO = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
       "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_resolution_names_the_storage_and_the_plan_sizes_it(fmt, tmp_path):
    import json
    (tmp_path / "config.json").write_text(json.dumps(GEO))
    res = vt.resolve_kv_cache_dtype(fmt, tmp_path)
    assert res.dtype == fmt and res.cache_dtype == fmt
    plan = vt.plan_kv_cache(tmp_path, fmt, block_size=16, num_blocks=10)
    assert plan.bytes_per_block == pth_twin.page_bytes(fmt, 3, 16, 2, 64)
    cache = vt.PagedKVCache.from_checkpoint(tmp_path, fmt, num_blocks=4)
    assert cache.dtype == fmt and cache.page_bytes == plan.bytes_per_block


def test_unknown_format_name_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"dtype must be one of .*int8_per_token_head.*; got 'int8'"):
        vt.PagedKVCache(1, 2, 16, 1, 64, "int8")
    with pytest.raises(ValueError, match=r"got 'int8_per_tensor'"):
        vt.PagedKVCache(1, 2, 16, 1, 64, "int8_per_tensor")
    c = vt.PagedKVCache(1, 2, 16, 1, 64, "fp8_e4m3")
    with pytest.raises(ValueError, match=r"k_scale_cache: the cache must have a per-token-head dtype; got 'fp8_e4m3'"):
        c.k_scale_cache(0)


def test_views_have_the_element_dtype():
    c = vt.PagedKVCache(1, 2, 16, 2, 64, "int8_per_token_head", layout="HND")
    assert c.key_cache(0).dtype == np.int8 and c.key_cache(0).shape == (2, 2, 16, 64)
    assert c.k_scale_cache(0).dtype == np.float32 and c.k_scale_cache(0).shape == (2, 16, 2)
    c8 = vt.PagedKVCache(1, 2, 16, 2, 64, "fp8_per_token_head")
    assert c8.value_cache(0).dtype == np.uint8


def reciprocal_rows(fmt: str, n_rows: int = 8, D: int = 64) -> np.ndarray:
    """Rows whose codes differ between x * (1 / scale) (vLLM's rule) and x / scale: elements a few
    ulps from a rounding midpoint, found by search with the twin's arithmetic. Element 0 is the
    absmax, so each row's scale is known in advance."""
    qmax = np.float32(pth_twin.QUANT[fmt][0])
    rng = np.random.default_rng(17)
    if fmt == "int8_per_token_head":
        mids = np.arange(0, 127, dtype=np.float32) + np.float32(0.5)
    else:
        vals = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)))
        vals = vals[np.isfinite(vals)]
        mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
    rows = []
    while len(rows) < n_rows:
        a = np.float32(rng.uniform(0.3, 9.0))
        s = np.float32(max(a / qmax, np.float32(1e-6)))
        r = np.float32(1.0) / s
        base = (mids * s).astype(np.float32)
        cand = (base[:, None] + np.arange(-6, 7, dtype=np.float32)[None, :] * np.spacing(base)[:, None]).ravel()
        cand = cand[(cand > 0) & (cand < a)]
        mul = pth_twin.quantize(np.concatenate([[a], cand]).astype(np.float32), fmt)[0][1:]
        if fmt == "int8_per_token_head":
            q = (cand / s).astype(np.float32) + np.float32(0.5)
            div = np.trunc(np.fmin(q, qmax)).astype(np.int8)
        else:
            div = np.fmin((cand / s).astype(np.float32), qmax).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        diff = cand[mul.view(np.uint8) != div.view(np.uint8)]
        if len(diff) >= D - 1:
            row = np.concatenate([[a], rng.choice(diff, D - 1, replace=False) * rng.choice([-1, 1], D - 1)])
            rows.append(row.astype(np.float32))
    return np.asarray(rows)


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_multiplies_by_the_reciprocal(isa, fmt):
    """Every element of these rows gets a different code from x / scale than from x * (1 / scale)."""
    rows = reciprocal_rows(fmt)
    cache = vt.PagedKVCache(1, 1, 16, 1, rows.shape[1], fmt)
    slots = np.arange(len(rows), dtype=np.int64)
    cache.store(0, rows[:, None, :], rows[:, None, :], slots)
    check_bytes(cache, 0, rows[:, None, :], rows[:, None, :], slots, fmt)
