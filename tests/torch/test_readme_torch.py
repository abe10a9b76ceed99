"""The README's torch example runs: a vLLM-shaped chunked prefill on
CPU torch tensors through torch.ops.vtinfer (store into a (num_blocks, 2,
...) cache via kv[:, 0] / kv[:, 1], attention over prefix and suffix,
merge_attn_states equal to one call), and torch.compile(fullgraph=True) of
it equal to eager. The example asserts both itself; a fresh inductor cache
makes the compile a cold one."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.torch._util import TORCH_REASON

pytest.importorskip("torch", reason=TORCH_REASON)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def torch_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if "torch.ops.vtinfer" in b]
    assert len(found) == 1, "README.md must have one python example using torch.ops.vtinfer"
    return found[0]


def test_readme_torch_example_runs_and_compiles(tmp_path):
    code = torch_example()
    for op in ("reshape_and_cache_flash", "flash_attn_varlen_func", "merge_attn_states", "torch.compile", "kv[:, 0]"):
        assert op in code
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "torch.float32 (3, 8, 64) compiled == eager" in r.stdout
