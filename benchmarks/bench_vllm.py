"""vLLM offline generation on SmolLM2-135M: vLLM's own CPU_ATTN against vtinfer's backend per KV format.

    python benchmarks/bench_vllm.py --rounds 2 --out /tmp/bench_vllm.json

Needs vLLM's CPU build (``pip install 'vtinfer[vllm]'``) and the demo's default model (converted on
first use). Per configuration, one engine (``enforce_eager``, the ``uni`` executor, engine core in
process) is started and, after one warm-up pass, the workloads below are repeated ``--repeats`` times:

- ``decode``: ``--batch`` prompts of ``--prompt-tokens`` tokens (the demo's eval text, one offset per
  prompt), ``--gen-tokens`` greedy tokens each (EOS ignored), submitted together: generated tokens
  per second of wall time (prefill included, as a user sees it);
- ``ttft``: one prompt of ``--ttft-tokens`` tokens and one generated token: time to first token.

and the KV cache capacity vLLM reports for ``VLLM_CPU_KVCACHE_SPACE`` (``--kv-gib``) GiB:
``num_gpu_blocks * block_size`` tokens.

vLLM loads its plugins once per process, so CPU_ATTN (``VTINFER_VLLM`` unset) and vtinfer
(``VTINFER_VLLM=1``) run in separate child processes; the children alternate (reference, vtinfer,
reference, vtinfer, ...) for ``--rounds`` rounds so that drift of this shared machine hits both alike,
and each figure is the median over every repeat of every round. OpenMP (``OMP_NUM_THREADS``) and
vtinfer (``VTINFER_NUM_THREADS``) get the same ``--threads``. Prints ``/proc/loadavg`` before and
after every child, the CPU model and ISA. Never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VTINFER_FORMATS = ("auto", "fp8", "int8_per_token_head", "int4_per_token_head", "turboquant_k8v4")
# stored bytes per token and layer relative to bf16 (K and V, head_dim 64): 8-bit codes + a 4-byte
# scale per (token, head) for the per-token-head formats; TurboQuant's slot; vLLM's int4 page
BYTE_RATIO_GOAL = {"auto": 1.0, "fp8": 2.0, "int8_per_token_head": 2.0, "int4_per_token_head": 3.5,
                   "turboquant_k8v4": None}


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def cpu_info() -> dict[str, Any]:
    model, flags = "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    isa = [f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma", "f16c"))]
    return {"model": model, "isa": sorted(isa), "cpus": len(os.sched_getaffinity(0))}


# ----------------------------------------------------------------------------------------------- child

def _child(job: dict[str, Any]) -> dict[str, Any]:
    import gc

    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    toks = job["tokens"]
    b, p = job["batch"], job["prompt_tokens"]
    prompts = [{"prompt_token_ids": toks[i * 7:i * 7 + p]} for i in range(b)]
    ttft_prompt = [{"prompt_token_ids": toks[:job["ttft_tokens"]]}]
    gen = SamplingParams(temperature=0.0, max_tokens=job["gen_tokens"], ignore_eos=True, detokenize=False)
    one = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
    out = []
    for cfg in job["configs"]:
        rec: dict[str, Any] = {"config": cfg, "error": None}
        try:
            t0 = time.perf_counter()
            llm = LLM(model=job["model"], dtype=job["dtype"], kv_cache_dtype=cfg, enforce_eager=True,
                      max_model_len=job["max_model_len"], distributed_executor_backend="uni", seed=0)
            rec["start_s"] = time.perf_counter() - t0
            vc = llm.llm_engine.vllm_config
            layers = [a for a in vc.compilation_config.static_forward_context.values() if hasattr(a, "attn_backend")]
            rec["backend"] = sorted({f"{a.attn_backend.__module__}.{a.attn_backend.__qualname__}" for a in layers})
            rec["kv_tokens"] = int(vc.cache_config.num_gpu_blocks) * int(vc.cache_config.block_size)
            rec["block_size"] = int(vc.cache_config.block_size)
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False),
                         use_tqdm=False)  # warm-up
            dec, ttft = [], []
            for _ in range(job["repeats"]):
                t0 = time.perf_counter()
                res = llm.generate(prompts, gen, use_tqdm=False)
                dt = time.perf_counter() - t0
                dec.append(sum(len(r.outputs[0].token_ids) for r in res) / dt)
                t0 = time.perf_counter()
                llm.generate(ttft_prompt, one, use_tqdm=False)
                ttft.append(time.perf_counter() - t0)
            rec["decode_tok_s"], rec["ttft_s"] = dec, ttft
            llm.llm_engine.engine_core.shutdown()
            del llm
        except Exception as e:  # a format the backend lacks is a row with its error, not a crash
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()
        out.append(rec)
        print(f"[bench child] {cfg}: {rec.get('error') or 'ok'}", file=sys.stderr, flush=True)
    return {"results": out}


# ---------------------------------------------------------------------------------------------- parent

def _run_child(job: dict[str, Any], vtinfer_on: bool, threads: int, kv_gib: int, log: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("VTINFER_VLLM", None)
    if vtinfer_on:
        env["VTINFER_VLLM"] = "1"
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE=str(kv_gib),
               OMP_NUM_THREADS=str(threads), VTINFER_NUM_THREADS=str(threads),
               VLLM_CPU_OMP_THREADS_BIND=env.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"))
    with tempfile.TemporaryDirectory() as d:
        jp, op = Path(d) / "job.json", Path(d) / "out.json"
        jp.write_text(json.dumps(job))
        with open(log, "a") as lf:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(jp), str(op)], env=env,
                           stdout=lf, stderr=subprocess.STDOUT, check=False)
        return json.loads(op.read_text()) if op.exists() else {"results": []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo's model)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=768)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--ttft-tokens", type=int, default=512)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE (GiB)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS = VTINFER_NUM_THREADS")
    ap.add_argument("--formats", nargs="*", default=list(VTINFER_FORMATS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--log", default=None, help="children's vLLM logs (default: a temporary file)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        job = json.loads(Path(a.child[0]).read_text())
        Path(a.child[1]).write_text(json.dumps(_child(job)))
        return

    from vtinfer.models.evaltext import eval_text
    from vtinfer.models.gguf_convert import default_model_dir
    from vtinfer.models.tokenizer import HFTokenizer

    model = Path(a.model) if a.model else default_model_dir(convert=True, fetch=True)
    toks = HFTokenizer(Path(model) / "tokenizer.json").encode(eval_text())
    need = max(a.prompt_tokens + 7 * a.batch, a.ttft_tokens)
    toks = (toks * (need // len(toks) + 1))[:need]
    base = {"model": str(model), "dtype": a.dtype, "tokens": toks, "batch": a.batch,
            "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "ttft_tokens": a.ttft_tokens,
            "max_model_len": a.max_model_len, "repeats": a.repeats}
    log = Path(a.log) if a.log else Path(tempfile.mkstemp(prefix="bench_vllm_", suffix=".log")[1])
    info = cpu_info()
    print(f"CPU: {info['model']}, {info['cpus']} cpus; ISA: {' '.join(info['isa'])}")
    print(f"threads {a.threads}; KV budget {a.kv_gib} GiB; model dtype {a.dtype}; decode: {a.batch} x "
          f"({a.prompt_tokens} prompt + {a.gen_tokens} generated); ttft: {a.ttft_tokens} tokens; log {log}")
    rows: dict[str, dict[str, Any]] = {}
    loads = []
    for rnd in range(a.rounds):
        for name, on, cfgs in (("cpu_attn", False, ["auto"]), ("vtinfer", True, a.formats)):
            before = loadavg()
            t0 = time.time()
            res = _run_child(dict(base, configs=cfgs), on, a.threads, a.kv_gib, log)
            after = loadavg()
            loads.append({"round": rnd, "child": name, "before": before, "after": after,
                          "seconds": time.time() - t0})
            print(f"round {rnd} {name}: loadavg before {before} | after {after} ({time.time() - t0:.0f} s)")
            for r in res["results"]:
                key = f"{name}/{r['config']}"
                row = rows.setdefault(key, {"decode_tok_s": [], "ttft_s": [], "errors": []})
                if r.get("error"):
                    row["errors"].append(r["error"])
                    continue
                row["decode_tok_s"] += r["decode_tok_s"]
                row["ttft_s"] += r["ttft_s"]
                row.update(kv_tokens=r["kv_tokens"], backend=r["backend"], block_size=r["block_size"])
    ref = rows.get("cpu_attn/auto", {})
    vt_bf16 = rows.get("vtinfer/auto", {})

    def med(row: dict[str, Any], k: str) -> float:
        return statistics.median(row[k]) if row.get(k) else float("nan")

    print()
    print(f"{'backend/kv':34s} {'tok/s':>8s} {'vs CPU_ATTN':>11s} {'vs vt bf16':>10s} {'ttft ms':>8s} "
          f"{'KV tokens':>10s} {'x bf16':>7s}  backend")
    for key, row in rows.items():
        if not row["decode_tok_s"]:
            print(f"{key:34s} error: {row['errors'][0] if row['errors'] else '?'}")
            continue
        tps, ttft = med(row, "decode_tok_s"), med(row, "ttft_s")
        kv_ratio = row["kv_tokens"] / ref["kv_tokens"] if ref.get("kv_tokens") else float("nan")
        print(f"{key:34s} {tps:8.1f} {tps / med(ref, 'decode_tok_s'):11.2f} "
              f"{tps / med(vt_bf16, 'decode_tok_s'):10.2f} {1e3 * ttft:8.0f} {row['kv_tokens']:10d} "
              f"{kv_ratio:7.2f}  {','.join(row['backend'])}")
        row.update(decode_tok_s_median=tps, ttft_s_median=ttft, kv_tokens_vs_cpu_attn_bf16=kv_ratio)
    payload = {"cpu": info, "args": {k: v for k, v in vars(a).items() if k != "child"}, "loads": loads,
               "rows": rows, "byte_ratio_goals": BYTE_RATIO_GOAL,
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if a.out:
        Path(a.out).write_text(json.dumps(payload, indent=2))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
