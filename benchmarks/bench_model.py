"""Decode speed of the reference decoder at long context, per KV-cache dtype.

    python benchmarks/bench_model.py --contexts 2048 4096 --out /tmp/bench_model.json

For each context length, one session per KV dtype has its cache filled with
``context`` tokens of synthetic K/V (stored through the cache's own store
kernel, so fp8 pages hold real codes), then single-token decode steps of the
real model (SmolLM2-135M-Instruct when converted, else ``--model``, else the
tiny generated checkpoint) are timed round-robin across the dtypes. Printed:
the ratios fp8/bf16 and fp8/f32 of decode tokens/s and of the attention time
inside a step, and each dtype's decode rate against a same-run bound (bytes a
step must read, weights + KV, over a same-run memcpy bandwidth probe).
Absolute times on this shared 2-core machine drift; quote the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import interleaved, machine, write_json  # noqa: E402

DTYPES = ("bfloat16", "fp8_e4m3", "float32")


def load_model(path: str | None):
    from vtinfer.models import Decoder
    from vtinfer.models.gguf_convert import default_model_dir
    from vtinfer.models.tiny import default_tiny_dir

    d = path or default_model_dir(convert=True) or default_tiny_dir()
    return Decoder.from_pretrained(d)


def filled_session(model, dtype: str, context: int, extra: int, seed: int):
    c = model.config
    s = model.session(dtype, max_tokens=context + extra, k_scale=0.05, v_scale=0.02)
    slots = np.asarray(s.alloc.append(0, context), np.int64)
    rng = np.random.default_rng(seed)
    for layer in range(c.num_layers):
        k = (5.0 * rng.standard_normal((context, c.num_kv_heads, c.head_dim))).astype(np.float32)
        v = rng.standard_normal((context, c.num_kv_heads, c.head_dim)).astype(np.float32)
        s.cache.store(layer, k, v, slots)
    return s


def memcpy_gbs(nbytes: int, repeats: int) -> float:
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = min(_t(lambda: np.copyto(b, a)) for _ in range(repeats))
    return 2 * nbytes / best / 1e9  # read + write


def _t(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--blas-threads", type=int, default=1)
    ap.add_argument("--num-threads", type=int, default=None, help="vtinfer kernel threads (default: all CPUs)")
    ap.add_argument("--out", help="write JSON results here")
    args = ap.parse_args()

    model = load_model(args.model)
    model.blas_threads = args.blas_threads
    model.num_threads = args.num_threads
    weight_bytes = sum(w.nbytes for L in model.layers for w in (L.wq, L.wk, L.wv, L.wo, L.wg, L.wu, L.wd))
    weight_bytes += model.lm_head.nbytes
    results = {"machine": machine(), "model": model.name, "blas_threads": args.blas_threads,
               "num_threads": args.num_threads, "contexts": {}}
    bw = memcpy_gbs(64 << 20, 5)
    results["memcpy_GBps"] = bw
    print(f"{model.name}: weights {weight_bytes / 1e6:.0f} MB float32, same-run memcpy {bw:.1f} GB/s")
    for ctx in args.contexts:
        sess = {dt: filled_session(model, dt, ctx, args.repeats + 4, 0) for dt in DTYPES}
        att0 = {dt: sess[dt].attention_s for dt in DTYPES}
        ops = {dt: (lambda s=sess[dt]: s.decode(7)) for dt in DTYPES}
        t = interleaved(ops, args.repeats, warmup=1)
        steps = args.repeats + 1
        att = {dt: (sess[dt].attention_s - att0[dt]) / steps for dt in DTYPES}
        row = {}
        for dt in DTYPES:
            kv_bytes = sess[dt].cache.page_bytes // sess[dt].cache.block_size * ctx
            bound = bw * 1e9 / (weight_bytes + kv_bytes)
            row[dt] = {"decode_tokens_per_s_best": 1 / t[dt]["best"], "decode_tokens_per_s_median": 1 / t[dt]["median"],
                       "attention_s_per_step_mean": att[dt], "kv_bytes_read_per_step": kv_bytes,
                       "bound_tokens_per_s": bound, "vs_bound_median": (1 / t[dt]["median"]) / bound}
        r = {
            "per_dtype": row,
            "fp8_over_bf16_decode_median": t["bfloat16"]["median"] / t["fp8_e4m3"]["median"],
            "fp8_over_bf16_decode_best": t["bfloat16"]["best"] / t["fp8_e4m3"]["best"],
            "fp8_over_f32_decode_median": t["float32"]["median"] / t["fp8_e4m3"]["median"],
            "fp8_over_bf16_attention": att["bfloat16"] / att["fp8_e4m3"],
        }
        results["contexts"][str(ctx)] = r
        print(f"context {ctx}: decode fp8/bf16 {r['fp8_over_bf16_decode_median']:.3f}x (median), "
              f"{r['fp8_over_bf16_decode_best']:.3f}x (best); fp8/f32 {r['fp8_over_f32_decode_median']:.3f}x; "
              f"attention fp8/bf16 {r['fp8_over_bf16_attention']:.2f}x")
        for dt in DTYPES:
            x = row[dt]
            print(f"  {dt:9s} {x['decode_tokens_per_s_median']:6.1f} tok/s median, attention "
                  f"{1e3 * x['attention_s_per_step_mean']:.1f} ms/step, {x['vs_bound_median']:.2f} of the "
                  f"weights+KV read bound")
        del sess
    write_json(args.out, results)


if __name__ == "__main__":
    main()
