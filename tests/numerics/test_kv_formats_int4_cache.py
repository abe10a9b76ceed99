"""int4_per_token_head in vt.PagedKVCache: page bytes and the plan against
vLLM's rule, the uint8 views of D / 2 bytes (NumPy, torch DLPack), the
store byte for byte against the independent NumPy twin
(tests/numerics/int4_twin.py) and against the functional store on vLLM's
padded page, gather against a float64 inverse rotation written from the
twin, and cache.attention against the float64 oracle of vLLM's int4 read
and the functional flash_attn_varlen_func on the same tokens; every ISA.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import int4_twin
from tests.numerics.test_kv_formats_int4 import _hadamard64, caches, reference, rows, store
from tests.numerics.test_attention_oracle import shuffled_block_table

FMT = "int4_per_token_head"
SRC = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def nhd(a, layout):
    return a.transpose(0, 2, 1, 3) if layout == "HND" else a


@pytest.mark.parametrize("geom", [(1, 16, 8, 64), (30, 16, 3, 128), (2, 32, 1, 80), (4, 1, 5, 256), (1, 16, 1, 6)])
def test_page_bytes_equal_vllm(geom):
    """vLLM's page per layer: block_size * H_kv * 2 * (D / 2 + 4) (codes of D / 2 bytes plus a float32 scale, K and
    V); nbytes holds the code and scale planes of every block."""
    layers, bs, heads, d = geom
    nb = 3
    cache = vt.PagedKVCache(layers, nb, bs, heads, d, FMT)
    assert cache.page_bytes == int4_twin.page_bytes(layers, bs, heads, d) == layers * bs * heads * 2 * (d // 2 + 4)
    assert cache.nbytes >= nb * cache.page_bytes
    assert cache.element_size == 1


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_views_are_uint8_of_half_the_head_size(layout):
    L, nb, bs, hkv, d = 2, 3, 16, 2, 80
    c = vt.PagedKVCache(L, nb, bs, hkv, d, FMT, layout=layout)
    want = (nb, hkv, bs, d // 2) if layout == "HND" else (nb, bs, hkv, d // 2)
    for view in (c.key_cache(1), c.value_cache(0), c.layer(1).key):
        assert view.dtype == np.uint8 and view.shape == want
    assert c.k_scale_cache(1).shape == (nb, bs, hkv) and c.k_scale_cache(1).dtype == np.float32
    # zero copy: the NumPy views are the memory the store writes
    before = c.value_cache(1)
    k = np.ones((1, hkv, d), np.float32)
    c.store(1, k, k * 3, np.array([bs + 2], np.int64))
    assert nhd(before, layout)[1, 2].any() and np.shares_memory(before, c.value_cache(1))
    r = repr(c)
    assert f"dtype='{FMT}'" in r and f"page_bytes={c.page_bytes}" in r and "per-token-head" in r
    assert "codes=2 per byte (rotated)" in r  # the row's packing and rotated read, said by the repr
    for h in (c._repr_html_(), c.layer(0)._repr_html_()):
        assert "per (token, KV head)" in h and "Hadamard-rotated" in h and "k_scale<" not in h


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_dlpack_views_are_uint8_of_half_the_head_size(layout):
    torch = pytest.importorskip("torch")
    L, nb, bs, hkv, d = 2, 3, 16, 2, 80
    c = vt.PagedKVCache(L, nb, bs, hkv, d, FMT, layout=layout)
    want = (nb, hkv, bs, d // 2) if layout == "HND" else (nb, bs, hkv, d // 2)
    t = torch.from_dlpack(c.layer(1))
    assert t.dtype == torch.uint8 and tuple(t.shape) == (2, *want)
    whole = torch.from_dlpack(c)
    assert whole.dtype == torch.uint8 and tuple(whole.shape) == (L, 2, *want)
    # zero copy: the views are the memory the store writes (layer 1's V through DLPack, and the NumPy view)
    k = np.ones((1, hkv, d), np.float32)
    c.store(1, k, k * 3, np.array([bs + 2], np.int64))
    np.testing.assert_array_equal(t[1].numpy(), c.value_cache(1))
    np.testing.assert_array_equal(whole[1, 0].numpy(), c.key_cache(1))
    assert nhd(c.value_cache(1), layout)[1, 2].any()


def twin_store(k, v, slots, bs, src):
    """(K codes, V codes, K scales, V scales) the twin writes for each token."""
    qk, sk = int4_twin.quantize(k, src)
    qv, sv = int4_twin.quantize(v, src)
    return qk, qv, sk, sv


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("src", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", [64, 80])
def test_cache_store_equals_twin_and_the_functional_store(isa, d, src, layout):
    rng = np.random.default_rng(d + len(src) + len(layout))
    L, nb, bs, hkv, n = 2, 3, 16, 2, 30
    cache = vt.PagedKVCache(L, nb, bs, hkv, d, FMT, layout=layout)
    page, kc, vc, ks, vs = caches(nb, bs, hkv, d, layout=layout)
    for layer in range(L):
        k, v = rows(rng, n, hkv, d, src), rows(rng, n, hkv, d, src)
        slots = rng.permutation(nb * bs)[:n].astype(np.int64)
        slots[3] = -1
        cache.store(layer, k, v, slots, num_threads=2)
        if layer == 1:
            store(k, v, kc, vc, ks, vs, slots, layout=layout)
        qk, qv, sk, sv = twin_store(k, v, slots, bs, src)
        keep = slots >= 0
        b, o = slots[keep] // bs, slots[keep] % bs
        got_k, got_v = nhd(cache.key_cache(layer), layout)[b, o], nhd(cache.value_cache(layer), layout)[b, o]
        np.testing.assert_array_equal(got_k, qk[keep])
        np.testing.assert_array_equal(got_v, qv[keep])
        np.testing.assert_array_equal(cache.k_scale_cache(layer)[b, o].view(np.uint32), sk[keep].view(np.uint32))
        np.testing.assert_array_equal(cache.v_scale_cache(layer)[b, o].view(np.uint32), sv[keep].view(np.uint32))
        # slots never stored keep zero codes and scale 1.0, as vLLM fills its scale caches
        unused = np.setdiff1d(np.arange(nb * bs), slots[keep])
        ub, uo = unused // bs, unused % bs
        assert not nhd(cache.key_cache(layer), layout)[ub, uo].any()
        assert (cache.v_scale_cache(layer)[ub, uo] == 1.0).all()
    # the functional store on vLLM's padded page wrote the same bytes as the cache's layer 1
    np.testing.assert_array_equal(nhd(kc[..., : d // 2], layout)[b, o], nhd(cache.key_cache(1), layout)[b, o])
    np.testing.assert_array_equal(nhd(vc[..., : d // 2], layout)[b, o], nhd(cache.value_cache(1), layout)[b, o])
    np.testing.assert_array_equal(ks[b, o].view(np.uint32), cache.k_scale_cache(1)[b, o].view(np.uint32))


def inverse_rotation_f64(y: np.ndarray) -> np.ndarray:
    """x with single_rht(x) = y, in float64: s * (H_b y) / b per block (explicit Sylvester matrix)."""
    d = y.shape[-1]
    b = int4_twin.block(d)
    s = int4_twin.signs(b).astype(np.float64)
    yb = np.asarray(y, np.float64).reshape(*y.shape[:-1], d // b, b)
    return ((yb @ _hadamard64(b)) * s / b).reshape(y.shape)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("d", [64, 80, 96])
def test_gather_rotates_back_to_the_stored_basis(isa, d, layout):
    """gather = s * (H y) / b of the twin-dequantized rotated rows y, within the float32 butterfly's rounding
    (log2 b additions: |error| <= log2(b) * 2^-24 * sum |y| / b per element); rotated=True returns y exactly."""
    rng = np.random.default_rng(d)
    nb, bs, hkv, n = 3, 16, 2, 25
    cache = vt.PagedKVCache(2, nb, bs, hkv, d, FMT, layout=layout)
    k, v = rows(rng, n, hkv, d), rows(rng, n, hkv, d)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    cache.store(1, k, v, slots)
    b = int4_twin.block(d)
    gk, gv = cache.gather(1, slots)
    rk, rv = cache.gather(1, slots, rotated=True)
    assert gk.dtype == np.float32 and gk.shape == (n, hkv, d)
    for got, got_rot, x in ((gk, rk, k), (gv, rv, v)):
        y = int4_twin.dequantize(*int4_twin.quantize(x))
        np.testing.assert_array_equal(got_rot, y)
        want = inverse_rotation_f64(y)
        yb = np.abs(y.astype(np.float64)).reshape(*y.shape[:-1], d // b, b).sum(-1, keepdims=True)
        bound = np.repeat(max(1, np.log2(b)) * 2.0**-24 * yb / b, b, axis=-1).reshape(y.shape) + 1e-45
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= bound).all(), f"worst {err.max():.3g} vs bound {bound[err > bound].min():.3g}"
        # and gather approximates what was stored: each rotated element is within half a code step (scale / 2)
        # and H_b / sqrt(b) is orthogonal, so per block the L2 error is at most sqrt(b) * scale / 2 / sqrt(b)
        scale = (int4_twin.quantize(x)[1].view(np.uint32) & 0xFFFFFFF0).view(np.float32).astype(np.float64)
        l2 = np.sqrt(((got.astype(np.float64) - x) ** 2).reshape(*x.shape[:-1], d // b, b).sum(-1))
        slack = 1e-5 * np.abs(x).max(-1, keepdims=True)
        assert (l2 <= 0.5 * scale[..., None] * (1 + 1e-3) + slack).all()

def cache_case(rng, d, H, hkv, q_lens, k_lens, layout, q_dtype="float32", bs=16):
    """A cache and vLLM's padded page holding the same tokens; unused scales NaN in both (a wrong read turns NaN)."""
    nb = sum(max(1, -(-k // bs)) for k in k_lens) + 2
    cache = vt.PagedKVCache(1, nb, bs, hkv, d, FMT, layout=layout)
    cache.k_scale_cache(0)[:] = np.nan
    cache.v_scale_cache(0)[:] = np.nan
    page, kc, vc, ks, vs = caches(nb, bs, hkv, d)
    nb, bt = shuffled_block_table(rng, k_lens, bs, extra_blocks=2, spare_column=False)
    for i, kl in enumerate(k_lens):
        j = np.arange(kl)
        slots = bt[i, j // bs].astype(np.int64) * bs + j % bs
        k, v = rows(rng, kl, hkv, d), rows(rng, kl, hkv, d)
        cache.store(0, k, v, slots)
        store(k, v, kc, vc, ks, vs, slots)
    q = rng.standard_normal((sum(q_lens), H, d)).astype(SRC[q_dtype])
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return cache, q, (kc, vc, ks, vs), cu, np.asarray(k_lens, np.int32), bt


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_cache_attention_matches_the_oracle_and_the_functional_read(isa, heads, layout, q_dtype):
    """bfloat16 q with >= 4 rows per KV head (the 5-query prefill; every row at GQA 4) runs the pair-dot
    tile on an AVX512-BF16 CPU's avx512."""
    H, hkv = heads
    d = 64
    rng = np.random.default_rng(H + hkv + len(layout))
    cache, q, (kc, vc, ks, vs), cu, sk, bt = cache_case(rng, d, H, hkv, [1, 5, 1], [30, 45, 20], layout,
                                                        q_dtype=q_dtype)
    kw = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt)
    out = np.asarray(cache.attention(0, q, num_threads=2, **kw))
    assert np.isfinite(out).all(), "NaN: an unused slot was read"
    # the oracle over the cache dequantized by the twin (rotated basis), from the cache's own bytes
    kdq = int4_twin.dequantize(nhd(cache.key_cache(0), layout), cache.k_scale_cache(0))
    vdq = int4_twin.dequantize(nhd(cache.value_cache(0), layout), cache.v_scale_cache(0))
    out = out.astype(np.float64)
    ref = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float64)
    naive = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float32)
    floor = 16 * 2.0**-24 * np.abs(ref).max()
    if q_dtype == "bfloat16":  # ours rounds the output to bf16 once, vLLM twice: the bf16 output ulp
        floor += 2.0**-8 * np.abs(ref).max()
    err, err_naive = np.abs(out - ref).max(), np.abs(naive.astype(np.float64) - ref).max()
    assert err <= 2 * err_naive + floor, f"{err:.3g} vs naive {err_naive:.3g} + {floor:.3g}"
    # the functional read over vLLM's padded page holding the same tokens: the same kernel, the same result
    fn = vt.flash_attn_varlen_func(q, kc, vc, kv_cache_dtype=FMT, k_scale_cache=ks, v_scale_cache=vs,
                                   num_threads=2, **kw)
    np.testing.assert_array_equal(out, np.asarray(fn).astype(np.float64))
