"""Benchmark of the KV store (PagedKVCache.store = reshape_and_cache_flash).

Model shape: H_kv 8, D 128, 4096 tokens per call, block_size 16, bfloat16
keys and values, into a bfloat16 or fp8_e4m3 cache whose blocks are handed out
in a shuffled order (as an allocator under churn does). Each repeat times, in
one interleaved round, the store and a memcpy probe (``np.copyto``) over the
same bytes the store moves (read K+V source, write the cache rows), so the
ratio store/memcpy is taken in the same run on the same, shared machine.

Quoted: tokens/s, bytes/s (source read + cache written) and the ratio to the
memcpy probe's bytes/s; median and best over the repeats. Never asserts.

    python benchmarks/bench_store.py --out /tmp/bench_store.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import ml_dtypes
import numpy as np

import vtinfer as vt


def run(dtype: str, tokens: int, heads: int, dim: int, block_size: int, threads: int, repeats: int, cache_mib: int,
        layout: str = "NHD"):
    rng = np.random.default_rng(0)
    elem = vt.dtype_info(dtype).elem_bytes if hasattr(vt, "dtype_info") else (1 if "fp8" in dtype else 2)
    row_bytes = heads * dim * elem
    num_blocks = max(tokens // block_size, (cache_mib << 20) // (2 * block_size * row_bytes))
    cache = vt.PagedKVCache(1, num_blocks, block_size, heads, dim, dtype, layout=layout, k_scale=0.37, v_scale=0.23)
    key = (rng.standard_normal((tokens, heads, dim)) * 2).astype(ml_dtypes.bfloat16)
    value = (rng.standard_normal((tokens, heads, dim)) * 2).astype(ml_dtypes.bfloat16)
    blocks = rng.permutation(num_blocks)[: tokens // block_size]
    slots = (blocks[:, None] * block_size + np.arange(block_size)[None, :]).reshape(-1).astype(np.int64)
    moved = key.nbytes + value.nbytes + 2 * tokens * row_bytes  # read source, write cache
    src = np.empty(moved // 2, np.uint8)
    src[:] = 1
    dst = np.empty_like(src)  # memcpy of moved/2 bytes reads and writes `moved` bytes
    cache.store(0, key, value, slots, num_threads=threads)  # warm up
    np.copyto(dst, src)
    t_store, t_copy = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cache.store(0, key, value, slots, num_threads=threads)
        t1 = time.perf_counter()
        np.copyto(dst, src)
        t2 = time.perf_counter()
        t_store.append(t1 - t0)
        t_copy.append(t2 - t1)
    med_s, med_c = float(np.median(t_store)), float(np.median(t_copy))
    ratios = [(moved / s) / (moved / c) for s, c in zip(t_store, t_copy)]
    return {
        "dtype": dtype,
        "layout": layout,
        "tokens": tokens,
        "num_kv_heads": heads,
        "head_size": dim,
        "block_size": block_size,
        "threads": threads,
        "cache_bytes": cache.nbytes,
        "bytes_moved": moved,
        "store_s_median": med_s,
        "memcpy_s_median": med_c,
        "tokens_per_s_median": tokens / med_s,
        "store_GBps_median": moved / med_s / 1e9,
        "memcpy_GBps_median": moved / med_c / 1e9,
        "ratio_median": float(np.median(ratios)),
        "ratio_best": float(np.max(ratios)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--cache-mib", type=int, default=256, help="cache size, so the stores go to DRAM")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--dtypes", nargs="*", default=["bfloat16", "fp8_e4m3"])
    ap.add_argument("--layouts", nargs="*", default=["NHD"],
                    help="NHD takes the fused per-token path (one row-kernel call per token); HND one call per head row")
    ap.add_argument("--out", help="write JSON results here")
    a = ap.parse_args()
    results = []
    for th in a.threads:
        for dt in a.dtypes:
            for lay in a.layouts:
                r = run(dt, a.tokens, a.heads, a.dim, a.block_size, th, a.repeats, a.cache_mib, lay)
                results.append(r)
                print(
                    f"{dt:9s} {lay} threads={th} tokens/s={r['tokens_per_s_median']:.3g} "
                    f"store={r['store_GBps_median']:.2f} GB/s memcpy={r['memcpy_GBps_median']:.2f} GB/s "
                    f"ratio median={r['ratio_median']:.2f} best={r['ratio_best']:.2f}"
                )
    doc = {"benchmark": "store", "machine": platform.machine(), "isa": vt.build_info().get("isa"), "results": results}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
