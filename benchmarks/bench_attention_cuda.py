"""CUDA arm benchmark: decode (bf16, fp8) and store vs a same-run device copy and torch SDPA.

Ratios are taken in one process: a device-to-device copy of the same bytes
as the KV read gives the bandwidth reference. Never asserts. Needs torch
with CUDA and a device; writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch

    from vtinfer import _cuda_ops

    dev = "cuda"
    H, Hkv, D, bs = 32, 8, 128, 16  # GQA 4
    B, ctx = a.batch, a.ctx
    nb = B * ctx // bs
    bt = torch.arange(nb, dtype=torch.int32, device=dev).reshape(B, ctx // bs)
    cu = torch.arange(B + 1, dtype=torch.int32, device=dev)
    sk = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(B, H, D, dtype=torch.bfloat16, device=dev)
    kb = torch.randn(nb, bs, Hkv, D, dtype=torch.bfloat16, device=dev)
    vb = torch.randn(nb, bs, Hkv, D, dtype=torch.bfloat16, device=dev)
    k8 = (kb.float() / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    v8 = (vb.float() / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)

    def timed(fn):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        st.record()
        for _ in range(a.reps):
            fn()
        en.record()
        torch.cuda.synchronize()
        return st.elapsed_time(en) / a.reps / 1e3

    src = torch.empty(2 * kb.numel() * 2, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    kw = dict(cu_seqlens_q=cu, seqused_k=sk, block_table=bt, max_seqlen_q=1, max_seqlen_k=ctx, validate=False)
    cases = {
        "copy_bf16_bytes": lambda: dst.copy_(src),
        "decode_bf16": lambda: _cuda_ops.flash_attn_varlen_func(q, kb, vb, **kw),
        "decode_fp8": lambda: _cuda_ops.flash_attn_varlen_func(q, k8, v8, kv_cache_dtype="fp8_e4m3",
                                                               k_descale=0.05, v_descale=0.05, **kw),
        "decode_bf16_validated": lambda: _cuda_ops.flash_attn_varlen_func(q, kb, vb, **{**kw, "validate": True}),
    }
    kg = kb.view(B, ctx, Hkv, D).permute(0, 2, 1, 3).repeat_interleave(H // Hkv, 1)
    vg = vb.view(B, ctx, Hkv, D).permute(0, 2, 1, 3).repeat_interleave(H // Hkv, 1)
    cases["torch_sdpa_gathered"] = lambda: torch.nn.functional.scaled_dot_product_attention(q.view(B, H, 1, D), kg, vg)
    ntok = 4096
    kn = torch.randn(ntok, Hkv, D, dtype=torch.bfloat16, device=dev)
    slots = torch.randperm(nb * bs, device=dev)[:ntok].to(torch.int64)
    kc16 = torch.zeros_like(kb)
    kc8 = torch.zeros(kb.shape, dtype=torch.uint8, device=dev)
    cases["store_bf16"] = lambda: _cuda_ops.reshape_and_cache_flash(kn, kn, kc16, kc16, slots, "auto", 1.0, 1.0)
    cases["store_fp8"] = lambda: _cuda_ops.reshape_and_cache_flash(kn, kn, kc8, kc8, slots, "fp8_e4m3", 0.05, 0.05)
    runs = {n: [] for n in cases}
    for _ in range(5):  # interleaved and repeated; medians quoted
        for n, f in cases.items():
            runs[n].append(timed(f))
    med = {n: statistics.median(v) for n, v in runs.items()}
    copy = med["copy_bf16_bytes"]
    res = {
        "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "shape": dict(B=B, ctx=ctx, H=H, Hkv=Hkv, D=D),
        "median_s": med,
        "bf16_decode_vs_copy": copy / med["decode_bf16"],  # same bytes: the decode reads K+V once
        "fp8_decode_vs_copy": (copy / 2) / med["decode_fp8"],
        "fp8_speedup_vs_bf16": med["decode_bf16"] / med["decode_fp8"],
        "fp8_store_over_bf16_store": med["store_fp8"] / med["store_bf16"],
        "bf16_decode_speedup_vs_sdpa": med["torch_sdpa_gathered"] / med["decode_bf16"],
    }
    print(json.dumps(res, indent=1))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
