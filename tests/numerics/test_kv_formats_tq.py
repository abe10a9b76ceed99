"""TurboQuant KV cache dtypes: the independent NumPy twin
(tests/numerics/tq_twin.py) against vLLM's own code from the pinned wheel.

vLLM's store launcher ``triton_turboquant_store`` (host rotation + the
``_tq_fused_store_fp8`` / ``_tq_fused_store_mse`` kernels) and its read
kernel ``_tq_full_dequant_kv`` run in Triton's CPU interpreter in a child
process (tests/numerics/tq_triton_child.py); the Hadamard matrix
(``_build_hadamard_cached``), the Lloyd-Max codebook (``solve_lloyd_max``)
and the slot size (``TurboQuantConfig``) are vLLM's own functions, run there too.

What is compared, and why:
- the whole cache, byte for byte (every byte the store did not write must still
  be the 0x5A fill), with the twin's kernel rules fed the float32 rotated rows
  and norms that the launcher's torch ops produced (a GEMM and a norm whose
  summation order is torch's, not a rule); the twin's own rotation is checked
  against those to float32 rounding;
- turboquant_k8v4's fp8 key bytes only where the interpreter's own
  float32 -> e4m3 cast equals torch's (it truncates some small/subnormal
  values and maps values beyond +-448 to the NaN code 0x7F, which its read then
  decodes as +-480: ``test_interpreter_fp8_cast_is_not_torchs`` pins it); the twin
  follows Triton's GPU lowering (``cvt.rn.satfinite``: nearest even, +-448);
- the read kernel's float16 K / V for every stored token against the twin's
  dequantized values rounded to float16.
vtinfer's own store / read are checked against this twin in test_kv_formats_tq_store.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.numerics import tq_twin
from tests.numerics.test_kv_formats_triton import _require_triton, run_child
from vtinfer.testing import upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(ROOT, "tests", "numerics", "tq_triton_child.py")
NB, BS, H, T = 4, 16, 3, 40
CASES = [("turboquant_k8v4", 64), ("turboquant_k8v4", 80), ("turboquant_4bit_nc", 64),
         ("turboquant_4bit_nc", 128), ("turboquant_k3v4_nc", 64), ("turboquant_3bit_nc", 128)]


def adversarial_rows(D: int) -> np.ndarray:
    """Rows that probe one rule each (float32)."""
    rows = [np.zeros(D)]                                         # v scale floor 1e-8; key norm 0 -> y = 0
    rows.append(np.full(D, 3.0))                                 # constant row: range 0
    r = np.full(D, 1e-3); r[5] = 1e5; rows.append(r)             # scale and norm overflow fp16 -> inf
    r = np.full(D, -2.0); r[0] = 13.0; rows.append(r)            # scale exactly 1 (15 / 15): (v-min)+0.5 ties
    r[1:16] = np.arange(15) + 0.5 - 2.0; rows.append(r.copy())   # values at the value midpoints
    rows.append(np.full(D, 1e-30) * (1 + np.arange(D)))          # range under the floor
    r = np.full(D, 1e-40); r[1] = -1e-41; rows.append(r)         # subnormals
    r = np.linspace(-600, 600, D); rows.append(r)                # fp8 keys beyond +-448 saturate
    r = np.zeros(D); r[3] = 1.0; rows.append(r)                  # one-hot key: y = +-1/sqrt(D) everywhere
    rows.append(np.linspace(-3, 5, D) * 1.000001)
    rows.append(division_probe_row(D))
    return np.asarray(rows, np.float32)


def division_probe_row(D: int) -> np.ndarray:
    """A value row (found by a seeded search) at the 15 half-code points
    ``vmin + (j - 0.5) * scale`` where ``(v - vmin) / scale`` and
    ``(v - vmin) * (1 / scale)`` give different codes."""
    f = np.float32
    rng = np.random.default_rng(1)
    for _ in range(1000):
        lo, span = f(-rng.uniform(0, 10)), f(rng.uniform(0.5, 40))
        row = np.full(D, lo, f)
        row[1] = f(lo + span)
        sc = f((row.max() - lo) / f(15))
        row[2:17] = lo + ((np.arange(1, 16) - f(0.5)) * sc).astype(f)
        d = (row - lo).astype(f)
        by_div = np.trunc((d / sc).astype(f) + f(0.5))
        by_rcp = np.trunc((d * (f(1) / sc)).astype(f) + f(0.5))
        if (by_div != by_rcp).sum() >= 2:
            return row
    raise AssertionError("no division probe row found")


def _cases() -> list[dict]:
    rng = np.random.default_rng(146)
    out = []
    for fmt, D in CASES:
        mag = 2.0 ** rng.integers(-8, 8, size=(T, H, 1))
        k = (rng.standard_normal((T, H, D)) * mag).astype(np.float32)
        v = (rng.standard_normal((T, H, D)) * mag[::-1] + rng.standard_normal((T, H, 1))).astype(np.float32)
        adv = adversarial_rows(D)
        k[: len(adv), 0] = adv
        v[: len(adv), 1] = adv[::-1]
        v[len(adv), 2] = division_probe_row(D)
        slots = rng.permutation(NB * BS)[:T].astype(np.int64)
        slots[3] = -1  # skipped by both
        out.append(dict(fmt=fmt, key=k, value=v, slots=slots))
    return out


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory):
    _require_triton()
    upstream.locate_or_skip()
    d = tmp_path_factory.mktemp("tq_triton")
    cases = _cases()
    for i, c in enumerate(cases):
        np.savez(d / f"case_{i:03d}.npz", nb=NB, bs=BS, **c)
    return run_child(CHILD, d, cases, timeout=900)


def _key_bits(fmt: str) -> int:
    kb, vb, _ = tq_twin.PRESETS[fmt]
    return vb if kb == 8 else kb  # vLLM's centroid_bits: k8v4 still builds a value-bits codebook


def test_codebook_rotation_and_slot_size_equal_vllms(vllm_results):
    for c, t in vllm_results:
        fmt, D = c["fmt"], c["key"].shape[-1]
        tag = f"{fmt} D={D}"
        assert tq_twin.layout(fmt, D)["slot_aligned"] == int(t["slot_size_aligned"]), tag
        cents = tq_twin.lloyd_max(D, _key_bits(fmt))
        np.testing.assert_array_equal(cents.view(np.uint32), t["centroids"].view(np.uint32), err_msg=tag)
        np.testing.assert_array_equal(tq_twin.midpoints(cents).view(np.uint32), t["mids"].view(np.uint32),
                                      err_msg=tag)
        if D & (D - 1) == 0:
            np.testing.assert_array_equal(tq_twin.hadamard(D).view(np.uint32), t["hadamard"].view(np.uint32))
        if tq_twin.PRESETS[fmt][0] != 8:
            y, n = tq_twin.rotate(c["key"], tq_twin.hadamard(D))
            np.testing.assert_allclose(y, t["y"], rtol=0, atol=4e-7, err_msg=f"rotated rows, {tag}")
            np.testing.assert_allclose(n, t["norms"], rtol=2e-6, atol=0, err_msg=f"norms, {tag}")


def test_store_equals_vllms_triton_kernels(vllm_results):
    compared = [0, 0]
    for c, t in vllm_results:
        fmt, D = c["fmt"], c["key"].shape[-1]
        lay = tq_twin.layout(fmt, D)
        keep = c["slots"] >= 0
        s = c["slots"][keep]
        if lay["key_bits"] == 8:
            want = tq_twin.store(fmt, c["key"][keep], c["value"][keep])
        else:
            want = tq_twin.store(fmt, c["key"][keep], c["value"][keep], y=t["y"][keep], norms=t["norms"][keep],
                                 mids=t["mids"])
        page = np.full((NB * BS, H, lay["slot_aligned"]), 0x5A, np.uint8)
        page[s, :, : lay["slot"]] = want[..., : lay["slot"]]
        got = t["cache"].reshape(NB * BS, H, -1)
        tag = f"{fmt} D={D}"
        if lay["key_bits"] == 8:
            trust = np.ones(got.shape, bool)
            trust[s, :, :D] = t["trust"][keep]
            compared[0] += int(t["trust"][keep].sum())
            compared[1] += t["trust"][keep].size
            np.testing.assert_array_equal(page[trust], got[trust], err_msg=f"cache bytes where trusted, {tag}")
        else:
            np.testing.assert_array_equal(page, got, err_msg=f"cache bytes, {tag}")
    assert compared[1] and compared[0] / compared[1] >= 0.8, f"only {compared[0]} of {compared[1]} fp8 keys compared"


def test_read_equals_vllms_dequant_kernel(vllm_results):
    for c, t in vllm_results:
        fmt, D = c["fmt"], c["key"].shape[-1]
        s = c["slots"][c["slots"] >= 0]
        slots = t["cache"].reshape(NB * BS, H, -1)[s]
        k, v = tq_twin.dequantize(fmt, slots, D, t["centroids"])
        tag = f"{fmt} D={D}"
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_array_equal(v.astype(np.float16), t["v_read"][s], err_msg=f"V, {tag}")
            if tq_twin.PRESETS[fmt][0] == 8:  # the interpreter decodes e4m3fn's NaN code 0x7F as 480: skipped
                ok = (slots[..., :D] & 0x7F) != 0x7F
                assert np.all(np.abs(t["k_read"][s][~ok]) == 480)
                np.testing.assert_array_equal(k.astype(np.float16)[ok], t["k_read"][s][ok], err_msg=f"K, {tag}")
            else:  # norm correction sums in float32 in the kernel's own order: within one float16 step
                np.testing.assert_allclose(k.astype(np.float16).astype(np.float32), t["k_read"][s].astype(np.float32),
                                           rtol=1e-3, atol=0, err_msg=f"K, {tag}")


def test_twin_rules_by_hand():
    """The twin against hand-computed slots (independent of any upstream code)."""
    # value row 0..15 step 1 plus min 0 -> scale 1, codes 0..15, element 2j in the low nibble
    v = np.arange(16, dtype=np.float32)[None]
    out = tq_twin.quantize_values(v, 4, 8)
    assert list(out[0, :8]) == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
    assert out[0, 8:10].view(np.float16)[0] == 1.0 and out[0, 10:12].view(np.float16)[0] == 0.0
    # 3-bit: 8 codes 0..7 -> 24-bit word sum(i << 3i), little endian
    out = tq_twin.quantize_values(np.arange(8, dtype=np.float32)[None] * 2, 3, 3)
    word = sum(i << (3 * i) for i in range(8))
    assert list(out[0, :3]) == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    # trunc(x + 0.5): 0.5 -> code 1 (x = 0.5 exactly at scale 1), 14.49 -> 14
    v = np.array([[0.0, 0.5, 14.49, 15.0]], np.float32)
    out = tq_twin.quantize_values(v, 4, 2)
    assert list(out[0, :2]) == [0x10, 0xFE]
    # e4m3 key saturates at 448, keeps NaN, rounds 17 (16|18 tie) to even 16
    k = tq_twin.fp8_key(np.array([1000.0, -1000.0, np.nan, 17.0], np.float32))
    assert list(k[:2]) == [0x7E, 0xFE] and k[2] & 0x7F == 0x7F and k[3] == 0x58
    # slot sizes: 3-bit D = 256 keys are 96 index bytes + the fp16 norm; the D = 128 presets
    assert tq_twin.layout("turboquant_k3v4_nc", 256)["kps"] == 98
    assert [tq_twin.layout(f, 128)["slot_aligned"] for f in tq_twin.PRESETS] == [196, 134, 118, 102]


def test_interpreter_fp8_cast_is_not_torchs(vllm_results):
    """Pins why k8v4's key bytes are compared only where trusted: the
    interpreter's float32 -> e4m3 cast disagrees with torch's on some inputs."""
    t = [t for c, t in vllm_results if c["fmt"] == "turboquant_k8v4"]
    assert sum(int((~x["trust"]).sum()) for x in t) > 0, (
        "the interpreter's e4m3 cast now equals torch's: compare k8v4 keys byte for byte")
