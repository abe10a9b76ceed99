"""What a newcomer reads first (info line, HTML reprs)."""

from __future__ import annotations

import re

import numpy as np

import vtinfer as vt


def test_info_says_cuda_extension_not_arm():
    line = vt.build_info()["cuda"]
    assert "arm" not in line
    assert line in ("CUDA extension not built", "CUDA extension built, no CUDA device") or re.fullmatch(
        r"CUDA extension built, \d+ CUDA devices?", line)


def test_html_repr_summarises_per_head_scales():
    L, H = 24, 8
    ks = (np.arange(L * H, dtype=np.float32).reshape(L, H) + 1) / 64
    c = vt.PagedKVCache(L, 2, 4, H, 8, "fp8_e4m3", k_scale=ks)
    h = c._repr_html_()
    assert "shape [24, 8], min 0.015625, max 3" in h
    assert len(h) < 1200  # not one long wrapped array string
    # a few per-layer scales are still shown as values
    assert "[1. 2.]" in vt.PagedKVCache(2, 3, 4, 2, 8, "fp8_e4m3", k_scale=[1.0, 2.0])._repr_html_()


def test_layer_has_an_html_repr():
    c = vt.PagedKVCache(2, 3, 4, 2, 8, "fp8_e4m3", k_scale=[[1.0, 2.0], [3.0, 4.0]])
    h = c.layer(1)._repr_html_()
    assert "<caption>KVLayer</caption>" in h
    assert "1 of 2" in h and "3 x 4 x 2 x 8" in h and "[3. 4.]" in h and "384" in h


def test_inspect_folds_equal_layers_and_the_block_warning(tmp_path):
    """An unquantized 30-layer model: one 'ignored (1.0)' row for layers 0-29,
    and the fallback block count said on the plan line, not as a warning."""
    import json
    import os
    import subprocess
    import sys

    from vtinfer.scales import write_safetensors

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "hidden_size": 576, "torch_dtype": "bfloat16"}))
    write_safetensors(tmp_path / "model.safetensors", {"x": np.ones(1, np.float32)})
    p = subprocess.run([sys.executable, "-m", "vtinfer", "inspect", str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "VTINFER_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if "ignored" in ln and "(1.0)" in ln]
    assert len(rows) == 1 and rows[0].split()[0] == "0-29", p.stdout
    assert "warning" not in p.stdout and "fallback: give --num-blocks or --kv-cache-memory" in p.stdout, p.stdout


# ------------------------------------------------ the CLI in the user's words

def _cli(*argv, timeout=120):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "vtinfer", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "VTINFER_NUM_THREADS": "1"})


def _tiny_model(d, layers=2, scales=False):
    import json

    from vtinfer.scales import write_safetensors

    d.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_size": 64, "torch_dtype": "bfloat16"}
    if scales:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (d / "config.json").write_text(json.dumps(cfg))
    t = {"x": np.ones(1, np.float32)}
    if scales:
        for i in range(layers):
            t[f"model.layers.{i}.self_attn.k_proj.k_scale"] = np.array(0.5, np.float32)
            t[f"model.layers.{i}.self_attn.v_proj.v_scale"] = np.array(0.25, np.float32)
    write_safetensors(d / "model.safetensors", t)
    return d


# every numeric option of every subcommand, out of range: one line, exit 2, the option named, nothing run
NUMERIC = [("demo", "--eval-tokens", "-5"), ("demo", "--eval-tokens", "0"), ("demo", "--gen-tokens", "0"),
           ("demo", "--calib-tokens", "-1"), ("demo", "--num-threads", "0"), ("demo", "--blas-threads", "-2"),
           ("demo", "--num-threads", str(2**40)),
           ("calibrate", "--tokens", "0"), ("calibrate", "--tokens", "-7"),
           ("inspect", "--num-blocks", "0"), ("inspect", "--block-size", "-16"),
           ("inspect", "--tensor-parallel-size", "0"), ("inspect", "--tensor-parallel-size", "x")]


def test_every_numeric_option_is_range_checked_in_one_line(tmp_path):
    import pytest

    m = _tiny_model(tmp_path / "m")
    pre = {"demo": ["demo", "--model", m], "calibrate": ["calibrate", m, "--out", tmp_path / "o"],
           "inspect": ["inspect", m]}
    bad = []
    for cmd, opt, val in NUMERIC:
        p = _cli(*pre[cmd], opt, val, timeout=60)
        lines = p.stderr.strip().splitlines()
        if not (p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"vtinfer {cmd}: argument {opt}: ")
                and val in lines[0]):
            bad.append((cmd, opt, val, p.returncode, p.stderr[-300:]))
    assert not (tmp_path / "o").exists()
    if bad:
        pytest.fail("\n".join(map(str, bad)))


def test_messages_are_in_the_users_words(tmp_path):
    """No internal function or class name leads a message; Python argument names become the options."""
    m = _tiny_model(tmp_path / "m")
    for argv, want in ((["inspect", m, "--kv-cache-memory", "0"], "vtinfer inspect: --kv-cache-memory must be > 0"),
                       (["inspect", m, "--tensor-parallel-size", "3"], "vtinfer inspect: Total number of attention"),
                       (["inspect", m, "--kv-cache-dtype", "fp9"], "vtinfer inspect: --kv-cache-dtype must be one of")):
        p = _cli(*argv)
        line = p.stderr.strip()
        assert p.returncode == 2 and line.startswith(want), line
        for internal in ("plan_kv_cache:", "resolve_kv_cache_dtype:", "inspect: inspect:", "DecoderConfig:",
                         "load_kv_scales:", "check_tensor_parallel"):
            assert internal not in line, line


def test_user_words_keeps_file_names_and_drops_internal_prefixes():
    from vtinfer.cli import user_words

    opts = {"block_size": "--block-size", "kv_cache_dtype": "--kv-cache-dtype", "kv_cache_memory": "--kv-cache-memory"}
    assert user_words("plan_kv_cache: block_size must be a positive int; got 0", opts) == \
        "--block-size must be a positive int; got 0"
    assert user_words("DecoderConfig: rope_theta must be > 0", opts) == "rope_theta must be > 0"
    assert user_words("inspect: inspect: x", opts) == "x"
    assert user_words("config.json: head_dim must be a positive integer", opts) == \
        "config.json: head_dim must be a positive integer"
    assert user_words("kv_cache_dtype_skip_layers keeps kv_cache_dtype 'fp8'", opts) == \
        "kv_cache_dtype_skip_layers keeps --kv-cache-dtype 'fp8'"


def test_an_unknown_kv_cache_dtype_lists_what_vtinfer_stores_then_the_rest_with_why(tmp_path):
    with __import__("pytest").raises(ValueError) as e:
        vt.resolve_kv_cache_dtype("fp9", _tiny_model(tmp_path / "m"))
    msg = str(e.value)
    stored, rest = msg.split(" (what vtinfer stores)")
    assert stored.endswith(", ".join(vt.KV_CACHE_DTYPES))  # derived from the dtype table, in its order
    others = [x for x in vt._C.vllm_kv_cache_dtypes() if x not in vt.KV_CACHE_DTYPES]
    assert others and f"vLLM also accepts {', '.join(others)}: vtinfer resolves them as vLLM does but does not " \
        "store them (vtinfer.KV_CACHE_DTYPES_NOT_STORED says why, per value)" in rest
    assert sorted(others) == sorted(vt.KV_CACHE_DTYPES_NOT_STORED)
    for x in others:
        assert x not in stored


def test_inspect_scale_tensor_lines_are_in_layer_order_and_folded(tmp_path):
    p = _cli("inspect", _tiny_model(tmp_path / "m", layers=30, scales=True), "--kv-cache-dtype", "fp8")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("remapped")]
    assert len(lines) == 2, p.stdout  # k and v, each once for the 30 layers, not 60 lines
    assert all("model.layers.N." in ln and "(layers 0-29;" in ln for ln in lines), lines
    from vtinfer.inspect_cmd import _natural, _spans

    assert _spans([0, 1, 2, 3, 5, 7, 8, 10]) == "0-3, 5, 7-8, 10"
    assert sorted(["layers.10", "layers.2", "layers.1"], key=_natural) == ["layers.1", "layers.2", "layers.10"]


def test_print_cache_shows_scale_values():
    c = vt.PagedKVCache(2, 4, 16, 2, 16, "fp8_e4m3", k_scale=0.5, v_scale=[0.25, 2.0])
    assert "k_scale=0.5 (per-tensor), v_scale=[0.25, 2] (per-layer)" in str(c) and str(c) == repr(c)
    many = vt.PagedKVCache(40, 2, 16, 2, 16, "fp8_e4m3", k_scale=np.full((40, 2), 0.75, np.float32))
    assert "k_scale=<shape [40, 2], min 0.75, max 0.75> (per-layer-and-head)" in str(many)
    assert "0.5 (per-tensor)" in str(c.layer(0))
