"""fp8 queries next to bf16 queries: decode and prefill time of
vt.flash_attn_varlen_func with a float8_e4m3fn q and q_descale (num_seqs,
num_kv_heads) against the same call with the bf16 q, on bf16 and fp8 KV
caches. Interleaved repeats, best of each; prints ratios (fp8-q time over
bf16-q time; 1.0 = no cost). Never asserts.

    python benchmarks/bench_fp8_query.py [--ctx 32768] [--reps 7] [--threads N] [--out f.json]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import vtinfer as vt

from _common import write_json


def case(ctx, H, Hkv, D, bs, kv, q_len, seed=0):
    rng = np.random.default_rng(seed)
    nb = -(-ctx // bs)
    shape = (nb, bs, Hkv, D)
    if kv.startswith("fp8"):
        k = rng.integers(0, 0x70, size=shape, dtype=np.uint8)
        v = rng.integers(0, 0x70, size=shape, dtype=np.uint8)
    else:
        k = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
        v = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
    q32 = rng.standard_normal((q_len, H, D), dtype=np.float32)
    args = dict(cu_seqlens_q=np.array([0, q_len], np.int32), seqused_k=np.array([ctx], np.int32),
                block_table=rng.permutation(nb).astype(np.int32)[None],
                kv_cache_dtype=kv if kv.startswith("fp8") else "auto")
    return q32.astype(ml_dtypes.bfloat16), q32.astype(ml_dtypes.float8_e4m3fn), k, v, args


def timed(fn, reps):
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--prefill-q", type=int, default=512)
    ap.add_argument("--prefill-k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    fig = {}
    runs = [(f"decode_gqa{g}", a.ctx, 8 * g, 1) for g in (1, 4, 8)] + [("prefill_gqa4", a.prefill_k, 32, a.prefill_q)]
    for name, ctx, H, q_len in runs:
        for kv in ("bfloat16", "fp8_e4m3"):
            qb, q8, k, v, args = case(ctx, H, 8, 128, 16, kv, q_len)
            qd = np.full((1, 8), 0.5, np.float32)  # folded into k_descale: [1, H_kv]
            f_b = lambda: vt.flash_attn_varlen_func(qb, k, v, **args, num_threads=a.threads)  # noqa: E731
            f_8 = lambda: vt.flash_attn_varlen_func(q8, k, v, **args, q_descale=qd, num_threads=a.threads)  # noqa: E731
            # the same values as the fp8 q, held in bf16 (the tiles' speed depends on the values)
            qr = q8.astype(ml_dtypes.bfloat16)
            f_r = lambda: vt.flash_attn_varlen_func(qr, k, v, **args, k_descale=qd, num_threads=a.threads)  # noqa: E731
            tb, t8, tr = [], [], []
            for _ in range(a.reps):
                tb += timed(f_b, 1)
                t8 += timed(f_8, 1)
                tr += timed(f_r, 1)
            fig[f"{name}_{kv}_kv_bf16_q_ms"] = min(tb) * 1e3
            fig[f"{name}_{kv}_kv_fp8_q_ms"] = min(t8) * 1e3
            fig[f"{name}_{kv}_kv_fp8_q_over_bf16_q_time"] = min(t8) / min(tb)
            fig[f"{name}_{kv}_kv_fp8_q_over_same_values_bf16_q"] = min(t8) / min(tr)
    for kk, vv in fig.items():
        print(f"{kk:48s} {vv:9.3f}")
    print(f"isa {vt.build_info()['isa']}  threads {a.threads}")
    write_json(a.out, fig)


if __name__ == "__main__":
    main()
