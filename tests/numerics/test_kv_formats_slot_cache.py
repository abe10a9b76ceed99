"""The slot formats (TurboQuant, UltraQuant, Octave: vt.SLOT_DTYPES) in PagedKVCache.

A slot format's layer is one uint8 slot cache, K and V together, as vLLM allocates it: key_cache and
value_cache are the same [num_blocks, block_size, H_kv, slot_bytes] view (HND: its permutation). The
judges are the caller-owned forms that test_kv_formats_tq*.py, _uq.py and _octave.py hold against
vLLM: PagedKVCache.store / gather / attention must give exactly turboquant_store / turboquant_gather /
turboquant_attention on a standalone cache of the same slots.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

D, H, BS, NB, L = 128, 2, 16, 6, 3


def kv(rng, T, d=D):
    return (rng.standard_normal((T, H, d)).astype(ml_dtypes.bfloat16),
            rng.standard_normal((T, H, d)).astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fmt", vt.SLOT_DTYPES)
def test_store_gather_attention_equal_the_caller_owned_forms(fmt, layout):
    rng = np.random.default_rng(len(fmt) + len(layout))
    c = vt.PagedKVCache(num_layers=L, num_blocks=NB, block_size=BS, num_kv_heads=H, head_size=D, dtype=fmt,
                        layout=layout)
    S = vt.turboquant_slot_bytes(fmt, D)
    assert c.page_bytes == L * BS * H * S and c.element_size == 1
    k, v = kv(rng, 70)
    slots = rng.permutation(NB * BS)[:70].astype(np.int64)
    slots[5] = -1
    c.store(1, k, v, slots)
    ref = np.zeros((NB, BS, H, S), np.uint8)
    vt.turboquant_store(k, v, ref, slots, fmt)
    view = c.key_cache(1)
    assert view.dtype == np.uint8 and view.shape == ((NB, BS, H, S) if layout == "NHD" else (NB, H, BS, S))
    assert np.array_equal(view if layout == "NHD" else view.transpose(0, 2, 1, 3), ref)
    assert np.shares_memory(c.key_cache(1), c.value_cache(1)) and np.array_equal(c.value_cache(1), view)
    assert not c.key_cache(0).any() and not c.key_cache(2).any()  # other layers untouched
    K, V = c.gather(1, slots[slots >= 0])
    rk, rv = vt.turboquant_gather(ref, slots[slots >= 0], fmt, D)
    assert np.array_equal(K, rk) and np.array_equal(V, rv)
    ck, cv = vt._C.PagedKVCache.gather(c, 1, slots[slots >= 0])  # the C cache's own gather (its own codebook)
    assert np.array_equal(ck, rk) and np.array_equal(cv, rv)
    q = rng.standard_normal((2, 4 * H, D)).astype(ml_dtypes.bfloat16)
    table = np.stack([rng.permutation(NB), rng.permutation(NB)]).astype(np.int32)
    kw = dict(cu_seqlens_q=np.array([0, 1, 2], np.int32), seqused_k=np.array([NB * BS, 37], np.int32),
              block_table=table)
    got = c.attention(1, q, **kw)
    want = vt.turboquant_attention(q, ref, kv_cache_dtype=fmt, **kw)
    assert np.array_equal(np.asarray(got).view(np.uint16), want.view(np.uint16))


def test_octave_rope_dim_sizes_the_slot_and_reaches_the_store():
    rng = np.random.default_rng(3)
    c = vt.PagedKVCache(num_layers=1, num_blocks=4, block_size=BS, num_kv_heads=H, head_size=256,
                        dtype="octave_k3v4", rope_dim=64)
    S = vt.turboquant_slot_bytes("octave_k3v4", 256, 64)
    assert c.rope_dim == 64 and c.key_cache(0).shape[-1] == S != vt.turboquant_slot_bytes("octave_k3v4", 256)
    assert f"slot_bytes={S}, rope_dim=64" in repr(c)
    assert "inside each (token, KV head) slot" in c._repr_html_() and "k_scale" not in c._repr_html_()
    k, v = kv(rng, 30, 256)
    slots = np.arange(30, dtype=np.int64)
    c.store(0, k, v, slots)
    ref = np.zeros((4, BS, H, S), np.uint8)
    vt.turboquant_store(k, v, ref, slots, "octave_k3v4")
    assert np.array_equal(c.key_cache(0), ref)
    assert vt.PagedKVCache(1, 1, BS, H, 256, "octave_k3v4").rope_dim == 256  # default: every dim rotary


def test_from_checkpoint_takes_the_configs_rotary_share(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
        "hidden_size": 512, "torch_dtype": "bfloat16", "partial_rotary_factor": 0.5}))
    c = vt.PagedKVCache.from_checkpoint(tmp_path, "octave_k3v3", num_blocks=3)
    assert (c.dtype, c.rope_dim, c.key_cache(0).shape) == (
        "octave_k3v3", 64, (3, 16, 2, vt.turboquant_slot_bytes("octave_k3v3", 128, 64)))
    assert c.page_bytes == vt.plan_kv_cache(tmp_path, "octave_k3v3", 16, num_blocks=3).bytes_per_block


def test_dlpack_exports_name_one_slot_cache_for_k_and_v():
    torch = pytest.importorskip("torch")
    c = vt.PagedKVCache(num_layers=2, num_blocks=3, block_size=BS, num_kv_heads=H, head_size=64,
                        dtype="ultraquant_4bit")
    S = vt.turboquant_slot_bytes("ultraquant_4bit", 64)
    whole = torch.from_dlpack(c)
    assert whole.shape == (2, 2, 3, BS, H, S) and whole.dtype == torch.uint8 and whole.stride(1) == 0
    c.key_cache(1)[2, 3, 1, 5] = 7
    assert whole[1, 0, 2, 3, 1, 5] == 7 and whole[1, 1, 2, 3, 1, 5] == 7 and whole[0].sum() == 0
    lay = torch.from_dlpack(c.layer(1))
    assert lay.shape == (2, 3, BS, H, S) and lay.stride(0) == 0 and lay[1, 2, 3, 1, 5] == 7
    del whole, lay


def test_the_cache_refuses_what_the_format_refuses():
    with pytest.raises(ValueError, match=r"PagedKVCache: head_size must be a power of two, at most 4096 .* for dtype "
                                         r"'turboquant_4bit_nc'; got 96"):
        vt.PagedKVCache(1, 1, BS, H, 96, "turboquant_4bit_nc")
    with pytest.raises(ValueError, match=r"rotated must be False for dtype 'ultraquant_4bit'"):
        vt.PagedKVCache(1, 1, BS, H, 64, "ultraquant_4bit").gather(0, np.zeros(1, np.int64), rotated=True)
    c = vt.PagedKVCache(2, 1, BS, H, 64, "turboquant_k8v4")
    with pytest.raises(IndexError, match=r"PagedKVCache.store: layer must be in \[0, 2\); got 2"):
        c.store(2, np.zeros((1, H, 64), np.float32), np.zeros((1, H, 64), np.float32), np.zeros(1, np.int64))
    with pytest.raises(IndexError, match=r"^PagedKVCache.store: slot_mapping\[0\] must be < num_blocks \* block_size "
                                         r"= 16"):
        c.store(0, np.ones((1, H, 64), np.float32), np.ones((1, H, 64), np.float32), np.array([16], np.int64))
    assert not c.key_cache(0).any()
    with pytest.raises(IndexError, match=r"^PagedKVCache.gather: slots\[1\] must be in \[0, "):
        c.gather(0, np.array([0, 16], np.int64))
