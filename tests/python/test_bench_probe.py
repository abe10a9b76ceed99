"""The benchmarks' machine probes (benchmarks/_attn_probe.c): they build with the system compiler, take the
vector width the kernels run (AVX2 on a CPU without AVX-512), and read what they say they read: the paged read
probe walks the block table's pages, K and V, split over threads, and its checksum proves which pages it read."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest

import vtinfer as vt

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no system C compiler (cc) to build the probes")


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, BENCH)
    try:
        from _common import build_probe
    finally:
        sys.path.remove(BENCH)
    return build_probe("avx2")


def widths():
    """The widths this CPU can run: 8 (AVX2 + FMA) always on the CI machines, 16 where it has AVX-512."""
    feats = vt.build_info()["cpu_features"]
    return [8] + ([16] if feats.get("avx512f") else [])


@pytest.mark.parametrize("want", [8, 16])
def test_lanes_follow_the_kernels_isa(probe, want):
    if want not in widths():
        pytest.skip(f"this CPU has no {want}-lane fp32 FMA")
    assert probe.probe_lanes(want) == want
    # fma_peak's FMAs per iteration: 16 accumulators in AVX-512's 32 registers, 12 in AVX2's 16 (no spills)
    assert probe.probe_fmas_per_iter() == {8: 12, 16: 16}[want]
    assert probe.fma_peak(1000, 1) > 0


@pytest.mark.parametrize("want", [8, 16])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_read_pages_reads_the_tables_pages(probe, want, nth):
    if want not in widths():
        pytest.skip(f"this CPU has no {want}-lane loads")
    probe.probe_lanes(want)
    n_pages, page = 37, 1024  # bytes per page: 256 floats
    rng = np.random.default_rng(nth)
    k = np.repeat(rng.integers(1, 9, n_pages).astype(np.float32), page // 4)
    v = np.repeat(rng.integers(1, 9, n_pages).astype(np.float32) * 16, page // 4)
    order = rng.integers(0, n_pages, 29).astype(np.int32)  # a page may repeat; some are never read
    t = probe.read_pages(k.ctypes.data, v.ctypes.data, page, order.ctypes.data, len(order), n_pages, nth)
    assert t > 0
    want_sum = (page // 4) * (k[order * (page // 4)].sum(dtype=np.float64) + v[order * (page // 4)].sum(dtype=np.float64))
    assert probe.probe_last_sum() == want_sum


def test_read_bw_sums_its_buffer(probe):
    probe.probe_lanes(8)
    buf = np.arange(1 << 12, dtype=np.float32) % 5
    assert probe.read_bw(buf.ctypes.data, buf.nbytes, 2, 3) > 0
    assert probe.probe_last_sum() == 3 * buf.sum(dtype=np.float64)


def test_read_pages_refuses_partial_steps(probe):
    probe.probe_lanes(8)
    k = np.ones(1024, np.float32)
    order = np.zeros(2, np.int32)
    assert probe.read_pages(k.ctypes.data, k.ctypes.data, 1000, order.ctypes.data, 2, 4, 1) == -1.0
    assert probe.read_pages(k.ctypes.data, k.ctypes.data, 1024, order.ctypes.data, 0, 4, 1) == -1.0


@pytest.mark.parametrize("bad", [-1, 4])
def test_read_pages_refuses_pages_outside_its_buffers(probe, bad):
    probe.probe_lanes(8)
    k = np.ones(2048, np.float32)  # 8 pages of 1024 bytes, of which the call is told 4: a miss reads no foreign memory
    order = np.array([0, bad, 1], np.int32)
    assert probe.read_pages(k.ctypes.data, k.ctypes.data, 1024, order.ctypes.data, 3, 4, 1) == -1.0
    order[1] = 3  # the last page is inside
    assert probe.read_pages(k.ctypes.data, k.ctypes.data, 1024, order.ctypes.data, 3, 4, 1) > 0
