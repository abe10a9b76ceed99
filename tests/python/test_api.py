"""The package surface: build_info, the dtype lists, VTINFER_ISA, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.conftest import available_isas


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)


def test_build_info_fields():
    info = vt.build_info()
    assert info["version"] == vt.__version__
    assert info["isa"] in ("scalar", "avx2", "avx512")
    assert info["isa_best"] == available_isas()[-1]
    assert isinstance(info["cpu_features"], dict) and "avx2" in info["cpu_features"]
    assert info["compiler"]
    assert info["cuda_built"] in (True, False) and "CUDA extension" in info["cuda"]


def test_dtype_lists_come_from_the_table():
    names = [d.name for d in vt.DTYPES]
    assert names == ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head",
                     "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                     "turboquant_3bit_nc", "ultraquant_4bit", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact",
                     "nvfp4", "nvfp4_4over6"]
    assert vt.TURBOQUANT_DTYPES == tuple(names[8:12])
    assert vt.SLOT_DTYPES == tuple(names[8:]) and {d.family for d in vt.DTYPES if d.name in vt.SLOT_DTYPES} == {
        "turboquant", "ultraquant", "octave", "nvfp4"}
    # NVFP4 is a family of the table, and the one whose slot codes also take the layer's global scale
    assert vt.NVFP4_DTYPES == ("nvfp4", "nvfp4_4over6") == tuple(d.name for d in vt.DTYPES if d.global_scale)
    # the slot read's K basis, vLLM's boundary layers and the rope-dependent layout are row fields
    assert [d.name for d in vt.DTYPES if d.key_basis == "hadamard"] == names[9:13]
    assert [d.name for d in vt.DTYPES if d.boundary_layers] == names[8:13]
    assert {d.name: d.rope_block for d in vt.DTYPES if d.rope_block} == {"octave_k3v4": 64, "octave_k3v3": 64}
    # which formats the AVX512-BF16 pair-dot tile reads (their codes are bf16 values) and vLLM's causal-only read
    assert [d.name for d in vt.DTYPES if d.pair_dot] == names[2:8]
    assert [d.name for d in vt.DTYPES if d.causal_only] == ["int4_per_token_head"]
    assert vt.FP8_DTYPES == ("fp8_e4m3", "fp8_e5m2")
    # the read's query rounding is a row field: vLLM's UltraQuant rounds the rotated query to e4m3fn
    assert {d.name: d.query_dtype for d in vt.DTYPES if d.query_dtype != "float32"} == {"ultraquant_4bit": "fp8_e4m3"}
    # and whether a slot format indexes a codebook (TurboQuant's MSE key presets), from its slot codec
    assert [d.name for d in vt.DTYPES if d.needs_codebook] == names[9:12]
    assert vt.dtype_info("fp8").name == "fp8_e4m3" and vt.dtype_info("half").name == "float16"
    assert vt.dtype_info("fp8_e4m3").numpy_dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    # an fp8 page is exactly half a bfloat16 page: element bytes are linear
    assert vt.dtype_info("bfloat16").elem_bytes == 2 * vt.dtype_info("fp8_e5m2").elem_bytes
    with pytest.raises(ValueError, match="dtype_info: name must be one of"):
        vt.dtype_info("auto")


@pytest.mark.parametrize("isa", available_isas())
def test_vtinfer_isa_lowers_the_choice(isa):
    r = run_py("import vtinfer; print(vtinfer.build_info()['isa'])", VTINFER_ISA=isa)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == isa


def test_vtinfer_isa_unknown_value_is_refused_at_import():
    r = run_py("import vtinfer", VTINFER_ISA="sse9")
    assert r.returncode != 0
    assert "VTINFER_ISA must be scalar, avx2 or avx512; got 'sse9'" in r.stderr


def test_a_refused_import_changes_no_process_wide_state():
    # A library must not replace sys.excepthook (or other interpreter state) when it refuses to load.
    code = ("import sys\n"
            "hook, dh = sys.excepthook, sys.displayhook\n"
            "try:\n"
            "    import vtinfer\n"
            "except ImportError as e:\n"
            "    assert 'VTINFER_ISA' in str(e), e\n"
            "else:\n"
            "    raise SystemExit('imported')\n"
            "assert sys.excepthook is hook and sys.displayhook is dh, sys.excepthook\n"
            "print('unchanged')\n")
    r = run_py(code, VTINFER_ISA="sse9")
    assert r.returncode == 0 and r.stdout.strip() == "unchanged", r.stderr


def test_set_isa_refuses_unknown_names():
    with pytest.raises(ValueError, match="set_isa: isa must be"):
        vt._C.set_isa("mmx")
    with pytest.raises(TypeError, match="set_isa: isa must be a str"):
        vt._C.set_isa(2)


def test_cli_info_json_and_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "vtinfer", "info", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["isa"] in ("scalar", "avx2", "avx512")
    r = subprocess.run([sys.executable, "-m", "vtinfer", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage: vtinfer" in r.stdout
