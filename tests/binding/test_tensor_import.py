"""The shared tensor importer (DLPack and NumPy front doors, hostile arrays)
and overlap as shared elements.

DLPack: every field of a capsule is validated before any pointer
arithmetic (a hostile producer written with ctypes, tests/binding/
dlpack_fake.py); torch's requires_grad / negative views / storage offsets.
NumPy: non-native byte order converted for inputs, refused for
destinations; object dtype, masked arrays, 0-d where a vector is expected.
Overlap: K/V views of one allocation in both vLLM layouts store exactly
what separate buffers store; an input sharing elements with a destination
is refused by name and nothing is written.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.binding.dlpack_fake import FakeTensor

torch = pytest.importorskip("torch")


def _codes(r):
    """fp8 codes as a NumPy uint8 array, whatever framework returned them."""
    if isinstance(r, torch.Tensor):
        return r.view(torch.uint8).numpy()
    return np.asarray(r)


# ------------------------------------------------------------------ DLPack
@pytest.mark.parametrize(
    "kw,fragment",
    [
        (dict(shape=[4], byte_offset=2**63), "byte_offset below 2^63"),
        (dict(shape=[4], byte_offset=2**64 - 8), "byte_offset below 2^63"),
        (dict(shape=[4], byte_offset=2**58), "inside the address space"),
        (dict(shape=[4], byte_offset=2**62), "inside the address space"),
        (dict(shape=[4], null_data=True), "data pointer; got NULL"),
        (dict(shape=[4, -2]), "sizes >= 0; got shape[1] = -2"),
        (dict(shape=[4], ndim=-1), "at most 8 dimensions; got -1"),
        (dict(shape=[1] * 9), "at most 8 dimensions; got 9"),
        (dict(shape=[4], null_shape=True), "NULL shape pointer"),
        (dict(shape=[4], lanes=2), "one lane per element; got lanes = 2"),
        (dict(shape=[4], lanes=0), "one lane per element; got lanes = 0"),
        (dict(shape=[4], bits=12), "whole bytes per element; got 12 bits"),
        (dict(shape=[4], bits=0), "whole bytes per element; got 0 bits"),
        (dict(shape=[3], strides=[-(2**62)]), "fit in 64 bits"),
        (dict(shape=[2**62, 4]), "fit in 64 bits"),
    ],
)
@pytest.mark.parametrize("versioned", [False, True])
def test_hostile_dlpack_fields_are_refused_by_name(kw, fragment, versioned):
    fake = FakeTensor(versioned=versioned, **kw)
    with pytest.raises(ValueError, match=r"fp8_quantize: x must") as e:
        vt.fp8_quantize(fake)
    assert fragment in str(e.value)
    assert fake.deleted == 1, "the producer's deleter ran exactly once"


def test_null_data_without_elements_is_fine():
    fake = FakeTensor([0, 3], null_data=True)
    assert vt.fp8_quantize(fake).shape == (0, 3)


def test_device_other_than_cpu_is_refused_on_the_cpu_path():
    for dev in (2, 4, 13):
        with pytest.raises(ValueError, match=f"x must be in CPU memory; got DLPack device type {dev}"):
            vt.fp8_quantize(FakeTensor([2], device_type=dev))


def test_versioned_capsule_read_only_flag_and_version():
    out = FakeTensor([4], code=1, bits=8, versioned=True, read_only=True)
    with pytest.raises(ValueError, match="out must be writable"):
        vt.fp8_quantize(np.ones(4, np.float32), out=out)
    assert out.deleted == 1
    with pytest.raises(TypeError, match="x must export DLPack 1.x; got version 2"):
        vt.fp8_quantize(FakeTensor([4], versioned=True, major=2))
    ok = FakeTensor([4], versioned=True)
    assert vt.fp8_quantize(ok).shape == (4,) and ok.deleted == 1


def test_torch_requires_grad_input_is_read_output_refused():
    x = torch.linspace(-3, 3, 8, requires_grad=True)
    assert np.array_equal(_codes(vt.fp8_quantize(x)), vt.fp8_quantize(x.detach().numpy()))
    out = torch.zeros(8, dtype=torch.float32, requires_grad=True)
    with pytest.raises(ValueError, match="fp8_dequantize: out must not require grad"):
        vt.fp8_dequantize(np.zeros(8, np.uint8), out=out)


def test_torch_negative_view_is_refused_by_name():
    x = torch._neg_view(torch.linspace(1, 2, 8))
    with pytest.raises(ValueError, match="fp8_quantize: x must hold its own values.*negative"):
        vt.fp8_quantize(x)


def test_torch_storage_offset_is_read_at_the_offset():
    base = torch.arange(64, dtype=torch.float32)
    x = base[5:13]
    assert x.storage_offset() == 5
    assert np.array_equal(_codes(vt.fp8_quantize(x)), vt.fp8_quantize(np.arange(5, 13, dtype=np.float32)))


def test_exporter_that_raises_is_named():
    class Bad:
        def __dlpack__(self, **kw):
            raise RuntimeError("nope")

    with pytest.raises(ValueError, match="fp8_quantize: x must be exportable through DLPack; got RuntimeError: nope"):
        vt.fp8_quantize(Bad())


# ------------------------------------------------------------------ NumPy
def test_non_native_inputs_are_converted():
    x = np.linspace(-300, 300, 37).astype(">f4")
    assert np.array_equal(vt.fp8_quantize(x), vt.fp8_quantize(x.astype("<f4")))
    assert np.array_equal(vt.convert(x.astype(">f2"), np.float32), x.astype(np.float16).astype(np.float32))
    rng = np.random.default_rng(3)
    k = rng.standard_normal((5, 2, 8)).astype(np.float32)
    want, got = np.zeros((4, 4, 2, 8), np.float32), np.zeros((4, 4, 2, 8), np.float32)
    wv, gv = want.copy(), got.copy()
    vt.reshape_and_cache_flash(k, k + 1, want, wv, np.arange(5), "auto", 1.0, 1.0)
    vt.reshape_and_cache_flash(k.astype(">f4"), (k + 1).astype(">f4"), got, gv, np.arange(5).astype(">i8"), "auto",
                               np.array(1.0, ">f4"), 1.0)
    assert np.array_equal(want, got) and np.array_equal(wv, gv)


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
def test_non_native_cache_is_refused_and_untouched(which):
    k = np.ones((2, 2, 8), np.float32)
    caches = {"key_cache": np.zeros((4, 4, 2, 8), np.float32), "value_cache": np.zeros((4, 4, 2, 8), np.float32)}
    caches[which] = caches[which].astype(">f4")
    with pytest.raises(TypeError, match=f"reshape_and_cache_flash: {which} must be in native byte order"):
        vt.reshape_and_cache_flash(k, k, caches["key_cache"], caches["value_cache"], np.arange(2), "auto", 1.0, 1.0)
    assert not caches[which].any()


def test_non_native_out_is_refused():
    with pytest.raises(TypeError, match="fp8_dequantize: out must be in native byte order"):
        vt.fp8_dequantize(np.zeros(4, np.uint8), out=np.zeros(4, ">f4"))


def test_object_dtype_masked_and_0d_are_refused():
    with pytest.raises(TypeError, match="fp8_quantize: x must have dtype .*; got object"):
        vt.fp8_quantize(np.array([1.0, "a"], dtype=object))
    with pytest.raises(TypeError, match="fp8_quantize: x must be a plain ndarray"):
        vt.fp8_quantize(np.ma.masked_array(np.ones(4, np.float32), mask=[0, 1, 0, 0]))
    c = vt.PagedKVCache(1, 2, 4, 2, 8, "float32")
    with pytest.raises(ValueError, match="PagedKVCache.gather: slots must have 1 dimensions; got 0"):
        c.gather(0, np.int64(3))
    with pytest.raises(ValueError, match="slot_mapping must have 1 dimensions; got 0"):
        c.store(0, np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32), np.int64(0))


# ------------------------------------------------- overlap = shared elements
KV_DTYPES = ["auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


def _cache_dtype(kv):
    import ml_dtypes

    return {"auto": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}.get(kv, np.uint8)


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("outer", ["blocks_first", "kv_first"])
def test_kv_views_of_one_allocation_store_like_separate_buffers(kv, layout, outer):
    nb, bs, H, D = 5, 4, 2, 16
    inner = (bs, H, D) if layout == "NHD" else (H, bs, D)
    dt = _cache_dtype(kv)
    rng = np.random.default_rng(7)
    key = rng.standard_normal((9, H, D)).astype(np.float32)
    value = rng.standard_normal((9, H, D)).astype(np.float32)
    slots = rng.permutation(nb * bs)[:9].astype(np.int64)
    ks, vs = np.float32(0.05), np.array([0.1, 0.2], np.float32)
    if outer == "blocks_first":  # vLLM's test factory: (num_blocks, 2, ...), kv[:, 0] / kv[:, 1]
        kvbuf = np.zeros((nb, 2, *inner), dt)
        kc, vc = kvbuf[:, 0], kvbuf[:, 1]
    else:  # engines' per-layer (2, num_blocks, ...)
        kvbuf = np.zeros((2, nb, *inner), dt)
        kc, vc = kvbuf[0], kvbuf[1]
    sk, sv = np.zeros((nb, *inner), dt), np.zeros((nb, *inner), dt)
    lay = None if layout == "NHD" else "HND"
    vt.reshape_and_cache_flash(key, value, kc, vc, slots, kv, ks, vs, layout=lay)
    vt.reshape_and_cache_flash(key, value, sk, sv, slots, kv, ks, vs, layout=lay)
    assert kc.tobytes() == sk.tobytes() and vc.tobytes() == sv.tobytes()
    assert sk.view(np.uint8).any()
    # and attention reads them exactly as it reads the separate buffers
    if layout == "HND":
        kc, vc, sk, sv = (a.transpose(0, 2, 1, 3) for a in (kc, vc, sk, sv))
    q = rng.standard_normal((3, 4, D)).astype(np.float32)
    kw = dict(cu_seqlens_q=np.array([0, 3], np.int32), seqused_k=np.array([12], np.int32),
              block_table=np.array([[4, 0, 2]], np.int32), kv_cache_dtype=kv)
    if kv.startswith("fp8"):
        kw.update(k_descale=np.float32(0.05), v_descale=np.float32(0.1))
    assert np.array_equal(vt.flash_attn_varlen_func(q, kc, vc, **kw), vt.flash_attn_varlen_func(q, sk, sv, **kw))


def test_element_interleaved_caches_are_disjoint():
    buf = np.zeros((4, 4, 2, 16), np.float32)
    kc, vc = buf[..., 0::2], buf[..., 1::2]  # last dim stride 8 bytes: refused for contiguity, not overlap
    k = np.ones((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        vt.reshape_and_cache_flash(k, k, kc, vc, np.array([0]), "auto", 1.0, 1.0)
    heads = np.zeros((4, 4, 2, 2, 8), np.float32)  # heads interleaved per slot
    vt.reshape_and_cache_flash(k, k + 1, heads[:, :, :, 0], heads[:, :, :, 1], np.array([5]), "auto", 1.0, 1.0)
    assert (heads[1, 1, :, 0] == 1).all() and (heads[1, 1, :, 1] == 2).all()


def test_caches_sharing_one_element_are_refused():
    buf = np.zeros(2 * 4 * 4 * 2 * 8 + 1, np.float32)
    n = 4 * 4 * 2 * 8
    kc = buf[:n].reshape(4, 4, 2, 8)
    vc = buf[n - 1:2 * n - 1].reshape(4, 4, 2, 8)  # shares exactly kc's last element
    k = np.ones((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="key_cache must not share memory with value_cache"):
        vt.reshape_and_cache_flash(k, k, kc, vc, np.array([0]), "auto", 1.0, 1.0)
    assert not buf.any()


@pytest.mark.parametrize("which", ["key", "value"])
def test_input_inside_a_destination_is_refused_and_nothing_written(which):
    rng = np.random.default_rng(5)
    kc = rng.standard_normal((4, 4, 2, 8)).astype(np.float32)
    vc = rng.standard_normal((4, 4, 2, 8)).astype(np.float32)
    before = kc.copy(), vc.copy()
    view = kc[1]  # (block_size, H, D): a view into key_cache used as the input
    other = np.ones((4, 2, 8), np.float32)
    args = (view, other) if which == "key" else (other, view)
    with pytest.raises(ValueError, match=f"reshape_and_cache_flash: {which} must not share memory with key_cache"):
        vt.reshape_and_cache_flash(*args, kc, vc, np.arange(4), "auto", 1.0, 1.0)
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])


def test_input_in_the_gaps_between_cache_rows_is_stored():
    # Rows of [K | spare]: key_cache is the K halves, the key input the spare halves (dims of other
    # sizes and strides, inside the cache's extent, no element shared). It is stored as a copy is.
    rng = np.random.default_rng(8)
    buf = rng.standard_normal((2, 4, 2, 16)).astype(np.float32)
    kc, key = buf[..., :8], buf[..., 8:].reshape(8, 2, 8)
    vc = np.zeros((2, 4, 2, 8), np.float32)
    want_k, want_v = kc.copy(), vc.copy()
    slots = np.array([6, 1, 3], np.int64)
    vt.reshape_and_cache_flash(key[:3].copy(), key[:3].copy(), want_k, want_v, slots, "auto", 1.0, 1.0)
    vt.reshape_and_cache_flash(key[:3], key[:3], kc, vc, slots, "auto", 1.0, 1.0)
    np.testing.assert_array_equal(kc, want_k)
    np.testing.assert_array_equal(vc, want_v)


def test_paged_cache_store_refuses_a_view_of_its_own_layer():
    c = vt.PagedKVCache(2, 4, 4, 2, 8, "float32")
    c.store(0, np.ones((16, 2, 8), np.float32), np.ones((16, 2, 8), np.float32) * 2, np.arange(16))
    kview = c.key_cache(0)[0]
    before = c.key_cache(0).copy(), c.value_cache(0).copy()
    with pytest.raises(ValueError, match="PagedKVCache.store: key must not share memory with the layer's key cache"):
        c.store(0, kview, np.ones((4, 2, 8), np.float32), np.arange(4, 8))
    assert np.array_equal(c.key_cache(0), before[0]) and np.array_equal(c.value_cache(0), before[1])
    c.store(1, kview.copy(), kview.copy(), np.arange(4))  # a view of another layer's copy is fine


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_attention_out_sharing_an_input_is_refused_by_name(which):
    rng = np.random.default_rng(9)
    kv = rng.standard_normal((2, 4, 4, 2, 8)).astype(np.float32)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    arrays = {"q": q, "k": kv[0], "v": kv[1]}
    out = arrays[which].reshape(-1)[: 2 * 4 * 8].reshape(2, 4, 8)
    before = out.copy()
    with pytest.raises(ValueError, match=f"flash_attn_varlen_func: {which} must not share memory with out"):
        vt.flash_attn_varlen_func(q, kv[0], kv[1], cu_seqlens_q=np.array([0, 2], np.int32),
                                  seqused_k=np.array([4], np.int32), block_table=np.array([[0]], np.int32), out=out)
    assert np.array_equal(out, before)
