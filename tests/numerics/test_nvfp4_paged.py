"""NVFP4 as a row of the format table: ``PagedKVCache(dtype="nvfp4" / "nvfp4_4over6")``, a slot format whose
slot ``[K codes D / 2 | K scales D / 16 | V codes D / 2 | V scales D / 16]`` is scaled by the layer's global
``k_scale`` / ``v_scale``. References: the NumPy twin of the codec (tests/numerics/nvfp4_twin.py), the float64
attention oracle, and the functional forms on vLLM's own NVFP4 pages (the swizzled page layout, its own store
and read)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import nvfp4_twin
from tests.numerics.test_attention_oracle import check_close, shuffled_block_table
from tests.numerics.test_nvfp4_pages import vllm_cache

L, H, D = 2, 2, 128
K_SCALES, V_SCALES = [0.5, 0.02], [1.5, 0.03]


def cache(fmt, nb, bs=16, **kw):
    return vt.PagedKVCache(num_layers=L, num_blocks=nb, block_size=bs, num_kv_heads=H, head_size=D, dtype=fmt,
                           k_scale=kw.pop("k_scale", K_SCALES), v_scale=kw.pop("v_scale", V_SCALES), **kw)


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("src", ["bfloat16", "float32"])
def test_slots_hold_the_twins_codes_and_scales_at_the_layers_global_scale(fmt, src):
    rng = np.random.default_rng(7)
    T, nb, bs = 40, 4, 16
    dt = ml_dtypes.bfloat16 if src == "bfloat16" else np.float32
    k = (rng.standard_normal((T, H, D)) * np.exp2(rng.integers(-5, 6, (T, H, 1)))).astype(dt)
    v = (rng.standard_normal((T, H, D)) * np.exp2(rng.integers(-5, 6, (T, H, 1)))).astype(dt)
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    c = cache(fmt, nb, bs)
    four = fmt.endswith("4over6")
    for layer in range(L):
        c.store(layer, k, v, slots)
        slot = c.key_cache(layer)
        assert slot.shape == (nb, bs, H, D + D // 8) and c.value_cache(layer).shape == slot.shape
        got = slot.reshape(nb * bs, H, -1)[slots]
        for x, off, sc in ((k, 0, K_SCALES[layer]), (v, D // 2 + D // 16, V_SCALES[layer])):
            codes, scales = nvfp4_twin.quantize(x.astype(np.float32), sc, four)
            assert np.array_equal(got[..., off:off + D // 2], codes), (layer, off)
            assert np.array_equal(got[..., off + D // 2:off + D // 2 + D // 16], scales), (layer, off)
        kg, vg = c.gather(layer, slots)
        for x, y, sc in ((k, kg, K_SCALES[layer]), (v, vg, V_SCALES[layer])):
            codes, scales = nvfp4_twin.quantize(x.astype(np.float32), sc, four)
            assert np.array_equal(y, nvfp4_twin.dequantize(codes, scales, sc))


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
def test_a_cache_reads_as_vllms_pages_read(fmt):
    """The same tokens through PagedKVCache (slots) and through the functional forms on vLLM's NVFP4 pages
    (another store and read: the page layout, V's swizzled scales): the same K and V, the same attention bits."""
    rng = np.random.default_rng(3)
    bs, k_lens, q_lens = 16, [70, 33], [1, 5]
    NB, bt = shuffled_block_table(rng, k_lens, bs)
    c = cache(fmt, NB, bs)
    _, kc, vc = vllm_cache(NB, bs, H, D, True)
    q = rng.standard_normal((sum(q_lens), H * 4, D)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    sk = np.asarray(k_lens, np.int32)
    layer = 1
    for b, kl in enumerate(k_lens):
        j = np.arange(kl)
        slots = bt[b, j // bs].astype(np.int64) * bs + j % bs
        k = rng.standard_normal((kl, H, D)).astype(ml_dtypes.bfloat16)
        v = rng.standard_normal((kl, H, D)).astype(ml_dtypes.bfloat16)
        c.store(layer, k, v, slots)
        vt.reshape_and_cache_flash(k, v, kc, vc, slots, fmt, K_SCALES[layer], V_SCALES[layer])
    used = np.unique(bt[bt >= 0]).astype(np.int64)
    kp, vp = vt._nvfp4.read_blocks(kc, vc, used, K_SCALES[layer], V_SCALES[layer])
    page_slots = (used[:, None] * bs + np.arange(bs)).reshape(-1)
    kg, vg = c.gather(layer, page_slots)
    assert np.array_equal(kg, kp.reshape(kg.shape)) and np.array_equal(vg, vp.reshape(vg.shape))
    ours = c.attention(layer, q, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True)
    pages = vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt,
                                      k_descale=K_SCALES[layer], v_descale=V_SCALES[layer], return_lse=True)
    assert np.array_equal(ours[0], pages[0]) and np.array_equal(ours[1], pages[1])


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("G", [1, 4])
def test_attention_matches_the_oracle_over_the_twins_values(fmt, G):
    rng = np.random.default_rng(11 + G)
    bs, k_lens, q_lens = 16, [45, 90], [3, 1]
    NB, bt = shuffled_block_table(rng, k_lens, bs)
    c = cache(fmt, NB, bs)
    K = np.zeros((NB, bs, H, D), np.float64)
    V = np.zeros_like(K)
    four = fmt.endswith("4over6")
    for b, kl in enumerate(k_lens):
        j = np.arange(kl)
        slots = bt[b, j // bs].astype(np.int64) * bs + j % bs
        k = rng.standard_normal((kl, H, D)).astype(np.float32)
        v = rng.standard_normal((kl, H, D)).astype(np.float32)
        c.store(0, k, v, slots)
        for x, dst, sc in ((k, K, K_SCALES[0]), (v, V, V_SCALES[0])):
            codes, scales = nvfp4_twin.quantize(x, sc, four)
            dst[bt[b, j // bs], j % bs] = nvfp4_twin.dequantize(codes, scales, sc)
    q = rng.standard_normal((sum(q_lens), H * G, D)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    sk = np.asarray(k_lens, np.int32)
    out, lse = c.attention(0, q, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True)
    check_close(out, lse, (q, K, V, cu, sk, bt), {}, what=f"{fmt} G{G}")


def test_the_global_scale_is_per_tensor_or_layer():
    with pytest.raises(ValueError, match=r"k_scale must be one number or one per layer for kv_cache_dtype 'nvfp4'"):
        cache("nvfp4", 2, k_scale=np.ones((L, H), np.float32))
    c = cache("nvfp4", 2)
    with pytest.raises(ValueError, match="v_scale must be one number or one per layer"):
        c.v_scale = np.ones((L, H), np.float32)
    assert "k_scale=[0.5, 0.02] (per-layer)" in repr(c) and "slot_bytes=144" in repr(c)
    q = np.ones((1, H, D), np.float32)
    args = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([1], np.int32),
                block_table=np.zeros((1, 1), np.int32))
    with pytest.raises(ValueError, match="k_descale and v_descale must be one number each"):
        c.attention(0, q, k_descale=np.ones((1, H), np.float32), **args)


def test_other_slot_formats_refuse_a_global_scale():
    c = vt.PagedKVCache(num_layers=1, num_blocks=2, block_size=16, num_kv_heads=H, head_size=D,
                        dtype="turboquant_k8v4")
    q = np.ones((1, H, D), np.float32)
    with pytest.raises(ValueError, match="k_scale must be None for kv_cache_dtype 'turboquant_k8v4'"):
        vt.turboquant_attention(q, c.key_cache(0), cu_seqlens_q=np.array([0, 1], np.int32),
                                seqused_k=np.array([1], np.int32), block_table=np.zeros((1, 1), np.int32),
                                kv_cache_dtype="turboquant_k8v4", k_scale=2.0)
    with pytest.raises(ValueError, match="k_descale must be None for kv_cache_dtype 'turboquant_k8v4'"):
        c.attention(0, q, cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([1], np.int32),
                    block_table=np.zeros((1, 1), np.int32), k_descale=2.0)


def test_head_size_follows_the_rows_one_rule():
    msg = "head_size must be a multiple of 64, at most 4096 for dtype 'nvfp4'; got 96"
    assert vt.dtype_info("nvfp4").head_size_error(96).endswith(msg)
    with pytest.raises(ValueError, match=msg):
        vt.PagedKVCache(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_size=96, dtype="nvfp4")
    _, kc, vc = vllm_cache(1, 16, 1, 96, True)  # the pages' store states the same rule
    with pytest.raises(ValueError, match="head_size must be a multiple of 64, at most 4096"):
        vt.reshape_and_cache_flash(np.ones((1, 1, 96), np.float32), np.ones((1, 1, 96), np.float32), kc, vc,
                                   np.zeros(1, np.int64), "nvfp4", 1.0, 1.0)


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_4over6"])
def test_the_functional_slot_forms_take_the_global_scales(fmt):
    """reshape_and_cache_flash on one slot cache (value_cache None) and turboquant_store / turboquant_gather with
    k_scale / v_scale write and read what PagedKVCache does at those layer scales."""
    rng = np.random.default_rng(5)
    nb, bs, T = 3, 16, 30
    k = rng.standard_normal((T, H, D)).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    slots = rng.permutation(nb * bs)[:T].astype(np.int64)
    c = cache(fmt, nb, bs)
    c.store(1, k, v, slots)
    want = c.key_cache(1)
    sc = np.zeros_like(want)
    vt.reshape_and_cache_flash(k, v, sc, None, slots, fmt, np.float32(K_SCALES[1]), V_SCALES[1])
    assert np.array_equal(sc, want)
    sc2 = np.zeros_like(want)
    vt.turboquant_store(k, v, sc2, slots, fmt, k_scale=K_SCALES[1], v_scale=V_SCALES[1])
    assert np.array_equal(sc2, want)
    kg, vg = vt.turboquant_gather(sc, slots, fmt, D, k_scale=K_SCALES[1], v_scale=V_SCALES[1])
    kw, vw = c.gather(1, slots)
    assert np.array_equal(kg, kw) and np.array_equal(vg, vw)
    sc3 = np.zeros_like(want)  # one-element arrays, as the checkpoint's scales arrive
    vt.turboquant_store(k, v, sc3, slots, fmt, k_scale=np.float32(K_SCALES[1]), v_scale=np.array([V_SCALES[1]]))
    assert np.array_equal(sc3, want)
    with pytest.raises(ValueError, match="k_scale must be finite and > 0"):
        vt.turboquant_store(k, v, sc2, slots, fmt, k_scale=0.0)
    q = np.ones((1, H, D), np.float32)
    read = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([1], np.int32),
                block_table=np.zeros((1, 1), np.int32), kv_cache_dtype=fmt)
    with pytest.raises(ValueError, match="turboquant_attention: k_scale and v_scale must be one number each"):
        vt.turboquant_attention(q, sc, k_scale=np.ones(H, np.float32), **read)
    with pytest.raises(ValueError, match="turboquant_attention: v_scale must be finite and > 0"):
        vt.turboquant_attention(q, sc, v_scale=0.0, **read)
    tq = np.zeros((nb, bs, H, vt.turboquant_slot_bytes("turboquant_k8v4", D)), np.uint8)
    with pytest.raises(ValueError, match="v_scale must be None for kv_cache_dtype 'turboquant_k8v4'"):
        vt.turboquant_store(k, v, tq, slots, "turboquant_k8v4", v_scale=2.0)
    assert not tq.any()
