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
