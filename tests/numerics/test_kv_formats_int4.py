"""int4_per_token_head: the store (vt.reshape_and_cache_flash on caller-owned
caches, vLLM's padded views) byte for byte against the independent NumPy
twin (tests/numerics/int4_twin.py) on every ISA: random rows of many
magnitudes, head sizes whose rotation block differs (64, 80 -> 16, 96 ->
32, 576 -> 64, 1024, 6 -> 2), float32 / bfloat16 / float16 sources, and
adversarial rows built in the rotated space (values at the rounding
midpoints, the zero point at a midpoint, constant rows, the 1e-6 floor,
huge ranges, NaN).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import int4_twin
from tests.numerics.test_attention_oracle import shuffled_block_table

FMT = "int4_per_token_head"
SRC = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def caches(nb, bs, hkv, d, *, pad=4, layout="NHD"):
    """Code caches as vLLM's padded uint8 views ([nb, bs, H, D/2 + 4], pads 0x5A) and scale caches."""
    shape = (nb, hkv, bs, 2 * (d // 2 + pad)) if layout == "HND" else (nb, bs, hkv, 2 * (d // 2 + pad))
    page = np.full(shape, 0x5A, np.uint8)
    kc, vc = page[..., : d // 2 + pad], page[..., d // 2 + pad:]
    ks = np.full((nb, bs, hkv), np.nan, np.float32)
    vs = np.full((nb, bs, hkv), np.nan, np.float32)
    return page, kc, vc, ks, vs


def store(k, v, kc, vc, ks, vs, slots, layout="NHD", **kw):
    vt.reshape_and_cache_flash(k, v, kc, vc, slots, FMT, 1.0, 1.0, k_scale_cache=ks, v_scale_cache=vs,
                               layout=layout, **kw)


def nhd(a, layout):
    return a.transpose(0, 2, 1, 3) if layout == "HND" else a


def check(page, kc, vc, ks, vs, k, v, slots, d, src, layout="NHD"):
    """Every stored row equals the twin; every other byte (pads, unstored slots) untouched."""
    want = page.copy()
    wk, wv = nhd(want[..., : kc.shape[-1]], layout), nhd(want[..., kc.shape[-1]:], layout)
    bs = ks.shape[1]
    qk, sk = int4_twin.quantize(k, src)
    qv, sv = int4_twin.quantize(v, src)
    want_ks, want_vs = np.full_like(ks, np.nan), np.full_like(vs, np.nan)
    for t, s in enumerate(slots):
        if s < 0:
            continue
        b, o = divmod(int(s), bs)
        wk[b, o, :, : d // 2], wv[b, o, :, : d // 2] = qk[t], qv[t]
        want_ks[b, o], want_vs[b, o] = sk[t], sv[t]
    np.testing.assert_array_equal(page, want)
    np.testing.assert_array_equal(ks.view(np.uint32), want_ks.view(np.uint32))
    np.testing.assert_array_equal(vs.view(np.uint32), want_vs.view(np.uint32))


def rows(rng, n, hkv, d, src="float32"):
    mag = 2.0 ** rng.integers(-10, 11, size=(n, hkv, 1))
    off = rng.standard_normal((n, hkv, 1)) * mag  # rows not centred at 0: the zero point moves
    return (rng.standard_normal((n, hkv, d)) * mag + off).astype(SRC[src])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
# 6, 42: rows with a tail past the SIMD vectors; 48 .. 256: rotation blocks of 1 .. 16 vectors (held in registers),
# 576: nine blocks of 64; 1024: a block wider than the registers hold
@pytest.mark.parametrize("d", [48, 64, 80, 96, 128, 256, 576, 1024, 6, 42])
def test_store_bytes_equal_numpy_twin(isa, d, src, layout):
    rng = np.random.default_rng(d)
    nb, bs, hkv, n = 3, 16, 2, 30
    page, kc, vc, ks, vs = caches(nb, bs, hkv, d, layout=layout)
    k, v = rows(rng, n, hkv, d, src), rows(rng, n, hkv, d, src)
    if src == "float16":
        k, v = np.clip(k, -1e3, 1e3).astype(np.float16), np.clip(v, -1e3, 1e3).astype(np.float16)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[4] = -1
    store(k, v, kc, vc, ks, vs, slots, layout=layout, num_threads=2)
    check(page, kc, vc, ks, vs, k, v, slots, d, src, layout)


def from_rotated(y: np.ndarray) -> np.ndarray:
    """x with rht(x) == y exactly (float64 inverse; exact for the dyadic y used here)."""
    d = y.shape[-1]
    b = int4_twin.block(d)
    x = int4_twin.rht(y.astype(np.float32), inverse=True).astype(np.float64) / b
    assert np.array_equal(int4_twin.rht(x.astype(np.float32)), y.astype(np.float32))
    return x.astype(np.float32)


def adversarial_rotated(d: int) -> np.ndarray:
    """Rows in the rotated space, [n, 1, d]."""
    r = []
    base = np.arange(d) % 16
    r.append(np.where(base == 0, 0.0, base - 0.5).astype(np.float64))  # min 0, max 14.5: codes at x.5 midpoints
    r[-1][1] = 15.0  # max 15: scale exactly 1, zp 0
    z = (np.arange(d) % 16 - 2.5)  # min -2.5, max 12.5: scale 1, -min / scale = 2.5: zp midpoint
    r.append(z)
    r.append(np.zeros(d))  # all zero: scale 1e-6, zp 0
    r.append(np.full(d, 3.0))  # constant positive: -min / 1e-6 saturates below 0 -> zp 0
    r.append(np.full(d, -3.0))  # constant negative: zp saturates at 15
    huge = np.zeros(d)
    huge[0], huge[1] = 2.0**100, -(2.0**100)  # a huge range, everything else at the zero point
    r.append(huge)
    tiny = (np.arange(d) % 4) * 2.0**-30  # range below the 1e-6 floor
    r.append(tiny)
    return np.stack(r)[:, None, :]


@pytest.mark.parametrize("d", [16, 64, 128])
def test_store_adversarial_rotated_rows_equal_numpy_twin(isa, d):
    y = adversarial_rotated(d)
    x = from_rotated(y)
    n = x.shape[0]
    page, kc, vc, ks, vs = caches(2, 16, 1, d)
    slots = np.arange(n, dtype=np.int64)
    store(x, x[::-1].copy(), kc, vc, ks, vs, slots)
    check(page, kc, vc, ks, vs, x, x[::-1], slots, d, "float32")


def test_twin_rules_by_hand():
    """The twin against hand-computed bytes for a rotated row (so the twin itself is pinned)."""
    y = np.array([[0.0, 15.0, 2.5, 3.5, 7.5, 14.5, 1.0, 0.49999997]], np.float32)  # min 0, max 15: scale 1, zp 0
    packed, stored = int4_twin.quantize_rotated(y)
    # codes: 0, 15, 3 (2.5 away from zero), 4, 8, 15, 1, 0 (0.49999997 + 0.5 rounds to 1.0 in float32? no: < 1)
    codes = [0, 15, 3, 4, 8, 15, 1, int(np.float32(0.49999997) + np.float32(0.5))]
    assert packed.tolist() == [[codes[0] | codes[1] << 4, codes[2] | codes[3] << 4, codes[4] | codes[5] << 4,
                                codes[6] | codes[7] << 4]]
    assert stored.view(np.uint32).tolist() == [np.float32(1.0).view(np.uint32) & 0xFFFFFFF0]
    z = np.array([[-2.5, 12.5]], np.float32)  # scale 1, -min / scale = 2.5: zp 3 (half away from zero)
    _, st = int4_twin.quantize_rotated(z)
    assert st.view(np.uint32)[0] & 0xF == 3
    s = int4_twin.signs(8)
    assert s.tolist() == [1, -1, 1, 1, -1, -1, -1, -1]  # torch 2.13's draws (the C table's first byte, 0xf2)


@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("d", [32, 42, 48])
def test_nan_and_overflow_rows_equal_numpy_twin(isa, d, src):
    """NaN elements: min / max ignore them (fminf / fmaxf), their codes are 0 (NVIDIA's NaN -> int 0). Rotated sums
    past the source dtype's range round to +-inf (a range of inf or NaN)."""
    rng = np.random.default_rng(3)
    k = rng.standard_normal((4, 1, d)).astype(np.float32)
    k[0, 0, 3] = np.nan  # d 32: the rotation spreads it over the whole row; d 42 (blocks of 2) / 48 (of 16): its block
    k[1, 0, d - 1] = np.nan  # in the row's tail past the SIMD vectors (d 42), in the last block (d 48)
    k[1, 0, d - 3] = np.nan  # in the last full 8-vector (d 42)
    big = {"float32": 3e38, "bfloat16": 3e38, "float16": 6e4}[src]
    k[2, 0, :] = big  # the rotation's sums overflow: +inf in the first lane of each block
    k[3, 0, :] = np.where(np.arange(d) % 2, -big, big)  # mixed signs: +inf and -inf lanes in one row
    k = k.astype(SRC[src])
    page, kc, vc, ks, vs = caches(1, 16, 1, d)
    store(k, k, kc, vc, ks, vs, np.arange(4, dtype=np.int64))
    with np.errstate(over="ignore", invalid="ignore"):  # the twin's overflowing sums and inf - inf
        check(page, kc, vc, ks, vs, k, k, np.arange(4), d, src)


def test_page_bytes_and_plan_equal_vllm(tmp_path):
    import json
    geo = {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(geo))
    res = vt.resolve_kv_cache_dtype(FMT, tmp_path)
    assert res.dtype == FMT and res.cache_dtype == FMT
    plan = vt.plan_kv_cache(tmp_path, FMT, block_size=16, num_blocks=10)
    assert plan.bytes_per_block == int4_twin.page_bytes(3, 16, 2, 64) == 3 * 2 * 16 * (64 + 8)
    cache = vt.PagedKVCache.from_checkpoint(tmp_path, FMT, num_blocks=4)
    assert cache.dtype == FMT and cache.page_bytes == plan.bytes_per_block
    assert cache.key_cache(2).shape == (4, 16, 2, 32) and cache.key_cache(2).dtype == np.uint8


def test_table_row():
    i4 = vt.dtype_info(FMT)
    assert (i4.scale_kind, i4.elem_bits, i4.quant_max, i4.quant_min, i4.numpy_name) == (
        "token_head", 4, 15.0, 0.0, "uint8")
    assert FMT in vt.PER_TOKEN_HEAD_DTYPES and FMT in vt.KV_CACHE_DTYPES


def test_refusals_name_the_argument():
    page, kc, vc, ks, vs = caches(1, 16, 1, 64)
    before = page.copy()
    k = np.ones((2, 1, 64), np.float32)
    with pytest.raises(TypeError, match=r"reshape_and_cache_flash: key_cache must hold uint8 \(two 4-bit\) codes "
                                        r"for kv_cache_dtype 'int4_per_token_head'; got int8"):
        store(k, k, kc.view(np.int8), vc.view(np.int8), ks, vs, np.arange(2))
    with pytest.raises(ValueError, match=r"key_cache must have shape \[num_blocks, block_size, H_kv, D / 2\] = "
                                         r"\[1, 16, 1, 32\] .*or D / 2 \+ 4"):
        store(k, k, np.zeros((1, 16, 1, 64), np.uint8), vc, ks, vs, np.arange(2))
    with pytest.raises(ValueError, match=r"key's head size must be even and at most 4096, .* for kv_cache_dtype 'int4_per_token_head'; got 63"):
        store(np.ones((2, 1, 63), np.float32), np.ones((2, 1, 63), np.float32), kc, vc, ks, vs, np.arange(2))
    with pytest.raises(ValueError, match=r"head size must be even and at most 4096, .*; got 6144"):
        p2, kc2, vc2, ks2, vs2 = caches(1, 16, 1, 2048 * 3)
        store(np.ones((1, 1, 6144), np.float32), np.ones((1, 1, 6144), np.float32), kc2, vc2, ks2, vs2,
              np.arange(1))
    np.testing.assert_array_equal(page, before)


# ---- the read: flash_attn_varlen_func over int4 caches (the AVX2 and AVX-512 tiles; the scalar twin)


def _hadamard64(b: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return h


def reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, dt, **kw):
    """vLLM's int4 read (unified_attention_int4) over the twin-dequantized rotated cache: q rotated and
    rounded to its dtype, softmax_scale / b, the output rotated back and / b; in float64 (dt) or float32."""
    from tests.numerics.test_attention_oracle import attention_ref
    b = int4_twin.block(d)
    qr = int4_twin.round_to(int4_twin.rht(q.astype(np.float32)), q_dtype)
    out, _ = attention_ref(qr.astype(dt), kdq.astype(dt), vdq.astype(dt), cu, sk, bt,
                           softmax_scale=(1.0 / np.sqrt(d)) / b, dt=dt, **kw)
    if dt == np.float64:
        s = int4_twin.signs(b).astype(np.float64)
        o = np.asarray(out, np.float64).reshape(*out.shape[:-1], d // b, b) @ _hadamard64(b)
        return (o * s / b).reshape(out.shape)
    return (int4_twin.rht(np.asarray(out, np.float32), inverse=True) / np.float32(b)).astype(np.float32)


def read_case(rng, d, H, hkv, q_lens, k_lens, *, q_dtype="float32", bs=16):
    nb = sum(max(1, -(-k // bs)) for k in k_lens) + 2
    page, kc, vc, ks, vs = caches(nb, bs, hkv, d)  # unused slots keep scale NaN: a wrong read turns NaN
    nb, bt = shuffled_block_table(rng, k_lens, bs, extra_blocks=2, spare_column=False)
    for i, kl in enumerate(k_lens):
        j = np.arange(kl)
        slots = bt[i, j // bs].astype(np.int64) * bs + j % bs
        store(rows(rng, kl, hkv, d), rows(rng, kl, hkv, d), kc, vc, ks, vs, slots)
    q = rng.standard_normal((sum(q_lens), H, d)).astype(SRC[q_dtype])
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    kdq = int4_twin.dequantize(kc[..., : d // 2], ks)
    vdq = int4_twin.dequantize(vc[..., : d // 2], vs)
    return q, kc, vc, ks, vs, kdq, vdq, cu, np.asarray(k_lens, np.int32), bt


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("d", [64, 80])
def test_attention_matches_the_rotated_reference(isa, d, heads, q_dtype):
    H, hkv = heads
    rng = np.random.default_rng(d + H + hkv)
    q, kc, vc, ks, vs, kdq, vdq, cu, sk, bt = read_case(rng, d, H, hkv, [1, 6, 1], [30, 45, 70], q_dtype=q_dtype)
    out = vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=FMT,
                                    k_scale_cache=ks, v_scale_cache=vs, num_threads=2)
    out = np.asarray(out).astype(np.float64)
    ref = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float64)
    naive = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float32)
    assert np.isfinite(out).all(), "NaN: a poisoned (unused) slot was read"
    floor = 16 * 2.0**-24 * np.abs(ref).max()
    if q_dtype == "bfloat16":  # ours rounds the output to bf16 once, vLLM twice: the bf16 output ulp
        floor += 2.0**-8 * np.abs(ref).max()
    err, err_naive = np.abs(out - ref).max(), np.abs(naive.astype(np.float64) - ref).max()
    assert err <= 2 * err_naive + floor, f"error {err:.3g} > 2 x naive {err_naive:.3g} + {floor:.3g}"


def test_attention_refusals():
    rng = np.random.default_rng(0)
    q, kc, vc, ks, vs, *_ , cu, sk, bt = read_case(rng, 64, 2, 1, [1], [10])
    kw = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=FMT, k_scale_cache=ks, v_scale_cache=vs)
    with pytest.raises(ValueError, match=r"causal must be True for kv_cache_dtype 'int4_per_token_head'"):
        vt.flash_attn_varlen_func(q, kc, vc, causal=False, **kw)
    with pytest.raises(TypeError, match=r"k must hold uint8 \(two 4-bit\) codes for kv_cache_dtype "
                                        r"'int4_per_token_head'; got int8"):
        vt.flash_attn_varlen_func(q, kc.view(np.int8), vc.view(np.int8), **kw)
    with pytest.raises(ValueError, match=r"k must have shape \[num_blocks, block_size, num_kv_heads, 32 or "
                                         r"D / 2 \+ 4\]"):
        vt.flash_attn_varlen_func(q, kc[..., :30], vc[..., :30], **kw)


OPTIONS = {
    "softcap": {"softcap": 3.0},
    "window+sink": {"window_size": (5, 0), "s_aux": np.linspace(-1, 1, 8).astype(np.float32)},
    "alibi": {"alibi_slopes": np.linspace(0.05, 0.4, 8).astype(np.float32)},
}


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_attention_options_match_the_rotated_reference(isa, name, q_dtype):
    """softcap, sliding window with sinks, ALiBi: they act on the logits, which the rotation leaves unchanged
    (q' . k' = b q . k), so vLLM's int4 kernel applies them after its softmax_scale / b as vtinfer does.
    bfloat16 q at GQA 4 (12 and 4 rows per KV head): the pair-dot tile on an AVX512-BF16 CPU's avx512."""
    kw = OPTIONS[name]
    rng = np.random.default_rng(len(name))
    d = 64
    q, kc, vc, ks, vs, kdq, vdq, cu, sk, bt = read_case(rng, d, 8, 2, [3, 1], [40, 70], q_dtype=q_dtype)
    out = vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=FMT,
                                    k_scale_cache=ks, v_scale_cache=vs, **kw)
    out = np.asarray(out).astype(np.float64)
    ref = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float64, **kw)
    naive = reference(q, kdq, vdq, cu, sk, bt, d, q_dtype, np.float32, **kw)
    assert np.isfinite(out).all()
    floor = 16 * 2.0**-24 * np.abs(ref).max()
    if q_dtype == "bfloat16":  # ours rounds the output to bf16 once, vLLM twice: the bf16 output ulp
        floor += 2.0**-8 * np.abs(ref).max()
    err, err_naive = np.abs(out - ref).max(), np.abs(naive.astype(np.float64) - ref).max()
    assert err <= 2 * err_naive + floor, f"{name}: {err:.3g} vs naive {err_naive:.3g} + {floor:.3g}"


@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("simd", ["avx2", "avx512"])
def test_simd_tile_agrees_with_the_scalar_twin(simd, d, q_dtype):
    """The AVX2 and AVX-512 int4 tiles against the scalar twin (attn_ref.c) on one cache: the same
    rotation of q, zero points, scales and rotation back, so the outputs differ only by float32
    summation order. D 80 rotates in blocks of 16 and takes a half-filled 16-byte chunk on AVX-512;
    GQA 4 prefill and decode rows."""
    from tests.conftest import available_isas, forced_isa
    if simd not in available_isas():
        pytest.skip(f"no {simd} on this CPU")
    rng = np.random.default_rng(d + 3)
    q, kc, vc, ks, vs, kdq, vdq, cu, sk, bt = read_case(rng, d, 8, 2, [1, 9, 2], [70, 45, 130], q_dtype=q_dtype)
    kw = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=FMT, k_scale_cache=ks, v_scale_cache=vs)
    outs = {}
    for name in ("scalar", simd):
        with forced_isa(name):
            outs[name] = np.asarray(vt.flash_attn_varlen_func(q, kc, vc, **kw)).astype(np.float64)
    ref = outs["scalar"]
    if q_dtype == "bfloat16":  # the bf16 output: one rounding of nearly equal float32 values may differ by a unit
        np.testing.assert_allclose(outs[simd], ref, rtol=2.0**-7, atol=1e-6 * np.abs(ref).max())
    else:
        np.testing.assert_allclose(outs[simd], ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
