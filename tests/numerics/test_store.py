"""Numerics of the store: bytes, the error envelope, padding, duplicates, layouts.

References are independent of the store: a NumPy scatter written here for
where each token lands, ``vt.fp8_quantize`` (the codec, tested on its own
against a nearest-value search) and ml_dtypes' casts for what each element
becomes. Scales are non-unit and unequal for K and V, per layer and per
head, so a swapped or dropped scale cannot pass.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

L, NB, BS, H, D = 3, 6, 4, 3, 32
FMT = {"fp8_e4m3": ("e4m3", 448.0, ml_dtypes.float8_e4m3fn), "fp8_e5m2": ("e5m2", 57344.0, ml_dtypes.float8_e5m2)}


def scales_for(mode: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = {"tensor": (), "layer": (L,), "head": (L, H)}[mode]
    k = (2.0 ** rng.integers(-3, 3, size=shape)) * rng.uniform(1.0, 1.9, size=shape)
    v = k * 3.7  # never equal to k
    return np.asarray(k, np.float32), np.asarray(v, np.float32)


def expand(s: np.ndarray) -> np.ndarray:
    """Scales as [L, H]."""
    return np.broadcast_to(s.reshape(s.shape + (1,) * (2 - s.ndim)) if s.ndim == 1 else s, (L, H)).astype(np.float32)


def fill(cache: vt.PagedKVCache, seed: int, dtype=np.float32, slots_per_layer=None):
    """Store distinct random tokens into every layer; return (keys, values, slots) per layer."""
    rng = np.random.default_rng(seed)
    out = []
    for layer in range(cache.num_layers):
        n = 9
        slots = rng.permutation(NB * BS)[:n].astype(np.int64) if slots_per_layer is None else slots_per_layer
        # magnitudes across the fp8 normal range relative to the scales
        k = (rng.standard_normal((n, H, D)) * 4.0).astype(dtype)
        v = (rng.standard_normal((n, H, D)) * 4.0).astype(dtype)
        cache.store(layer, k, v, slots)
        out.append((k, v, slots))
    return out


def view_nhd(cache: vt.PagedKVCache, layer: int, which: int) -> np.ndarray:
    a = cache.key_cache(layer) if which == 0 else cache.value_cache(layer)
    return a.transpose(0, 2, 1, 3) if cache.layout == "HND" else a


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", ["tensor", "layer", "head"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_bytes_equal_quantize_every_layer(layout, mode, dtype):
    fmt, _, mld = FMT[dtype]
    ks, vs = scales_for(mode, seed=11)
    cache = vt.PagedKVCache(L, NB, BS, H, D, dtype, layout=layout, k_scale=ks, v_scale=vs)
    data = fill(cache, seed=12)
    kf, vf = expand(ks), expand(vs)
    for layer, (k, v, slots) in enumerate(data):
        for which, (x, sc) in enumerate(((k, kf), (v, vf))):
            page = view_nhd(cache, layer, which)
            stored = page[slots // BS, slots % BS]  # [n, H, D]
            for h in range(H):
                want = vt.fp8_quantize(np.ascontiguousarray(x[:, h]), float(sc[layer, h]), fmt)
                np.testing.assert_array_equal(stored[:, h], want, err_msg=f"layer {layer} head {h} which {which}")
                # independent: ml_dtypes' round-to-nearest-even cast of the clipped quotient
                q = np.clip(x[:, h] / sc[layer, h], -FMT[dtype][1], FMT[dtype][1]).astype(np.float32)
                np.testing.assert_array_equal(stored[:, h], q.astype(mld).view(np.uint8))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_envelope_every_element_every_layer(layout, dtype):
    fmt, fmax, _ = FMT[dtype]
    ks, vs = scales_for("head", seed=21)
    cache = vt.PagedKVCache(L, NB, BS, H, D, dtype, layout=layout, k_scale=ks, v_scale=vs)
    # every slot of every layer, so the population is every stored element
    slots = np.arange(NB * BS, dtype=np.int64)
    rng = np.random.default_rng(22)
    rel, absf = (2.0**-4, 2.0**-10) if dtype == "fp8_e4m3" else (2.0**-3, 2.0**-17)
    total = 0
    for layer in range(L):
        k = (rng.standard_normal((NB * BS, H, D)) * 3.0).astype(np.float32)
        v = (rng.standard_normal((NB * BS, H, D)) * 3.0).astype(np.float32)
        cache.store(layer, k, v, slots)
        gk, gv = cache.gather(layer, slots)
        for x, g, sc in ((k, gk, expand(ks)[layer]), (v, gv, expand(vs)[layer])):
            s = sc[None, :, None].astype(np.float64)
            err = np.abs(g.astype(np.float64) - x.astype(np.float64))
            bound = rel * np.abs(x.astype(np.float64)) + absf * s
            assert (err <= bound).all(), f"layer {layer}: worst excess {(err - bound).max()}"
            q = np.abs(x / s)
            # anti-vacuity: mostly normal values, none saturated, some error present
            assert (q >= (2.0**-6 if dtype == "fp8_e4m3" else 2.0**-14)).mean() > 0.9
            assert (q < fmax).all()
            assert (err > 0).mean() > 0.5
            total += x.size
    assert total == 2 * L * NB * BS * H * D


@pytest.mark.parametrize("dtype,mld", [("float32", np.float32), ("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("src", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_plain_dtypes_are_rounded_casts(dtype, mld, src):
    cache = vt.PagedKVCache(L, NB, BS, H, D, dtype, k_scale=3.0, v_scale=5.0)  # scales ignored
    data = fill(cache, seed=31, dtype=src)
    for layer, (k, v, slots) in enumerate(data):
        for which, x in enumerate((k, v)):
            stored = view_nhd(cache, layer, which)[slots // BS, slots % BS]
            want = x.astype(np.float32).astype(mld)
            np.testing.assert_array_equal(stored.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "bfloat16"])
def test_negative_slots_skip_and_unmapped_bytes_stay_zero(dtype):
    cache = vt.PagedKVCache(2, NB, BS, H, D, dtype, k_scale=0.5, v_scale=2.0)
    rng = np.random.default_rng(41)
    k = rng.standard_normal((6, H, D)).astype(np.float32) + 3.0  # no zero codes
    v = rng.standard_normal((6, H, D)).astype(np.float32) + 3.0
    slots = np.array([3, -1, 9, -5, 17, -1], np.int64)
    cache.store(1, k, v, slots)
    for which in (0, 1):
        page = cache.key_cache(1) if which == 0 else cache.value_cache(1)
        b = page.view(np.uint8).reshape(NB * BS, -1)
        written = np.zeros(NB * BS, bool)
        written[[3, 9, 17]] = True
        assert (b[~written] == 0).all()
        assert (b[written] != 0).any(axis=1).all()
        assert (cache.key_cache(0).view(np.uint8) == 0).all()  # other layer untouched
        assert (cache.value_cache(0).view(np.uint8) == 0).all()
    gk, gv = cache.gather(1, [3, 9, 17])
    np.testing.assert_allclose(gk, k[[0, 2, 4]], rtol=0.07, atol=1e-3)
    np.testing.assert_allclose(gv, v[[0, 2, 4]], rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("num_threads", [1, 2, 4])
def test_duplicate_slots_last_token_wins(num_threads):
    """Documented: when tokens share a slot, the later token's values are kept."""
    cache = vt.PagedKVCache(1, 64, 16, 8, 128, "fp8_e4m3", k_scale=0.25, v_scale=0.5)
    rng = np.random.default_rng(51)
    n = 4096
    slots = rng.integers(0, 64 * 16, size=n).astype(np.int64)  # many duplicates
    k = rng.standard_normal((n, 8, 128)).astype(np.float32)
    v = rng.standard_normal((n, 8, 128)).astype(np.float32)
    cache.store(0, k, v, slots, num_threads=num_threads)
    last = {}
    for t, s in enumerate(slots):
        last[int(s)] = t
    ss = np.array(sorted(last), np.int64)
    ts = np.array([last[int(s)] for s in ss])
    stored = cache.key_cache(0)[ss // 16, ss % 16]
    np.testing.assert_array_equal(stored, vt.fp8_quantize(k[ts], 0.25))
    stored = cache.value_cache(0)[ss // 16, ss % 16]
    np.testing.assert_array_equal(stored, vt.fp8_quantize(v[ts], 0.5))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "float16"])
def test_nhd_and_hnd_hold_the_same_values(dtype):
    ks, vs = scales_for("head", seed=61)
    a = vt.PagedKVCache(L, NB, BS, H, D, dtype, layout="NHD", k_scale=ks, v_scale=vs)
    b = vt.PagedKVCache(L, NB, BS, H, D, dtype, layout="HND", k_scale=ks, v_scale=vs)
    fill(a, seed=62)
    fill(b, seed=62)
    for layer in range(L):
        np.testing.assert_array_equal(a.key_cache(layer), b.key_cache(layer).transpose(0, 2, 1, 3))
        np.testing.assert_array_equal(a.value_cache(layer), b.value_cache(layer).transpose(0, 2, 1, 3))
        assert a.key_cache(layer).view(np.uint8).any()


@pytest.mark.parametrize("hnd_strides", [False, True])
@pytest.mark.parametrize("per_head", [False, True])
def test_flash_on_caller_arrays_matches_cache_store(hnd_strides, per_head):
    """reshape_and_cache_flash on caller arrays (NHD, or vLLM's HND strides)
    writes the same bytes as PagedKVCache.store: one mechanism."""
    rng = np.random.default_rng(71)
    ks = rng.uniform(0.2, 2.0, H).astype(np.float32) if per_head else np.float32(0.7)
    vs = rng.uniform(0.2, 2.0, H).astype(np.float32) if per_head else np.float32(1.9)
    cache = vt.PagedKVCache(1, NB, BS, H, D, "fp8_e4m3", k_scale=np.broadcast_to(ks, (1, H)) if per_head else ks,
                            v_scale=np.broadcast_to(vs, (1, H)) if per_head else vs)
    n = 11
    k = rng.standard_normal((n + 3, H, D)).astype(np.float32)[::1]
    v = rng.standard_normal((n + 3, H, D)).astype(np.float32)
    slots = rng.permutation(NB * BS)[:n].astype(np.int64)
    slots[4] = -1
    cache.store(0, k[:n], v[:n], slots)
    if hnd_strides:
        kc = np.zeros((NB, H, BS, D), np.uint8).transpose(0, 2, 1, 3)  # shape NHD, HND strides
        vc = np.zeros((NB, H, BS, D), np.uint8).transpose(0, 2, 1, 3)
    else:
        kc = np.zeros((NB, BS, H, D), np.uint8)
        vc = np.zeros((NB, BS, H, D), np.uint8)
    vt.reshape_and_cache_flash(k, v, kc, vc, slots, "fp8", np.atleast_1d(ks), np.atleast_1d(vs))
    np.testing.assert_array_equal(kc, cache.key_cache(0))
    np.testing.assert_array_equal(vc, cache.value_cache(0))


def test_flash_layout_hnd_keyword_and_bf16_auto():
    rng = np.random.default_rng(81)
    k = rng.standard_normal((5, H, D)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((5, H, D)).astype(ml_dtypes.bfloat16)
    slots = np.array([0, 7, 8, 23, 1], np.int64)
    kc = np.zeros((NB, H, BS, D), ml_dtypes.bfloat16)
    vc = np.zeros((NB, H, BS, D), ml_dtypes.bfloat16)
    vt.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", 1.0, 1.0, layout="HND")
    np.testing.assert_array_equal(kc[slots // BS, :, slots % BS], k)
    np.testing.assert_array_equal(vc[slots // BS, :, slots % BS], v)


def test_key_stride0_honoured():
    """A key that is a slice of a wider [T, 2*H, D] buffer (vLLM's qkv split)."""
    rng = np.random.default_rng(91)
    kv = rng.standard_normal((7, 2 * H, D)).astype(np.float32)
    k, v = kv[:, :H], kv[:, H:]
    assert not k.flags.c_contiguous
    kc = np.zeros((NB, BS, H, D), np.float32)
    vc = np.zeros((NB, BS, H, D), np.float32)
    slots = np.arange(7, dtype=np.int64) * 3
    vt.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", 1.0, 1.0)
    np.testing.assert_array_equal(kc[slots // BS, slots % BS], k)
    np.testing.assert_array_equal(vc[slots // BS, slots % BS], v)
