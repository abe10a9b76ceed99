"""Two views whose coarsest dims are one layout and nest (vLLM's page: K and V interleaved per
(token, head) row; per-token-head code rows and their float32 scales): the exact shared-element answer,
in O(2^ndim) tail tests whatever the cache size (csrc/binding/common/tensor_desc.c, nested_layout_share)."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt


def _store(k, v):
    H, D = k.shape[2], k.shape[3]
    x = np.ones((1, H, D), k.dtype)
    vt.reshape_and_cache_flash(x, x, k, v, np.array([0], np.int64), "auto", 1.0, 1.0)


def test_vllm_page_halves_of_a_large_layer_cache_store():
    # One layer of a vLLM page: 32768 blocks x 16 tokens x 8 KV heads x (K | V) of 128 bf16 (2 GiB,
    # zero pages never touched but the stored slot's). The splitting search gave up past 2^22 rows
    # and refused these halves as sharing elements.
    nb, bs, H, D = 32768, 16, 8, 128
    page = np.zeros((nb, bs, H, 2 * D), ml_dtypes.bfloat16)
    k, v = page[..., :D], page[..., D:]
    _store(k, v)
    assert float(k[0, 0, 0, 0]) == 1.0 and float(v[0, 0, 0, 0]) == 1.0 and float(page[1, 0, 0, 0]) == 0.0


def _shares(shape, strides, off, itemsize):
    """Brute force: byte sets of the view at 0 and the view at `off` bytes (same shape and strides)."""
    starts = {sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*map(range, shape))}
    a = {x + b for x in starts for b in range(itemsize)}
    return any(x + off + b in a for x in starts for b in range(itemsize))


@pytest.mark.parametrize("seed", range(6))
def test_same_layout_views_share_exactly_when_brute_force_says_so(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        nb, bs, H, D = (int(x) for x in rng.integers(1, 4, 4))
        D = D * 2
        pad = int(rng.integers(0, 3))
        row = 2 * D + pad  # elements per (token, head) row: K | V | pad
        buf = np.zeros(nb * bs * H * row + 2 * D + 8, np.float32)
        base = buf[: nb * bs * H * row].reshape(nb, bs, H, row)
        off = int(rng.integers(0, 2 * D + pad + 1))
        k = base[..., :D]
        flat = buf[off: off + nb * bs * H * row].reshape(nb, bs, H, row)
        v = flat[..., :D]
        want = _shares(k.shape, [s // 4 for s in k.strides], off, 1)
        if want:
            with pytest.raises(ValueError, match="must not share memory"):
                _store(k, v)
        else:
            _store(k, v)


def _pth_page(nb, bs, H, D, pad, off_k, off_v):
    """A uint8 page [nb, H, bs, row] (vLLM's per-token-head layout, row = 2 * D + pad bytes) with int8
    K / V code views at bytes 0 and D + 4 of each row and float32 scale views at bytes off_k / off_v."""
    row = 2 * D + pad
    page = np.zeros((nb, H, bs, row), np.uint8)
    codes = page.transpose(0, 2, 1, 3)
    kc, vc = codes[..., :D].view(np.int8), codes[..., D + 4: 2 * D + 4].view(np.int8)
    s = page.strides
    scale = [np.lib.stride_tricks.as_strided(page.reshape(-1)[off:].view(np.float32), (nb, bs, H), (s[0], s[2], s[1]))
             for off in (off_k, off_v)]  # off a multiple of 4 (row is)
    return page, kc, vc, scale[0], scale[1]


def _bytes_of(view, page):
    start = view.__array_interface__["data"][0] - page.__array_interface__["data"][0]
    idx = itertools.product(*map(range, view.shape))
    return {start + sum(i * st for i, st in zip(ix, view.strides)) + b for ix in idx for b in range(view.itemsize)}


@pytest.mark.parametrize("seed", range(4))
def test_code_and_scale_views_of_one_page_share_exactly_when_brute_force_says_so(seed):
    """Codes (int8) and their float32 scales in one page are views of different dtypes and dims; the
    store refuses them exactly when their byte sets intersect (the codes counted to D bytes)."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        nb, bs, H = (int(x) for x in rng.integers(1, 4, 3))
        D = 8 * int(rng.integers(1, 3))
        pad = 4 * int(rng.integers(2, 4))
        row = 2 * D + pad
        off_k, off_v = (4 * int(x) for x in rng.integers(0, (row - 4) // 4 + 1, 2))
        page, kc, vc, ks, vs = _pth_page(nb, bs, H, D, pad, off_k, off_v)
        codes = _bytes_of(kc, page) | _bytes_of(vc, page)
        sk, sv = _bytes_of(ks, page), _bytes_of(vs, page)
        want = bool(codes & (sk | sv)) or bool(sk & sv)
        x = np.ones((1, H, D), np.float32)
        call = lambda: vt.reshape_and_cache_flash(x, x, kc, vc, np.array([0], np.int64), "int8_per_token_head",  # noqa: E731
                                                  1.0, 1.0, k_scale_cache=ks, v_scale_cache=vs)
        if want:
            before = page.copy()
            with pytest.raises(ValueError, match="must not share memory"):
                call()
            np.testing.assert_array_equal(page, before)
        else:
            call()
            assert (kc[0, 0] == 127).all() and ks[0, 0, 0] == np.float32(1 / 127)


def test_per_token_head_page_of_a_large_layer_cache_stores():
    # One layer of vLLM's int8 per-token-head page: 32768 blocks x 16 tokens x 8 KV heads, rows of
    # K | k_scale | V | v_scale (2 x (128 + 4) bytes; 1.1 GB of zero pages never touched but the
    # stored slot's). The code / scale views differ in dtype and dims: the splitting search walked
    # every row and gave up past 2^22 of them, refusing the page as sharing memory.
    nb, bs, H, D = 32768, 16, 8, 128
    page, kc, vc, ks, vs = _pth_page(nb, bs, H, D, 8, D, 2 * D + 4)
    x = np.ones((1, H, D), np.float32)
    vt.reshape_and_cache_flash(x, x, kc, vc, np.array([17], np.int64), "int8_per_token_head", 1.0, 1.0,
                               k_scale_cache=ks, v_scale_cache=vs)
    assert (kc[1, 1] == 127).all() and (vc[1, 1] == 127).all() and (ks[1, 1] == np.float32(1 / 127)).all()
    assert not kc[0].any() and not ks[0].any()
