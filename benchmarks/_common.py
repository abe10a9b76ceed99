"""Shared helpers of the benchmarks: interleaved, repeated timing and JSON.

Benchmarks never assert. Every figure that matters is a ratio taken in one
run against a same-run reference (memcpy of the same bytes, a bandwidth
probe, torch), because this machine is shared and absolute times drift."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Callable

import vtinfer as vt


def interleaved(ops: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, dict[str, float]]:
    """Time each op `repeats` times, round-robin so that drift hits all of
    them alike. Returns per op: best, median (seconds) and all samples."""
    for _ in range(warmup):
        for f in ops.values():
            f()
    samples: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(repeats):
        for k, f in ops.items():
            t0 = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t0)
    return {k: {"best": min(v), "median": statistics.median(v), "samples": v} for k, v in samples.items()}


def machine() -> dict[str, object]:
    info = vt.build_info()
    return {
        "isa": info["isa"],
        "isa_best": info["isa_best"],
        "cpu_features": [k for k, v in info["cpu_features"].items() if v],
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_json(path: str | None, payload: dict) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
    print(f"wrote {path}")
