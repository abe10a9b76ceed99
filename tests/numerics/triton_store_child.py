"""Child process of tests/numerics/test_kv_formats_triton.py: runs vLLM's own
per-token-head stores in Triton's CPU interpreter: ``_reshape_cache_per_token_head``
of the pinned wheel's triton_reshape_and_cache_flash.py (int8, fp8), and for
int4 the whole ``reshape_and_cache_int4`` of int4_per_token_head.py (its
randomized Hadamard rotation takes vLLM's CPU path, the torch butterfly, then
``_reshape_cache_int4_kernel``), compiled from the wheel's text with stubs
only for the platform query.

    python tests/numerics/triton_store_child.py DIR

For every ``DIR/case_*.npz`` (key, value: float32 or bfloat16 bits; slots;
nb, bs; fmt) it writes ``DIR/out_*.npz``: the code caches' bytes, the scale
caches, and for fp8 the interpreter's own float32 -> fp8 cast of every
pre-cast value next to torch's (``trust``: where they agree), because the
interpreter's fp8 casts are not torch's on every input.

A child process, so that TRITON_INTERPRET is set before triton is imported
whatever the test session imported before.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from vtinfer.testing import upstream  # noqa: E402

FP8_MAX = 448.0  # get_fp8_min_max() for float8_e4m3fn on CUDA


@triton.jit
def _cast_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m), mask=m)


@triton.jit
def _int32_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m).to(tl.int32), mask=m)


class _CPUPlatform:
    """vLLM's current_platform as seen on this machine: no CUDA, ROCm or XPU."""

    def is_cuda(self):
        return False

    is_rocm = is_xpu = is_cuda

    def has_device_capability(self, *_):
        return False


def int4_store(src):
    """vLLM's reshape_and_cache_int4 from the wheel's text."""
    py_names = ["_INT4_PACKING_FACTOR", "_HADACORE_AVAILABLE", "_hadacore_available", "_TRITON_HADAMARD_MIN_D",
                "_TRITON_HADAMARD_MAX_D", "fast_hadamard_transform", "_RHT_SIGNS_CACHE", "_get_rht_signs",
                "single_rht", "_run_reshape_kernel", "reshape_and_cache_int4"]
    math = upstream.extract(src.read(upstream.F_MATH_UTILS), ["largest_power_of_2_divisor"])
    ns = upstream.triton_kernels(src, upstream.F_INT4_PTH, ["pack_int4_nibbles", "_reshape_cache_int4_kernel"],
                                 {"torch": torch, "current_platform": _CPUPlatform(),
                                  "largest_power_of_2_divisor": math["largest_power_of_2_divisor"]})
    py = upstream.extract(src.read(upstream.F_INT4_PTH), py_names, ns)
    return py["reshape_and_cache_int4"], py["single_rht"]


def _int4_trust(rot: torch.Tensor) -> torch.Tensor:
    """[T, H] True where no float -> int32 conversion of the int4 kernel leaves
    int32's range: the interpreter converts out-of-range values as NumPy does
    (not saturating: +inf -> INT_MIN), NVIDIA's cvt.rzi.s32.f32 saturates, so
    such rows (e.g. a constant row of -3e38: -min / 1e-6 = inf) are not
    compared. ``rot`` is the rotated row the kernel reads, float32."""
    big = 2.0 ** 31
    with torch.no_grad():
        mn = torch.nan_to_num(rot, nan=float("inf")).amin(-1)
        mx = torch.nan_to_num(rot, nan=float("-inf")).amax(-1)
        scale = torch.clamp((mx - mn) / 15.0, min=1e-6)
        zp_t = -mn / scale
        zp = torch.clamp(torch.where(zp_t >= 0, zp_t + 0.5, zp_t - 0.5).nan_to_num(nan=0.0).clamp(-big, big).trunc(),
                         0, 15)
        t = rot * (1.0 / scale)[..., None] + zp[..., None]
        ok = (zp_t.abs() < big - 1) | zp_t.isnan()
        return ok & ((t.abs() < big - 1) | t.isnan()).all(-1)


def _inputs(case: dict):
    key, value = (torch.from_numpy(case[n]) for n in ("key", "value"))
    view = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(case["src"]))
    if view is not None:
        key, value = key.view(view), value.view(view)
    return key, value


def run_int4(fns, case: dict) -> dict:
    store, rht = fns
    nb, bs = int(case["nb"]), int(case["bs"])
    key, value = _inputs(case)
    T, H, D = key.shape
    kc = torch.zeros((nb, bs, H, D // 2), dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    ks = torch.ones((nb, bs, H), dtype=torch.float32)
    vs = torch.ones_like(ks)
    store(key, value, kc, vc, torch.from_numpy(case["slots"]), k_scale_cache=ks, v_scale_cache=vs)
    keep = torch.from_numpy(case["slots"]) >= 0
    trust = {f"{n}_trust": _int4_trust(rht(x[keep].float()).to(x.dtype).float()).numpy()
             for n, x in (("k", key), ("v", value))}
    return {"kc": kc.numpy(), "vc": vc.numpy(), "ks": ks.numpy(), "vs": vs.numpy(), **trust}


def run_case(kernel, case: dict) -> dict:
    fmt = str(case["fmt"])
    nb, bs = int(case["nb"]), int(case["bs"])
    key, value = _inputs(case)
    T, H, D = key.shape
    code = torch.int8 if fmt == "int8_per_token_head" else torch.float8_e4m3fn
    qmax, qmin = (127.0, -128.0) if code == torch.int8 else (FP8_MAX, -FP8_MAX)
    kc = torch.zeros((nb, bs, H, D), dtype=code)
    vc = torch.zeros_like(kc)
    ks = torch.ones((nb, bs, H), dtype=torch.float32)
    vs = torch.ones_like(ks)
    slots = torch.from_numpy(case["slots"])
    kernel[(T, H)](
        key, value, kc, vc, ks, vs, slots,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        ks.stride(0), ks.stride(1), ks.stride(2), vs.stride(0), vs.stride(1), vs.stride(2),
        block_size=bs, head_size=D, head_size_v=D, HEAD_SIZE_PADDED=triton.next_power_of_2(D),
        QUANT_MAX=qmax, QUANT_MIN=qmin, IS_INT_QUANT=code == torch.int8,
    )
    out = {"kc": kc.view(torch.uint8).numpy(), "vc": vc.view(torch.uint8).numpy(),
           "ks": ks.numpy(), "vs": vs.numpy()}
    if code != torch.int8:
        keep = slots >= 0
        for side, x, sc in (("k", key, ks), ("v", value, vs)):
            s = sc.reshape(nb * bs, H)[slots[keep]]                      # the kernel's own scales
            pre = (x[keep].float() * (1.0 / s)[..., None]).clamp(qmin, qmax).contiguous().reshape(-1)
            probe = torch.empty(pre.numel(), dtype=code)
            _cast_probe[(triton.cdiv(pre.numel(), 1024),)](pre, probe, pre.numel(), BLOCK=1024)
            trust = probe.view(torch.uint8) == pre.to(code).view(torch.uint8)
            out[f"{side}_trust"] = trust.reshape(-1, H, D).numpy()
    return out


def main(d: str) -> None:
    src = upstream.locate()
    kernel = upstream.triton_kernel(src, upstream.F_TRITON_STORE, "_reshape_cache_per_token_head")
    int4 = int4_store(src)
    for name in sorted(os.listdir(d)):
        if name.startswith("case_") and name.endswith(".npz"):
            with np.load(os.path.join(d, name)) as z:
                case = dict(z)
            res = run_int4(int4, case) if str(case["fmt"]) == "int4_per_token_head" else run_case(kernel, case)
            np.savez(os.path.join(d, "out_" + name[len("case_"):]), **res)


if __name__ == "__main__":
    main(sys.argv[1])
