"""vLLM's cache ops against byte-level and float64 references written from
vLLM's semantics (vllm/_custom_ops.py and the kernels' documented meaning,
UPSTREAM.md), never from vtinfer's code: swap_blocks and cp_gather_cache by
bytes, convert_fp8 and gather_and_maybe_dequant_cache against ml_dtypes
casts, merge_attn_states against a float64 log-sum-exp merge. NumPy arrays
and CPU torch tensors, every KV dtype vtinfer stores, every ISA."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

torch = pytest.importorskip("torch")

FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
FLOATS = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
KV_DTYPES = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


def cache_array(rng, shape, kv_dtype):
    """Random cache contents: fp8 as uint8 codes of finite values."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kv_dtype in FP8:
        return x.astype(FP8[kv_dtype]).view(np.uint8)
    return x.astype(FLOATS[kv_dtype])


# ----------------------------------------------------------------- swap_blocks


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("threads", [1, 3])
def test_swap_blocks_copies_the_mapped_blocks_bytes(kv_dtype, threads):
    rng = np.random.default_rng(1)
    NB, BS, H, D = 64, 16, 4, 80
    src = cache_array(rng, (NB, BS, H, D), kv_dtype)
    dst = cache_array(rng, (NB, BS, H, D), kv_dtype)
    before = dst.copy()
    pairs = np.stack([rng.choice(NB, 20, replace=False), rng.choice(NB, 20, replace=False)], 1).astype(np.int64)
    bb = src.itemsize * src.strides[0] // src.itemsize
    vt.swap_blocks(src, dst, bb, pairs, num_threads=threads)
    expect = before.view(np.uint8).copy()
    for s, d in pairs:
        expect[d] = src.view(np.uint8)[s]
    assert np.array_equal(dst.view(np.uint8), expect)


def test_swap_blocks_torch_views_of_one_kv_allocation_move_k_and_v():
    """vLLM's flash layout: kv[:, 0] with stride(0) bytes per block copies K and V of the block."""
    kv = torch.randn(8, 2, 4, 2, 16, dtype=torch.bfloat16)
    out = torch.zeros_like(kv)
    bb = kv[:, 0].element_size() * kv[:, 0].stride(0)
    m = torch.tensor([[7, 0], [3, 5]], dtype=torch.int64)
    vt.swap_blocks(kv[:, 0], out[:, 0], bb, m)
    assert torch.equal(out[0], kv[7]) and torch.equal(out[5], kv[3])  # the last block (7) too
    assert not out[[1, 2, 3, 4, 6, 7]].any()


def test_swap_blocks_chains_within_one_buffer_run_in_order():
    buf = np.arange(4 * 8, dtype=np.uint8).reshape(4, 8)
    orig = buf.copy()
    vt.swap_blocks(buf, buf, 8, np.array([[0, 1], [1, 2]], np.int64))
    assert np.array_equal(buf[1], orig[0]) and np.array_equal(buf[2], orig[0])


def ref_swap_bytes(src_buf, src_off, src_stride, dst_buf, dst_off, dst_stride, nbytes, mapping):
    """vLLM's swap_blocks on raw allocations: block b of a view starts b * stride(0) * element_size bytes after
    the view's first byte; each pair copies nbytes, in order."""
    out = dst_buf.copy()
    for s, d in np.asarray(mapping).tolist():
        chunk = (out if src_buf is dst_buf else src_buf)[src_off + s * src_stride: src_off + s * src_stride + nbytes]
        out[dst_off + d * dst_stride: dst_off + d * dst_stride + nbytes] = chunk.copy()
    return out


def test_swap_blocks_v_half_views_copy_v_blocks_only():
    """The V halves kv[:, 1] of (num_blocks, 2, 32) uint8 caches with 32 bytes per V block: only V blocks move."""
    src = np.random.default_rng(4).integers(0, 255, (4, 2, 32), dtype=np.uint8)
    dst = np.zeros_like(src)
    m = np.array([[0, 2], [3, 1]], np.int64)
    vt.swap_blocks(src[:, 1], dst[:, 1], 32, m)
    want = ref_swap_bytes(src.reshape(-1), 32, 64, np.zeros(src.size, np.uint8), 32, 64, 32, m).reshape(src.shape)
    assert np.array_equal(dst, want)
    assert np.array_equal(dst[2, 1], src[0, 1]) and np.array_equal(dst[1, 1], src[3, 1]) and not dst[:, 0].any()


@pytest.mark.parametrize("half", [0, 1])
def test_swap_blocks_torch_halves_into_a_packed_cache(half):
    """K or V half of a flash-layout torch cache into a separate packed cache and back, also through
    torch.ops.vtinfer.swap_blocks: block strides differ between src (the pair) and dst (one half)."""
    import vtinfer.torch  # noqa: F401  (registers torch.ops.vtinfer)

    kv = torch.randn(6, 2, 4, 2, 8).to(torch.bfloat16)
    packed = torch.zeros(5, 4, 2, 8, dtype=torch.bfloat16)
    m = torch.tensor([[5, 0], [1, 4], [2, 2]], dtype=torch.int64)
    nbytes = packed.element_size() * packed.stride(0)
    torch.ops.vtinfer.swap_blocks(kv[:, half], packed, nbytes, m)
    as_u8 = kv.view(torch.uint8).reshape(-1).numpy()
    want = ref_swap_bytes(as_u8, half * nbytes, 2 * nbytes, np.zeros(packed.numel() * 2, np.uint8), 0, nbytes,
                          nbytes, m.numpy())
    assert np.array_equal(packed.view(torch.uint8).reshape(-1).numpy(), want)
    back = torch.zeros_like(kv)
    vt.swap_blocks(packed, back[:, half], nbytes, m[:, [1, 0]])
    for s, d in m.tolist():
        assert torch.equal(back[s, half], kv[s, half])
    assert not back[:, 1 - half].any()


def test_swap_blocks_padded_blocks_copy_the_given_bytes():
    """Blocks padded for alignment (stride(0) past the block's bytes), as vLLM's kernel addresses them."""
    buf = np.random.default_rng(5).integers(0, 255, (5, 48), dtype=np.uint8)
    src = buf[:, :40]  # 40 bytes of data, 48 apart
    dst_buf = np.zeros((7, 64), np.uint8)
    m = np.array([[4, 6], [0, 0], [2, 3]], np.int64)
    vt.swap_blocks(src, dst_buf[:, 8:48], 40, m)
    want = ref_swap_bytes(buf.reshape(-1), 0, 48, np.zeros(dst_buf.size, np.uint8), 8, 64, 40, m)
    assert np.array_equal(dst_buf.reshape(-1), want)


# ----------------------------------------------------------------- convert_fp8


@pytest.mark.parametrize("fmt", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
def test_convert_fp8_both_directions_match_ml_dtypes(isa, fmt, src):
    rng = np.random.default_rng(2)
    name = "fp8_e4m3" if fmt == "fp8" else fmt
    scale = 0.37
    x = (rng.standard_normal((6, 4, 33)) * 40).astype(np.float32).astype(FLOATS[src])
    codes = np.zeros(x.shape, np.uint8)
    vt.convert_fp8(codes, x, scale, fmt)
    fmax = float(ml_dtypes.finfo(FP8[name]).max)
    q = np.clip(x.astype(np.float32) / np.float32(scale), -fmax, fmax)  # torch/ml_dtypes casts do not saturate
    assert np.array_equal(codes, q.astype(FP8[name]).view(np.uint8))
    back = np.zeros(x.shape, FLOATS[src])
    vt.convert_fp8(back, codes, scale, fmt)
    ref = (codes.view(FP8[name]).astype(np.float32) * np.float32(scale)).astype(FLOATS[src])
    assert np.array_equal(back.view(np.uint8), ref.view(np.uint8))


def test_convert_fp8_torch_float8_and_auto():
    x = torch.randn(3, 5, 16) * 10
    c = torch.empty(3, 5, 16, dtype=torch.float8_e4m3fn)
    vt.convert_fp8(c, x, torch.tensor(0.5))
    ref = (x / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(c.view(torch.uint8), ref.view(torch.uint8))
    h = torch.empty(3, 5, 16, dtype=torch.bfloat16)
    vt.convert_fp8(h, x, 1.0, "auto")  # float -> float: a plain conversion
    assert torch.equal(h, x.to(torch.bfloat16))


# ------------------------------------------------------------------- gathers


def ref_gather(src, block_table, cu, seq_starts, token_to_seq, num_tokens, dst_rows):
    """Row t of the result: the entry token t names, or None for a skipped token."""
    bs = src.shape[1]
    rows = [None] * dst_rows
    for t in range(num_tokens):
        b = int(token_to_seq[t])
        if t >= cu[b + 1]:
            continue
        pos = t - int(cu[b]) + (0 if seq_starts is None else int(seq_starts[b]))
        rows[t] = src[block_table[b, pos // bs], pos % bs]
    return rows


def batch(rng, NB, BS, lens, starts=None):
    B = len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    need = [(l + (0 if starts is None else starts[i]) + BS - 1) // BS for i, l in enumerate(lens)]
    bt = np.stack([rng.permutation(NB)[: max(need) + 1] for _ in range(B)]).astype(np.int32)
    tts = np.repeat(np.arange(B, dtype=np.int32), lens)
    return cu, bt, tts


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dst_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("with_starts", [False, True])
def test_gather_and_maybe_dequant_cache_fp8_matches_ml_dtypes(isa, kv_dtype, dst_dtype, with_starts):
    rng = np.random.default_rng(3)
    NB, BS, H, D = 40, 16, 2, 72
    src = cache_array(rng, (NB, BS, H, D), kv_dtype)
    lens = [17, 0, 40, 5]
    starts = np.array([3, 0, 16, 31], np.int32) if with_starts else None
    cu, bt, tts = batch(rng, NB, BS, lens, starts)
    T = int(cu[-1])
    pad = 3  # rows past the tokens (token_to_seq names the last sequence): skipped, untouched
    tts_p = np.concatenate([tts, np.full(pad, len(lens) - 1, np.int32)])
    dst = np.full((T + pad, H, D), 7.0, np.float32).astype(FLOATS[dst_dtype])
    scale = 0.25
    vt.gather_and_maybe_dequant_cache(src, dst, bt, cu, tts_p, T + pad, kv_dtype, np.float32(scale), starts)
    rows = ref_gather(src, bt, cu, starts, tts_p, T + pad, T + pad)
    for t, r in enumerate(rows):
        if r is None:
            assert np.all(dst[t].astype(np.float32) == 7.0)
            continue
        ref = (r.view(FP8[kv_dtype]).astype(np.float32) * np.float32(scale)).astype(FLOATS[dst_dtype])
        assert np.array_equal(dst[t].view(np.uint8), ref.view(np.uint8)), t


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cp_gather_cache_copies_bytes_with_any_seq_start(kv_dtype, layout):
    rng = np.random.default_rng(4)
    NB, BS, H, D = 30, 8, 3, 16
    src = cache_array(rng, (NB, BS, H, D), kv_dtype)
    if layout == "HND":  # an HND cache seen as [NB, BS, H, D]: entry rows strided by block_size * D
        src = np.ascontiguousarray(src.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    lens = [9, 20, 1]
    starts = np.array([5, 0, 7], np.int32)  # not block multiples
    cu, bt, tts = batch(rng, NB, BS, lens, starts)
    dst = np.zeros((int(cu[-1]) + 2, H, D), src.dtype)
    vt.cp_gather_cache(src, dst, bt, cu, len(lens), starts)
    rows = ref_gather(src, bt, cu, starts, tts, int(cu[-1]), int(cu[-1]))
    for t, r in enumerate(rows):
        assert np.array_equal(dst[t].view(np.uint8), np.ascontiguousarray(r).view(np.uint8)), t
    assert not dst[int(cu[-1]):].view(np.uint8).any()


def test_gather_auto_and_torch_mla_entries():
    """vLLM's MLA shape: [num_blocks, block_size, 576] entries, torch tensors."""
    g = torch.Generator().manual_seed(0)
    src = torch.randn(16, 16, 576, generator=g)
    lens = torch.tensor([20, 33], dtype=torch.int32)
    cu = torch.zeros(3, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    bt = torch.stack([torch.randperm(16, generator=g) for _ in range(2)]).to(torch.int32)
    tts = torch.repeat_interleave(torch.arange(2, dtype=torch.int32), lens)
    dst = torch.zeros(53, 576)
    vt.gather_and_maybe_dequant_cache(src, dst, bt, cu, tts, 53, "auto", torch.tensor(1.0))
    for b in range(2):
        for i in range(int(lens[b])):
            assert torch.equal(dst[int(cu[b]) + i], src[bt[b, i // 16], i % 16])


# --------------------------------------------------------------- merge_attn_states


def ref_merge(po, pl, so, sl, ptc=None):
    """float64 LSE merge with vLLM's +inf -> -inf rule and empty rows -> 0 / -inf."""
    T = po.shape[0]
    ptc = T if ptc is None else ptc
    p = np.where(pl == np.inf, -np.inf, pl.astype(np.float64))
    s = np.where(sl == np.inf, -np.inf, sl.astype(np.float64))
    m = np.maximum(p, s)
    empty = m == -np.inf
    ms = np.where(empty, 0.0, m)
    a, b = np.exp(p - ms), np.exp(s - ms)
    with np.errstate(invalid="ignore", divide="ignore"):
        wa, wb = np.where(empty, 0, a / (a + b)), np.where(empty, 0, b / (a + b))
        lse = np.where(empty, -np.inf, np.log(a + b) + ms)
    out = po.astype(np.float64) * wa.T[:, :, None] + so.astype(np.float64) * wb.T[:, :, None]
    out[ptc:] = so[ptc:].astype(np.float64)
    lse[:, ptc:] = sl[:, ptc:]
    return out, lse


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("ptc", [None, 5])
def test_merge_attn_states_matches_float64(isa, dtype, ptc):
    rng = np.random.default_rng(5)
    T, H, D = 13, 4, 40
    po = rng.standard_normal((T, H, D)).astype(FLOATS[dtype])
    so = rng.standard_normal((T, H, D)).astype(FLOATS[dtype])
    pl = (rng.standard_normal((H, T)) * 3).astype(np.float32)
    sl = (rng.standard_normal((H, T)) * 3).astype(np.float32)
    pl[0, 1] = np.inf  # FA2's empty prefix
    sl[1, 2] = np.inf  # FA2's empty suffix
    pl[2, 3] = -np.inf  # FA3's empty prefix
    pl[3, 4] = sl[3, 4] = -np.inf  # both empty
    pl[0, 6] = sl[0, 6] = np.inf  # both empty, FA2
    out = np.full((T, H, D), 9, FLOATS[dtype])
    ol = np.zeros((H, T), np.float32)
    vt.merge_attn_states(out, po, pl, so, sl, ol, ptc)
    ref, lref = ref_merge(po, pl, so, sl, ptc)
    # float32 arithmetic rounded to the output dtype: half an output ulp + float32 units
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    tol = np.abs(ref) * ulp + 8 * 2.0**-24 * np.abs(ref).max()
    assert np.all(np.abs(out.astype(np.float64) - ref) <= tol)
    assert not out[4, 3].any() and (ptc is not None or not out[6, 0].any())  # both empty: zeros
    fin = np.isfinite(lref)
    assert np.array_equal(np.isfinite(ol), fin) and np.all(ol[~fin] == lref[~fin])
    assert np.all(np.abs(ol[fin] - lref[fin]) <= 4 * 2.0**-23 * np.maximum(np.abs(lref[fin]), 1))


def test_merge_attn_states_strided_lse_and_fp8_output():
    """A transposed [T, H] LSE view (vLLM indexes LSEs by strides) and an fp8 output with output_scale."""
    rng = np.random.default_rng(6)
    T, H, D = 9, 3, 32
    po = torch.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32)).to(torch.bfloat16)
    so = torch.from_numpy(rng.standard_normal((T, H, D)).astype(np.float32)).to(torch.bfloat16)
    pl = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).T  # [H, T] view, strides (1, H)
    sl = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).T
    out = torch.zeros(T, H, D, dtype=torch.float8_e4m3fn)
    vt.merge_attn_states(out, po, pl, so, sl, output_scale=torch.tensor([0.05]))
    ref, _ = ref_merge(po.float().numpy(), pl.numpy(), so.float().numpy(), sl.numpy())
    codes = np.clip(ref / 0.05, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    got = out.float().numpy().astype(np.float64)
    # one fp8 step at most (float32 rounding of the merged value before the encode)
    step = np.maximum(np.abs(codes), 2.0**-6) * 2.0**-3
    assert np.all(np.abs(got - codes) <= step)
    assert np.mean(got == codes) > 0.95
