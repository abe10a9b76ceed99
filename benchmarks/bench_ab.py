"""Same-run A/B comparison of two builds of vtinfer (e.g. before and after a
refactor): small-call overhead and kernel time of the store, the codec and
attention.

    python benchmarks/bench_ab.py --a /path/to/old/tree --b /path/to/new/tree --rounds 7

Each round runs one child process per tree, in alternating order (A B, then
B A, ...), so that drift on a shared machine hits both alike. A child imports
vtinfer from its tree (PYTHONPATH), times every workload (best of `--reps`
calls after a warm-up) and a same-process memcpy of 64 MiB, and prints JSON.
The report gives, per workload, the median over rounds of each build's time
normalized by its own round's memcpy, and B/A of those medians (> 1: B is
slower). Only public API calls present in both builds are used. Never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import ml_dtypes, numpy as np
import vtinfer as vt
reps = int(sys.argv[1])
rng = np.random.default_rng(0)

def best(f):
    f()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); t.append(time.perf_counter() - t0)
    return min(t)

H, D, BS = 8, 128, 16
res = {}
src = np.ones(64 << 20, np.uint8); dst = np.empty_like(src)
res["memcpy_64MiB"] = best(lambda: np.copyto(dst, src))

# store: one token (the small-call path) and 4096 tokens, functional form on a bf16 NHD cache
nb = 4096
kc = np.zeros((nb, BS, H, D), ml_dtypes.bfloat16); vc = np.zeros_like(kc)
for n in (1, 4096):
    k = rng.standard_normal((n, H, D)).astype(ml_dtypes.bfloat16); v = k.copy()
    slots = rng.permutation(nb * BS)[:n].astype(np.int64)
    res[f"store_bf16_{n}tok"] = best(lambda: vt.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", 1.0, 1.0))
# fp8 cache store, 4096 tokens
kq = np.zeros((nb, BS, H, D), np.uint8); vq = np.zeros_like(kq)
k = rng.standard_normal((4096, H, D)).astype(ml_dtypes.bfloat16); v = k.copy()
slots = rng.permutation(nb * BS)[:4096].astype(np.int64)
res["store_fp8_4096tok"] = best(lambda: vt.reshape_and_cache_flash(k, v, kq, vq, slots, "fp8_e4m3", 0.05, 0.05))
# codec: small and 16M elements
for n in (4096, 16 << 20):
    x = rng.standard_normal(n).astype(np.float32)
    res[f"fp8_quantize_{n}"] = best(lambda: vt.fp8_quantize(x, 0.01))
# attention decode: 256 keys (small call) and 32K keys GQA 4 (kernel), bf16 cache, 2 threads
for ctx in (256, 32768):
    nbk = ctx // BS
    k = rng.standard_normal((nbk, BS, H, D)).astype(ml_dtypes.bfloat16); v = k.copy()
    q = rng.standard_normal((1, 4 * H, D)).astype(ml_dtypes.bfloat16)
    bt = rng.permutation(nbk).astype(np.int32)[None]
    args = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([ctx], np.int32), block_table=bt)
    res[f"decode_bf16_{ctx}"] = best(lambda: vt.flash_attn_varlen_func(q, k, v, **args, num_threads=2))
# memory-bound decode: 32K keys GQA 1, float32 q, a bf16 and an fp8 e4m3 cache (the fp32 tile), 2 threads
nbk = 32768 // BS
kf = rng.standard_normal((nbk, BS, H, D)).astype(np.float32)
q = rng.standard_normal((1, H, D)).astype(np.float32)
bt = rng.permutation(nbk).astype(np.int32)[None]
args = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([32768], np.int32), block_table=bt)
kb = kf.astype(ml_dtypes.bfloat16)
res["decode_gqa1_bf16_32768"] = best(lambda: vt.flash_attn_varlen_func(q, kb, kb, **args, num_threads=2))
k8 = vt.fp8_quantize(kf, 0.05)
res["decode_gqa1_fp8_32768"] = best(lambda: vt.flash_attn_varlen_func(
    q, k8, k8, **args, kv_cache_dtype="fp8_e4m3", k_descale=np.float32(0.05), v_descale=np.float32(0.05),
    num_threads=2))
print(json.dumps(res))
"""


def child(tree: str, reps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), VTINFER_CUDA="0")
    out = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env, capture_output=True, text=True,
                         cwd=os.path.abspath(tree), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="tree of build A (built in place)")
    ap.add_argument("--b", required=True, help="tree of build B (built in place)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        for name in order:
            runs[name].append(child(getattr(args, name), args.reps))
    load1 = os.getloadavg()[0]
    report = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b), "rounds": args.rounds,
              "load": [load0, load1], "workloads": {}}
    print(f"A {report['a']}\nB {report['b']}\nrounds {args.rounds}  load {load0:.2f} -> {load1:.2f}")
    print(f"{'workload':24s} {'A us':>10s} {'B us':>10s} {'B/A (memcpy-normalized medians)':>34s}")
    for w in runs["a"][0]:
        if w == "memcpy_64MiB":
            continue
        na = statistics.median(x[w] / x["memcpy_64MiB"] for x in runs["a"])
        nb = statistics.median(x[w] / x["memcpy_64MiB"] for x in runs["b"])
        ta = statistics.median(x[w] for x in runs["a"]) * 1e6
        tb = statistics.median(x[w] for x in runs["b"]) * 1e6
        report["workloads"][w] = {"a_us": ta, "b_us": tb, "b_over_a": nb / na}
        print(f"{w:24s} {ta:10.1f} {tb:10.1f} {nb / na:34.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
