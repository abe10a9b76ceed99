"""torch stays optional: importing vtinfer, every submodule but
vtinfer.torch, and running the NumPy paths never imports torch. Run in
subprocesses: one where torch cannot be imported at all (a meta-path hook
refuses it, as a venv without torch would), one where it is installed but
must stay unimported. Neither needs torch installed."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, _NoTorch())
"""

USE = """
import importlib, pkgutil
import numpy as np
import vtinfer as vt
for m in pkgutil.walk_packages(vt.__path__, "vtinfer."):
    # __main__ runs the CLI; vtinfer.vllm's submodules run inside vLLM, which brings torch (the package
    # itself, the plugin's entry point, must import without either)
    if m.name not in ("vtinfer.torch", "vtinfer.__main__") and not m.name.startswith("vtinfer.vllm."):
        importlib.import_module(m.name)
assert "vllm" not in sys.modules, "vtinfer imported vllm"
x = np.linspace(-3, 3, 64, dtype=np.float32)
codes = vt.fp8_quantize(x, 0.5)
assert type(codes) is np.ndarray and codes.dtype == np.uint8
assert type(vt.fp8_dequantize(codes, 0.5)) is np.ndarray
assert type(vt.convert(x, np.float16)) is np.ndarray
cache = vt.PagedKVCache(1, 4, 16, 1, 8, "fp8_e4m3")
k = np.ones((3, 1, 8), np.float32)
cache.store(0, k, k, np.arange(3))
assert type(cache.gather(0, np.arange(3))[0]) is np.ndarray
out = cache.attention(0, np.ones((1, 2, 8), np.float32), cu_seqlens_q=np.array([0, 1], np.int32),
                      seqused_k=np.array([3], np.int32), block_table=np.array([[0]], np.int32))
assert type(out) is np.ndarray
assert "torch" not in sys.modules, "vtinfer imported torch"
print("numpy paths ok")
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_vtinfer_works_where_torch_cannot_be_imported():
    r = run(BLOCK + USE + """
try:
    import vtinfer.torch
except ImportError as e:
    print("refused:", e)
else:
    raise SystemExit("vtinfer.torch imported without torch")
""")
    assert r.returncode == 0, r.stderr
    assert "numpy paths ok" in r.stdout and "refused: torch is blocked" in r.stdout


def test_importing_vtinfer_leaves_torch_unimported():
    r = run("import sys\n" + USE)
    assert r.returncode == 0, r.stderr
    assert "numpy paths ok" in r.stdout
