"""Leaks and threads.

Leaks: 10^5 calls of each public entry point on tiny inputs (each call is
a few microseconds), after a warm-up, in 5 windows; the process's own
allocations (glibc's mallinfo2: malloc'd bytes in use) must be flat in at
least 3 windows and RSS must not climb (not tracemalloc,
which read +3.8 MB once torch had been imported). A leak of 48 bytes of
malloc or one object per call shows in every window.

Threads: 8 Python threads call store / attention / the resolver at once
(the binding releases the GIL around each kernel) on separate caches and on
one shared cache (disjoint slots for the stores; reads of one cache for
attention); every result must equal the serial run's bytes.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import vtinfer as vt
from vtinfer import _C

CALLS = 100_000
WARMUP = 2_000
TRACE_CALLS = 20_000  # tracemalloc slows every allocation; 2e4 traced calls still show a 1-object leak


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _config_bytes() -> bytes:
    return json.dumps({"quantization_config": {"quant_method": "fp8", "kv_cache_scheme": {
        "dynamic": False, "num_bits": 8, "type": "float"}}}).encode()


def entry_points(tmp: Path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(16).astype(np.float32)
    codes = vt.fp8_quantize(x)
    cache = vt.PagedKVCache(num_layers=1, num_blocks=4, block_size=4, num_kv_heads=2, head_size=8, dtype="fp8_e4m3",
                            k_scale=0.5, v_scale=2.0)
    k = rng.standard_normal((2, 2, 8)).astype(np.float32)
    slots = np.array([0, 5])
    kc, vc = np.zeros((4, 4, 2, 8), np.uint8), np.zeros((4, 4, 2, 8), np.uint8)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    kk = rng.standard_normal((4, 4, 2, 8)).astype(np.float32)
    cu, sk = np.array([0, 1, 2], np.int32), np.array([3, 5], np.int32)
    bt = np.array([[0, 1], [2, 3]], np.int32)
    (tmp / "config.json").write_bytes(_config_bytes())
    cfg = _config_bytes()
    bad = np.array([0, 99])
    return {
        "fp8_quantize": (lambda: vt.fp8_quantize(x, num_threads=1), CALLS),
        "fp8_dequantize": (lambda: vt.fp8_dequantize(codes, num_threads=1), CALLS),
        "PagedKVCache.store": (lambda: cache.store(0, k, k, slots, num_threads=1), CALLS),
        "reshape_and_cache_flash": (lambda: vt.reshape_and_cache_flash(k, k, kc, vc, slots, "fp8_e4m3", 1.0, 1.0,
                                                                       num_threads=1), CALLS),
        "flash_attn_varlen_func": (lambda: vt.flash_attn_varlen_func(q, kk, kk, cu_seqlens_q=cu, seqused_k=sk,
                                                                     block_table=bt, num_threads=1), CALLS),
        "_C.resolve_kv_cache_dtype": (lambda: _C.resolve_kv_cache_dtype("auto", cfg, None), CALLS),
        # the public function reads files and builds a Checkpoint (~100 us): 10^4 calls
        "resolve_kv_cache_dtype": (lambda: vt.resolve_kv_cache_dtype("auto", tmp), CALLS // 10),
        # the refusal path: exception objects and messages must not leak either
        "store refused": (lambda: _refused(lambda: cache.store(0, k, k, bad, num_threads=1)), CALLS),
    }


def _refused(call):
    try:
        call()
    except IndexError:
        return
    raise AssertionError("expected IndexError")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_reader():
    """Bytes this process holds from malloc (``uordblks``: in-use chunks of the
    heap arenas, + ``hblkhd``: chunks malloc mmapped): what C code, NumPy's
    buffers and Python's objects (pymalloc's arenas are counted by RSS below)
    have allocated and not freed. glibc's mallinfo2 (2.33+) through ctypes;
    None elsewhere (the RSS bound still applies)."""
    try:
        libc = ctypes.CDLL(None)
        f = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _Mallinfo2

    def heap() -> int:
        mi = f()
        return int(mi.uordblks) + int(mi.hblkhd)

    return heap


HEAP = _heap_reader()
WINDOWS = 5
FLAT = 64 << 10  # bytes: a window counts as flat below this


@pytest.mark.parametrize("name", ["fp8_quantize", "fp8_dequantize", "PagedKVCache.store", "reshape_and_cache_flash",
                                  "flash_attn_varlen_func", "_C.resolve_kv_cache_dtype", "resolve_kv_cache_dtype",
                                  "store refused"])
def test_no_growth_over_many_calls(tmp_path, name):
    """The process's own allocations (not tracemalloc, whose count
    depends on what else was imported -- torch's import made it read +3.8 MB).

    ``n`` calls in 5 windows after a warm-up; in each window the malloc'd
    bytes in use (mallinfo2) and RSS are read before and after. A per-call
    leak grows every window (48 bytes a call: ~1 MB a window of 2x10^4); a
    cache that fills once grows one window. So at least 3 of the 5 windows
    must be flat (< 64 KiB of malloc'd bytes), and RSS over all windows must
    stay under 1 MiB beyond its largest single-window jump."""
    call, n = entry_points(tmp_path)[name]
    for _ in range(WARMUP):
        call()
    gc.collect()
    w = n // WINDOWS
    heap_growth, rss_growth = [], []
    for _ in range(WINDOWS):
        h0, r0 = (HEAP() if HEAP else 0), rss_bytes()
        for _ in range(w):
            call()
        gc.collect()
        heap_growth.append((HEAP() if HEAP else 0) - h0)
        rss_growth.append(rss_bytes() - r0)
    asan = "libasan" in os.environ.get("LD_PRELOAD", "")
    if asan:
        # AddressSanitizer replaces malloc (mallinfo2 reads nothing) and keeps freed memory in a
        # quarantine of up to 256 MB (RSS grows without a leak): only tracemalloc can be asserted there.
        # A table that was allocated before tracemalloc started and is replaced during a batch (the
        # interned-string dict, resized as the result's keys are interned and freed) reads as one
        # block of growth in that batch only; a per-call leak grows every batch. So one of two
        # consecutive batches must be flat.
        tracemalloc.start()
        try:
            t = []
            for _ in range(3):
                for _ in range(min(n, TRACE_CALLS) // 2):
                    call()
                gc.collect()
                t.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
        growth = [t[1] - t[0], t[2] - t[1]]
        assert min(growth) < 64 << 10, f"{name}: tracemalloc grew by {growth} bytes in two batches of {min(n, TRACE_CALLS) // 2} calls"
        return
    flat = sum(g < FLAT for g in heap_growth)
    assert flat >= 3, f"{name}: malloc'd bytes grew in {WINDOWS - flat} of {WINDOWS} windows of {w} calls: {heap_growth}"
    steady = sum(rss_growth) - max(rss_growth)
    assert steady < 1 << 20, f"{name}: RSS grew by {rss_growth} bytes in windows of {w} calls"


# ---------------------------------------------------------------- threads

THREADS = 8


def _run_threads(fns):
    """Start every fn at once (a barrier), join, re-raise the first error."""
    barrier = threading.Barrier(len(fns))
    errors = []
    out = [None] * len(fns)

    def wrap(i, fn):
        try:
            barrier.wait()
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return out


def _data(seed, n=64, H=2, D=64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, H, D)).astype(np.float32), rng.standard_normal((n, H, D)).astype(np.float32)


def _cache(dtype="fp8_e4m3"):
    if dtype.endswith("per_token_head"):  # its scales are per (token, head), in the cache's own planes
        return vt.PagedKVCache(num_layers=2, num_blocks=64, block_size=16, num_kv_heads=2, head_size=64, dtype=dtype)
    return vt.PagedKVCache(num_layers=2, num_blocks=64, block_size=16, num_kv_heads=2, head_size=64, dtype=dtype,
                           k_scale=np.array([0.5, 2.0], np.float32), v_scale=np.array([1.5, 0.25], np.float32))


def _planes(c, layer):
    """The arrays a store writes for one layer: codes, and the per-token-head scale planes where the format has them."""
    out = [c.key_cache(layer), c.value_cache(layer)]
    if c.dtype.endswith("per_token_head"):
        out += [c.k_scale_cache(layer), c.v_scale_cache(layer)]
    return out


def _bytes(c):
    return b"".join(a.tobytes() for layer in range(c.num_layers) for a in _planes(c, layer))


def _slot_bytes(c, layer, slots):
    """The bytes of the given slots only (every plane is [block, slot in block, ...])."""
    b, o = np.divmod(np.asarray(slots), c.block_size)
    return b"".join(a[b, o].tobytes() for a in _planes(c, layer))


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "bfloat16", "int4_per_token_head"])
def test_store_separate_caches_threads_equal_serial(dtype):
    """8 threads, each storing into its own cache, again and again: every repetition into a fresh cache is
    compared with the serial bytes (a later repetition must not hide an earlier race)."""
    jobs = [(_data(i), np.random.default_rng(100 + i).permutation(1024)[:64]) for i in range(THREADS)]

    def run(i):
        (k, v), slots = jobs[i]
        c = _cache(dtype)
        for layer in range(2):
            c.store(layer, k, v, slots, num_threads=2)
        return _bytes(c)

    serial = [run(i) for i in range(THREADS)]

    def job(i):
        for rep in range(20):  # repeat: overlap the threads for longer
            got = run(i)
            if got != serial[i]:
                return f"thread {i}: repetition {rep} differs from the serial bytes"
        return "same"

    assert _run_threads([lambda i=i: job(i) for i in range(THREADS)]) == ["same"] * THREADS


def test_store_shared_cache_disjoint_slots_threads_equal_serial():
    """8 threads store disjoint slots of one cache; before each repetition a thread zeroes its own slots and
    after it compares them with the serial bytes, so every repetition is checked."""
    perm = np.random.default_rng(7).permutation(1024)
    jobs = [(_data(i), perm[i * 64:(i + 1) * 64], i % 2) for i in range(THREADS)]
    ref = _cache()
    for (k, v), slots, layer in jobs:
        ref.store(layer, k, v, slots, num_threads=1)
    want = [_slot_bytes(ref, layer, slots) for _, slots, layer in jobs]
    shared = _cache()

    def job(i):
        (k, v), slots, layer = jobs[i]
        b, o = np.divmod(slots, shared.block_size)
        for rep in range(20):
            for a in _planes(shared, layer):
                a[b, o] = 0
            shared.store(layer, k, v, slots, num_threads=2)
            if _slot_bytes(shared, layer, slots) != want[i]:
                return f"thread {i}: repetition {rep} differs from the serial bytes"
        return "same"

    assert _run_threads([lambda i=i: job(i) for i in range(THREADS)]) == ["same"] * THREADS
    assert _bytes(shared) == _bytes(ref)


def test_attention_on_shared_and_separate_caches_threads_equal_serial():
    k, v = _data(1, n=1024)
    shared = _cache()
    for layer in range(2):
        shared.store(layer, k, v, np.arange(1024))
    rng = np.random.default_rng(9)
    cu = np.array([0, 1, 5], np.int32)
    sk = np.array([300, 77], np.int32)
    bt = np.stack([rng.permutation(64)[:32], rng.permutation(64)[:32]]).astype(np.int32)
    qs = [rng.standard_normal((5, 8, 64)).astype(np.float32) for _ in range(THREADS)]
    separate = [_cache() for _ in range(THREADS)]
    for c in separate:
        c.store(1, k, v, np.arange(1024))

    def attend(i, cache):
        return cache.attention(i % 2 if cache is shared else 1, qs[i], cu_seqlens_q=cu, seqused_k=sk,
                               block_table=bt, num_threads=2)

    serial_shared = [attend(i, shared).tobytes() for i in range(THREADS)]
    serial_sep = [attend(i, separate[i]).tobytes() for i in range(THREADS)]
    got = _run_threads([lambda i=i: [attend(i, shared).tobytes() for _ in range(5)] for i in range(THREADS)])
    for i in range(THREADS):
        assert all(b == serial_shared[i] for b in got[i])
    got = _run_threads([lambda i=i: [attend(i, separate[i]).tobytes() for _ in range(5)] for i in range(THREADS)])
    for i in range(THREADS):
        assert all(b == serial_sep[i] for b in got[i])


def test_resolver_threads_equal_serial(tmp_path):
    configs = [
        {"quantization_config": {"quant_method": "fp8", "kv_cache_scheme": {"dynamic": False, "num_bits": 8,
                                                                              "type": "float"}}},
        {"quantization_config": {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8",
                                                                                    "kv_cache_quant_algo": "FP8"}}},
        {"quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "NVFP4"}},
        {},
    ]
    dirs = []
    for i in range(THREADS):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(configs[i % len(configs)]))
        dirs.append(d)
    flags = ["auto", "fp8", "auto", "bfloat16"]
    serial = [repr(vt.resolve_kv_cache_dtype(flags[i % 4], dirs[i])) for i in range(THREADS)]
    got = _run_threads([lambda i=i: [repr(vt.resolve_kv_cache_dtype(flags[i % 4], dirs[i])) for _ in range(50)]
                        for i in range(THREADS)])
    for i in range(THREADS):
        assert all(r == serial[i] for r in got[i])


def test_reshape_and_cache_x_split_threads_equal_serial():
    """The chunked (x-split) store converts pieces through a buffer: 8 threads
    on separate caches must each get the serial run's bytes."""
    NB, H, D, BS, x = 64, 2, 64, 16, 16
    jobs = [(_data(20 + i, n=1024), np.random.default_rng(200 + i).permutation(NB * BS)) for i in range(THREADS)]

    def fresh():
        return np.zeros((NB, H, D // x, BS, x), np.uint8), np.zeros((NB, H, D, BS), np.uint8)

    def run(i, reps, want=None):
        """Every rep into fresh caches (a later rep must not hide an earlier race); the
        first result that differs from `want` is returned."""
        (k, v), slots = jobs[i]
        for _ in range(reps):
            kc, vc = fresh()
            vt.reshape_and_cache(k, v, kc, vc, slots, "fp8_e4m3", np.float32(0.5), np.float32(2.0), num_threads=2)
            got = kc.tobytes() + vc.tobytes()
            if want is not None and got != want:
                break
        return got

    serial = [run(i, 1) for i in range(THREADS)]
    got = _run_threads([lambda i=i: run(i, 60, serial[i]) for i in range(THREADS)])
    assert [g == s for g, s in zip(got, serial)] == [True] * THREADS
