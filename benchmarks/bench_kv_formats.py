"""Decode speed of the per-token-head KV formats next to bfloat16 and per-tensor fp8, one run.

python benchmarks/bench_kv_formats.py [--ctx 32768] [--block-size 16] [--reps 5] [--threads N] [--no-int4]
                                      [--slots] [--dtypes FMT,FMT,...]
                                      [--ggml SRC --ggml-lib LIBDIR] [--out FILE]

One query per KV-head group (decode) over a 32K-token sequence, H_kv 8,
D 128, block_size 16 (``--block-size``: vLLM's CPU default is 128), shuffled
blocks, GQA 1/4/8, bf16 queries; the caches
are filled by PagedKVCache.store, except int4_per_token_head, which has no
PagedKVCache here: its caller-owned caches (vLLM's uint8 page views) are
filled by vt.reshape_and_cache_flash and read by vt.flash_attn_varlen_func
(causal: vLLM's int4 read is causal only; one query at the last position sees
every key). ``--slots`` adds the slot formats turboquant_k8v4,
ultraquant_4bit and octave_k3v4 (vt.turboquant_store into one uint8 slot cache, read by
vt.turboquant_attention: chunks of slots decoded into float32 rows under the
float32 tile); ``--dtypes`` runs the formats it names instead (any of the
above, the other TurboQuant presets, nvfp4 / nvfp4_4over6 as slot caches, and
``nvfp4_pages``: nvfp4 on vLLM's two page side views, whose read dequantizes
the referenced blocks and then runs the float32 attention). ``--ggml`` adds ggml's CPU flash attention
(``ggml_flash_attn_ext``) over the same K / V values as f16, q8_0 and q4_0,
contiguous (ggml has no pages), float32 queries, in the same rounds
(_common.GGML_HOWTO says how to build one). Each round also runs the paged
read probe (benchmarks/_attn_probe.c ``read_pages``) per paged format: the
threads read that format's K and V code pages (block_size x H_kv rows of its
row bytes each; the per-token-head scales left out) in the block table's
order, split as the sequence is, and nothing else: ``page_read_ms``, each
read's time over it (``over_page_read``, GQA 1), and the speed over bf16
that the page reads alone allow (``page_read_speedup_vs_bf16``). The --reps rounds are interleaved (every format
and GQA once per round) and the times are their best/median; ratios are taken
within this run (the machine is shared: quote same-run ratios only, with the load).
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
from _common import GGML_HOWTO, build_probe, ggml_flash_attn

DTYPES = ("bfloat16", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
INT4 = "int4_per_token_head"
SLOTS = ("turboquant_k8v4", "ultraquant_4bit", "octave_k3v4")
# every slot format the bench can read (--dtypes), SLOTS the ones --slots adds
SLOT_FORMATS = SLOTS + ("turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "nvfp4", "nvfp4_4over6")
# nvfp4 on vLLM's own page views (two side views; the read dequantizes the referenced blocks, then float32)
NVFP4_PAGES = "nvfp4_pages"
GGML_TYPES = ("f16", "q8_0", "q4_0")
# bytes of one (token, KV head) code row per D elements, for the paged read probe
ROW_BYTES = {"bfloat16": 2, "fp8_e4m3": 1, "int8_per_token_head": 1, "fp8_per_token_head": 1,
             "int4_per_token_head": 0.5}


def make_readers(dtypes, k, v, nb, BS, Hkv, D, slots, bt, ctx, threads):
    """One callable per dtype: q -> the decode output over that dtype's cache of k / v."""
    kw = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([ctx], np.int32), block_table=bt,
              num_threads=threads)
    readers = {}
    for dt in dtypes:
        if dt in SLOT_FORMATS:  # one caller-owned uint8 slot cache holds K and V
            sc = np.zeros((nb, BS, Hkv, vt.turboquant_slot_bytes(dt, D)), np.uint8)
            vt.turboquant_store(k, v, sc, slots, dt)
            readers[dt] = lambda q, sc=sc, dt=dt: vt.turboquant_attention(q, sc, kv_cache_dtype=dt, **kw)
            continue
        if dt == NVFP4_PAGES:
            kv = np.zeros((nb, 2 * Hkv, BS, D // 2 + D // 16), np.uint8).transpose(0, 2, 1, 3)
            kc, vc = kv[:, :, :Hkv], kv[:, :, Hkv:]
            vt.reshape_and_cache_flash(k, v, kc, vc, slots, "nvfp4", 1.0, 1.0)
            readers[dt] = lambda q, kc=kc, vc=vc: vt.flash_attn_varlen_func(q, kc, vc, kv_cache_dtype="nvfp4", **kw)
            continue
        if dt == INT4:  # caller-owned caches: codes [nb, BS, Hkv, D / 2] uint8, scales [nb, BS, Hkv] float32
            kc, vc = (np.zeros((nb, BS, Hkv, D // 2), np.uint8) for _ in range(2))
            ks, vs = (np.zeros((nb, BS, Hkv), np.float32) for _ in range(2))
            vt.reshape_and_cache_flash(k, v, kc, vc, slots, INT4, 1.0, 1.0, k_scale_cache=ks, v_scale_cache=vs)
            readers[dt] = lambda q, kc=kc, vc=vc, ks=ks, vs=vs: vt.flash_attn_varlen_func(
                q, kc, vc, kv_cache_dtype=INT4, k_scale_cache=ks, v_scale_cache=vs, causal=True, **kw)
            continue
        c = vt.PagedKVCache(1, nb, BS, Hkv, D, dt, k_scale=0.05, v_scale=0.05) if dt == "fp8_e4m3" else \
            vt.PagedKVCache(1, nb, BS, Hkv, D, dt)
        c.store(0, k, v, slots)
        readers[dt] = lambda q, c=c: c.attention(0, q, **kw)
    return readers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=16, help="tokens per page (a multiple of 16; vLLM's CPU "
                    "default is 128)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-int4", action="store_true", help="leave out int4_per_token_head")
    ap.add_argument("--slots", action="store_true", help="add turboquant_k8v4, ultraquant_4bit and octave_k3v4")
    ap.add_argument("--dtypes", default=None, help="a comma-separated list of formats to run instead (of "
                    + ", ".join(DTYPES + SLOT_FORMATS) + ")")
    ap.add_argument("--ggml", default=None, help="a ggml source tree, for same-run ggml figures; " + GGML_HOWTO)
    ap.add_argument("--ggml-lib", default=None, help="the folder of that ggml's built shared libraries")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    Hkv, D, BS = 8, 128, a.block_size
    if BS < 16 or BS % 16 or a.ctx % BS:
        ap.error(f"--block-size must be a multiple of 16 that divides --ctx; got {BS}")
    nb = a.ctx // BS
    dtypes = tuple(d for d in DTYPES if not (a.no_int4 and d == INT4)) + (SLOTS if a.slots else ())
    if a.dtypes:
        dtypes = tuple(a.dtypes.split(","))
        bad = [d for d in dtypes if d not in DTYPES + SLOT_FORMATS + (NVFP4_PAGES,)]
        if bad:
            ap.error(f"--dtypes: unknown {bad}; known: {', '.join(DTYPES + SLOT_FORMATS + (NVFP4_PAGES,))}")
    rng = np.random.default_rng(0)
    perm = rng.permutation(nb).astype(np.int32)
    slots = (perm[np.arange(a.ctx) // BS].astype(np.int64) * BS + np.arange(a.ctx) % BS)
    k = rng.standard_normal((a.ctx, Hkv, D)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((a.ctx, Hkv, D)).astype(ml_dtypes.bfloat16)
    res: dict = {"ctx": a.ctx, "block_size": BS, "reps": a.reps, "uptime": os.getloadavg(), "isa": vt.build_info()["isa"], "ms": {}}
    readers = make_readers(dtypes, k, v, nb, BS, Hkv, D, slots, perm[None, :], a.ctx, a.threads)
    qs = {G: rng.standard_normal((1, Hkv * G, D)).astype(ml_dtypes.bfloat16) for G in (1, 4, 8)}
    nth = a.threads or len(os.sched_getaffinity(0))
    probe = build_probe(res["isa"])
    # per paged format: its K pages, then its V pages (one buffer)
    pages = {dt: np.ones(2 * int(nb * BS * Hkv * D * ROW_BYTES[dt]) // 4, np.float32) for dt in dtypes if dt in ROW_BYTES}
    res["probe_lanes"] = probe.lanes
    if a.ggml:  # ggml reads the same values, contiguous, with float32 queries; one graph per (type, GQA)
        make = ggml_flash_attn(a.ggml, a.ggml_lib or os.path.join(a.ggml, "build", "bin"))
        kf, vf = k.astype(np.float32), v.astype(np.float32)
        runs = {(t, G): make(t, kf, vf, q.astype(np.float32)) for t in GGML_TYPES for G, q in qs.items()}
        del kf, vf
        for t in GGML_TYPES:
            readers[f"ggml_{t}"] = lambda q, t=t: runs[(t, q.shape[1] // Hkv)](nth)
        dtypes = dtypes + tuple(f"ggml_{t}" for t in GGML_TYPES)
        res["ggml"] = {"src": a.ggml, "lib": a.ggml_lib}
    ts: dict = {}
    for G, q in qs.items():  # warm-up: one call of each
        for dt in dtypes:
            readers[dt](q)
    for _ in range(a.reps):
        for G, q in qs.items():
            for dt in dtypes:
                t0 = time.perf_counter()
                t_own = readers[dt](q)  # ggml's readers time their graph compute themselves
                t = t_own if isinstance(t_own, float) else time.perf_counter() - t0
                ts.setdefault(f"{dt} GQA{G}", []).append(t)
        for dt, buf in pages.items():  # the same pages' read alone, K and V, best of 3 within the round
            pb, kb = buf.nbytes // (2 * nb), buf.ctypes.data
            ts.setdefault(f"{dt} page_read", []).append(min(
                probe.read_pages(kb, kb + nb * pb, pb, perm.ctypes.data, nb, nb, nth) for _ in range(3)))
    for name, t in ts.items():
        res["ms"][name] = {"best": 1e3 * min(t), "median": 1e3 * float(np.median(t))}
    res["uptime_after"] = os.getloadavg()
    pr = {dt: res["ms"][f"{dt} page_read"]["median"] for dt in pages}
    for dt in pages:
        r = res.setdefault("page_read", {})[dt] = {
            "page_read_ms": pr[dt], "page_bytes": pages[dt].nbytes // (2 * nb),
            "over_page_read_gqa1": res["ms"][f"{dt} GQA1"]["median"] / pr[dt]}
        if "bfloat16" in pr:
            r["page_read_speedup_vs_bf16"] = pr["bfloat16"] / pr[dt]
    for G in qs:
        m = {dt: res["ms"][f"{dt} GQA{G}"]["median"] for dt in dtypes}
        for dt in dtypes:  # against whichever of the two references this run has
            refs = {f"speedup_vs_{n}": m[r] / m[dt] for n, r in (("bf16", "bfloat16"), ("fp8", "fp8_e4m3"))
                    if r in m and dt not in ("bfloat16", "fp8_e4m3")}
            if refs:
                res.setdefault("ratios", {})[f"{dt} GQA{G}"] = refs
        if a.ggml:  # the ggml goals: vt bf16 / ggml f16 time, vt int4 / ggml q4_0 time
            r = res.setdefault("vs_ggml", {})
            r[f"GQA{G}"] = {"bf16_time_over_ggml_f16": m.get("bfloat16", float("nan")) / m["ggml_f16"],
                            "fp8_time_over_ggml_q8_0": m.get("fp8_e4m3", float("nan")) / m["ggml_q8_0"],
                            "int8_pth_time_over_ggml_q8_0": m.get("int8_per_token_head", float("nan")) / m["ggml_q8_0"],
                            "int4_pth_time_over_ggml_q4_0": m.get(INT4, float("nan")) / m["ggml_q4_0"]}
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
