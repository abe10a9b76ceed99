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
            assert len(lines) == 1 and lines[0].startswith("vtinfer calibrate: --out must"), p.stderr
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


def _edit_marker(out, fn):
    rec = json.loads((out / MARKER).read_text())
    fn(rec)
    (out / MARKER).write_text(json.dumps(rec))


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("edit", ["entries_only", "files_wrong_hash", "files_right_size_wrong_hash"])
def test_an_edited_marker_listing_a_users_file_does_not_get_it_deleted(tree, cal, edit):
    """The second hostile round: a user's file added to a previous output and listed in an edited marker."""
    home, m, _ = tree
    out = home / "cal"
    write_calibrated(m, out, cal)
    (out / "mine.txt").write_text("the user's\n")

    def add(rec):
        rec["entries"].append("mine.txt")
        if edit != "entries_only":
            rec["files"]["mine.txt"] = {"size": 11 if edit.startswith("files_right") else 99, "sha256": "0" * 64}

    _edit_marker(out, add)
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=True), FileExistsError,
                       r"mine\.txt: not written by vtinfer|mine\.txt: changed since vtinfer wrote it")
    assert (out / "mine.txt").read_text() == "the user's\n"


def test_a_file_vtinfer_wrote_and_the_user_changed_is_kept(tree, cal):
    home, m, _ = tree
    out = home / "cal"
    write_calibrated(m, out, cal)
    cfg = json.loads((out / "config.json").read_text())
    cfg["my_note"] = "edited by hand"
    (out / "config.json").write_text(json.dumps(cfg))
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=True), FileExistsError,
                       r"config\.json: changed since vtinfer wrote it.*left in place and nothing was removed")


def test_marker_names_outside_the_directory_and_symlinks_reach_nothing(tree, cal):
    """A marker naming ../notes/keep.txt (with its true size and hash) and a symlink to it inside the output:
    the walk of the output never leaves it, a symlink is never vtinfer's, the user's file survives."""
    home, m, notes = tree
    out = home / "cal"
    write_calibrated(m, out, cal)
    keep = notes / "keep.txt"
    rec = {"size": keep.stat().st_size, "sha256": _sha(keep)}

    def add(r):
        r["entries"] += ["../notes/keep.txt", str(keep), "link.txt"]
        r["files"].update({"../notes/keep.txt": rec, str(keep): rec, "link.txt": rec})

    _edit_marker(out, add)
    os.symlink(keep, out / "link.txt")
    _refused_unchanged(home, lambda: write_calibrated(m, out, cal, overwrite=True), FileExistsError,
                       r"link\.txt: a symlink")
    (out / "link.txt").unlink()
    write_calibrated(m, out, cal, overwrite=True)  # the rest is vtinfer's: replaced; the named outside file stays
    assert keep.read_text() == "a user's file\n"
    assert "../notes/keep.txt" not in json.loads((out / MARKER).read_text())["files"]


def test_the_marker_records_every_files_size_and_hash(tree, cal):
    home, m, _ = tree
    out = home / "cal"
    write_calibrated(m, out, cal)
    files = json.loads((out / MARKER).read_text())["files"]
    on_disk = {p.relative_to(out).as_posix(): p for p in out.rglob("*") if p.is_file() and p.name != MARKER}
    assert set(files) == set(on_disk)
    for rel, p in on_disk.items():
        assert files[rel] == {"size": p.stat().st_size, "sha256": _sha(p)}


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
