"""torch.ops.vtinfer: schemas name the mutated arguments, fake
implementations give shapes and dtypes without computing, and
``torch.library.opcheck`` (schema, autograd registration, fake tensor,
AOT dispatch with dynamic shapes) passes over the grid: every KV dtype,
NHD and HND, fp8 with per-tensor and per-head scales. The ops' values are
checked against independent references (torch's own fp8 cast, the float64
attention oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.numerics.test_attention_oracle import check_close, make_case
from tests.torch._util import TORCH_REASON, as_numpy, as_torch, vllm_pth_page

torch = pytest.importorskip("torch", reason=TORCH_REASON)
import vtinfer as vt  # noqa: E402
import vtinfer.torch  # noqa: E402,F401  (registers torch.ops.vtinfer)

ops = torch.ops.vtinfer
opcheck = torch.library.opcheck
FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
PLAIN = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (kv dtype, scale kind): every KV dtype; fp8 with per-tensor and per-head scales
KV_GRID = [(d, "tensor") for d in PLAIN] + [(d, s) for d in FP8 for s in ("tensor", "head")]
KV_IDS = [f"{d}-{s}" for d, s in KV_GRID]
HKV, D, BS = 2, 16, 4


def schema(op) -> str:
    return str(op.default._schema)


def test_schemas_name_the_mutated_arguments():
    for name in ("reshape_and_cache_flash", "reshape_and_cache"):
        s = schema(getattr(ops, name))
        assert "Tensor(a2!) key_cache" in s and "Tensor(a3!) value_cache" in s, s
        assert "Tensor key," in s and "Tensor value," in s and s.endswith("-> ()"), s
    for name in ("flash_attn_varlen_func", "fp8_quantize", "fp8_dequantize"):
        assert "!" not in schema(getattr(ops, name)), schema(getattr(ops, name))


def scales(kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "tensor":
        return torch.tensor(0.05), torch.tensor(0.02)
    return (torch.from_numpy(rng.uniform(0.01, 0.1, HKV).astype(np.float32)) for _ in range(2))


def caches(dtype, layout, num_blocks=6):
    tdt = torch.uint8 if dtype in FP8 else PLAIN[dtype]  # vLLM keeps fp8 caches as uint8
    if layout == "NHD":
        return torch.zeros(num_blocks, BS, HKV, D, dtype=tdt), torch.zeros(num_blocks, BS, HKV, D, dtype=tdt)
    # HND: [num_blocks, H_kv, block_size, D] memory seen as NHD, as vLLM's FlashAttention backend passes it
    return (torch.zeros(num_blocks, HKV, BS, D, dtype=tdt).transpose(1, 2),
            torch.zeros(num_blocks, HKV, BS, D, dtype=tdt).transpose(1, 2))


def expected_rows(x, dtype, scale):
    """What one stored row must hold: the value itself, or torch's fp8 cast of x / scale (clamped)."""
    if dtype in FP8:
        tdt, mx = FP8[dtype]
        s = scale.reshape(-1, 1) if scale.dim() else scale
        return (x.float() / s).clamp(-mx, mx).to(tdt).view(torch.uint8)
    return x.to(PLAIN[dtype])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype,kind", KV_GRID, ids=KV_IDS)
def test_reshape_and_cache_flash(dtype, kind, layout):
    g = torch.Generator().manual_seed(len(dtype) + len(kind))
    src = torch.bfloat16 if dtype in FP8 else PLAIN[dtype]
    key, value = (torch.randn(5, HKV, D, generator=g).to(src) for _ in range(2))
    kc, vc = caches(dtype, layout)
    slot = torch.tensor([3, 0, -1, 17, 9])  # -1: padding, skipped
    ks, vs = scales(kind, 1)
    kvd = "auto" if dtype in PLAIN else dtype
    ops.reshape_and_cache_flash(key, value, kc, vc, slot, kvd, ks, vs)
    for t, s in enumerate(slot.tolist()):
        if s < 0:
            continue
        assert torch.equal(kc[s // BS, s % BS], expected_rows(key[t], dtype, ks))
        assert torch.equal(vc[s // BS, s % BS], expected_rows(value[t], dtype, vs))
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 4  # nothing else written
    # fresh caches: opcheck's schema check sees a mutation only where bytes change
    opcheck(ops.reshape_and_cache_flash, (key, value, *caches(dtype, layout), slot, kvd, ks, vs))


@pytest.mark.parametrize("dtype,kind", KV_GRID, ids=KV_IDS)
def test_reshape_and_cache_x_split(dtype, kind):
    g = torch.Generator().manual_seed(7)
    src = torch.bfloat16 if dtype in FP8 else PLAIN[dtype]
    key, value = (torch.randn(3, HKV, D, generator=g).to(src) for _ in range(2))
    tdt = torch.uint8 if dtype in FP8 else PLAIN[dtype]
    x = 16 // (1 if dtype in FP8 else PLAIN[dtype].itemsize)
    kc = torch.zeros(4, HKV, D // x, BS, x, dtype=tdt)
    vc = torch.zeros(4, HKV, D, BS, dtype=tdt)
    slot = torch.tensor([5, 0, 14])
    ks, vs = scales(kind, 2)
    kvd = "auto" if dtype in PLAIN else dtype
    ops.reshape_and_cache(key, value, kc, vc, slot, kvd, ks, vs)
    for t, s in enumerate(slot.tolist()):
        b, o = divmod(s, BS)
        got_k = kc[b, :, :, o, :].reshape(HKV, D)
        assert torch.equal(got_k, expected_rows(key[t], dtype, ks))
        assert torch.equal(vc[b, :, :, o], expected_rows(value[t], dtype, vs))
    opcheck(ops.reshape_and_cache, (key, value, torch.zeros_like(kc), torch.zeros_like(vc), slot, kvd, ks, vs))


def attention_args(dtype, kind, layout, seed=0):
    fp8 = dtype in FP8
    args = make_case(np.random.default_rng(seed), q_lens=[1, 3], k_lens=[9, 5], H=4, Hkv=HKV, D=D, block_size=BS,
                     q_dtype="bfloat16" if fp8 else dtype, kv_cache_dtype=dtype if fp8 else "auto",
                     kv_float="float32" if fp8 else dtype, layout=layout, extra_blocks=1)
    q, k, v, cu, sk, bt = (as_torch(torch, a) for a in args)
    kw = {}
    if fp8:
        kw["kv_cache_dtype"] = dtype
        if kind == "tensor":
            kw["k_descale"], kw["v_descale"] = torch.tensor(0.5), torch.tensor(2.0)
        else:
            kw["k_descale"], kw["v_descale"] = torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.25])
    return args, (q, k, v, cu, sk, bt), kw


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype,kind", KV_GRID, ids=KV_IDS)
def test_flash_attn_varlen_func(dtype, kind, layout):
    np_args, targs, kw = attention_args(dtype, kind, layout)
    if layout == "HND":
        assert not targs[1].is_contiguous()  # the permuted view itself goes in
    out, lse = ops.flash_attn_varlen_func(*targs, **kw)
    assert out.dtype == targs[0].dtype and out.shape == targs[0].shape
    assert lse.dtype == torch.float32 and lse.shape == (targs[0].shape[1], targs[0].shape[0])
    np_kw = {n: (t.numpy() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    check_close(as_numpy(out), as_numpy(lse), np_args, np_kw, what=f"op {dtype} {kind} {layout}")
    opcheck(ops.flash_attn_varlen_func, targs, kw)


def test_flash_attn_options_pass_through():
    np_args, targs, _ = attention_args("float32", "tensor", "NHD", seed=4)
    kw = dict(softmax_scale=0.3, causal=False, window_left=3, window_right=1, softcap=2.0,
              alibi_slopes=torch.tensor([0.5, 0.25, 0.1, 0.0]), s_aux=torch.tensor([0.0, 1.0, -1.0, 2.0]))
    out, lse = ops.flash_attn_varlen_func(*targs, **kw)
    np_kw = {n: (t.numpy() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    np_kw["window_size"] = (np_kw.pop("window_left"), np_kw.pop("window_right"))
    check_close(out.numpy(), lse.numpy(), np_args, np_kw, what="options")
    opcheck(ops.flash_attn_varlen_func, targs, kw)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_fp8_quantize_op(fmt, src):
    tdt, mx = FP8["fp8_" + fmt]
    x = (torch.randn(6, 32, generator=torch.Generator().manual_seed(1)) * 300).to(src)
    got = ops.fp8_quantize(x, 0.5, fmt)
    assert got.dtype == tdt and got.shape == x.shape
    assert torch.equal(got.view(torch.uint8), (x.float() / 0.5).clamp(-mx, mx).to(tdt).view(torch.uint8))
    opcheck(ops.fp8_quantize, (x, 0.5, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_dequantize_op(fmt, dtype):
    tdt, _ = FP8["fp8_" + fmt]
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) < 0x7C]  # finite codes of both formats (opcheck compares with allclose)
    got = ops.fp8_dequantize(codes, 0.25, fmt, dtype)
    assert got.dtype == dtype and got.shape == codes.shape
    assert torch.equal(got, (codes.view(tdt).float() * 0.25).to(dtype))
    opcheck(ops.fp8_dequantize, (codes, 0.25, fmt, dtype))


def test_fake_impls_compute_nothing():
    """Under FakeTensorMode the ops give shapes and dtypes; no kernel runs (a kernel would need real data)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(7, 4, D, dtype=torch.bfloat16)
        kc = torch.empty(3, BS, HKV, D, dtype=torch.uint8)
        i32 = torch.empty(3, dtype=torch.int32)
        out, lse = ops.flash_attn_varlen_func(q, kc, kc, i32, i32[:2], torch.empty(2, 2, dtype=torch.int32),
                                              kv_cache_dtype="fp8_e4m3")
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((7, 4, D), torch.bfloat16, (4, 7), torch.float32)
        c = ops.fp8_quantize(torch.empty(5, 3), 1.0, "e5m2")
        assert (c.shape, c.dtype) == ((5, 3), torch.float8_e5m2)
        d = ops.fp8_dequantize(torch.empty(5, dtype=torch.uint8), 1.0, None, torch.float16)
        assert (d.shape, d.dtype) == ((5,), torch.float16)
        assert ops.reshape_and_cache_flash(q[:, :2], q[:, :2], kc, kc, i32, "fp8", torch.empty(()),
                                           torch.empty(())) is None


def _meta_calls():
    m = lambda *shape, dtype=torch.float32: torch.empty(*shape, dtype=dtype, device="meta")  # noqa: E731
    kc = lambda: m(3, BS, HKV, D, dtype=torch.uint8)  # noqa: E731
    i32 = lambda n: m(n, dtype=torch.int32)  # noqa: E731
    return {
        "reshape_and_cache_flash": ("key", lambda: ops.reshape_and_cache_flash(
            m(2, HKV, D), m(2, HKV, D), kc(), kc(), m(2, dtype=torch.int64), "fp8", m(()), m(()))),
        "flash_attn_varlen_func": ("q", lambda: ops.flash_attn_varlen_func(
            m(7, 4, D), kc(), kc(), i32(3), i32(2), m(2, 2, dtype=torch.int32), kv_cache_dtype="fp8_e4m3")),
        "fp8_quantize": ("x", lambda: ops.fp8_quantize(m(5, 3), 1.0, "e4m3")),
        "swap_blocks": ("src", lambda: ops.swap_blocks(kc(), kc(), BS * HKV * D, m(1, 2, dtype=torch.int64))),
        "convert_fp8": ("output", lambda: ops.convert_fp8(m(4, dtype=torch.uint8), m(4), 1.0, "fp8")),
    }


@pytest.mark.parametrize("name", sorted(_meta_calls()))
def test_meta_tensors_passed_eagerly_are_refused_by_name(name):
    """torch runs an op's fake implementation for meta tensors: an eager call on them must not return as if the
    op had run (a FakeTensor under tracing still passes: test_fake_impls_compute_nothing, opcheck)."""
    arg, call = _meta_calls()[name]
    with pytest.raises(ValueError, match=rf"^{name}: {arg} must be a CPU tensor with data; got a meta tensor"):
        call()


@pytest.mark.parametrize("codes_as", ["float8", "uint8"])
@pytest.mark.parametrize("kind", ["tensor", "head", "batch"])
def test_flash_attn_fp8_query_with_q_descale(kind, codes_as):
    """An fp8 q (FA3): logits from decode(q) * q_descale; out is bfloat16 (fake and real agree)."""
    np_args, targs, kw = attention_args("fp8_e4m3", "head", "NHD", seed=5)
    q = targs[0].float().to(torch.float8_e4m3fn)
    qd = {"tensor": torch.tensor(0.75), "head": torch.tensor([0.5, 2.0]),
          "batch": torch.tensor([[0.5, 2.0], [1.25, 0.625]])}[kind]
    qarg = q if codes_as == "float8" else q.view(torch.uint8)
    out, lse = ops.flash_attn_varlen_func(qarg, *targs[1:], **kw, q_descale=qd)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    # reference: decode(q) exactly (bfloat16 holds every e4m3 value), q_descale folded into k_descale
    ref_args = (as_numpy(q.float().to(torch.bfloat16)), *np_args[1:])
    kd = (kw["k_descale"].reshape(1, -1) * qd.reshape(-1, 1) if kind == "tensor" else
          kw["k_descale"].reshape(1, -1) * (qd.reshape(1, -1) if kind == "head" else qd))
    ref_kw = {"kv_cache_dtype": kw["kv_cache_dtype"], "k_descale": kd.expand(2, HKV).numpy(),
              "v_descale": kw["v_descale"].numpy()}
    check_close(as_numpy(out), as_numpy(lse), ref_args, ref_kw, what=f"fp8 q {kind} {codes_as}")
    # opcheck's schema check compares inputs with allclose, which torch 2.13 lacks for float8 on the CPU
    skip = ("test_schema",) if codes_as == "float8" else ()
    utils = [u for u in ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
             if u not in skip]
    opcheck(ops.flash_attn_varlen_func, (qarg, *targs[1:]), {**kw, "q_descale": qd}, test_utils=utils)


def test_flash_attn_packed_varlen():
    """Non-paged K/V (cu_seqlens_k): the same as a paged cache of block size 1 with the identity table."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(5, 4, D, generator=g)
    k, v = (torch.randn(12, HKV, D, generator=g) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 12], dtype=torch.int32)
    out, lse = ops.flash_attn_varlen_func(q, k, v, cu_q, None, None, cu_seqlens_k=cu_k)
    bt = np.array([[0, 1, 2, 3, 0, 0, 0, 0], [4, 5, 6, 7, 8, 9, 10, 11]], np.int32)
    paged = (q.numpy(), k.numpy()[:, None], v.numpy()[:, None], cu_q.numpy(), np.array([4, 8], np.int32), bt)
    check_close(out.numpy(), lse.numpy(), paged, {}, what="packed")
    opcheck(ops.flash_attn_varlen_func, (q, k, v, cu_q, None, None), {"cu_seqlens_k": cu_k})


@pytest.mark.parametrize("fmt", ["int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"])
def test_per_token_head_store_and_read_with_scale_caches(fmt):
    """The per-token-head formats through the ops: the store writes codes and scale caches (the schema marks
    both), equal to vt.reshape_and_cache_flash's bytes; the read takes the scale caches; opcheck accepts both."""
    nb, bs, hkv, d, n = 3, 16, 2, 64, 20
    code = torch.int8 if fmt == "int8_per_token_head" else torch.uint8
    row = d // 2 if fmt == "int4_per_token_head" else d
    g = torch.Generator().manual_seed(1)
    key, value = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    slot = torch.randperm(nb * bs, generator=g)[:n].to(torch.int64)

    def fresh():
        return (torch.zeros(nb, bs, hkv, row, dtype=code), torch.zeros(nb, bs, hkv, row, dtype=code),
                torch.ones(nb, bs, hkv), torch.ones(nb, bs, hkv))

    one = torch.ones(1)
    kc, vc, ks, vs = fresh()
    ops.reshape_and_cache_flash(key, value, kc, vc, slot, fmt, one, one, ks, vs)
    want = fresh()
    vt.reshape_and_cache_flash(key, value, *want[:2], slot, fmt, one, one, k_scale_cache=want[2],
                               v_scale_cache=want[3])
    for got, ref in zip((kc, vc, ks, vs), want):
        assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float32 else got,
                           ref.view(torch.uint8) if ref.dtype != torch.float32 else ref)
    assert not torch.equal(ks, torch.ones_like(ks))  # the scales were written
    s = schema(ops.reshape_and_cache_flash)
    assert "Tensor(a8!)? k_scale_cache" in s and "Tensor(a9!)? v_scale_cache" in s, s
    opcheck(ops.reshape_and_cache_flash, (key, value, *fresh()[:2], slot, fmt, one, one, *fresh()[2:]))
    q = torch.randn(2, 4, d, generator=g)
    cu, sk = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([n, 5], dtype=torch.int32)
    bt = torch.tensor([[0, 1, 2], [2, 0, 1]], dtype=torch.int32)  # unwritten slots hold codes 0, scale 1
    out, lse = ops.flash_attn_varlen_func(q, kc, vc, cu, sk, bt, kv_cache_dtype=fmt, k_scale_cache=ks,
                                          v_scale_cache=vs)
    ref, ref_lse = vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                             kv_cache_dtype=fmt, k_scale_cache=ks, v_scale_cache=vs, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    opcheck(ops.flash_attn_varlen_func, (q, kc, vc, cu, sk, bt), {"kv_cache_dtype": fmt, "k_scale_cache": ks,
                                                                  "v_scale_cache": vs})


@pytest.mark.parametrize("fmt", ["int8_per_token_head", "fp8_per_token_head", "int4_per_token_head"])
def test_per_token_head_ops_over_vllms_aliasing_page(fmt):
    """The ops on vLLM's own page, whose scale caches alias the code caches'
    storage: the store's bytes equal vt.reshape_and_cache_flash's on
    separate caches, the read equals vt's on those, and opcheck accepts both
    ops over the aliasing views."""
    nb, bs, hkv, d, n = 3, 16, 2, 64, 20
    row = d // 2 if fmt == "int4_per_token_head" else d
    g = torch.Generator().manual_seed(5)
    key, value = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    slot = torch.randperm(nb * bs, generator=g)[:n].to(torch.int64)
    one = torch.ones(1)
    kv, (kc, vc, ks, vs) = vllm_pth_page(torch, fmt, nb, bs, hkv, d)
    ops.reshape_and_cache_flash(key, value, kc, vc, slot, fmt, one, one, ks, vs)
    code = torch.int8 if fmt == "int8_per_token_head" else torch.uint8
    ref = (torch.zeros(nb, bs, hkv, row, dtype=code), torch.zeros(nb, bs, hkv, row, dtype=code),
           torch.ones(nb, bs, hkv), torch.ones(nb, bs, hkv))
    vt.reshape_and_cache_flash(key, value, *ref[:2], slot, fmt, one, one, k_scale_cache=ref[2], v_scale_cache=ref[3])
    assert torch.equal(kc.view(torch.uint8)[..., :row], ref[0].view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8)[..., :row], ref[1].view(torch.uint8))
    assert torch.equal(ks, ref[2]) and torch.equal(vs, ref[3]) and not torch.equal(ks, torch.ones_like(ks))
    _, fresh = vllm_pth_page(torch, fmt, nb, bs, hkv, d, typed=False)
    opcheck(ops.reshape_and_cache_flash, (key, value, fresh[0], fresh[1], slot, fmt, one, one, fresh[2], fresh[3]))
    q = torch.randn(2, 4, d, generator=g)
    cu, sk = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([n, 7], dtype=torch.int32)
    bt = torch.tensor([[0, 1, 2], [2, 0, 1]], dtype=torch.int32)
    kw = {"kv_cache_dtype": fmt, "k_scale_cache": ks, "v_scale_cache": vs}
    out, lse = ops.flash_attn_varlen_func(q, kc, vc, cu, sk, bt, **kw)
    want, want_lse = vt.flash_attn_varlen_func(q, ref[0], ref[1], cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                               kv_cache_dtype=fmt, k_scale_cache=ref[2], v_scale_cache=ref[3],
                                               return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    if fmt == "fp8_per_token_head":
        kc, vc = kc.view(torch.uint8), vc.view(torch.uint8)
    opcheck(ops.flash_attn_varlen_func, (q, kc, vc, cu, sk, bt), kw)
