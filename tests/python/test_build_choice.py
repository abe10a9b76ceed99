"""setup.py's choices: the CUDA arm only when asked for (VTINFER_CUDA=1) or where a GPU is
present, never merely because nvcc exists; and the build says what it builds on the terminal."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("vtinfer_setup_py", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: setup() does not run
    return mod


NVCC = "/usr/local/cuda/bin/nvcc"


@pytest.mark.parametrize("mode,nvcc,gpu,build", [
    ("auto", NVCC, False, False),  # nvcc on a machine without a GPU: not built
    ("auto", NVCC, True, True),
    ("auto", None, True, False),
    ("auto", None, False, False),
    ("0", NVCC, True, False),
    ("1", NVCC, False, True),
])
def test_the_cuda_arm_is_built_only_when_asked_for_or_with_a_gpu(setup_py, mode, nvcc, gpu, build):
    got, why = setup_py.cuda_choice(mode, nvcc, gpu)
    assert got is build, why
    assert why
    if mode == "auto" and nvcc and not gpu:
        assert "no GPU" in why and "VTINFER_CUDA=1" in why, why


def test_bad_modes_and_a_missing_nvcc_are_refused(setup_py):
    with pytest.raises(SystemExit, match="VTINFER_CUDA must be auto, 0 or 1; got 'yes'"):
        setup_py.cuda_choice("yes", NVCC, True)
    with pytest.raises(SystemExit, match="VTINFER_CUDA=1: nvcc was not found"):
        setup_py.cuda_choice("1", None, True)


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_gpu_is_seen_by_its_device_file_or_nvidia_smi(setup_py, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not setup_py.gpu_present(dev=str(tmp_path / "nvidia0"))  # no device file, no nvidia-smi
    (tmp_path / "nvidia0").write_text("")
    assert setup_py.gpu_present(dev=str(tmp_path / "nvidia0"))
    no_dev = str(tmp_path / "none")
    _exe(tmp_path / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n")
    assert setup_py.gpu_present(dev=no_dev)
    _exe(tmp_path / "nvidia-smi", "#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n")
    assert not setup_py.gpu_present(dev=no_dev)


def test_say_writes_stdout_and_the_terminal(setup_py, tmp_path, capsys):
    tty = tmp_path / "tty"
    tty.write_text("")
    setup_py.say("compiling vtinfer._C", tty=str(tty))
    assert capsys.readouterr().out == "vtinfer build: compiling vtinfer._C\n"
    assert tty.read_text() == "vtinfer build: compiling vtinfer._C\n"
    setup_py.say("no terminal", tty=str(tmp_path / "no" / "tty"))  # none: stdout only, no error
    assert capsys.readouterr().out == "vtinfer build: no terminal\n"


def test_the_cuda_compile_gate_does_not_depend_on_the_choice():
    # .ci/cuda_compile compiles csrc/cuda with nvcc itself wherever nvcc exists, GPU or not
    gate = (ROOT / ".ci" / "cuda_compile").read_text()
    assert "csrc/cuda/*.cu" in gate and "setup.py" not in gate
    assert os.access(ROOT / ".ci" / "cuda_compile", os.X_OK)
