"""Hostile model directories (and the scale rules that read them).

FIFOs, sockets and devices are never opened (each case runs ``vtinfer
inspect`` in a child process with a timeout, so a hang fails the test rather
than the suite); index paths and symlinks may not leave the directory;
absurd geometry is refused by name; F64 scales outside float32 and layer
indices that are not vLLM parameter names are refused or ignored as vLLM
does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vtinfer as vt
from vtinfer.scales import write_safetensors

CFG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "hidden_size": 64, "torch_dtype": "float16"}


def _model(d: Path, cfg: dict | None = None, shard: bool = True) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg or CFG))
    if shard:
        write_safetensors(d / "model.safetensors", {"model.embed_tokens.weight": np.ones((2, 2), np.float32)})
    return d


def _inspect(d: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vtinfer", "inspect", str(d), *extra], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "VTINFER_NUM_THREADS": "1"})


def _refused(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vtinfer inspect: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_fifo_named_model_safetensors_is_refused_not_opened(tmp_path):
    d = _model(tmp_path / "m", shard=False)
    os.mkfifo(d / "model.safetensors")
    _refused(_inspect(d), "model.safetensors", "regular file", "FIFO")


def test_fifo_listed_in_the_index_is_refused(tmp_path):
    d = _model(tmp_path / "m")
    os.mkfifo(d / "w2.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "w2.safetensors"}}))
    _refused(_inspect(d), "w2.safetensors", "regular file", "FIFO")


def test_fifo_config_and_index_are_refused(tmp_path):
    d = _model(tmp_path / "m")
    os.mkfifo(d / "model.safetensors.index.json")
    _refused(_inspect(d), "model.safetensors.index.json", "regular file")
    d2 = _model(tmp_path / "m2", shard=False)
    (d2 / "config.json").unlink()
    os.mkfifo(d2 / "config.json")
    _refused(_inspect(d2), "config.json", "regular file")


def test_socket_and_device_are_refused(tmp_path):
    d = _model(tmp_path / "m", shard=False)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(d / "model.safetensors"))
        _refused(_inspect(d), "model.safetensors", "socket")
    finally:
        s.close()
    d2 = _model(tmp_path / "m2", shard=False)
    (d2 / "model.safetensors").symlink_to("/dev/zero")
    _refused(_inspect(d2), "model.safetensors")  # a symlink out of the directory, and a device


def test_symlink_to_a_device_inside_is_refused_as_a_device(tmp_path):
    d = _model(tmp_path / "m", shard=False)
    os.mkfifo(d / "pipe")
    (d / "model.safetensors").symlink_to("pipe")
    _refused(_inspect(d), "model.safetensors", "FIFO")


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors",
                                  "", "a\\..\\b.safetensors"])
def test_index_paths_outside_the_directory_are_refused(tmp_path, name):
    d = _model(tmp_path / "m")
    write_safetensors(tmp_path / "outside.safetensors", {"x": np.ones(1, np.float32)})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": name}}))
    with pytest.raises(vt.ConfigError, match="shard"):
        vt.Checkpoint(d)
    _refused(_inspect(d), "shard")


def test_symlinks_out_of_the_directory_are_refused(tmp_path):
    write_safetensors(tmp_path / "outside.safetensors", {"x": np.ones(1, np.float32)})
    d = _model(tmp_path / "m", shard=False)
    (d / "model.safetensors").symlink_to(tmp_path / "outside.safetensors")
    with pytest.raises(vt.ConfigError, match="must resolve inside the model directory"):
        vt.Checkpoint(d)
    d2 = _model(tmp_path / "m2")
    (d2 / "sub").symlink_to(tmp_path)  # a directory symlink used by an index name
    (d2 / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "sub/outside.safetensors"}}))
    with pytest.raises(vt.ConfigError, match="must resolve inside"):
        vt.Checkpoint(d2)
    d3 = tmp_path / "m3"
    d3.mkdir()
    (d3 / "config.json").symlink_to(d / "config.json")
    with pytest.raises(vt.ConfigError, match="config.json must resolve inside"):
        vt.Checkpoint(d3)


def test_symlinks_inside_and_the_hub_cache_layout_are_accepted(tmp_path):
    d = _model(tmp_path / "m")
    (d / "model.safetensors").rename(d / "real.bin")
    (d / "model.safetensors").symlink_to("real.bin")
    assert [s.name for s in vt.Checkpoint(d).shards] == ["model.safetensors"]
    # the Hugging Face hub cache: snapshots/<rev>/file -> ../../blobs/<sha>
    repo = tmp_path / "models--x--y"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    src = _model(tmp_path / "src")
    for f in ("config.json", "model.safetensors"):
        (src / f).rename(repo / "blobs" / f"sha-{f}")
        (snap / f).symlink_to(Path("..") / ".." / "blobs" / f"sha-{f}")
    ck = vt.Checkpoint(snap)
    assert len(ck.shards) == 1 and ck.geometry.num_layers == 2
    assert _inspect(snap).returncode == 0


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 10 ** 9), ("num_attention_heads", 10 ** 9),
                                       ("head_dim", 10 ** 12), ("hidden_size", 10 ** 12)])
def test_absurd_geometry_is_refused_by_name_quickly(tmp_path, key, value):
    cfg = {**CFG, key: value}
    d = _model(tmp_path / "m", cfg)
    p = _inspect(d, timeout=60)  # 10**9 layer specs: refused quickly (the timeout catches a parse that takes minutes)
    _refused(p, key, "must be at most")


def test_json_documents_are_bounded(tmp_path, monkeypatch):
    from vtinfer import _fileio

    d = _model(tmp_path / "m")
    monkeypatch.setattr(_fileio, "MAX_JSON_BYTES", 16)
    with pytest.raises(vt.ConfigError, match="config.json must be at most 16 bytes"):
        _fileio.read_regular(d / "config.json", _fileio.MAX_JSON_BYTES, what=str(d / "config.json"))



def test_a_file_longer_than_its_stat_size_is_read_whole_or_refused(tmp_path, monkeypatch):
    # read_regular reads the fstat size (+1 byte), not the limit; a file longer than fstat said (it
    # grew) is still read to its end, or refused past the limit
    from vtinfer import _fileio

    f = tmp_path / "c.json"
    f.write_bytes(b"x" * 100)
    real = os.fstat

    class Stat:
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 10

    monkeypatch.setattr(os, "fstat", lambda fd: Stat(real(fd)))
    assert _fileio.read_regular(f, 1000) == b"x" * 100
    with pytest.raises(vt.ConfigError, match="at most 50 bytes; got more"):
        _fileio.read_regular(f, 50)

# ---- scales as vLLM loads them ----

@pytest.mark.parametrize("value", [1e300, 1e-300, 3.5e38])
def test_f64_scales_outside_float32_are_refused(tmp_path, value):
    f = tmp_path / "s.safetensors"
    write_safetensors(f, {"model.layers.0.self_attn.k_scale": np.array(value, np.float64)})
    with pytest.raises(ValueError, match=r"k_scale must be representable as a positive finite float32"):
        vt.load_kv_scales([f], 1, 2)


def test_f64_scales_are_read_as_float32_values(tmp_path):
    f = tmp_path / "s.safetensors"
    write_safetensors(f, {"model.layers.0.self_attn.k_scale": np.array(0.1, np.float64),
                          "model.layers.0.self_attn.v_scale": np.array(3e38, np.float64)})
    (s,) = vt.load_kv_scales([f], 1, 2)
    assert s.k_scale == float(np.float32(0.1)) and s.v_scale == float(np.float32(3e38))


@pytest.mark.parametrize("index", ["\u0660", "\u0661", "01", "\uff11", "1\u0660"])
def test_layer_indices_must_be_vllm_parameter_names(tmp_path, index):
    f = tmp_path / "s.safetensors"
    write_safetensors(f, {f"model.layers.{index}.self_attn.k_scale": np.array(0.5, np.float32),
                          f"model.layers.{index}.self_attn.v_scale": np.array(0.5, np.float32)})
    msgs: list[str] = []
    sc = vt.load_kv_scales([f], 2, 2, messages=msgs)
    assert all(s.origin == "default" for s in sc), sc  # not loaded into layer 0 or 1
    assert any("not found the expected name" in m for m in msgs)
