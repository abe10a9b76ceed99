"""octave_k3v4, octave_k3v3, octave_k3v3_compact (vLLM 0.33's Octave KV formats) on the slot cache.

Judges, each independent of vtinfer's C codec:
- the NumPy twin written from the wheel's rocm_octave.py (tests/numerics/octave_twin.py): byte for byte,
  with torch absent too, non-finite rows and untouched pad bytes included;
- vLLM's PyTorch reference (rocm_octave.py compiled from the wheel's text): its ``reference_quantize``
  (byte for byte but where torch's vectorized float32 sums round differently from the element-order sums,
  counted), ``reference_dequantize`` (bit for bit on the same slots), ``reference_attention``, and
  ``OctaveFormat.slot_bytes``; its sign pattern drawn from torch;
- the float64 attention oracle of test_attention_oracle.py over the twin's read, with FlashAttention's
  2x rule.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import octave_twin as twin
from tests.numerics.test_kv_formats_uq import (ORACLE_Q_LENS, check_attention_against_oracle, rows as uq_rows,
                                                 store_oracle_sequences)
from vtinfer.testing import upstream

FMTS = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
SRC = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# (head size, rotary dims): full, none, partial, a head size that is not a power of two
GEOMS = [(64, 64), (128, 128), (128, 0), (256, 64), (192, 128)]


def cases():
    for fmt in FMTS:
        for D, r in GEOMS:
            if fmt.endswith("_compact") and D & (D - 1):
                continue
            yield fmt, D, (D if fmt.endswith("_compact") else r)


def rows(rng, T, H, D, src, adversarial=True):
    """[T, H, D]: UltraQuant's test rows (N(0, s^2), s per row over 2^-20 .. 2^20; zero, constant and one-hot
    rows), with rows 3 - 5 (adversarial) integer, tiny and negated-integer rows instead of UltraQuant's ties."""
    x = uq_rows(rng, T, H, D, src, adversarial)
    if adversarial and T >= 8:
        x[3] = rng.integers(-4, 5, (H, D)).astype(x.dtype)
        x[4] = 1e-30 if src == "float32" else 1e-4
        x[5] = -x[3]
    return x


def slots_for(rng, T, nb=4, bs=16):
    s = rng.permutation(nb * bs)[:T].astype(np.int64)
    s[rng.random(T) < 0.1] = -1
    return s


def store_both(fmt, rope, k, v, slots, nb=4, bs=16, fill=0x5A):
    H, D = k.shape[1], k.shape[2]
    ours = np.full((nb, bs, H, vt.turboquant_slot_bytes(fmt, D, rope)), fill, np.uint8)
    theirs = ours.copy()
    vt.turboquant_store(k, v, ours, slots, fmt)
    twin.store(k, v, theirs, slots, fmt, rope)
    return ours, theirs


@pytest.mark.parametrize("src", sorted(SRC))
@pytest.mark.parametrize("fmt,D,rope", list(cases()))
def test_store_and_read_match_the_numpy_twin(fmt, D, rope, src):
    rng = np.random.default_rng(D + rope + len(fmt))
    T, H = 40, 2
    k, v = rows(rng, T, H, D, src), rows(rng, T, H, D, src)
    ours, theirs = store_both(fmt, rope, k, v, slots_for(rng, T))
    assert np.array_equal(ours, theirs)  # the pad bytes (0x5A) kept in both
    every = np.arange(ours.shape[0] * ours.shape[1], dtype=np.int64)
    K, V = vt.turboquant_gather(ours, every, fmt, D)
    tk, tv = twin.decode(ours.reshape(-1, H, ours.shape[-1]), fmt, D, rope)
    assert np.array_equal(K, tk, equal_nan=True) and np.array_equal(V, tv, equal_nan=True)


def test_non_finite_rows_follow_the_arithmetic():
    """A NaN or inf in a row reaches its block's codes and scale as the reference's float32 arithmetic carries
    it (bucketize's lower bound puts a NaN at the last code; a NaN dot gives scale 0); nothing else moves."""
    rng = np.random.default_rng(1)
    k = rng.standard_normal((3, 1, 128)).astype(np.float32)
    v = k.copy()
    k[0, 0, 3], v[1, 0, 70], k[2, 0, 100] = np.nan, np.inf, -np.inf
    for fmt in FMTS:
        ours, theirs = store_both(fmt, 128, k, v, np.array([0, 1, 2], np.int64), nb=1)
        assert np.array_equal(ours, theirs), fmt
    clean = k.copy()
    clean[0, 0, 3] = 0.5
    a, _ = store_both("octave_k3v4", 64, k, v, np.array([0, 1, 2], np.int64), nb=1)
    b, _ = store_both("octave_k3v4", 64, clean, v, np.array([0, 1, 2], np.int64), nb=1)
    # row 0's NaN is in K block 0: block 1's codes (bytes 32..56) and its scale are untouched
    assert np.array_equal(a[0, 0, 0, 32:56], b[0, 0, 0, 32:56]) and np.array_equal(a[0, 0, 0, 114:116],
                                                                                   b[0, 0, 0, 114:116])


@functools.cache
def _octave_module():
    torch = pytest.importorskip("torch")
    src = upstream.locate_or_skip()
    names = ["HADAMARD_BLOCK", "_SIGN_SEED", "ROPE_BITS", "NOPE_BITS", "LUT", "LUT_MULT", "LUT_ONE", "OctaveFormat",
             "_signs_cpu", "signs", "sign_bits", "fwht_blocks", "rotate", "unrotate", "v_block", "_lut",
             "_quantize_lut", "_pack", "_unpack", "reference_quantize", "reference_dequantize", "reference_attention"]
    ns = upstream.extract(src.read(upstream.F_OCTAVE), names,
                          {"torch": torch, "math": math, "functools": functools, "dataclass": dataclass,
                           "__name__": __name__})  # the dataclass looks its module up in sys.modules
    return torch, ns


@pytest.fixture(scope="module")
def vllm_octave():
    return _octave_module()


@pytest.mark.parametrize("d", list(range(64, 4097, 64)))
def test_the_checked_in_signs_equal_torchs_draws(d):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0x5E17)
    drawn = (torch.randint(0, 2, (d,), generator=g, dtype=torch.int64) * -2 + 1).numpy().astype(np.float32)
    assert np.array_equal(twin.signs(d), drawn), (
        f"torch {torch.__version__} draws other signs for d={d}: update tests/numerics/octave_signs.txt and "
        "csrc/core/kv_store_octave.c's oct_sign_bits, and record the torch version")


def test_slot_bytes_equal_vllms(vllm_octave):
    _, ref = vllm_octave
    for fmt in FMTS:
        for D in range(64, 4097, 64):
            if fmt.endswith("_compact") and D & (D - 1):
                continue
            for r in sorted({0, 64, D // 2 // 64 * 64, D}):
                want = ref["OctaveFormat"].from_cache_dtype(fmt, D, r).slot_bytes
                assert vt.turboquant_slot_bytes(fmt, D, r) == want == twin.layout(fmt, D, r)["slot"], (fmt, D, r)
        assert vt.turboquant_slot_bytes(fmt, 128) == ref["OctaveFormat"].from_cache_dtype(fmt, 128, 128).slot_bytes


@pytest.mark.parametrize("fmt,D,rope", list(cases()))
def test_store_and_read_match_vllms_reference(vllm_octave, fmt, D, rope):
    """reference_quantize on the same rows gives vtinfer's bytes but where a float32 sum of 64 or D squares rounds
    differently in torch's vectorized order and moves a value across a code boundary: the N(0, s^2) rows match
    but for at most one slot in 256, and where a slot differs (the adversarial constant / integer rows put values
    on the boundaries) vtinfer's reconstruction is as close to the row as vLLM's. reference_dequantize of
    vtinfer's slots is vtinfer's read, bit for bit; finite and non-finite rows."""
    torch, ref = vllm_octave
    fm = ref["OctaveFormat"].from_cache_dtype(fmt, D, rope)
    rng = np.random.default_rng(7 * D + rope)
    T, H = 64, 4
    k, v = rows(rng, T, H, D, "bfloat16"), rows(rng, T, H, D, "bfloat16")
    k[6, 0, 1], v[7, 1, 9] = np.nan, np.inf
    cache = np.zeros((T // 16, 16, H, vt.turboquant_slot_bytes(fmt, D, rope)), np.uint8)
    vt.turboquant_store(k, v, cache, np.arange(T, dtype=np.int64), fmt)
    ours = cache.reshape(T, H, -1)
    kf, vf = torch.from_numpy(k.astype(np.float32)), torch.from_numpy(v.astype(np.float32))
    want = ref["reference_quantize"](kf, vf, fm).numpy()
    differ = (ours != want).any(-1)
    assert int(differ[6:].sum()) <= max(1, differ[6:].size // 256), f"{int(differ[6:].sum())} random slots differ"
    mine = ref["reference_dequantize"](torch.from_numpy(ours.copy()), fm)
    theirs = ref["reference_dequantize"](torch.from_numpy(want), fm)
    for x, a, b in zip((k, v), mine, theirs):
        x = x.astype(np.float32)
        with np.errstate(invalid="ignore"):
            ea = np.linalg.norm(a.numpy() - x, axis=-1)[differ & np.isfinite(x).all(-1)]
            eb = np.linalg.norm(b.numpy() - x, axis=-1)[differ & np.isfinite(x).all(-1)]
        assert np.all(ea <= eb * 1.01 + 1e-30), (ea, eb)
    K, V = vt.turboquant_gather(cache, np.arange(T, dtype=np.int64), fmt, D)
    assert np.array_equal(K.reshape(T, H, D), mine[0].numpy(), equal_nan=True)
    assert np.array_equal(V.reshape(T, H, D), mine[1].numpy(), equal_nan=True)


def test_attention_matches_vllms_reference_attention(vllm_octave):
    """reference_attention over vLLM's own [num_blocks, H_kv, block_size, slot] page (vtinfer stores through
    its transpose(1, 2) view) against vt.turboquant_attention on the same page: the same dequantized K / V, so
    only the softmax's float32 arithmetic differs."""
    torch, ref = vllm_octave
    rng = np.random.default_rng(4)
    B, N, Hk, Hq, D, bs, fmt = 3, 80, 2, 8, 256, 16, "octave_k3v4"
    fm = ref["OctaveFormat"].from_cache_dtype(fmt, D, 64)
    nbp = N // bs
    table = rng.permutation(B * nbp).reshape(B, nbp).astype(np.int32)
    page = np.zeros((B * nbp, Hk, bs, fm.slot_bytes), np.uint8)
    nhd = page.transpose(0, 2, 1, 3)
    for b in range(B):
        j = np.arange(N)
        kv = rng.standard_normal((2, N, Hk, D)).astype(ml_dtypes.bfloat16)
        vt.turboquant_store(kv[0], kv[1], nhd, table[b, j // bs].astype(np.int64) * bs + j % bs, fmt)
    q = rng.standard_normal((B, Hq, D)).astype(np.float32)
    k_lens = np.array([80, 33, 1], np.int32)
    want = ref["reference_attention"](torch.from_numpy(q), torch.from_numpy(page), torch.from_numpy(table),
                                      torch.arange(B), torch.from_numpy(k_lens), fm, D ** -0.5).numpy()
    got = vt.turboquant_attention(q, nhd, cu_seqlens_q=np.arange(B + 1, dtype=np.int32), seqused_k=k_lens,
                                  block_table=table, kv_cache_dtype=fmt, softmax_scale=D ** -0.5)
    assert float(np.abs(got - want).max()) < 1e-5 * max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("Hkv,H", [(2, 2), (2, 8)])
def test_attention_matches_oracle_over_dequantized_cache(fmt, Hkv, H):
    """The float64 oracle reads the twin's dequantized K / V (model basis, the query as given)."""
    D = 128
    rng = np.random.default_rng(H + len(fmt))

    def draw(T):
        kv = rng.standard_normal((2, T, Hkv, D)) * np.exp2(rng.integers(-4, 5, (2, T, Hkv, 1)))
        return kv[0].astype(np.float32), kv[1].astype(np.float32)

    cache, bt, used = store_oracle_sequences(rng, fmt, Hkv, D, draw)
    K, V = twin.decode(cache.reshape(-1, Hkv, cache.shape[-1]), fmt, D, D)
    q = rng.standard_normal((sum(ORACLE_Q_LENS), H, D)).astype(np.float32)
    check_attention_against_oracle(fmt, q, q, cache, bt, used, K, V, what=f"{fmt} GQA {H // Hkv}")


def test_bad_geometry_gets_the_formats_one_message():
    for fmt, D, rule in [("octave_k3v4", 96, r"a multiple of 64, at most 4096"),
                         ("octave_k3v3", 8192, r"a multiple of 64, at most 4096"),
                         ("octave_k3v3_compact", 192, r"a power of two from 64 to 4096"),
                         ("octave_k3v3_compact", 32, r"a power of two from 64 to 4096")]:
        k = np.ones((1, 1, D), np.float32)
        cache = np.zeros((1, 16, 1, 64), np.uint8)
        with pytest.raises(ValueError, match=rule + rf".* for kv_cache_dtype '{fmt}'; got {D}"):
            vt.turboquant_store(k, k, cache, np.zeros(1, np.int64), fmt)
        assert not cache.any()
        # the same rule, asked of the row (the demo keeps the formats whose rule takes the model's head size)
        assert f"for dtype '{fmt}'; got {D}" in vt.dtype_info(fmt).head_size_error(D)
        assert vt.dtype_info(fmt).head_size_error(128) is None
    with pytest.raises(ValueError, match=r"dtype_head_size_error: head_size must be > 0; got 0"):
        vt.dtype_info("octave_k3v4").head_size_error(0)


def test_a_slot_width_no_rope_dim_gives_is_refused_and_names_the_widths():
    k = np.ones((1, 1, 128), np.float32)
    widths = [vt.turboquant_slot_bytes("octave_k3v4", 128, r) for r in (0, 64, 128)]
    assert widths == [120, 128, 136]
    for w in (100, 121, 144):
        cache = np.zeros((1, 16, 1, w), np.uint8)
        with pytest.raises(ValueError, match=r"slot_bytes that of kv_cache_dtype 'octave_k3v4' at head_size 128 for "
                                             r"rotary dims \(rope_dim\) 0, 64, .. 128: one of 120, 128, 136; got "
                                             rf"\[1, 16, 1, {w}\]"):
            vt.turboquant_store(k, k, cache, np.zeros(1, np.int64), "octave_k3v4")
        assert not cache.any()
    for r in (-64, 32, 192):
        with pytest.raises(ValueError, match=rf"rope_dim must be a multiple of 64 in \[0, head_size = 128\] for "
                                             rf"dtype 'octave_k3v4'; got {r}"):
            vt.turboquant_slot_bytes("octave_k3v4", 128, r)
    # the compact format's slot does not depend on the rotary dims: any rope_dim is ignored
    assert vt.turboquant_slot_bytes("octave_k3v3_compact", 128, 32) == vt.turboquant_slot_bytes(
        "octave_k3v3_compact", 128) == 100


def test_plan_resolution_and_rows_equal_vllms(tmp_path):
    """Every layer takes the format (vLLM's packed-KV boundary rule names TurboQuant and UltraQuant only), one
    slot per (token, KV head) at the config's rotary dims; the flag resolves to the format."""
    import json

    from vtinfer.hf_config import ModelGeometry

    for cfg, rope in [({}, 256), ({"partial_rotary_factor": 0.25}, 64),
                      ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, 128)]:
        geo = ModelGeometry.from_dict({"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2,
                                       "head_dim": 256, "torch_dtype": "bfloat16", **cfg})
        assert geo.rope_dim() == rope
        p = vt.plan_kv_cache(geo, "octave_k3v4", 16, num_blocks=4)
        assert p.skipped_layers == () and p.layer_dtypes == ("octave_k3v4",) * 6
        assert p.layer_page_bytes[0] == 2 * 16 * twin.layout("octave_k3v4", 256, rope)["slot"]
    with pytest.raises(ValueError, match="partial_rotary_factor must be a number in"):
        ModelGeometry.from_dict({"num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 64,
                                 "partial_rotary_factor": "half"})
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "hidden_size": 256,
                                                      "torch_dtype": "bfloat16"}))
    for fmt in FMTS:
        assert vt.resolve_kv_cache_dtype(fmt, tmp_path).dtype == fmt
        info = vt.dtype_info(fmt)
        assert (info.family, info.page_layout, info.scale_kind, info.key_basis, info.boundary_layers) == (
            "octave", "slots", "slot", "model", 0)
        assert fmt in vt.SLOT_DTYPES and fmt in vt.KV_CACHE_DTYPES and fmt not in vt.KV_CACHE_DTYPES_NOT_STORED
    for r in (32, 192):
        with pytest.raises(ValueError, match=rf"PagedKVCache: rope_dim must be a multiple of 64 in \[0, head_size = "
                                             rf"128\] for dtype 'octave_k3v4'; got {r}"):
            vt.PagedKVCache(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_size=128,
                            dtype="octave_k3v4", rope_dim=r)
