"""Decode speed of the per-token-head KV formats next to bfloat16 and per-tensor fp8, one run.

python benchmarks/bench_kv_formats.py [--ctx 32768] [--reps 5] [--out FILE]

One query per KV-head group (decode) over a 32K-token sequence, H_kv 8,
D 128, block_size 16, shuffled blocks, GQA 1/4/8; the caches are filled by
PagedKVCache.store; times are best/median of --reps calls; ratios are taken
within this run (the machine is shared: quote same-run ratios only).
Benchmarks never assert.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import ml_dtypes
import numpy as np

import vtinfer as vt

DTYPES = ("bfloat16", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    Hkv, D, BS = 8, 128, 16
    nb = a.ctx // BS
    rng = np.random.default_rng(0)
    perm = rng.permutation(nb).astype(np.int32)
    slots = (perm[np.arange(a.ctx) // BS].astype(np.int64) * BS + np.arange(a.ctx) % BS)
    k = rng.standard_normal((a.ctx, Hkv, D)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((a.ctx, Hkv, D)).astype(ml_dtypes.bfloat16)
    res: dict = {"ctx": a.ctx, "uptime": os.getloadavg(), "isa": vt.build_info()["isa"], "ms": {}}
    caches = {}
    for dt in DTYPES:
        c = vt.PagedKVCache(1, nb, BS, Hkv, D, dt, k_scale=0.05, v_scale=0.05) if dt == "fp8_e4m3" else \
            vt.PagedKVCache(1, nb, BS, Hkv, D, dt)
        c.store(0, k, v, slots)
        caches[dt] = c
    bt = perm[None, :]
    for G in (1, 4, 8):
        q = rng.standard_normal((1, Hkv * G, D)).astype(ml_dtypes.bfloat16)
        for dt in DTYPES:
            c = caches[dt]
            kw = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([a.ctx], np.int32),
                      block_table=bt, num_threads=a.threads)
            c.attention(0, q, **kw)
            ts = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                c.attention(0, q, **kw)
                ts.append(time.perf_counter() - t0)
            res["ms"][f"{dt} GQA{G}"] = {"best": 1e3 * min(ts), "median": 1e3 * float(np.median(ts))}
    res["uptime_after"] = os.getloadavg()
    for G in (1, 4, 8):
        m = {dt: res["ms"][f"{dt} GQA{G}"]["median"] for dt in DTYPES}
        for dt in DTYPES[2:]:
            res.setdefault("ratios", {})[f"{dt} GQA{G}"] = {"speedup_vs_bf16": m["bfloat16"] / m[dt],
                                                            "speedup_vs_fp8": m["fp8_e4m3"] / m[dt]}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
