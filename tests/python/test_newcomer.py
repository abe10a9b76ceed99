"""Issue #15 item 9: what a newcomer reads first (info line, HTML reprs)."""

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
