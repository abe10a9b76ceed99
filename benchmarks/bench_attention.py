"""Paged attention benchmark: model shapes (H_kv 8, D 128), ratios taken in
one run against same-run probes (read bandwidth of a same-sized buffer,
float32 FMA peak from benchmarks/_attn_probe.c built with the system
compiler), interleaved and repeated, best of N quoted; with torch installed,
torch SDPA (bfloat16, contiguous keys, same thread count) timed on the same
problems, quoted as SDPA time / ours. Never asserts.

    python benchmarks/bench_attention.py [--ctx 32768] [--reps 5] [--threads N] [--out results/attention.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import vtinfer as vt  # noqa: E402
from vtinfer import _C  # noqa: E402


def build_probe():
    src = os.path.join(os.path.dirname(__file__), "_attn_probe.c")
    so = os.path.join(tempfile.mkdtemp(), "probe.so")
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-o", so, src])
    lib = ctypes.CDLL(so)
    lib.read_sum.restype = ctypes.c_double
    lib.read_sum.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.fma_run.restype = ctypes.c_double
    lib.fma_run.argtypes = [ctypes.c_long]
    return lib


def best(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def make(ctx, H, Hkv, D, bs, kv, q_len=1, contiguous=False, seed=0):
    rng = np.random.default_rng(seed)
    nb = -(-ctx // bs)
    fp8 = kv.startswith("fp8")
    dt = np.uint8 if fp8 else ml_dtypes.bfloat16
    shape = (nb, bs, Hkv, D)
    if fp8:
        k = rng.integers(0, 0x70, size=shape, dtype=np.uint8)
        v = rng.integers(0, 0x70, size=shape, dtype=np.uint8)
    else:
        k = rng.standard_normal(shape, dtype=np.float32).astype(dt)
        v = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    bt = (np.arange(nb) if contiguous else rng.permutation(nb)).astype(np.int32)[None]
    q = rng.standard_normal((q_len, H, D), dtype=np.float32).astype(ml_dtypes.bfloat16)
    args = dict(cu_seqlens_q=np.array([0, q_len], np.int32), seqused_k=np.array([ctx], np.int32), block_table=bt,
                kv_cache_dtype=kv if fp8 else "auto")
    return q, k, v, args, k.nbytes + v.nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--prefill-q", type=int, default=512)
    ap.add_argument("--prefill-k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    nth = a.threads or len(os.sched_getaffinity(0))
    lib = build_probe()
    res = {"isa": _C.isa(), "cpu": vt.build_info()["cpu_features"], "threads": nth, "figures": {}}
    fig = res["figures"]

    def bw_probe(nbytes):
        buf = np.ones(nbytes // 4, np.float32)
        return nbytes / best(lambda: lib.read_sum(buf.ctypes.data, buf.size, 1), a.reps)

    # FMA peak: 16 x 16-lane FMAs (2 flops) per iteration, one thread; x threads
    iters = 20_000_000
    t = best(lambda: lib.fma_run(iters), 3)
    fma_peak = iters * 16 * 16 * 2 / t * nth
    res["fma_peak_gflops"] = fma_peak / 1e9

    try:
        import torch

        torch.set_num_threads(nth)
        res["torch"] = torch.__version__
    except ImportError:
        torch = None
        res["torch"] = "not installed"

    def sdpa_time(q, k, v, bt, G, q_len):
        """torch SDPA (bfloat16, CPU) on the same keys gathered to contiguous
        [1, H, ctx, D] outside the timing; GQA by enable_gqa; bottom-right
        causal mask when q_len > 1."""
        kc = torch.from_numpy(k[bt[0]].reshape(-1, k.shape[2], k.shape[3]).astype(np.float32))
        vc = torch.from_numpy(v[bt[0]].reshape(-1, v.shape[2], v.shape[3]).astype(np.float32))
        tk = kc.to(torch.bfloat16).transpose(0, 1)[None].contiguous()
        tv = vc.to(torch.bfloat16).transpose(0, 1)[None].contiguous()
        tq = torch.from_numpy(q.astype(np.float32)).to(torch.bfloat16).transpose(0, 1)[None].contiguous()
        kl = tk.shape[2]
        mask = None
        if q_len > 1:
            mask = torch.from_numpy(np.arange(kl)[None, :] <= (kl - q_len + np.arange(q_len))[:, None])
        f = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask,  # noqa: E731
                                                                     enable_gqa=G > 1)
        return f

    # decode, GQA 1/4/8, bf16 vs fp8, paged vs contiguous, softcap on/off
    for gqa in (1, 4, 8):
        H = 8 * gqa
        times = {}
        for kv in ("bfloat16", "fp8_e4m3"):
            q, k, v, args, nbytes = make(a.ctx, H, 8, 128, 16, kv)
            qc, kc, vc, argsc, _ = make(a.ctx, H, 8, 128, 16, kv, contiguous=True)
            bw = bw_probe(nbytes)
            run = lambda: vt.flash_attn_varlen_func(q, k, v, **args, num_threads=nth)  # noqa: E731
            runc = lambda: vt.flash_attn_varlen_func(qc, kc, vc, **argsc, num_threads=nth)  # noqa: E731
            runcap = lambda: vt.flash_attn_varlen_func(q, k, v, **args, softcap=30.0, num_threads=nth)  # noqa: E731
            tr, tc, ts = [], [], []
            for _ in range(a.reps):  # interleaved
                tr.append(best(run, 1))
                tc.append(best(runc, 1))
                ts.append(best(runcap, 1))
            times[kv] = min(tr)
            if torch is not None and kv == "bfloat16":
                f = sdpa_time(q, k, v, args["block_table"], gqa, 1)
                ts_ = [best(f, 1) for _ in range(a.reps)]
                fig[f"decode_gqa{gqa}_sdpa_bf16_time_over_ours_bf16"] = min(ts_) / min(tr)
            fig[f"decode_gqa{gqa}_{kv}_kv_bytes_per_s_over_read_bw"] = nbytes / min(tr) / bw
            fig[f"decode_gqa{gqa}_{kv}_paged_over_contiguous"] = min(tr) / min(tc)
            fig[f"decode_gqa{gqa}_{kv}_softcap_on_over_off"] = min(ts) / min(tr)
            fig[f"decode_gqa{gqa}_{kv}_read_bw_GBps"] = bw / 1e9
        fig[f"decode_gqa{gqa}_fp8_speedup_over_bf16"] = times["bfloat16"] / times["fp8_e4m3"]

    # prefill: 512 queries x 4K keys, GQA 4 (H 32), causal
    pt = {}
    for kv in ("bfloat16", "fp8_e4m3"):
        q, k, v, args, _ = make(a.prefill_k, 32, 8, 128, 16, kv, q_len=a.prefill_q)
        t = best(lambda: vt.flash_attn_varlen_func(q, k, v, **args, num_threads=nth), max(2, a.reps // 2))
        ql, kl = a.prefill_q, a.prefill_k
        pairs = sum(kl - ql + i + 1 for i in range(ql))  # causal (query, key) pairs
        flops = 4.0 * 32 * 128 * pairs
        pt[kv] = t
        if torch is not None and kv == "bfloat16":
            f = sdpa_time(q, k, v, args["block_table"], 4, a.prefill_q)
            fig["prefill_sdpa_bf16_time_over_ours_bf16"] = best(f, max(2, a.reps // 2)) / t
        fig[f"prefill_{kv}_gflops"] = flops / t / 1e9
        fig[f"prefill_{kv}_over_fma_peak"] = flops / t / fma_peak
    fig["prefill_fp8_over_bf16_speed"] = pt["bfloat16"] / pt["fp8_e4m3"]
    for kk, vv in fig.items():
        print(f"{kk:55s} {vv:8.3f}")
    print(f"fma_peak_gflops {res['fma_peak_gflops']:.1f}  isa {res['isa']}  threads {nth}")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
