"""Child process of tests/numerics/test_kv_formats_triton.py: runs vLLM's own
per-token-head store kernel (``_reshape_cache_per_token_head`` of the pinned
wheel's triton_reshape_and_cache_flash.py) in Triton's CPU interpreter.

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


def run_case(kernel, case: dict) -> dict:
    fmt = str(case["fmt"])
    nb, bs = int(case["nb"]), int(case["bs"])
    key, value = (torch.from_numpy(case[n]) for n in ("key", "value"))
    if str(case["src"]) == "bfloat16":
        key, value = key.view(torch.bfloat16), value.view(torch.bfloat16)
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
    for name in sorted(os.listdir(d)):
        if name.startswith("case_") and name.endswith(".npz"):
            with np.load(os.path.join(d, name)) as z:
                res = run_case(kernel, dict(z))
            np.savez(os.path.join(d, "out_" + name[len("case_"):]), **res)


if __name__ == "__main__":
    main(sys.argv[1])
