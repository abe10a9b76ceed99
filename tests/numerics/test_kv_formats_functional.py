"""The functional per-token-head store and read on caller-owned caches laid
out as vLLM 0.33's Triton backend lays them out (triton_attn.py
``_ensure_scale_caches`` / ``_pth_key_value_caches``): one raw page
``[num_blocks, H_kv, block_size, 2 * (D + 4)]`` holding per (block, head,
slot) ``[K codes (D) | K scale (4 B) | V codes (D) | V scale (4 B)]``; the
code caches are the ``[num_blocks, block_size, H_kv, D + 4]`` halves, the
scale caches float32 strided views over the 4-byte pads. The whole page is
compared byte for byte with the same page written by the NumPy twin
(tests/numerics/pth_twin.py), so a byte written anywhere else is caught;
attention reads the page through the same views against the float64
oracle over the twin-dequantized cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import pth_twin
from tests.numerics.test_attention_oracle import check_close
from tests.torch._util import vllm_pth_page

FORMATS = ("int8_per_token_head", "fp8_per_token_head")


class Page:
    """vLLM's inline per-token-head page over one NumPy buffer (physical HND or NHD)."""

    def __init__(self, nb: int, bs: int, hkv: int, d: int, fmt: str, physical: str = "HND", fill: int = 0x5A):
        self.nb, self.bs, self.hkv, self.d, self.fmt = nb, bs, hkv, d, fmt
        content = 2 * (d + 4)
        self.raw = np.full(nb * hkv * bs * content, fill, np.uint8)
        if physical == "HND":
            kv = self.raw.reshape(nb, hkv, bs, content)  # logical (B, H, N, 2 * (hs + pad))
        else:
            kv = self.raw.reshape(nb, bs, hkv, content).transpose(0, 2, 1, 3)
        code = np.int8 if fmt == "int8_per_token_head" else np.uint8
        kvt = kv.view(code).transpose(0, 2, 1, 3)  # (B, N, H, content): vLLM's kv_cache.transpose(1, 2)
        self.key_cache, self.value_cache = kvt[..., : d + 4], kvt[..., d + 4:]
        # the float32 scales sit at byte offsets d (K) and 2d + 4 (V) of each (block, head, slot) row
        self.k_scale_cache = self._scale_view(kv, d)
        self.v_scale_cache = self._scale_view(kv, 2 * d + 4)
        self.k_scale_cache[:] = 1.0  # as vLLM fills them at creation
        self.v_scale_cache[:] = 1.0

    def _scale_view(self, kv: np.ndarray, byte_offset: int) -> np.ndarray:
        f32 = self.raw.view(np.float32)
        s_blk, s_head, s_slot, _ = kv.strides  # bytes
        return np.lib.stride_tricks.as_strided(f32[byte_offset // 4:], shape=(self.nb, self.bs, self.hkv),
                                               strides=(s_blk, s_slot, s_head))


def expected_raw(page: Page, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The page's bytes after the store, by the twin: a copy of the page, the
    codes and scales of each stored token written through NumPy views."""
    raw = page.raw.copy()
    kc_codes, ks = pth_twin.quantize(k, page.fmt)
    vc_codes, vs = pth_twin.quantize(v, page.fmt)
    views = _views_like(page, raw)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        b, o = divmod(int(s), page.bs)
        views[0][b, o, :, : page.d] = kc_codes[t].view(views[0].dtype)
        views[1][b, o, :, : page.d] = vc_codes[t].view(views[1].dtype)
        views[2][b, o] = ks[t]
        views[3][b, o] = vs[t]
    return raw


def _views_like(page: Page, raw: np.ndarray):
    """page's four views re-based onto another buffer of the same size."""
    out = []
    for a in (page.key_cache, page.value_cache, page.k_scale_cache, page.v_scale_cache):
        off = a.ctypes.data - page.raw.ctypes.data
        flat = raw.view(a.dtype) if a.dtype.itemsize == 1 else raw.view(np.float32)
        out.append(np.lib.stride_tricks.as_strided(flat[off // a.dtype.itemsize:], shape=a.shape, strides=a.strides))
    return out


def store(page: Page, k, v, slots, **kw):
    vt.reshape_and_cache_flash(k, v, page.key_cache, page.value_cache, slots, page.fmt, 1.0, 1.0,
                               k_scale_cache=page.k_scale_cache, v_scale_cache=page.v_scale_cache, **kw)


def rows(rng, n, hkv, d):
    mag = 2.0 ** rng.integers(-8, 9, size=(n, hkv, 1))
    return (rng.standard_normal((n, hkv, d)) * mag).astype(np.float32)


@pytest.mark.parametrize("physical", ["HND", "NHD"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("fmt", FORMATS)
def test_store_into_vllms_page_is_byte_exact(isa, fmt, d, physical):
    rng = np.random.default_rng(d)
    nb, bs, hkv, n = 4, 16, 3, 40
    page = Page(nb, bs, hkv, d, fmt, physical)
    k, v = rows(rng, n, hkv, d), rows(rng, n, hkv, d)
    k[3, 1] = 0.0  # an all-zero head: the 1e-6 floor
    k[4, 0, 5] = np.nan
    v[5, 2, 0] = 3e38
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[7] = -1  # skipped
    want = expected_raw(page, k, v, slots)
    store(page, k, v, slots, num_threads=2)
    np.testing.assert_array_equal(page.raw, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_store_into_unpadded_caches_equals_the_paged_cache(fmt):
    """Code caches of last dimension D (no pad) and contiguous scale caches:
    the bytes equal vt.PagedKVCache's store of the same tokens."""
    rng = np.random.default_rng(5)
    nb, bs, hkv, d, n = 3, 16, 2, 64, 30
    c = vt.PagedKVCache(1, nb, bs, hkv, d, fmt)
    k, v = rows(rng, n, hkv, d), rows(rng, n, hkv, d)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    c.store(0, k, v, slots)
    kc, vc = np.zeros_like(c.key_cache(0)), np.zeros_like(c.value_cache(0))
    ks, vs = np.ones_like(c.k_scale_cache(0)), np.ones_like(c.v_scale_cache(0))
    vt.reshape_and_cache_flash(k, v, kc, vc, slots, fmt, 1.0, 1.0, k_scale_cache=ks, v_scale_cache=vs)
    for got, ref in ((kc, c.key_cache(0)), (vc, c.value_cache(0)), (ks, c.k_scale_cache(0)),
                     (vs, c.v_scale_cache(0))):
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_store_and_read_through_torch_views_as_vllm_builds_them():
    """The same page built with torch as vLLM builds it (untyped storage,
    as_strided float32 scale views; fp8 codes retyped to float8_e4m3fn)."""
    torch = pytest.importorskip("torch")
    fmt = "fp8_per_token_head"
    nb, bs, hkv, d, n = 3, 16, 2, 64, 25
    _, (key_cache, value_cache, ks, vs) = vllm_pth_page(torch, fmt, nb, bs, hkv, d)
    rng = np.random.default_rng(9)
    k, v = rows(rng, n, hkv, d), rows(rng, n, hkv, d)
    slots = np.arange(n, dtype=np.int64)
    vt.reshape_and_cache_flash(torch.from_numpy(k), torch.from_numpy(v), key_cache, value_cache,
                               torch.from_numpy(slots), fmt, torch.ones(1), torch.ones(1),
                               k_scale_cache=ks, v_scale_cache=vs)
    want_k, want_ks = pth_twin.quantize(k, fmt)
    b, o = slots // bs, slots % bs
    np.testing.assert_array_equal(key_cache.view(torch.uint8).numpy()[b, o, :, :d], want_k)
    np.testing.assert_array_equal(ks.numpy()[b, o].view(np.uint32), want_ks.view(np.uint32))
    q = rng.standard_normal((1, 4, d)).astype(np.float32)
    cu, sk, bt = np.array([0, 1], np.int32), np.array([n], np.int32), np.array([[0, 1, 2]], np.int32)
    out = vt.flash_attn_varlen_func(torch.from_numpy(q), key_cache, value_cache, cu_seqlens_q=torch.from_numpy(cu),
                                    seqused_k=torch.from_numpy(sk), block_table=torch.from_numpy(bt),
                                    kv_cache_dtype=fmt, k_scale_cache=ks, v_scale_cache=vs)
    kdq = pth_twin.dequantize(key_cache.view(torch.uint8).numpy()[..., :d], ks.numpy(), fmt)
    vdq = pth_twin.dequantize(value_cache.view(torch.uint8).numpy()[..., :d], vs.numpy(), fmt)
    check_close(np.asarray(out), None, (q, kdq, vdq, cu, sk, bt), {}, what="torch page")


@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_attention_reads_vllms_page(isa, fmt, heads):
    """flash_attn_varlen_func over the padded code views and strided scale
    views, against the float64 oracle over the twin-dequantized page. Slots
    never stored keep scale NaN: a read of a wrong slot turns the output NaN."""
    H, hkv = heads
    rng = np.random.default_rng(H + hkv)
    nb, bs, d = 8, 16, 64
    page = Page(nb, bs, hkv, d, fmt, "NHD")
    page.k_scale_cache[:] = np.nan
    page.v_scale_cache[:] = np.nan
    q_lens, k_lens = [1, 5, 1], [20, 37, 50]
    perm = rng.permutation(nb)
    bt = np.array([perm[0:2].tolist() + [perm[7]] * 2, perm[2:5].tolist() + [perm[7]], perm[3:7].tolist()],
                  np.int32)
    for b, kl in enumerate(k_lens):
        j = np.arange(kl)
        slots = bt[b, j // bs].astype(np.int64) * bs + j % bs
        store(page, rows(rng, kl, hkv, d), rows(rng, kl, hkv, d), slots)
    q = rng.standard_normal((sum(q_lens), H, d)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    sk = np.asarray(k_lens, np.int32)
    out, lse = vt.flash_attn_varlen_func(q, page.key_cache, page.value_cache, cu_seqlens_q=cu, seqused_k=sk,
                                         block_table=bt, kv_cache_dtype=fmt, k_scale_cache=page.k_scale_cache,
                                         v_scale_cache=page.v_scale_cache, return_lse=True, num_threads=2)
    kdq = pth_twin.dequantize(page.key_cache[..., :d], page.k_scale_cache, fmt)
    vdq = pth_twin.dequantize(page.value_cache[..., :d], page.v_scale_cache, fmt)
    check_close(np.asarray(out), np.asarray(lse), (q, kdq, vdq, cu, sk, bt), {}, what=f"{fmt} {heads} page")
