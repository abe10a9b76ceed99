"""``calibrate --out`` never deletes what vtinfer did not create.

Every form of ``--out`` is tried against a tree holding the model and a
user's files; the bytes of every file that was there before are compared
after each refusal, and no temporary directory may be left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vtinfer as vt
from vtinfer.models import Decoder, calibrate_amax, write_calibrated
from vtinfer.models.store import MARKER
from vtinfer.models.tiny import make_tiny_checkpoint


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture(scope="module")
def cal(tiny_dirs):
    return calibrate_amax(Decoder.from_pretrained(tiny_dirs["llama"]), [1, 2, 3, 4], progress=False)


@pytest.fixture
def tree(tmp_path, tiny_dirs):
    """tmp/home/models/llama (the model), tmp/home/notes/keep.txt (a user's file)."""
    home = tmp_path / "home"
    m = home / "models" / "llama"
    m.parent.mkdir(parents=True)
    for f in Path(tiny_dirs["llama"]).iterdir():
        (m / f.name).parent.mkdir(parents=True, exist_ok=True)
        (m / f.name).write_bytes(f.read_bytes())
    (m / "README.md").write_text("the user's model card\n")
    notes = home / "notes"
    notes.mkdir()
    (notes / "keep.txt").write_text("a user's file\n")
    return home, m, notes


def _refused_unchanged(home, fn, exc=(ValueError, FileExistsError), match=None):
    before = _snapshot(home)
    with pytest.raises(exc, match=match):
        fn()
    assert _snapshot(home) == before  # nothing removed, nothing written, no temp dir left


@pytest.mark.parametrize("form", ["user_dir", "user_dir_overwrite", "model_dir", "model_parent", "home",
                                  "inside_model", "existing_file", "symlink_to_user_dir", "model_via_symlink"])
def test_every_out_form_that_could_destroy_data_is_refused(tree, cal, form):
    home, m, notes = tree
    overwrite = form.endswith("overwrite")
    out = {"user_dir": notes, "user_dir_overwrite": notes, "model_dir": m, "model_parent": m.parent,
           "home": home, "inside_model": m / "calibrated", "existing_file": notes / "keep.txt",
           "symlink_to_user_dir": home / "link", "model_via_symlink": home / "mlink"}[form]
    if form == "symlink_to_user_dir":
        out.symlink_to(notes)
    if form == "model_via_symlink":
        out.symlink_to(m)
    # the model directory, what contains it and what lies inside it are named as such
    # (before the emptiness check, which would refuse most of them too)
    near_model = form in ("model_dir", "model_parent", "home", "inside_model", "model_via_symlink")
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=overwrite),
                       match="must lie outside the model directory" if near_model else None)
    assert (notes / "keep.txt").read_text() == "a user's file\n"


def test_cli_refuses_in_one_line_and_the_user_file_survives(tree):
    home, m, notes = tree
    before = _snapshot(home)
    for out in (notes, m.parent, m / "x"):
        for extra in ([], ["--overwrite"]):
            p = subprocess.run([sys.executable, "-m", "vtinfer", "calibrate", str(m), "--out", str(out),
                                "--tokens", "8", *extra], capture_output=True, text=True, timeout=300)
            assert p.returncode == 2, (out, p.stderr)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("vtinfer calibrate: out must"), p.stderr
    assert _snapshot(home) == before


def test_new_and_empty_out_are_written_and_marked(tree, cal):
    home, m, _ = tree
    out = home / "new" / "deeper" / "cal"
    write_calibrated(m, out, cal)
    rec = json.loads((out / MARKER).read_text())
    assert rec["written_by"] == "vtinfer" and "config.json" in rec["entries"]
    assert vt.resolve_kv_cache_dtype("auto", out).dtype == "fp8_e4m3"
    empty = home / "empty"
    empty.mkdir()
    write_calibrated(m, empty, cal)
    assert (empty / "config.json").is_file()


def test_previous_output_needs_overwrite_and_only_its_own_files_go(tree, cal):
    home, m, _ = tree
    out = home / "cal"
    write_calibrated(m, out, cal)
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal), FileExistsError, "--overwrite")
    write_calibrated(m, out, cal, fmt="compressed-tensors", overwrite=True)  # replaced
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == \
        "compressed-tensors"
    # a file the user added to a previous output: the output is no longer only vtinfer's
    (out / "my-notes.txt").write_text("mine\n")
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=True), FileExistsError,
                       "did not write")
    assert (out / "my-notes.txt").read_text() == "mine\n"
    # a forged marker that does not list the user's file does not help
    (out / "my-notes.txt").unlink()
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_bytes(b"user")
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=True), FileExistsError)


def test_an_error_midway_leaves_no_temporary_directory(tree, cal, monkeypatch):
    home, m, _ = tree
    C = sys.modules["vtinfer.models.calibrate"]  # the package re-exports a function of the same name

    def boom(*a, **k):
        raise OSError("disk full (planted)")

    monkeypatch.setattr(C, "save_safetensors", boom)
    before = _snapshot(home)
    with pytest.raises(OSError, match="planted"):
        write_calibrated(m, home / "a" / "b" / "cal", cal)
    assert _snapshot(home) == before  # no .cal.XXXX, and a/ and a/b/ (made for it) are gone again


def test_shard_name_collision_keeps_both_shards(tmp_path, tiny_dirs, cal):
    from safetensors.numpy import load_file, save_file

    src = Path(tiny_dirs["llama"])
    m = tmp_path / "m"
    (m / "a").mkdir(parents=True)
    (m / "b").mkdir()
    (m / "config.json").write_bytes((src / "config.json").read_bytes())
    w = load_file(str(src / "model.safetensors"))
    names = sorted(w)
    half = len(names) // 2
    save_file({k: w[k] for k in names[:half]}, str(m / "a" / "w.safetensors"))
    save_file({k: w[k] for k in names[half:]}, str(m / "b" / "w.safetensors"))
    wm = {k: ("a/w.safetensors" if i < half else "b/w.safetensors") for i, k in enumerate(names)}
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    out = write_calibrated(m, tmp_path / "out", cal)
    for sub in ("a", "b"):
        assert (out / sub / "w.safetensors").read_bytes() == (m / sub / "w.safetensors").read_bytes()
    got = load_file(str(out / "a" / "w.safetensors")) | load_file(str(out / "b" / "w.safetensors"))
    assert sorted(got) == names and all(np.array_equal(got[k], w[k]) for k in names)
    idx = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert {idx[k] for k in names} == {"a/w.safetensors", "b/w.safetensors"}


def test_a_shard_named_like_the_scales_file_is_not_overwritten(tmp_path, tiny_dirs, cal):
    src = Path(tiny_dirs["llama"])
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_bytes((src / "config.json").read_bytes())
    (m / "kv_scales.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    out = write_calibrated(m, tmp_path / "out", cal)
    assert (out / "kv_scales.safetensors").read_bytes() == (m / "kv_scales.safetensors").read_bytes()
    assert len(vt.load_kv_scales(vt.Checkpoint(out).shards, 2, 2)) == 2
