"""Shared helpers of the benchmarks: interleaved, repeated timing and JSON.

Benchmarks never assert. Every figure that matters is a ratio taken in one
run against a same-run reference (memcpy of the same bytes, a bandwidth
probe, torch), because this machine is shared and absolute times drift."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import statistics
import subprocess
import tempfile
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


def build_probe(isa: str):
    """The machine probes of _attn_probe.c, built with the system compiler, their vector width set to the
    kernels' (`isa`: vtinfer's active ISA; 16 lanes for avx512 where the CPU has it, else 8 with AVX2 + FMA).
    Returns the library; `lib.lanes` is the width taken (0: the CPU has neither, and every probe returns -1),
    `lib.fmas_per_iter` the FMAs of one fma_peak iteration at that width."""
    src = os.path.join(os.path.dirname(__file__), "_attn_probe.c")
    so = os.path.join(tempfile.mkdtemp(), "probe.so")
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-pthread", "-o", so, src])
    lib = ctypes.CDLL(so)
    sig = {"read_bw": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int],
           "read_pages": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_long,
                          ctypes.c_long, ctypes.c_int],
           "fma_peak": [ctypes.c_long, ctypes.c_int], "bf16dot_peak": [ctypes.c_long, ctypes.c_int]}
    for name, args in sig.items():
        getattr(lib, name).restype = ctypes.c_double
        getattr(lib, name).argtypes = args
    lib.probe_last_sum.restype = ctypes.c_double
    lib.probe_lanes.restype = ctypes.c_int
    lib.probe_lanes.argtypes = [ctypes.c_int]
    lib.lanes = lib.probe_lanes(16 if isa == "avx512" else 8)
    lib.fmas_per_iter = lib.probe_fmas_per_iter()  # fma_peak's FMAs per iteration at that width
    return lib


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


GGML_HOWTO = ("--ggml takes a ggml source tree (its include/ holds ggml.h) and --ggml-lib the folder of its built "
              "libggml.so / libggml-base.so / libggml-cpu.so, e.g. from the llama.cpp that the llama-cpp-python "
              "sdist (76 MB) vendors: pip download llama-cpp-python --no-deps --no-binary :all: (pip then prepares "
              "the sdist's metadata for minutes; the tarball is saved first); tar xzf it; cmake -S "
              "vendor/llama.cpp -B build -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF "
              "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF "
              "[-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON for an AVX2 build]; "
              "make -C build ggml ggml-cpu (a few minutes on 2 cores); --ggml vendor/llama.cpp/ggml "
              "--ggml-lib build/bin (ggml/ alone does not configure from that tree)")


def ggml_flash_attn(src: str, libdir: str):
    """ggml's CPU flash attention through benchmarks/_ggml_fa.c, built here against the named ggml
    (see GGML_HOWTO). Returns make(type, k, v, q, causal) -> run(threads) -> seconds, with k / v
    [n_kv, H_kv, D] and q [n_q, H_q, D] float32 (type "f16", "q8_0" or "q4_0")."""
    import ctypes
    import subprocess
    import tempfile

    import numpy as np

    here = os.path.dirname(os.path.abspath(__file__))
    so = os.path.join(tempfile.mkdtemp(), "ggml_fa.so")
    subprocess.check_call(["cc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(here, "_ggml_fa.c"),
                           "-I", os.path.join(src, "include"), "-L", libdir, "-lggml", "-lggml-base", "-lggml-cpu",
                           f"-Wl,-rpath,{os.path.abspath(libdir)}", "-lm"])
    lib = ctypes.CDLL(so)
    lib.ggml_fa_new.restype = ctypes.c_void_p
    lib.ggml_fa_new.argtypes = [ctypes.c_char_p] + [ctypes.c_long] * 5 + [ctypes.c_int] + [ctypes.c_void_p] * 3
    lib.ggml_fa_run.restype = ctypes.c_double
    lib.ggml_fa_run.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ggml_fa_free.argtypes = [ctypes.c_void_p]
    keep = []

    def make(type_name: str, k, v, q, causal: bool = False):
        k, v, q = (np.ascontiguousarray(x, np.float32) for x in (k, v, q))
        n_kv, hkv, d = k.shape
        n_q, hq, _ = q.shape
        h = lib.ggml_fa_new(type_name.encode(), d, n_kv, hkv, hq // hkv, n_q, int(causal),
                            k.ctypes.data, v.ctypes.data, q.ctypes.data)
        if not h:
            raise RuntimeError(f"ggml_fa_new failed for type {type_name!r}")
        keep.append(h)

        def run(threads: int) -> float:
            ms = lib.ggml_fa_run(h, threads)
            if ms < 0:
                raise RuntimeError("ggml_graph_compute failed")
            return ms * 1e-3
        return run

    return make
