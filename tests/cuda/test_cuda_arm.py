"""The CUDA arm against the CPU: store bytes, attention read parity, gates.

CPU-only machines run the build/import tests; the device tests skip with the
reason (tests/cuda/conftest.py). References are the CPU path (its own tests
hold it against float64 oracles and vLLM), never a second device run.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt

from .conftest import DEVICE_REASON, needs_device

_cuda = pytest.importorskip("vtinfer._cuda", reason="vtinfer._cuda not built (setup.py builds it where a GPU is present, or with VTINFER_CUDA=1)")


# ---- runs everywhere the arm is built ----


def test_build_info_reports_the_arm():
    info = vt.build_info()
    assert info["cuda_built"] is True
    n = _cuda.device_count()
    assert info["cuda_devices"] == n
    assert info["cuda"] == ("CUDA extension built, no CUDA device" if n == 0
                            else f"CUDA extension built, {n} CUDA device" + ("s" if n > 1 else ""))


def test_device_status_never_raises():
    assert isinstance(_cuda.device_status(), str) and _cuda.device_status()
    rt, _drv = _cuda.runtime_version()
    assert rt >= 12000


def test_cuda_error_is_a_vtinfer_error():
    assert issubclass(_cuda.CudaError, vt.VtinferError) and issubclass(_cuda.CudaError, RuntimeError)


def test_store_refuses_host_arrays_naming_the_argument():
    key = np.zeros((2, 1, 4), np.float32)  # a NumPy array exports DLPack on the CPU
    with pytest.raises(ValueError, match="reshape_and_cache_flash: key must be on a CUDA device"):
        _cuda.reshape_and_cache_flash(key, key, key, key, key, "auto", 1.0, 1.0)


def test_store_refuses_non_tensors():
    with pytest.raises(TypeError, match="key must be a CUDA tensor"):
        _cuda.reshape_and_cache_flash(1, 2, 3, 4, 5, "auto", 1.0, 1.0)


# ---- device tests ----

FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def _every_code_input(fmt: str, scale: float, rng) -> np.ndarray:
    """Every decoded code times the scale, the midpoints between neighbours (ties), specials, random values."""
    import ml_dtypes

    dt = getattr(ml_dtypes, FP8[fmt])
    vals = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
    vals = np.sort(vals[np.isfinite(vals)])
    mids = (vals[:-1].astype(np.float64) + vals[1:]) / 2
    extra = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 1e-40], np.float64)
    x = np.concatenate([vals * scale, mids * scale, extra, rng.standard_normal(4000) * 100 * scale])
    return x.astype(np.float32)


@needs_device
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "auto", "float16", "bfloat16", "float32"])
@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("per_head", [False, True])
def test_store_bytes_equal_the_cpu(fmt, src, layout, per_head):
    import ml_dtypes
    import torch

    rng = np.random.default_rng(7)
    H, D, bs, nb = 4, 64, 16, 0
    x = _every_code_input(fmt if fmt in FP8 else "fp8_e4m3", 0.5, rng)
    n_tok = -(-x.size // (H * D))
    x = np.resize(x, n_tok * H * D).reshape(n_tok, H, D)
    npdt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[src]
    key, value = x.astype(npdt), (-x).astype(npdt)
    nb = -(-n_tok // bs) + 2
    slots = rng.permutation(nb * bs)[:n_tok].astype(np.int64)
    slots[::7] = -1  # skipped tokens
    slots[5] = slots[9] if slots[9] >= 0 else slots[5]  # a duplicate: the later token wins
    cache_np = {"auto": npdt, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}.get(fmt, np.uint8)
    shape = (nb, bs, H, D) if layout == "NHD" else (nb, H, bs, D)
    kc, vc = np.full(shape, 0x55, np.uint8).view(np.uint8), None
    kc = np.zeros(shape, cache_np)
    vc = np.zeros(shape, cache_np)
    ks = (rng.uniform(0.25, 4, H) if per_head else np.array([0.75])).astype(np.float32)
    vs = (rng.uniform(0.25, 4, H) if per_head else np.array([1.5])).astype(np.float32)
    vt.reshape_and_cache_flash(key, value, kc, vc, slots, fmt, ks, vs, layout=layout)

    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    dkey = torch.from_numpy(key.view(np.uint16) if src != "float32" else key).cuda()
    dval = torch.from_numpy(value.view(np.uint16) if src != "float32" else value).cuda()
    if src != "float32":
        dkey, dval = dkey.view(tdt[src]), dval.view(tdt[src])
    cache_t = torch.uint8 if fmt in FP8 else tdt[{"auto": src}.get(fmt, fmt)]
    dkc = torch.zeros(shape, dtype=cache_t, device="cuda")
    dvc = torch.zeros(shape, dtype=cache_t, device="cuda")
    _cuda.reshape_and_cache_flash(dkey, dval, dkc, dvc, torch.from_numpy(slots).cuda(), fmt,
                                  torch.from_numpy(ks).cuda(), torch.from_numpy(vs).cuda(), layout=layout)
    torch.cuda.synchronize()
    got_k = dkc.cpu().view(torch.uint8).numpy()
    got_v = dvc.cpu().view(torch.uint8).numpy()
    np.testing.assert_array_equal(got_k, kc.view(np.uint8))
    np.testing.assert_array_equal(got_v, vc.view(np.uint8))


def _attn_case(rng, kv, G, q_lens, k_lens, D=128, bs=16):
    import ml_dtypes

    Hkv, H = 2, 2 * G
    nb = sum(-(-k // bs) for k in k_lens) + 3
    maxb = max(-(-k // bs) for k in k_lens)
    ids = rng.permutation(nb)
    bt = np.zeros((len(k_lens), maxb), np.int32)
    used = 0
    for b, k in enumerate(k_lens):
        n = -(-k // bs)
        bt[b, :n] = ids[used:used + n]
        used += n
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), H, D)).astype(np.float32)
    kf = rng.standard_normal((nb, bs, Hkv, D)).astype(np.float32)
    vf = rng.standard_normal((nb, bs, Hkv, D)).astype(np.float32)
    if kv in FP8:
        k = vt.fp8_quantize(kf, 0.05, fmt=kv[4:]).view(np.uint8)
        v = vt.fp8_quantize(vf, 0.05, fmt=kv[4:]).view(np.uint8)
    else:
        k, v = kf.astype(ml_dtypes.bfloat16), vf.astype(ml_dtypes.bfloat16)
    return q, k, v, cu, np.array(k_lens, np.int32), bt


def _to_cuda(a):
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@needs_device
@pytest.mark.parametrize("kv", ["bfloat16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("G", [1, 4, 8])
@pytest.mark.parametrize("shape", ["decode", "prefill", "long"])
@pytest.mark.parametrize("extras", ["plain", "window_softcap_alibi_sink"])
def test_attention_reads_like_the_cpu_reference(kv, G, shape, extras):
    rng = np.random.default_rng(11 + G)
    q_lens, k_lens = {"decode": ([1, 1, 1], [37, 300, 5]), "prefill": ([17, 40], [60, 40]),
                      "long": ([1, 1], [9000, 4100])}[shape]
    q, k, v, cu, sk, bt = _attn_case(rng, kv, G, q_lens, k_lens)
    H = q.shape[1]
    kw = dict(causal=True, kv_cache_dtype=kv if kv in FP8 else "auto", k_descale=0.05 if kv in FP8 else None,
              v_descale=0.05 if kv in FP8 else None)
    if extras != "plain":
        kw.update(window_size=(63, 0), softcap=20.0, alibi_slopes=rng.uniform(0, 0.1, H).astype(np.float32),
                  s_aux=rng.standard_normal(H).astype(np.float32))
    vt._C.set_isa("scalar")  # the CPU reference twin
    try:
        ref, ref_lse = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                                 return_lse=True, **kw)
    finally:
        vt._C.set_isa(vt.build_info()["isa_best"])
    from vtinfer import _cuda_ops

    dkw = {n: (_to_cuda(x) if isinstance(x, np.ndarray) else x) for n, x in kw.items()}
    out, lse = _cuda_ops.flash_attn_varlen_func(_to_cuda(q), _to_cuda(k), _to_cuda(v), cu_seqlens_q=_to_cuda(cu),
                                                seqused_k=_to_cuda(sk), block_table=_to_cuda(bt), return_lse=True,
                                                **dkw)
    np.testing.assert_allclose(out.cpu().numpy(), ref, atol=2e-5, rtol=2e-4)
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=2e-5, rtol=2e-5)


@needs_device
def test_attention_bad_block_id_raises_and_writes_nothing():
    import torch

    rng = np.random.default_rng(3)
    q, k, v, cu, sk, bt = _attn_case(rng, "bfloat16", 4, [1], [40])
    bt[0, 1] = k.shape[0]  # out of range
    from vtinfer import _cuda_ops

    out = torch.full(q.shape, 7.0, device="cuda")
    with pytest.raises(IndexError, match="block_table must hold block ids"):
        _cuda_ops.flash_attn_varlen_func(_to_cuda(q), _to_cuda(k), _to_cuda(v), cu_seqlens_q=_to_cuda(cu),
                                         seqused_k=_to_cuda(sk), block_table=_to_cuda(bt), out=out)
    assert bool((out == 7.0).all())


def test_reason_is_recorded():
    # On a CPU-only machine the device tests above skip with this reason.
    assert DEVICE_REASON is None or "CUDA" in DEVICE_REASON or "torch" in DEVICE_REASON or "_cuda" in DEVICE_REASON
