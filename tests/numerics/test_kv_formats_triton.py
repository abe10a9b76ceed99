"""vLLM's own per-token-head store kernel as a second oracle.

The pinned wheel's Triton kernel ``_reshape_cache_per_token_head`` runs in
Triton's CPU interpreter (``TRITON_INTERPRET=1``, CPU torch tensors) in a
child process (tests/numerics/triton_store_child.py); vtinfer's
``reshape_and_cache_flash(..., k_scale_cache=, v_scale_cache=)`` writes the
same tokens into caches of the same shape, and the bytes are compared.

What the interpreter gets right decides what is compared
(``test_interpreter_casts_against_torch`` pins it):
- float32 -> int8 stores truncate toward zero exactly as torch's cast does,
  so int8_per_token_head is compared byte for byte, codes and scales;
- float32 -> float8_e4m3fn stores do NOT round as torch does on every input
  (ties and some values near powers of two differ), so for
  fp8_per_token_head the scales are compared bit for bit and the codes only
  where the interpreter's own cast of the kernel's pre-cast value equals
  torch's (the child reports that mask); at least 90% of the codes must be
  compared, and vtinfer's codes are separately byte-exact against the NumPy
  twin everywhere (test_kv_formats.py).
- int4 rows are compared byte for byte (codes and scale bits) wherever no
  float -> int32 conversion of the kernel leaves int32's range: the
  interpreter converts out-of-range values as NumPy does (+inf -> INT_MIN,
  pinned below), NVIDIA's cvt.rzi.s32.f32 saturates (vtinfer follows the
  GPU); e.g. a constant rotated row of -3e38 gives -min / 1e-6 = inf, zero
  point 15 on the GPU and here, 0 in the interpreter. The child reports
  those rows; at least 90% must be compared.
- NaN / inf rows are in: the interpreter's ``tl.max`` ignores a NaN and
  its clamp maps a NaN to QUANT_MIN, the rule recorded in kv-formats.md
  for vLLM's GPU lowering (maxnum / minnum).
"""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_kv_formats import adversarial_rows
from vtinfer.testing import upstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(ROOT, "tests", "numerics", "triton_store_child.py")
FORMATS = ("int8_per_token_head", "fp8_per_token_head")  # int4_per_token_head: see _grid
NB, BS = 6, 16


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError:
        if os.environ.get("VTINFER_REQUIRE_TRITON", "") not in ("", "0"):
            pytest.fail("triton required (VTINFER_REQUIRE_TRITON=1) but not installed")
        pytest.skip("triton not installed (pip install triton==3.9.0)")


def run_child(child: str, d, cases: list[dict], timeout: int) -> list[tuple[dict, dict]]:
    """Run ``child DIR`` (its ``case_NNN.npz`` already written to ``d``, one per
    case) with this tree first on PYTHONPATH; returns (case, out_NNN.npz as a
    dict) pairs. The child's stderr tail is the failure message."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, child, str(d)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"the Triton child failed:\n{proc.stderr[-3000:]}"
    outs = []
    for i in range(len(cases)):
        with np.load(d / f"out_{i:03d}.npz") as z:
            outs.append(dict(z))
    return list(zip(cases, outs))


def _grid():
    for fmt in FORMATS:
        for src in ("float32", "bfloat16"):
            for D in (64, 80):
                yield fmt, src, D
    for src in ("float32", "bfloat16", "float16"):  # int4: 80 rotates in blocks of 16, 128 in one block
        for D in (64, 80, 128):
            yield "int4_per_token_head", src, D


def _cases() -> list[dict]:
    rng = np.random.default_rng(14)
    cases = []
    for fmt, src, D in _grid():
        H, n = 3, 40
        mag = 2.0 ** rng.integers(-10, 10, size=(n, H, 1))
        k = rng.standard_normal((n, H, D)) * mag
        v = rng.standard_normal((n, H, D)) * mag[::-1] * 3
        with np.errstate(all="ignore"):
            adv = adversarial_rows(D, "int8_per_token_head" if fmt == "int4_per_token_head" else fmt)
        m = min(len(adv), n)
        k[:m, 0] = adv[:m]
        v[:m, 1] = adv[::-1][:m]
        slots = rng.permutation(NB * BS)[:n].astype(np.int64)
        slots[3] = -1  # skipped by both
        cast = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}.get(src, np.float32)
        with np.errstate(over="ignore"):
            k, v = k.astype(cast), v.astype(cast)
        cases.append(dict(fmt=fmt, src=src, D=D, key=k, value=v, slots=slots))
    return cases


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    _require_triton()
    src = upstream.locate_or_skip()
    del src
    d = tmp_path_factory.mktemp("triton_store")
    cases = _cases()
    for i, c in enumerate(cases):
        bits = (lambda a: a.view(np.uint16)) if c["src"] == "bfloat16" else (lambda a: a)  # noqa: E731
        # (float16 travels as itself; the child views bfloat16 bits back)
        np.savez(d / f"case_{i:03d}.npz", fmt=c["fmt"], src=c["src"], nb=NB, bs=BS, key=bits(c["key"]),
                 value=bits(c["value"]), slots=c["slots"])
    return run_child(CHILD, d, cases, timeout=600)


def _ours(c: dict):
    H, D = c["key"].shape[1:]
    code = np.int8 if c["fmt"] == "int8_per_token_head" else np.uint8
    w = D // 2 if c["fmt"] == "int4_per_token_head" else D  # int4: two codes per byte
    kc, vc = np.zeros((NB, BS, H, w), code), np.zeros((NB, BS, H, w), code)
    ks, vs = np.ones((NB, BS, H), np.float32), np.ones((NB, BS, H), np.float32)
    vt.reshape_and_cache_flash(c["key"], c["value"], kc, vc, c["slots"], c["fmt"], 1.0, 1.0,
                               k_scale_cache=ks, v_scale_cache=vs)
    return kc.view(np.uint8), vc.view(np.uint8), ks, vs


def test_store_equals_vllms_triton_kernel(isa, triton_results):
    compared = {fmt: [0, 0] for fmt in (*FORMATS, "int4_per_token_head")}
    for c, t in triton_results:
        kc, vc, ks, vs = _ours(c)
        tag = f"{c['fmt']} {c['src']} D={c['D']} ({isa})"
        keep = c["slots"] >= 0
        s = c["slots"][keep]
        if c["fmt"] == "int4_per_token_head":  # rows whose int32 conversions stay in range: every byte
            for side, ours, theirs, so, st in (("k", kc, t["kc"], ks, t["ks"]), ("v", vc, t["vc"], vs, t["vs"])):
                trust = t[f"{side}_trust"]
                H = ours.shape[2]
                o, r = ours.reshape(NB * BS, H, -1)[s], theirs.reshape(NB * BS, H, -1)[s]
                np.testing.assert_array_equal(o[trust], r[trust], err_msg=f"{side.upper()} codes, {tag}")
                so_, st_ = so.reshape(NB * BS, H)[s], st.reshape(NB * BS, H)[s]
                np.testing.assert_array_equal(so_[trust].view(np.uint32), st_[trust].view(np.uint32),
                                              err_msg=f"{side.upper()} scales, {tag}")
                compared[c["fmt"]][0] += int(trust.sum())
                compared[c["fmt"]][1] += trust.size
            continue
        np.testing.assert_array_equal(ks.view(np.uint32), t["ks"].view(np.uint32), err_msg=f"K scales, {tag}")
        np.testing.assert_array_equal(vs.view(np.uint32), t["vs"].view(np.uint32), err_msg=f"V scales, {tag}")
        if c["fmt"] == "int8_per_token_head":  # every byte
            np.testing.assert_array_equal(kc, t["kc"], err_msg=f"K codes, {tag}")
            np.testing.assert_array_equal(vc, t["vc"], err_msg=f"V codes, {tag}")
            compared[c["fmt"]][0] += kc.size + vc.size
            compared[c["fmt"]][1] += kc.size + vc.size
            continue
        for side, ours, theirs in (("k", kc, t["kc"]), ("v", vc, t["vc"])):
            trust = t[f"{side}_trust"]
            H, D = ours.shape[2:]
            o, r = ours.reshape(NB * BS, H, D)[s], theirs.reshape(NB * BS, H, D)[s]
            np.testing.assert_array_equal(o[trust], r[trust], err_msg=f"{side.upper()} codes where trusted, {tag}")
            compared[c["fmt"]][0] += int(trust.sum())
            compared[c["fmt"]][1] += trust.size
    for fmt, (n, total) in compared.items():
        assert total > 0 and n / total >= 0.9, f"{fmt}: only {n} of {total} codes could be compared"


def test_interpreter_casts_against_torch():
    """Pins what the oracle relies on: the interpreter's int8 store is torch's
    cast; its e4m3 store differs from torch's on some inputs (if that is ever
    fixed, the fp8 comparison above can become byte for byte)."""
    _require_triton()
    code = r'''
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton
from tests.numerics.triton_store_child import _cast_probe
e4 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
e4 = e4[torch.isfinite(e4)].unique().sort().values
mid = (e4[1:] + e4[:-1]) / 2
g = torch.Generator().manual_seed(0)
x = torch.cat([e4, mid, torch.randn(4000, generator=g) * 100]).clamp(-448, 448).contiguous()
for dt, xin in ((torch.int8, (x / 4).clamp(-128, 127).contiguous()), (torch.float8_e4m3fn, x)):
    y = torch.empty(xin.numel(), dtype=dt)
    _cast_probe[(triton.cdiv(xin.numel(), 1024),)](xin, y, xin.numel(), BLOCK=1024)
    ref = xin.to(dt)
    print(dt, int((y.view(torch.uint8) != ref.view(torch.uint8)).sum()))
from tests.numerics.triton_store_child import _int32_probe
x = torch.tensor([float("inf"), 3e9, 2.5, -2.5], dtype=torch.float32)
y = torch.empty(4, dtype=torch.int32)
_int32_probe[(1,)](x, y, 4, BLOCK=4)
print("int32", ",".join(str(int(a)) for a in y))
'''
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = dict(line.rsplit(" ", 1) for line in proc.stdout.strip().splitlines())
    assert int(got["torch.int8"]) == 0, "the interpreter's int8 store is no longer torch's cast"
    inf_, big, pos, neg = (int(a) for a in got["int32"].split(","))
    assert (pos, neg) == (2, -2), "the interpreter's float -> int32 no longer truncates toward zero"
    assert inf_ != 2**31 - 1 and big != 2**31 - 1, (
        "the interpreter's float -> int32 now saturates as NVIDIA's cvt.rzi does: drop the int4 trust mask")
    assert int(got["torch.float8_e4m3fn"]) > 0, (
        "the interpreter's e4m3 store now equals torch's on every probe: compare fp8 codes byte for byte")
