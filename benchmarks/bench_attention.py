"""Paged attention benchmark on realistic data, with the machine's limits.

Model shapes (H_kv 8, D 128, block 16, blocks shuffled). K and V are
N(0, 1) float32 values (quantized model activations look like this, not
like random fp8 codes); the bfloat16 cache holds them rounded to bf16 and
the fp8 cache holds ``fp8_quantize(x, s)`` of the same values with a
per-tensor scale ``s = max|x| / 448`` passed as the descale, so both
dtypes see the same logits and the same softmax.

Probes, built from benchmarks/_attn_probe.c with the system compiler and run
in the same process inside every round of every shape (so a load change hits
kernels and probes alike): read bandwidth of a buffer of the
cache's bytes on 1 and on N threads, the paged read of the same bytes (pages
of the cache's size in the block table's order, split over the threads:
``frac/pages`` is its time over the kernel's, the part of the read that is the
pages' own), the fp32 FMA peak (at the vector width
of the ISA the kernels run: 16 lanes on AVX-512, 8 on AVX2) and the AVX512-BF16
pair-dot (vdpbf16ps) peak on N threads. Per shape it prints the median time
of R interleaved rounds, the binding limit (memory: KV bytes / N-thread
read bandwidth; compute: QK + PV flops / fp32 FMA peak, the instruction the
kernels use today) and the fraction of that limit reached; with torch, SDPA
on the same values (bf16, keys gathered contiguous outside the timing) as
plain SDPA (enable_gqa) and as "group as rows" (torch held to the same ISA: with
VTINFER_ISA=avx2 or scalar, ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS
are set to match unless already set) (the G query heads of a KV
head as G query rows of one head). A second fraction is against the memory
floor or the bf16-dot peak, whichever binds (the goal of a vdpbf16ps
kernel). One more case uses the demo model's own K/V (SmolLM2-135M: 30
layers x 2048 tokens of the demo's text, H_kv 3, D 64, GQA 3, each layer one
sequence of a decode batch with its last token's real query; captured once
into ~/.cache/vtinfer/bench, ~50 MB; skipped with the reason when the model
is not converted, `--model-kv 0` leaves it out). Never asserts.

    python benchmarks/bench_attention.py [--ctx 32768] [--dram-ctx 131072] [--reps 5]
                                         [--threads N] [--out results/attention.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import vtinfer as vt  # noqa: E402
from vtinfer import _C  # noqa: E402
from _common import build_probe  # noqa: E402

HKV, D, BS = 8, 128, 16


def values(shape, rng):
    return rng.standard_normal(shape, dtype=np.float32)


def make(ctx, G, q_len=1, seed=0):
    """One problem: q, both caches (same values), the call's arguments."""
    rng = np.random.default_rng(seed)
    nb = -(-ctx // BS)
    shape = (nb, BS, HKV, D)
    kf, vf = values(shape, rng), values(shape, rng)
    ks, vs = float(np.abs(kf).max()) / 448.0, float(np.abs(vf).max()) / 448.0
    caches = {
        "bfloat16": (kf.astype(ml_dtypes.bfloat16), vf.astype(ml_dtypes.bfloat16), {}),
        "fp8_e4m3": (vt.fp8_quantize(kf, ks), vt.fp8_quantize(vf, vs),
                     dict(kv_cache_dtype="fp8_e4m3", k_descale=np.array([ks], np.float32),
                          v_descale=np.array([vs], np.float32))),
    }
    del kf, vf
    bt = rng.permutation(nb).astype(np.int32)[None]
    q = values((q_len, HKV * G, D), rng).astype(ml_dtypes.bfloat16)
    args = dict(cu_seqlens_q=np.array([0, q_len], np.int32), seqused_k=np.array([ctx], np.int32), block_table=bt)
    return q, caches, args


MODEL_TOKENS = 2048


def model_kv(cache_dir):
    """K, V and the last token's queries of every layer of the demo model
    (SmolLM2-135M-Instruct, converted under ~/.cache/vtinfer) over the first
    MODEL_TOKENS tokens of the demo's evaluation text, float32 post-RoPE, as
    the decoder stores and reads them. Captured once (about a minute) into
    ``cache_dir/smollm2_kv_{MODEL_TOKENS}.npz`` (~50 MB, bf16 bits); None
    (with the reason) when the model has not been converted: run
    ``vtinfer demo`` once."""
    path = os.path.join(cache_dir, f"smollm2_kv_{MODEL_TOKENS}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            return {n: z[n] for n in z.files}, None
    from vtinfer.models.decoder import Decoder
    from vtinfer.models.evaltext import eval_text
    from vtinfer.models.gguf_convert import default_model_dir

    mdir = default_model_dir(convert=False)
    if mdir is None:
        return None, "the demo model is not converted (run `vtinfer demo` once)"
    model = Decoder.from_pretrained(mdir)
    toks = np.asarray(model.tokenizer.encode(eval_text()), np.int64)[:MODEL_TOKENS]
    ks, vs, qs = [], [], []
    real = vt.flash_attn_varlen_func

    def grab_q(q, *a, **kw):  # the decoder calls vt.flash_attn_varlen_func once per layer, after the store
        qs.append(np.array(q[-1], np.float32))
        return real(q, *a, **kw)

    sess = model.session("float32", max_tokens=len(toks))
    sess.observer = lambda layer, k, v: (ks.append(np.array(k, np.float32)), vs.append(np.array(v, np.float32)))
    vt.flash_attn_varlen_func = grab_q
    try:
        for i in range(0, len(toks), 256):
            sess.forward_hidden(toks[i:i + 256])
    finally:
        vt.flash_attn_varlen_func = real
    L = model.config.num_layers
    k = np.stack([np.concatenate(ks[li::L]) for li in range(L)])  # [L, T, Hkv, D]
    v = np.stack([np.concatenate(vs[li::L]) for li in range(L)])
    q = np.stack(qs[-L:])  # [L, H, D]: the last token's queries, one row per layer
    bf = lambda a: a.astype(ml_dtypes.bfloat16).view(np.uint16)  # noqa: E731
    out = {"k": bf(k), "v": bf(v), "q": bf(q), "softmax_scale": np.float32(model.config.head_dim ** -0.5)}
    os.makedirs(cache_dir, exist_ok=True)
    np.savez(path, **out)
    return out, None


def make_model(cap):
    """A batch of one decode query per layer of the demo model: sequence b
    is layer b's MODEL_TOKENS keys (the model's own K/V, bf16) and its last
    token's real query; blocks shuffled across the batch."""
    k = cap["k"].view(ml_dtypes.bfloat16).astype(np.float32)
    v = cap["v"].view(ml_dtypes.bfloat16).astype(np.float32)
    L, T, hkv, d = k.shape
    nbs = T // BS
    perm = np.random.default_rng(0).permutation(L * nbs)
    inv = np.argsort(perm)  # page perm[j] holds logical block j

    def pages(a):
        return a.reshape(L * nbs, BS, hkv, d)[inv]

    # fp8: one scale per layer (the sequence of this batch), max |x| / 448, as the demo's per-layer calibration
    ks = (np.abs(k).max(axis=(1, 2, 3)) / 448.0).astype(np.float32)
    vs = (np.abs(v).max(axis=(1, 2, 3)) / 448.0).astype(np.float32)
    k8 = np.stack([vt.fp8_quantize(k[i], float(ks[i])) for i in range(L)])
    v8 = np.stack([vt.fp8_quantize(v[i], float(vs[i])) for i in range(L)])
    caches = {
        "bfloat16": (pages(k).astype(ml_dtypes.bfloat16), pages(v).astype(ml_dtypes.bfloat16), {}),
        "fp8_e4m3": (pages(k8), pages(v8),
                     dict(kv_cache_dtype="fp8_e4m3", k_descale=np.repeat(ks[:, None], hkv, 1),
                          v_descale=np.repeat(vs[:, None], hkv, 1))),
    }
    bt = perm.reshape(L, nbs).astype(np.int32)
    q = cap["q"].view(ml_dtypes.bfloat16)  # [L, H, D]: one query token per sequence
    args = dict(cu_seqlens_q=np.arange(L + 1, dtype=np.int32), seqused_k=np.full(L, T, np.int32), block_table=bt,
                softmax_scale=float(cap["softmax_scale"]))
    geom = {"batch": L, "hkv": hkv, "d": d, "G": q.shape[1] // hkv,
            "fp8_scales": [float(ks.min()), float(ks.max()), float(vs.min()), float(vs.max())]}
    return q, caches, args, geom


def torch_ops(torch, q, k, v, bt, G, q_len, nth):
    """SDPA (bf16) on the same values, keys gathered contiguous outside the timing."""
    F = torch.nn.functional
    tk = torch.from_numpy(k.view(np.uint16)[bt[0]].reshape(-1, HKV, D)).view(torch.bfloat16).transpose(0, 1)[None]
    tv = torch.from_numpy(v.view(np.uint16)[bt[0]].reshape(-1, HKV, D)).view(torch.bfloat16).transpose(0, 1)[None]
    tk, tv = tk.contiguous(), tv.contiguous()
    tq = torch.from_numpy(q.view(np.uint16)).view(torch.bfloat16).transpose(0, 1)[None].contiguous()  # [1, H, ql, D]
    kl = tk.shape[2]
    mask = None
    if q_len > 1:
        mask = torch.from_numpy(np.arange(kl)[None, :] <= (kl - q_len + np.arange(q_len))[:, None])
    ops = {"sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, enable_gqa=G > 1)}
    if q_len == 1 and G > 1:
        rows = tq.reshape(1, HKV, G, D)  # the G heads of a KV head as G query rows
        ops["sdpa_group_rows"] = lambda: F.scaled_dot_product_attention(rows, tk, tv)
    return ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--dram-ctx", type=int, default=131072, help="the DRAM-scale case (GQA 4); 0 skips it")
    ap.add_argument("--prefill-q", type=int, default=512)
    ap.add_argument("--prefill-k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--model-kv", type=int, default=1,
                    help="1: add the demo model's own K/V case (skipped, with the reason, when the model is not "
                         "converted); 0: leave it out")
    ap.add_argument("--model-kv-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "vtinfer", "bench"),
                    help="where the captured K/V are kept")
    a = ap.parse_args()
    nth = a.threads or len(os.sched_getaffinity(0))
    lib = build_probe(_C.isa())
    # torch held to the ISA vtinfer runs (VTINFER_ISA=avx2 on an AVX-512 machine gives the AVX2 figures of both);
    # set before torch is imported, and never over a value the caller set
    held = {"avx2": "avx2", "scalar": "default"}.get(os.environ.get("VTINFER_ISA", ""))
    if held:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", held)
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2" if held == "avx2" else "SSE41")
        os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2" if held == "avx2" else "SSE4_2")
    try:
        import torch

        torch.set_num_threads(nth)
        tver = f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    except ImportError:
        torch, tver = None, "not installed"
    res = {"isa": _C.isa(), "threads": nth, "torch": tver, "reps": a.reps,
           "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "shapes": {},
           "probes": {}}

    iters = 1_000_000
    has_bf16dot = lib.bf16dot_peak(1000, 1) > 0

    def compute_probes():
        """(fp32 FMA, bf16-dot) peaks in flop/s, best of 2 each; run inside every round."""
        f = max(iters * lib.fmas_per_iter * lib.lanes * 2 * nth / lib.fma_peak(iters, nth) for _ in range(2))
        b = max(iters * 16 * 64 * nth / lib.bf16dot_peak(iters, nth) for _ in range(2)) if has_bf16dot else float("nan")
        return f, b

    all_fma, all_bfd = [], []

    def synthetic(ctx, G, ql):
        def build():
            q, caches, args = make(ctx, G, ql)
            pairs = ctx if ql == 1 else sum(ctx - ql + i + 1 for i in range(ql))
            return q, caches, args, {"ctx": ctx, "gqa": G, "q_len": ql, "flops": 4.0 * HKV * G * D * pairs}
        return build

    shapes = [(f"decode_{a.ctx // 1024}k_gqa{g}", synthetic(a.ctx, g, 1)) for g in (1, 4, 8)]
    if a.dram_ctx:
        shapes.append((f"decode_{a.dram_ctx // 1024}k_gqa4", synthetic(a.dram_ctx, 4, 1)))
    shapes.append((f"prefill_{a.prefill_q}x{a.prefill_k}_gqa4_causal", synthetic(a.prefill_k, 4, a.prefill_q)))
    if a.model_kv:
        cap, why = model_kv(a.model_kv_cache)
        if cap is None:
            res["model_kv"] = f"skipped: {why}"
        else:
            def model_case():
                q, caches, args, g = make_model(cap)
                T = int(args["seqused_k"][0])
                info = {"ctx": T, "gqa": g["G"], "q_len": 1, "batch": g["batch"], "num_kv_heads": g["hkv"],
                        "head_size": g["d"], "fp8_scales": g["fp8_scales"],
                        "flops": 4.0 * g["batch"] * g["hkv"] * g["G"] * g["d"] * T}
                return q, caches, args, info
            shapes.append((f"decode_model_smollm2_{cap['k'].shape[0]}x{cap['k'].shape[1]}", model_case))
    for name, build in shapes:
        q, caches, args, info = build()
        ctx, G, ql, flops = info["ctx"], info["gqa"], info["q_len"], info["flops"]
        ops = {}
        for kv, (k, v, extra) in caches.items():
            ops[kv] = (lambda k=k, v=v, extra=extra: vt.flash_attn_varlen_func(q, k, v, **args, **extra,
                                                                               num_threads=nth))
        if torch is not None and "batch" not in info:
            k, v, _ = caches["bfloat16"]
            for tn, f in torch_ops(torch, q, k, v, args["block_table"], G, ql, nth).items():
                ops["torch_" + tn] = f
        bufs = {kv: np.ones((caches[kv][0].nbytes * 2) // 4, np.float32) for kv in caches}
        order = np.ascontiguousarray(args["block_table"].ravel(), np.int32)  # every sequence's pages, in its order
        pr = {kv: [] for kv in caches}
        samples = {k: [] for k in ops}
        bw1 = {kv: [] for kv in caches}
        bwn = {kv: [] for kv in caches}
        fmas, bfds = [], []
        for f in ops.values():
            f()  # warm up
        for _ in range(a.reps):  # interleaved rounds: kernels and probes alike
            for k, f in ops.items():
                t0 = time.perf_counter()
                f()
                samples[k].append(time.perf_counter() - t0)
            for kv, b in bufs.items():  # best of 3 reads within a round, median over rounds
                bw1[kv].append(max(b.nbytes / lib.read_bw(b.ctypes.data, b.nbytes, 1, 1) for _ in range(3)))
                bwn[kv].append(max(b.nbytes / lib.read_bw(b.ctypes.data, b.nbytes, nth, 1) for _ in range(3)))
                pb = caches[kv][0][0].nbytes  # one page of K (as of V): the buffer holds K's pages, then V's
                pr[kv].append(min(lib.read_pages(b.ctypes.data, b.ctypes.data + b.nbytes // 2, pb, order.ctypes.data,
                                                 len(order), b.nbytes // 2 // pb, nth) for _ in range(3)))
            f_, b_ = compute_probes()
            fmas.append(f_)
            bfds.append(b_)
        del bufs
        med = {k: statistics.median(v) for k, v in samples.items()}
        fma_peak, bfd_peak = statistics.median(fmas), statistics.median(bfds)
        all_fma += fmas
        all_bfd += bfds
        out = dict(info, median_s=med, samples_s=samples, fma_peak_gflops=fma_peak / 1e9,
                   bf16dot_peak_gflops=bfd_peak / 1e9)
        for kv in caches:
            nbytes = caches[kv][0].nbytes * 2
            bw = statistics.median(bwn[kv])
            t_mem, t_cmp = nbytes / bw, flops / fma_peak
            limit, bound = (t_mem, "memory") if t_mem >= t_cmp else (t_cmp, "fp32 FMA")
            # the goal of a bf16-dot kernel: the memory floor or the bf16-dot peak, whichever binds
            t_bfd = flops / bfd_peak if bfd_peak == bfd_peak else t_cmp
            limit2, bound2 = (t_mem, "memory") if t_mem >= t_bfd else (t_bfd, "bf16 dot")
            out[kv] = {"kv_bytes": nbytes, "read_bw_1t_GBps": statistics.median(bw1[kv]) / 1e9,
                       f"read_bw_{nth}t_GBps": bw / 1e9, "limit_s": limit, "bound": bound,
                       "fraction_of_limit": limit / med[kv], "kv_bytes_per_s_over_read_bw": nbytes / med[kv] / bw,
                       "limit_bf16dot_s": limit2, "bound_bf16dot": bound2,
                       "fraction_of_bf16dot_limit": limit2 / med[kv], "gflops": flops / med[kv] / 1e9,
                       "page_read_s": statistics.median(pr[kv]),
                       "fraction_of_page_read": statistics.median(pr[kv]) / med[kv]}
        out["fp8_speedup_over_bf16"] = med["bfloat16"] / med["fp8_e4m3"]
        for tk_ in [k for k in med if k.startswith("torch_")]:
            out[f"bf16_time_over_{tk_}"] = med["bfloat16"] / med[tk_]
        res["shapes"][name] = out
        del caches, ops
    res["load_average_end"] = os.getloadavg()
    res["probes"]["fma_peak_gflops"] = statistics.median(all_fma) / 1e9
    res["probes"]["bf16dot_peak_gflops"] = statistics.median(all_bfd) / 1e9
    res["probes"]["fma_lanes"] = lib.lanes
    res["probes"]["note"] = "medians over every round of every shape (each round runs the compute probes)"

    p = res["probes"]
    print(f"isa {res['isa']}  threads {nth}  torch {tver}  load {res['load_average'][0]:.1f} -> "
          f"{res['load_average_end'][0]:.1f}  fp32 FMA peak ({lib.lanes} lanes) {p['fma_peak_gflops']:.0f} GFLOP/s  "
          f"bf16-dot peak {p['bf16dot_peak_gflops']:.0f} GFLOP/s")
    if "model_kv" in res:
        print(f"model K/V case {res['model_kv']}")
    print(f"{'shape':34s} {'kv':9s} {'ms':>8s} {'limit ms':>9s} {'bound':>9s} {'frac':>6s} {'frac/bf16dot':>12s} "
          f"{'rd bw GB/s':>10s} {'frac/pages':>10s}")
    for name, o in res["shapes"].items():
        for kv in ("bfloat16", "fp8_e4m3"):
            r = o[kv]
            print(f"{name:34s} {kv:9s} {o['median_s'][kv] * 1e3:8.2f} {r['limit_s'] * 1e3:9.2f} {r['bound']:>9s} "
                  f"{r['fraction_of_limit']:6.3f} {r['fraction_of_bf16dot_limit']:12.3f} "
                  f"{r[f'read_bw_{nth}t_GBps']:10.1f} {r['fraction_of_page_read']:10.3f}")
        extra = "  ".join(f"{k[6:]} {v * 1e3:.2f} ms" for k, v in o["median_s"].items() if k.startswith("torch_"))
        ratios = "  ".join(f"{k[15:]}: {v:.3f}" for k, v in o.items() if k.startswith("bf16_time_over_"))
        print(f"{'':34s} fp8/bf16 speedup {o['fp8_speedup_over_bf16']:.3f}  {extra}  bf16 time / torch {ratios}")
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    if a.json:
        print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
