"""Child process of tests/numerics/test_kv_formats_tq.py: runs vLLM's own
TurboQuant store launcher ``triton_turboquant_store`` (and its two kernels)
and the read kernel ``_tq_full_dequant_kv`` of the pinned wheel in Triton's
CPU interpreter.

    python tests/numerics/tq_triton_child.py DIR

For every ``DIR/case_*.npz`` (fmt; key, value float32 ``[T, H, D]``; slots;
nb, bs) it writes ``DIR/out_*.npz``: the cache bytes (filled 0x5A before the
store), vLLM's Hadamard, centroids and midpoints, the rotated rows ``y`` and
norms the launcher computed (the same torch ops, repeated), for k8v4 the
interpreter's own float32 -> e4m3 cast of the keys next to torch's (``trust``),
and the dequantized K / V (float16, ``[slot, H, D]``) the read kernel gives for every slot.

A child process, so that TRITON_INTERPRET is set before triton is imported.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from vtinfer.testing import upstream  # noqa: E402

BACKEND = "vllm/v1/attention/backends/turboquant_attn.py"


@triton.jit
def _cast_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m).to(tl.float8e4nv), mask=m)


def vllm_functions(src):
    store = upstream.triton_kernels(
        src, upstream.F_TQ_STORE,
        ["_store_quantized_value", "_tq_fused_store_fp8", "_tq_fused_store_mse", "triton_turboquant_store"],
        {"math": math, "torch": torch, "_use_fp8_e4b15": lambda device=0: 0},  # e4nv (Hopper+)
    )["triton_turboquant_store"]
    dequant = upstream.triton_kernel(src, upstream.F_TQ_DECODE, "_tq_full_dequant_kv")
    had = upstream.extract(src.read(BACKEND), ["_build_hadamard_cached"], {"torch": torch, "math": math})
    lm = upstream.extract(src.read(upstream.F_TQ_CENTROIDS), ["_gaussian_pdf", "_trapz", "solve_lloyd_max"],
                          {"torch": torch, "math": math})
    # dataclass() resolves the (string) annotations through sys.modules[cls.__module__]
    sys.modules.setdefault("vtinfer_upstream", types.ModuleType("vtinfer_upstream"))
    cfg = upstream.extract(src.read(upstream.F_TQ_CONFIG), ["TQ_PRESETS", "TurboQuantConfig"],
                           {"dataclass": __import__("dataclasses").dataclass, "math": math,
                            "ModelConfig": object, "TurboQuantConfig": object})
    return store, dequant, functools.partial(had["_build_hadamard_cached"], device_str="cpu"), \
        lm["solve_lloyd_max"], cfg["TurboQuantConfig"]


def run_case(fns, case: dict) -> dict:
    store, dequant, hadamard, lloyd, Cfg = fns
    fmt = str(case["fmt"])
    nb, bs = int(case["nb"]), int(case["bs"])
    key, value = torch.from_numpy(case["key"]), torch.from_numpy(case["value"])
    slots = torch.from_numpy(case["slots"])
    T, H, D = key.shape
    cfg = Cfg.from_cache_dtype(fmt, D)
    PiT = hadamard(D)
    cents = lloyd(D, cfg.centroid_bits)[0]
    c_sorted, _ = cents.sort()
    mids = (c_sorted[:-1] + c_sorted[1:]) / 2
    cache = torch.full((nb, bs, H, cfg.slot_size_aligned), 0x5A, dtype=torch.uint8)
    store(key, value, cache, slots, PiT, mids, mse_bits=cfg.key_mse_bits, key_packed_size=cfg.key_packed_size,
          value_quant_bits=cfg.effective_value_quant_bits, key_fp8=cfg.key_fp8)
    out = {"cache": cache.numpy(), "hadamard": PiT.numpy(), "centroids": cents.numpy(), "mids": mids.numpy(),
           "slot_size_aligned": cfg.slot_size_aligned}
    if not cfg.key_fp8:
        k_flat = key.float().reshape(T * H, D)  # the launcher's host ops, repeated
        norms = k_flat.norm(dim=1, keepdim=True)
        out["y"] = ((k_flat / (norms + 1e-8)) @ PiT).reshape(T, H, D).numpy()
        out["norms"] = norms.reshape(T, H).numpy()
    else:
        x = key.float().contiguous().reshape(-1)
        probe = torch.empty(x.numel(), dtype=torch.float8_e4m3fn)
        _cast_probe[(triton.cdiv(x.numel(), 1024),)](x, probe, x.numel(), BLOCK=1024)
        ref = x.clamp(-448, 448).where(~x.isnan(), x).to(torch.float8_e4m3fn)
        out["trust"] = (probe.view(torch.uint8) == ref.view(torch.uint8)).reshape(T, H, D).numpy()
    # the read kernel: sequence b = cache block b (block table [nb, 1]), all bs positions
    bt = torch.arange(nb, dtype=torch.int32).reshape(nb, 1)
    ko = torch.zeros((nb, H, bs, D), dtype=torch.float16)
    vo = torch.zeros_like(ko)
    mse_bytes = math.ceil(D * cfg.key_mse_bits / 8) if not cfg.key_fp8 else D
    dequant[(bs, nb * H)](
        cache, bt, cents, ko, vo, ko.stride(0), ko.stride(1), ko.stride(2), vo.stride(0), vo.stride(1), vo.stride(2),
        cache.stride(0), cache.stride(1), cache.stride(2), bt.stride(0),
        HEAD_DIM=D, BLOCK_SIZE=bs, NUM_KV_HEADS=H, MSE_BYTES=mse_bytes, KPS=cfg.key_packed_size,
        VQB=cfg.effective_value_quant_bits, VAL_DATA_BYTES=math.ceil(D * cfg.effective_value_quant_bits / 8),
        MSE_BITS=cfg.key_mse_bits, KEY_FP8=1 if cfg.key_fp8 else 0, BLOCK_D=triton.next_power_of_2(D),
        NORM_CORRECTION=1 if cfg.norm_correction else 0, FP8_E4B15=0,
    )
    out["k_read"] = ko.transpose(1, 2).reshape(nb * bs, H, D).numpy()  # [slot, H, D]
    out["v_read"] = vo.transpose(1, 2).reshape(nb * bs, H, D).numpy()
    return out


def main(d: str) -> None:
    fns = vllm_functions(upstream.locate())
    for name in sorted(os.listdir(d)):
        if name.startswith("case_") and name.endswith(".npz"):
            with np.load(os.path.join(d, name)) as z:
                res = run_case(fns, dict(z))
            np.savez(os.path.join(d, "out_" + name[len("case_"):]), **res)


if __name__ == "__main__":
    main(sys.argv[1])
