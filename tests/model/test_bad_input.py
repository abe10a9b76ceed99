"""Bad checkpoints and arguments: clear exceptions naming what is wrong, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vtinfer.models import Decoder, DecoderConfig, calibrate
from vtinfer.models.tiny import make_tiny_checkpoint, tiny_config


@pytest.mark.parametrize("over,exc,match", [
    ({"model_type": "gpt2"}, NotImplementedError, "model_type"),
    ({"hidden_act": "gelu"}, NotImplementedError, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, NotImplementedError, "rope_scaling"),
])
def test_unsupported_config(over, exc, match):
    with pytest.raises(exc, match=match):
        DecoderConfig.from_dict({**tiny_config(), **over})


def test_missing_key_and_missing_dir(tmp_path):
    cfg = tiny_config()
    del cfg["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocab_size"):
        DecoderConfig.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        Decoder.from_pretrained(tmp_path / "nope")


def test_config_is_read_as_checkpoint_discovery_reads_it(tmp_path):
    """from_dir reads only a regular config.json inside the directory, as JSON object, or names the file."""
    from vtinfer import ConfigError

    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(tiny_config()))
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").symlink_to(outside)
    with pytest.raises(ConfigError, match="must resolve inside the model directory"):
        DecoderConfig.from_dir(d)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")  # open() of a FIFO would block: refused before it is opened
    with pytest.raises(ConfigError, match="must be a regular file; got a FIFO"):
        DecoderConfig.from_dir(d)
    (d / "config.json").unlink()
    (d / "config.json").write_text('{"model_type": "llama",\n  "vocab_size": }')
    with pytest.raises(ConfigError, match="config.json"):
        DecoderConfig.from_dir(d)
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object; got list"):
        DecoderConfig.from_dir(d)
    (d / "config.json").write_text(json.dumps(tiny_config()))
    assert DecoderConfig.from_dir(d) == DecoderConfig.from_dict(tiny_config())


def test_missing_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = make_tiny_checkpoint(tmp_path / "m")
    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        Decoder.from_pretrained(d)
    with pytest.raises(ValueError, match="up_proj"):
        calibrate(d, tmp_path / "out", max_tokens=8, progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_errors_are_one_line(tmp_path):
    env = {**os.environ, "VTINFER_CACHE": str(tmp_path)}
    for argv in (["demo", "--model", str(tmp_path / "nope")], ["calibrate", str(tmp_path / "nope"), "--out",
                                                                  str(tmp_path / "o")],
                 ["convert-gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "o")]):
        p = subprocess.run([sys.executable, "-m", "vtinfer", *argv], capture_output=True, text=True, env=env,
                           timeout=120)
        assert p.returncode == 2, (argv, p.stderr)
        assert p.stderr.startswith(f"vtinfer {argv[0]}: ") and "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()
