"""vLLM's cache ops as torch.ops.vtinfer: each op's
result against a reference written with torch's own indexing and casts,
then ``torch.library.opcheck`` over every KV dtype vtinfer stores (NHD and
HND where the op reads a paged cache). Outputs start from fresh tensors
before opcheck: its schema check sees a mutation only where bytes change."""

from __future__ import annotations

import pytest

from tests.torch._util import TORCH_REASON

torch = pytest.importorskip("torch", reason=TORCH_REASON)
import vtinfer.torch  # noqa: E402,F401

ops = torch.ops.vtinfer
opcheck = torch.library.opcheck
FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
PLAIN = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
KV_DTYPES = [*PLAIN, *FP8]
NB, BS, H, D = 10, 4, 2, 16


def gen(seed):
    return torch.Generator().manual_seed(seed)


def cache(kv_dtype, layout="NHD", seed=0):
    """[NB, BS, H, D] random finite contents (fp8: uint8 codes, as vLLM keeps them); HND as a permuted view."""
    x = torch.randn(NB, H, BS, D, generator=gen(seed)).transpose(1, 2) if layout == "HND" else \
        torch.randn(NB, BS, H, D, generator=gen(seed))
    if kv_dtype in FP8:
        return x.to(FP8[kv_dtype][0]).view(torch.uint8)
    return x.to(PLAIN[kv_dtype])


def decode(codes, kv_dtype):
    return codes.view(FP8[kv_dtype][0]).float()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_swap_blocks(kv_dtype):
    src = cache(kv_dtype)
    mapping = torch.tensor([[3, 0], [9, 4], [0, 9]], dtype=torch.int64)
    nbytes = src.element_size() * src.stride(0)
    dst = torch.zeros_like(src)
    ops.swap_blocks(src, dst, nbytes, mapping)
    want = torch.zeros_like(src)
    for s, d in mapping.tolist():
        want[d] = src[s]
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))
    opcheck(ops.swap_blocks, (src, torch.zeros_like(src), nbytes, mapping))


def test_swap_blocks_kv_views_of_one_allocation():
    """vLLM's (num_blocks, 2, ...) cache: kv[:, 0] with stride(0) bytes per block moves K and V together."""
    kv = torch.randn(NB, 2, BS, H, D, generator=gen(1)).to(torch.bfloat16)
    out = torch.zeros_like(kv)
    mapping = torch.tensor([[9, 1], [2, 7]], dtype=torch.int64)
    nbytes = kv[:, 0].element_size() * kv[:, 0].stride(0)
    ops.swap_blocks(kv[:, 0], out[:, 0], nbytes, mapping)
    assert torch.equal(out[1], kv[9]) and torch.equal(out[7], kv[2])
    assert not out[[0, 2, 3, 4, 5, 6, 8, 9]].any()


@pytest.mark.parametrize("fmt", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("src", list(PLAIN))
def test_convert_fp8_both_directions(fmt, src):
    name = "fp8_e4m3" if fmt == "fp8" else fmt
    tdt, mx = FP8[name]
    x = (torch.randn(6, H, D, generator=gen(2)) * 40).to(PLAIN[src])
    codes = torch.zeros(x.shape, dtype=torch.uint8)
    ops.convert_fp8(codes, x, 0.37, fmt)
    assert torch.equal(codes, (x.float() / 0.37).clamp(-mx, mx).to(tdt).view(torch.uint8))
    back = torch.zeros(x.shape, dtype=PLAIN[src])
    ops.convert_fp8(back, codes, 0.37, fmt)
    assert torch.equal(back, (decode(codes, name) * 0.37).to(PLAIN[src]))
    opcheck(ops.convert_fp8, (torch.zeros_like(codes), x, 0.37, fmt))
    opcheck(ops.convert_fp8, (torch.zeros_like(back), codes, 0.37, fmt))


def batch(lens, starts, seed):
    g = gen(seed)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens_t, 0)
    bt = torch.stack([torch.randperm(NB, generator=g)[:6] for _ in lens]).to(torch.int32)
    tts = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32), lens_t)
    return cu, bt, tts, torch.tensor(starts, dtype=torch.int32)


def entry(src, bt, b, pos):
    return src[int(bt[b, pos // BS]), pos % BS]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_e4m3", "fp8_e5m2"])
def test_gather_and_maybe_dequant_cache(kv_dtype, layout):
    src = cache("bfloat16" if kv_dtype == "auto" else kv_dtype, layout, seed=3)
    lens, starts = [5, 0, 7], [2, 0, 9]
    cu, bt, tts, st = batch(lens, starts, 4)
    T = int(cu[-1])
    dst = torch.full((T, H, D), 7.0, dtype=torch.bfloat16)
    scale = torch.tensor(0.25)
    ops.gather_and_maybe_dequant_cache(src, dst, bt, cu, tts, T, kv_dtype, scale, st)
    for b, n in enumerate(lens):
        for i in range(n):
            e = entry(src, bt, b, i + starts[b])
            want = e if kv_dtype == "auto" else (decode(e, kv_dtype) * 0.25).to(torch.bfloat16)
            assert torch.equal(dst[int(cu[b]) + i], want), (b, i)
    fresh = torch.full_like(dst, 7.0)
    opcheck(ops.gather_and_maybe_dequant_cache, (src, fresh, bt, cu, tts, T, kv_dtype, scale, st))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_cp_gather_cache(kv_dtype, layout):
    src = cache(kv_dtype, layout, seed=5)
    lens, starts = [3, 9], [5, 1]
    cu, bt, _, st = batch(lens, starts, 6)
    dst = torch.zeros((int(cu[-1]) + 1, H, D), dtype=src.dtype)
    ops.cp_gather_cache(src, dst, bt, cu, len(lens), st)
    for b, n in enumerate(lens):
        for i in range(n):
            assert torch.equal(dst[int(cu[b]) + i], entry(src, bt, b, i + starts[b])), (b, i)
    assert not dst[-1].view(torch.uint8).any()
    opcheck(ops.cp_gather_cache, (src, torch.zeros_like(dst), bt, cu, len(lens), st))


def ref_merge(po, pl, so, sl):
    """float64 log-sum-exp merge; +inf read as -inf (an empty row), both empty -> 0 and -inf."""
    p = torch.where(pl == float("inf"), float("-inf"), pl.double())
    s = torch.where(sl == float("inf"), float("-inf"), sl.double())
    m = torch.maximum(p, s)
    ms = torch.where(m == float("-inf"), 0.0, m)
    a, b = torch.exp(p - ms), torch.exp(s - ms)
    z = a + b
    wa = torch.where(z > 0, a / z, 0.0).T[:, :, None]
    wb = torch.where(z > 0, b / z, 0.0).T[:, :, None]
    return po.double() * wa + so.double() * wb, torch.log(z) + ms


@pytest.mark.parametrize("with_lse", [True, False])
@pytest.mark.parametrize("dtype", list(PLAIN))
def test_merge_attn_states(dtype, with_lse):
    g = gen(7)
    T = 6
    po, so = (torch.randn(T, H, D, generator=g).to(PLAIN[dtype]) for _ in range(2))
    pl, sl = (torch.randn(H, T, generator=g) * 3 for _ in range(2))
    pl[0, 1] = float("inf")  # FlashAttention-2's empty prefix
    pl[1, 2] = sl[1, 2] = float("-inf")  # both empty
    out = torch.zeros(T, H, D, dtype=PLAIN[dtype])
    lse = torch.zeros(H, T) if with_lse else None
    ops.merge_attn_states(out, po, pl, so, sl, lse)
    ref, lref = ref_merge(po, pl, so, sl)
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    tol = ref.abs() * ulp + 8 * 2.0**-24 * ref.abs().max()
    assert bool(((out.double() - ref).abs() <= tol).all())
    assert not out[2, 1].any()
    if with_lse:
        fin = torch.isfinite(lref)
        assert torch.equal(torch.isfinite(lse), fin) and bool((lse[~fin] == lref[~fin]).all())
        assert bool(((lse.double()[fin] - lref[fin]).abs() <= 4 * 2.0**-23 * lref[fin].abs().clamp(min=1)).all())
    opcheck(ops.merge_attn_states, (torch.zeros_like(out), po, pl, so, sl, torch.zeros(H, T) if with_lse else None))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_e5m2", "fp8_ds_mla"])
def test_concat_and_cache_mla(kv_cache_dtype):
    """Each entry against torch's own concatenation and casts (fp8_ds_mla: the tile scales and the
    rope bytes from their definition), padded slots untouched; then opcheck."""
    g = gen(8)
    T, rank, pe, nb, bs = 5, 512, 64, 3, 4
    kv_c = torch.randn(T, rank, generator=g).to(torch.bfloat16)
    k_pe = torch.randn(T, pe, generator=g).to(torch.bfloat16)
    slots = torch.tensor([7, -1, 0, 11, 3])
    width, cdt = {"auto": (rank + pe, torch.bfloat16), "fp8_ds_mla": (656, torch.uint8)}.get(
        kv_cache_dtype, (rank + pe, torch.uint8))
    kv = torch.zeros(nb, bs, width, dtype=cdt)
    ops.concat_and_cache_mla(kv_c, k_pe, kv, slots, kv_cache_dtype, torch.tensor(0.25))
    flat = kv.view(nb * bs, width)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        e = flat[s]
        if kv_cache_dtype == "auto":
            assert torch.equal(e, torch.cat([kv_c[t], k_pe[t]]))
        elif kv_cache_dtype == "fp8_ds_mla":
            tiles = kv_c[t].float().view(4, 128)
            sc = (tiles.abs().amax(1) / 448).clamp(min=torch.finfo(torch.float32).tiny)
            assert torch.equal(e[512:528].view(torch.float32), sc)
            assert torch.equal(e[:512].view(torch.float8_e4m3fn).float(), (tiles / sc[:, None]).to(
                torch.float8_e4m3fn).float().view(-1))
            assert torch.equal(e[528:].view(torch.bfloat16), k_pe[t])
        else:
            f8 = FP8["fp8_e5m2" if kv_cache_dtype == "fp8_e5m2" else "fp8_e4m3"][0]
            want = (torch.cat([kv_c[t], k_pe[t]]).float() / 0.25).to(f8).view(torch.uint8)
            assert torch.equal(e, want)
    assert not flat[[1, 2, 4, 5, 6, 8, 9, 10]].any()
    opcheck(ops.concat_and_cache_mla, (kv_c, k_pe, torch.zeros_like(kv), slots, kv_cache_dtype, torch.tensor(0.25)))


def test_mask_empty_context_lse():
    lse = torch.randn(3, 9, generator=gen(9))
    want = lse.clone()
    want[:, 4:8] = float("-inf")
    qsl = torch.tensor([0, 4, 8, 8, 9], dtype=torch.int32)
    csl = torch.tensor([0, 2, 2, 2, 5], dtype=torch.int32)  # request 2 is empty both ways
    ops.mask_empty_context_lse(lse, qsl, csl)
    assert torch.equal(lse, want)
    opcheck(ops.mask_empty_context_lse, (torch.randn(3, 9, generator=gen(10)), qsl, csl))
