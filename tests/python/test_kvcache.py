"""PagedKVCache surface: geometry and bytes, views, DLPack, scales, repr,
release under views; reshape_and_cache (x-split) against vLLM's torch
scatter reference; the block allocator."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_geometry_bytes_and_views(layout):
    c = vt.PagedKVCache(4, 10, 16, 8, 128, "bfloat16", layout=layout)
    f = vt.PagedKVCache(4, 10, 16, 8, 128, "fp8_e4m3", layout=layout)
    assert c.page_bytes == 2 * 4 * 16 * 8 * 128 * 2
    assert f.page_bytes * 2 == c.page_bytes  # an fp8 page is exactly half a bf16 page
    assert c.nbytes == 10 * c.page_bytes  # 10 blocks, regions already 64-byte multiples
    shape = (10, 16, 8, 128) if layout == "NHD" else (10, 8, 16, 128)
    k = c.key_cache(3)
    assert k.shape == shape and k.dtype == ml_dtypes.bfloat16 and k.flags.writeable
    assert f.key_cache(0).dtype == np.uint8
    assert f.key_cache(0).view(ml_dtypes.float8_e4m3fn).shape == shape
    for layer in range(4):
        for a in (c.key_cache(layer), c.value_cache(layer)):
            assert a.ctypes.data % 64 == 0
    # zero-copy: a write through the view is what the cache reads back
    v = c.value_cache(2)
    v[1, 0, 0, :] = ml_dtypes.bfloat16(1.5) if layout == "NHD" else v[1, 0, 0, :]
    if layout == "NHD":
        _, gv = c.gather(2, [16])
        assert (gv[0, 0] == 1.5).all()
    assert (c.key_cache(0) == 0).all()


def test_auto_needs_model_dtype():
    c = vt.PagedKVCache(1, 2, 4, 1, 8, "auto", model_dtype="float16")
    assert c.dtype == "float16"
    with pytest.raises(ValueError, match="model_dtype"):
        vt.PagedKVCache(1, 2, 4, 1, 8, "auto")


def test_dtype_aliases():
    assert vt.PagedKVCache(1, 2, 4, 1, 8, "fp8").dtype == "fp8_e4m3"
    assert vt.PagedKVCache(1, 2, 4, 1, 8, "fp8_e5m2").dtype == "fp8_e5m2"


def test_scales_readable_and_settable():
    c = vt.PagedKVCache(3, 2, 4, 2, 8, "fp8_e4m3", k_scale=0.5, v_scale=[1.0, 2.0, 3.0])
    assert c.k_scale.shape == () and float(c.k_scale) == 0.5
    np.testing.assert_array_equal(c.v_scale, [1.0, 2.0, 3.0])
    c.k_scale = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(c.k_scale, np.arange(1, 7).reshape(3, 2))
    np.testing.assert_array_equal(c.v_scale, [1.0, 2.0, 3.0])  # untouched
    with pytest.raises(ValueError, match="k_scale"):
        c.k_scale = [1.0, 0.0, 1.0]
    np.testing.assert_array_equal(c.k_scale, np.arange(1, 7).reshape(3, 2))  # unchanged after refusal
    # the store uses what was set: layer 2 head 1 has k scale 6
    x = np.full((1, 2, 8), 12.0, np.float32)
    c.store(2, x, x, np.array([0], np.int64))
    assert (c.key_cache(2)[0, 0, 1] == vt.fp8_quantize(np.float32([2.0]))[0]).all()


def test_repr_and_html():
    c = vt.PagedKVCache(2, 3, 4, 2, 8, "fp8_e4m3", k_scale=[1.0, 2.0])
    r = repr(c)
    for part in ("fp8_e4m3", "num_blocks=3", "page_bytes=", "per-layer"):
        assert part in r
    h = c._repr_html_()
    assert "<table>" in h and "fp8_e4m3" in h and "[1. 2.]" in h


def test_release_refused_while_views_live():
    c = vt.PagedKVCache(1, 2, 4, 1, 8, "float32")
    v = c.key_cache(0)
    w = v[1:]  # a view of the view keeps the pin
    del v
    with pytest.raises(BufferError):
        c.release()
    del w
    gc.collect()
    assert c.exports == 0
    c.release()
    assert c.released
    with pytest.raises(ValueError, match="released"):
        c.key_cache(0)


def test_views_keep_the_cache_alive():
    c = vt.PagedKVCache(1, 2, 4, 1, 8, "float32")
    v = c.key_cache(0)
    del c
    gc.collect()
    v[:] = 3.0  # memory still owned through the view's pin
    assert (v == 3.0).all()


def test_blocks_allocator_refcounts_tables_slots():
    a = vt.BlockAllocator(num_blocks=6, block_size=4)
    assert a.allocate("a", 6) == [0, 1]
    assert a.fork("a", "b") == [0, 1]
    assert a.refcount(0) == 2
    assert a.allocate("c", 1) == [2]
    with pytest.raises(ValueError, match="shared"):
        a.append("b", 1)  # would write into shared block 1
    a.free("a")
    assert a.refcount(0) == 1 and a.num_free == 3
    assert a.append("b", 3) == [6, 7, 12]  # block 1 no longer shared; then a new block 3
    np.testing.assert_array_equal(a.block_table(["b", "c"]), np.array([[0, 1, 3], [2, 0, 0]], np.int32))
    assert a.block_table(["b"]).dtype == np.int32
    sm = a.slot_mapping(["b", "c"], [[0, 5, 8], [0, -1]])
    assert sm.dtype == np.int64
    np.testing.assert_array_equal(sm, [0, 5, 12, 8, -1])
    with pytest.raises(MemoryError):
        a.allocate("d", 4 * 10)
    assert "d" not in a and a.num_free == 2
    with pytest.raises(IndexError):
        a.slot_mapping(["c"], [[1]])
    a.free("b")
    a.free("c")
    assert a.num_free == 6


def test_blocks_drive_a_store():
    a = vt.BlockAllocator(num_blocks=8, block_size=4)
    a.allocate("x", 5)
    a.allocate("y", 3)
    c = vt.PagedKVCache(1, 8, 4, 2, 8, "float32")
    rng = np.random.default_rng(5)
    k = rng.standard_normal((8, 2, 8)).astype(np.float32)
    sm = a.slot_mapping(["x", "y"], [range(5), range(3)])
    c.store(0, k, k, sm)
    bt = a.block_table(["x", "y"])
    got = c.key_cache(0)[bt[0, 1], 0]  # token 4 of x
    np.testing.assert_array_equal(got, k[4])


# ---- DLPack and the x-split layout: torch needed ----

def test_dlpack_torch_sees_the_same_memory():
    torch = pytest.importorskip("torch")
    c = vt.PagedKVCache(2, 3, 4, 2, 8, "bfloat16")
    t = torch.from_dlpack(c)
    assert tuple(t.shape) == (2, 2, 3, 4, 2, 8) and t.dtype == torch.bfloat16
    t[1, 1, 2, 3, 1, :] = 2.5  # layer 1, V, block 2, offset 3, head 1
    _, gv = c.gather(1, [2 * 4 + 3])
    assert (gv[0, 1] == 2.5).all()
    layer = torch.from_dlpack(c.layer(1))
    assert tuple(layer.shape) == (2, 3, 4, 2, 8)
    assert layer.data_ptr() == c.key_cache(1).ctypes.data
    assert c.exports >= 2
    with pytest.raises(BufferError):
        c.release()
    del t, layer
    gc.collect()
    assert c.exports == 0
    f = vt.PagedKVCache(1, 3, 4, 2, 8, "fp8_e4m3", layout="HND")
    tf = torch.from_dlpack(f.layer(0))
    assert tf.dtype == torch.uint8 and tuple(tf.shape) == (2, 3, 2, 4, 8)
    x = torch.randn(5, 2, 8)
    vt.reshape_and_cache_flash(x, x, tf[0].permute(0, 2, 1, 3), tf[1].permute(0, 2, 1, 3),
                               torch.tensor([0, 1, 2, 3, 11]), "fp8", 1.0, 1.0)
    np.testing.assert_array_equal(f.key_cache(0)[2, :, 3], vt.fp8_quantize(x[4].numpy()))


def _torch_x_split_reference(torch, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, fp8):
    """The scatter of vLLM's tests/kernels/attention/test_cache.py::test_reshape_and_cache,
    written here in torch: key_cache[b, :, :, off, :] = key.reshape(T, H, D/x, x)[i];
    value_cache[b, :, :, off] = value[i]; fp8 divides by the scale, clamps to +-448
    (torch's cast does not saturate) and casts to float8_e4m3fn."""
    T, H, D = key.shape
    x = key_cache.shape[-1]
    rk = key.reshape(T, H, D // x, x)
    for i in range(T):
        s = int(slot_mapping[i])
        if s < 0:
            continue
        b, off = s // key_cache.shape[3], s % key_cache.shape[3]
        kr, vr = rk[i], value[i]
        if fp8:
            kr = (kr.float() / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
            vr = (vr.float() / v_scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        key_cache[b, :, :, off, :] = kr
        value_cache[b, :, :, off] = vr


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_x_split_matches_vllm_torch_reference(kv_cache_dtype, seed):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    T, H, D, NB, BS = 13, 4, 64, 5, 8
    dt = torch.bfloat16
    fp8 = kv_cache_dtype == "fp8"
    cache_dt = torch.uint8 if fp8 else dt
    x = 16 // torch.tensor([], dtype=cache_dt).element_size()
    key = torch.randn(T, H, D, generator=g).to(dt) * 3
    value = torch.randn(T, H, D, generator=g).to(dt) * 3
    slots = torch.randperm(NB * BS, generator=g)[:T].to(torch.int64)
    slots[2] = -1
    kc = torch.zeros(NB, H, D // x, BS, x, dtype=cache_dt)
    vc = torch.zeros(NB, H, D, BS, dtype=cache_dt)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ks, vs = (0.37, 1.9) if fp8 else (1.0, 1.0)
    _torch_x_split_reference(torch, key, value, kc_ref, vc_ref, slots, ks, vs, fp8)
    vt.reshape_and_cache(key, value, kc, vc, slots, kv_cache_dtype, torch.tensor([ks]), torch.tensor([vs]))
    assert torch.equal(kc.view(torch.uint8) if not fp8 else kc, kc_ref.view(torch.uint8) if not fp8 else kc_ref)
    assert torch.equal(vc, vc_ref)
    assert kc.any()


def test_flash_matches_torch_scatter_reference():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    T, H, D, NB, BS = 9, 2, 32, 4, 4
    key = torch.randn(T, H, D, generator=g) * 5
    value = torch.randn(T, H, D, generator=g) * 5
    slots = torch.randperm(NB * BS, generator=g)[:T]
    kc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
    vc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
    ks = torch.tensor([0.5, 3.0])
    vs = torch.tensor([2.0, 0.125])
    vt.reshape_and_cache_flash(key, value, kc, vc, slots, "fp8_e4m3", ks, vs)
    ref_k = (key / ks[None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    ref_v = (value / vs[None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(kc[slots // BS, slots % BS], ref_k)
    assert torch.equal(vc[slots // BS, slots % BS], ref_v)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "bfloat16"])
def test_cache_attention_matches_float64_oracle_over_gathered_values(layout, dtype):
    """cache.attention hands the layer's views and scales to flash_attn_varlen_func;
    the oracle is float64 softmax attention over cache.gather (dequantized K/V)."""
    rng = np.random.default_rng(7)
    L, NB, BS, Hkv, H, D = 2, 8, 4, 2, 4, 16
    ks = rng.uniform(0.1, 1.0, (L, Hkv)).astype(np.float32)
    vs = rng.uniform(0.1, 1.0, (L, Hkv)).astype(np.float32)
    c = vt.PagedKVCache(L, NB, BS, Hkv, D, dtype, layout=layout, k_scale=ks, v_scale=vs)
    a = vt.BlockAllocator(NB, BS)
    n = 13
    a.allocate("s", n)
    slots = a.slot_mapping(["s"], [range(n)])
    for layer in range(L):
        c.store(layer, rng.standard_normal((n, Hkv, D)).astype(np.float32),
                rng.standard_normal((n, Hkv, D)).astype(np.float32), slots)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    out = c.attention(1, q, cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([n], np.int32),
                      block_table=a.block_table(["s"]))
    gk, gv = c.gather(1, slots)
    ref = np.zeros((H, D))
    for h in range(H):
        kh = gk[:, h // (H // Hkv)].astype(np.float64)
        s = kh @ q[0, h].astype(np.float64) / np.sqrt(D)
        p = np.exp(s - s.max())
        ref[h] = (p / p.sum()) @ gv[:, h // (H // Hkv)].astype(np.float64)
    np.testing.assert_allclose(np.asarray(out)[0], ref, rtol=1e-4, atol=1e-5)
