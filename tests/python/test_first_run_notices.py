"""A first run says what it downloads, where and how big, before it starts: the vLLM wheel the
differential tests read (321 MiB), in a notice that reaches the terminal under pytest's capture,
and in the session header (tests/conftest.py) that every log shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vtinfer import _notice
from vtinfer.testing import upstream


@pytest.fixture
def no_vllm_anywhere(monkeypatch, tmp_path):
    real = upstream.importlib.util.find_spec
    monkeypatch.setattr(upstream.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    monkeypatch.delenv("VTINFER_VLLM_SOURCE", raising=False)
    monkeypatch.delenv("VTINFER_CACHE_DIR", raising=False)
    monkeypatch.setenv("VTINFER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "vllm"


def test_the_wheel_lives_in_vtinfers_cache_folder(no_vllm_anywhere, monkeypatch, tmp_path):
    assert upstream.cache_dir() == no_vllm_anywhere
    monkeypatch.setenv("VTINFER_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert upstream.cache_dir() == tmp_path / "elsewhere"


def test_the_download_is_announced_with_its_size_and_folder_before_it_starts(no_vllm_anywhere, monkeypatch):
    events = []
    monkeypatch.setattr(upstream, "notice", lambda msg: events.append(("notice", msg)))

    def fake_pip(cmd, **kw):
        events.append(("pip", cmd))
        d = Path(cmd[cmd.index("-d") + 1])
        (d / f"vllm-{upstream.VLLM_PIN}-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"\0" * (3 << 20))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(upstream.subprocess, "run", fake_pip)
    path = upstream.wheel_path()
    assert [e[0] for e in events] == ["notice", "pip", "notice"], events
    before = events[0][1]
    assert f"about {upstream.WHEEL_MIB} MiB" in before and f"vllm=={upstream.VLLM_PIN}" in before, before
    assert str(no_vllm_anywhere) in before, before
    assert str(path) in events[2][1] and "3 MiB" in events[2][1], events[2]
    events.clear()
    assert upstream.wheel_path() == path and events == []  # cached: nothing said, nothing fetched


def test_describe_says_where_the_source_comes_from_without_fetching(no_vllm_anywhere, monkeypatch):
    monkeypatch.setattr(upstream.subprocess, "run", lambda *a, **k: pytest.fail("describe() must not run pip"))
    line = upstream.describe()
    assert "not cached" in line and f"{upstream.WHEEL_MIB} MiB" in line and str(no_vllm_anywhere) in line, line
    no_vllm_anywhere.mkdir(parents=True)
    (no_vllm_anywhere / f"vllm-{upstream.VLLM_PIN}-x.whl").write_bytes(b"\0" * (2 << 20))
    assert "cached" in upstream.describe() and "2 MiB" in upstream.describe()


def test_a_notice_reaches_the_terminal_when_stderr_is_captured(tmp_path, capsys):
    tty = tmp_path / "tty"
    tty.write_text("")
    _notice.notice("downloading x", tty=str(tty))  # stderr is pytest's capture here, not a terminal
    assert capsys.readouterr().err == "vtinfer: downloading x\n"
    assert tty.read_text() == "vtinfer: downloading x\n"
    _notice.notice("no terminal", tty=str(tmp_path / "none" / "tty"))
    assert capsys.readouterr().err == "vtinfer: no terminal\n"


def test_the_session_header_names_the_download(tmp_path):
    env = {**os.environ, "VTINFER_CACHE": str(tmp_path / "cache")}
    env.pop("VTINFER_CACHE_DIR", None)
    env.pop("VTINFER_VLLM_SOURCE", None)
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider",
                        "tests/python/test_build_choice.py"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    if "the installed vllm package" not in p.stdout:
        assert f"about {upstream.WHEEL_MIB} MiB" in p.stdout and str(tmp_path / "cache" / "vllm") in p.stdout, p.stdout
