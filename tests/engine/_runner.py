"""The engine tests' child process: vLLM engines run one after another, their outputs as JSON.

``python tests/engine/_runner.py MODEL_DIR``: reads one ENGINE spec (JSON) per line on stdin, runs
that engine, prints its result as one line ``@@RESULT@@ {json}`` on stdout (vLLM's log lines go
there too), and exits at end of input. The tests never import vLLM themselves: each group of
engines that shares an environment (vLLM loads its plugins once per process, so ``VTINFER_VLLM`` is
fixed per process) is one such child, and an engine is only started when a test asks for it.
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine core in this process and the ``uni`` executor
keeps the model here too, so an engine starts in seconds instead of re-importing vLLM in two more
processes. A ``tensor_parallel_size`` above 1 uses vLLM's multiprocessing executor.

ENGINE::

    {"name": str, "llm": {LLM keyword arguments},
     "prompts": [[token ids], ...], "gen_tokens": int,
     "score": [token ids] | null, "logprobs": int}

RESULT::

    {"name", "error": str | null, "backend": [class paths], "impl": [class paths],
     "num_blocks", "block_size", "cache_dtype", "kv_cache": [[shape], dtype],
     "greedy": [{"tokens": [...], "logprobs": [...], "margins": [...]}, ...],
     "score": {"actual": [...], "top_ids": [[...]], "top_lps": [[...]]} | null,
     "seconds": {"start", "greedy", "score"}}

``score``: teacher-forced over the given tokens. Position i (0-based, i = 0 .. n - 1) is the
distribution of the token after ``tokens[:i + 1]``: ``actual[i]`` the log-probability of
``tokens[i + 1]`` (absent for the last position), ``top_ids[i]`` / ``top_lps[i]`` the ``logprobs``
most likely tokens by rank and their log-probabilities (vLLM's log-softmax over the whole vocabulary).
Positions 0 .. n - 2 come from vLLM's ``prompt_logprobs``, the last from the one generated token's
``logprobs``. ``greedy``: each generated token's log-probability and its margin over the runner-up.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from typing import Any


def _top(entry: dict, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` ranked entries of one position's ``{token: Logprob}`` (vLLM adds the actual token with its
    own rank, which may be past ``k``)."""
    ranked = sorted(((lp.rank, tok, lp.logprob) for tok, lp in entry.items() if lp.rank is not None
                     and lp.rank <= k))
    return [t for _, t, _ in ranked], [float(x) for _, _, x in ranked]


def _greedy(o: Any) -> dict[str, Any]:
    """Generated tokens, each one's log-probability and its margin over the runner-up (``logprobs=2``)."""
    lps, margins = [], []
    for d, t in zip(o.logprobs, o.token_ids):
        lp = float(d[t].logprob)
        other = [float(x.logprob) for tok, x in d.items() if tok != t]
        lps.append(lp)
        margins.append(lp - max(other) if other else float("inf"))
    return {"tokens": list(o.token_ids), "logprobs": lps, "margins": margins}


def _backend_info(llm: Any) -> dict[str, Any]:
    cfg = llm.llm_engine.vllm_config
    layers = [a for a in cfg.compilation_config.static_forward_context.values() if hasattr(a, "attn_backend")]
    backends = sorted({f"{a.attn_backend.__module__}.{a.attn_backend.__qualname__}" for a in layers})
    impls = sorted({f"{type(a.impl).__module__}.{type(a.impl).__qualname__}" for a in layers})
    kv = None
    if layers:
        t = layers[0].kv_cache
        t = t[0] if isinstance(t, (list, tuple)) else t
        kv = [list(t.shape), str(t.dtype)]
    cc = cfg.cache_config
    return {"backend": backends, "impl": impls, "num_blocks": cc.num_gpu_blocks, "block_size": cc.block_size,
            "cache_dtype": str(cc.cache_dtype), "kv_cache": kv, "num_attention_layers": len(layers)}


def _run_engine(llm_cls: Any, sp_cls: Any, model: str, spec: dict[str, Any]) -> dict[str, Any]:
    k = int(spec.get("logprobs", 20))
    kw = dict(model=model, enforce_eager=True, max_model_len=1024, seed=0, max_logprobs=k)
    kw.update(spec.get("llm", {}))
    if int(kw.get("tensor_parallel_size", 1)) == 1:
        kw.setdefault("distributed_executor_backend", "uni")
    out: dict[str, Any] = {"name": spec["name"], "error": None, "llm": kw, "seconds": {}}
    t0 = time.perf_counter()
    llm = llm_cls(**kw)
    try:
        out["seconds"]["start"] = time.perf_counter() - t0
        out.update(_backend_info(llm))
        prompts = spec.get("prompts") or []
        if prompts:
            t1 = time.perf_counter()
            sp = sp_cls(temperature=0.0, max_tokens=int(spec.get("gen_tokens", 32)), ignore_eos=True,
                        logprobs=2, detokenize=False)
            res = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
            out["greedy"] = [_greedy(r.outputs[0]) for r in res]
            out["seconds"]["greedy"] = time.perf_counter() - t1
        toks = spec.get("score")
        if toks:
            t1 = time.perf_counter()
            sp = sp_cls(temperature=0.0, max_tokens=1, prompt_logprobs=k, logprobs=k, detokenize=False)
            (r,) = llm.generate([{"prompt_token_ids": toks}], sp, use_tqdm=False)
            pl = r.prompt_logprobs  # [None, {..}, ...]: entry i is P(tokens[i] | tokens[:i])
            actual, ids, lps = [], [], []
            for i in range(1, len(toks)):
                actual.append(float(pl[i][toks[i]].logprob))
                a, b = _top(pl[i], k)
                ids.append(a)
                lps.append(b)
            a, b = _top(r.outputs[0].logprobs[0], k)
            ids.append(a)
            lps.append(b)
            out["score"] = {"actual": actual, "top_ids": ids, "top_lps": lps}
            out["seconds"]["score"] = time.perf_counter() - t1
    finally:
        _shutdown(llm)
    return out


def _shutdown(llm: Any) -> None:
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        destroy_model_parallel()
        destroy_distributed_environment()


MARK = "@@RESULT@@ "


def main(argv: list[str]) -> int:
    model = argv[1]
    from vllm import LLM, SamplingParams

    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        try:
            res = _run_engine(LLM, SamplingParams, model, spec)
        except Exception:  # one engine's failure is that test's failure, not the others'
            res = {"name": spec["name"], "error": traceback.format_exc()}
            gc.collect()
        print(f"[engine runner] {spec['name']}: {'error' if res.get('error') else 'ok'} {res.get('seconds')}",
              file=sys.stderr, flush=True)
        sys.stdout.write(MARK + json.dumps(res) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
