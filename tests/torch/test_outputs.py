"""Outputs follow the caller's framework: torch tensors in give torch
tensors out (the dtype vLLM's op gives, zero-copy), NumPy in gives NumPy
out, and ``out=`` returns the caller's own object for both.

Values are checked against torch's own casts (fp8, bfloat16), the float64
attention oracle, or the NumPy call on the same data (the conversion must
not change a byte)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import check_close, make_case
from tests.torch._util import TORCH_REASON, as_numpy, as_torch

torch = pytest.importorskip("torch", reason=TORCH_REASON)

FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
FLOAT = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}


def values(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)


# ---- fp8_quantize ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_quantize_torch_in_float8_out(fmt, src):
    x = torch.from_numpy(values()).to(src).reshape(64, 64)
    tdt, mx = FP8["e5m2" if "e5m2" in fmt else "e4m3"]
    got = vt.fp8_quantize(x, 0.5, fmt)
    assert isinstance(got, torch.Tensor) and got.dtype == tdt and got.shape == x.shape and got.device == x.device
    want = (x.float() / 0.5).clamp(-mx, mx).to(tdt)  # torch's own cast (RNE), clamped: vLLM's saturation
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_fp8_quantize_numpy_in_numpy_out():
    got = vt.fp8_quantize(values(), 0.5)
    assert type(got) is np.ndarray and got.dtype == np.uint8


@pytest.mark.parametrize("out_dtype", ["uint8", "float8_e4m3fn"])
def test_fp8_quantize_torch_out_is_returned_as_itself(out_dtype):
    x = torch.from_numpy(values(256))
    out = torch.zeros(256, dtype=getattr(torch, out_dtype))
    got = vt.fp8_quantize(x, 2.0, out=out)
    assert got is out
    assert torch.equal(out.view(torch.uint8), (x / 2.0).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


def test_fp8_quantize_numpy_out_with_torch_input():
    x = torch.from_numpy(values(256))
    out = np.zeros(256, np.uint8)
    assert vt.fp8_quantize(x, out=out) is out


ZERO_COPY = {
    "fp8_quantize": lambda: vt.fp8_quantize(torch.ones(8)),
    "fp8_dequantize_bf16": lambda: vt.fp8_dequantize(torch.ones(8, dtype=torch.uint8), dtype=torch.bfloat16),
    "convert_f16": lambda: vt.convert(torch.ones(8), torch.float16),
}


@pytest.mark.parametrize("name", list(ZERO_COPY))
def test_outputs_are_zero_copy(monkeypatch, name):
    """The tensor is the C core's array itself (DLPack), not a copy of it."""
    seen = {}
    fn = name.rsplit("_", 1)[0] if name != "fp8_quantize" else name
    real = getattr(vt._C, fn)

    def spy(*a, **k):
        seen["a"] = real(*a, **k)
        return seen["a"]

    monkeypatch.setattr(vt._C, fn, spy)
    got = ZERO_COPY[name]()
    assert got.data_ptr() == seen["a"].ctypes.data


# ---- fp8_dequantize -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, None])
@pytest.mark.parametrize("codes_as", ["float8", "uint8"])
def test_fp8_dequantize_torch_in_torch_out(fmt, dtype, codes_as):
    tdt, _ = FP8[fmt]
    codes = torch.arange(256, dtype=torch.uint8).view(tdt)
    arg = codes if codes_as == "float8" else codes.view(torch.uint8)
    kw = {} if dtype is None else {"dtype": dtype}
    got = vt.fp8_dequantize(arg, 0.25, fmt, **kw)
    want_dt = dtype or torch.float32
    assert isinstance(got, torch.Tensor) and got.dtype == want_dt and got.shape == (256,)
    want = (codes.float() * 0.25).to(want_dt)  # exact decode, one float32 multiply, RNE to dtype
    assert torch.equal(got.isnan(), want.isnan())
    fin = ~want.isnan()
    assert torch.equal(got[fin], want[fin])


def test_fp8_dequantize_numpy_dtype_keeps_working_for_torch_codes():
    got = vt.fp8_dequantize(torch.zeros(4, dtype=torch.uint8), dtype=ml_dtypes.bfloat16)
    assert got.dtype == torch.bfloat16


def test_fp8_dequantize_out():
    codes = torch.arange(16, dtype=torch.uint8)
    out = torch.empty(16, dtype=torch.bfloat16)
    assert vt.fp8_dequantize(codes, 1.0, "e4m3", torch.bfloat16, out=out) is out
    assert torch.equal(out, codes.view(torch.float8_e4m3fn).float().to(torch.bfloat16))
    nout = np.empty(16, np.float32)
    assert vt.fp8_dequantize(codes.numpy(), out=nout) is nout


def test_fp8_dequantize_numpy_in_numpy_out():
    got = vt.fp8_dequantize(np.arange(16, dtype=np.uint8), dtype=ml_dtypes.bfloat16)
    assert type(got) is np.ndarray and got.dtype == ml_dtypes.bfloat16


def test_a_torch_dtype_vtinfer_cannot_make_is_refused_by_name():
    with pytest.raises(TypeError, match="fp8_dequantize: dtype must be"):
        vt.fp8_dequantize(torch.zeros(4, dtype=torch.uint8), dtype=torch.float64)


# ---- convert ---------------------------------------------------------------------


@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.bfloat16])
def test_convert_torch_in_torch_out(src, dst):
    x = torch.from_numpy(values()).to(src)
    got = vt.convert(x, dst)
    assert isinstance(got, torch.Tensor) and got.dtype == dst
    assert torch.equal(got, x.to(dst))  # torch's own RNE conversion


def test_convert_numpy_in_numpy_out():
    assert vt.convert(values(), ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16


# ---- flash_attn_varlen_func ----------------------------------------------------------


def attention_case(q_dtype="bfloat16", kv="auto", kv_float="bfloat16", layout="NHD", seed=0):
    rng = np.random.default_rng(seed)
    return make_case(rng, q_lens=[1, 5], k_lens=[37, 9], H=4, Hkv=2, D=32, block_size=16, q_dtype=q_dtype,
                     kv_cache_dtype=kv, kv_float=kv_float, layout=layout)


@pytest.mark.parametrize("q_dtype,kv,kv_float", [("bfloat16", "auto", "bfloat16"), ("float16", "auto", "float16"),
                                                 ("float32", "auto", "float32"), ("bfloat16", "fp8_e4m3", None),
                                                 ("float32", "fp8_e5m2", None)])
def test_flash_attn_torch_in_torch_out(q_dtype, kv, kv_float):
    args = attention_case(q_dtype, kv, kv_float or "float32")
    q, k, v, cu, sk, bt = (as_torch(torch, a) for a in args)
    kw = {"kv_cache_dtype": kv}
    out, lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (q.shape[1], q.shape[0])
    check_close(as_numpy(out), as_numpy(lse), args, kw, what=f"torch {q_dtype} {kv}")
    only = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, **kw)
    assert isinstance(only, torch.Tensor) and torch.equal(only.view(torch.uint8), out.view(torch.uint8))


def test_flash_attn_numpy_in_numpy_out():
    q, k, v, cu, sk, bt = attention_case()
    out, lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True)
    assert type(out) is np.ndarray and out.dtype == ml_dtypes.bfloat16 and type(lse) is np.ndarray


def test_flash_attn_torch_out_is_returned_as_itself():
    args = attention_case()
    q, k, v, cu, sk, bt = (as_torch(torch, a) for a in args)
    out = torch.zeros_like(q)
    got, lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, out=out,
                                         return_lse=True)
    assert got is out and isinstance(lse, torch.Tensor)
    check_close(as_numpy(out), as_numpy(lse), args, {}, what="torch out=")
    assert vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, out=out) is out


# ---- PagedKVCache --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "fp8_e4m3"])
def test_paged_cache_gather_and_attention_follow_torch(dtype):
    cache = vt.PagedKVCache(1, 8, 16, 2, 32, dtype, k_scale=0.5, v_scale=0.25)
    rng = np.random.default_rng(3)
    k, v = (torch.from_numpy(a) for a in rng.standard_normal((2, 20, 2, 32), dtype=np.float32))
    slots = torch.arange(20)
    cache.store(0, k, v, slots)
    gk, gv = cache.gather(0, slots)
    assert isinstance(gk, torch.Tensor) and gk.dtype == torch.float32 and gk.shape == k.shape
    nk, nv = cache.gather(0, slots.numpy())
    assert type(nk) is np.ndarray
    assert np.array_equal(gk.numpy(), nk) and np.array_equal(gv.numpy(), nv)
    if dtype == "float32":
        assert torch.equal(gk, k) and torch.equal(gv, v)
    q = torch.from_numpy(rng.standard_normal((1, 4, 32), dtype=np.float32)).to(torch.bfloat16)
    kw = dict(cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32), seqused_k=torch.tensor([20], dtype=torch.int32),
              block_table=torch.tensor([[0, 1]], dtype=torch.int32))
    out = cache.attention(0, q, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    nout = cache.attention(0, as_numpy(q), **{n: t.numpy() for n, t in kw.items()})
    assert type(nout) is np.ndarray
    assert np.array_equal(as_numpy(out).view(np.uint16), nout.view(np.uint16))


def test_flash_attn_fp8_query_and_return_softmax_lse_follow_torch():
    """An fp8 torch q (FlashAttention-3) gives a torch bfloat16 out; return_softmax_lse a torch float32 LSE."""
    args = attention_case("float32", "fp8_e4m3")
    q, k, v, cu, sk, bt = (as_torch(torch, a) for a in args)
    q8 = q.to(torch.float8_e4m3fn)
    out, lse = vt.flash_attn_varlen_func(q8, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                         kv_cache_dtype="fp8_e4m3", q_descale=torch.tensor(0.5),
                                         return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    ref_args = (as_numpy(q8.float().to(torch.bfloat16)), *args[1:])
    check_close(as_numpy(out), as_numpy(lse), ref_args, {"kv_cache_dtype": "fp8_e4m3", "k_descale": np.float32(0.5)},
                what="fp8 q torch")
