"""Two views of one layout whose dims nest (vLLM's page: K and V interleaved per (token, head) row):
the exact shared-element answer, in O(2^ndim) whatever the cache size (csrc/binding/common/tensor_desc.c,
same_layout_share)."""

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
