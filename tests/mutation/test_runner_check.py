"""A mutant that no longer applies fails the mutation run
up front, for the whole list, even with --fast; and today's list applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "run.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=120)


def test_every_mutant_of_the_list_applies_to_the_working_tree():
    p = _run("--check", "--rev", "WORKTREE")
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_stale_mutant_fails_even_a_fast_run_that_does_not_select_it(tmp_path):
    toml = tmp_path / "m.toml"
    toml.write_text('''
[[mutant]]
name = "applies"
file = "vtinfer/cli.py"
find = "def build_parser()"
replace = "def build_parser_x()"
tests = ["tests/python/test_api.py"]
fast = true

[[mutant]]
name = "rotted"
file = "vtinfer/cli.py"
find = "this text was refactored away long ago"
replace = "x"
tests = ["tests/python/test_api.py"]
''')
    for args in (["--check"], ["--fast"], ["applies"]):
        p = _run(*args, "--rev", "WORKTREE", "--toml", str(toml))
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "STALE rotted: vtinfer/cli.py: find text occurs 0 times" in p.stdout, p.stdout
        assert "killed" not in p.stdout  # nothing was built or run
    good = tmp_path / "good.toml"
    good.write_text(toml.read_text().split("[[mutant]]\nname = \"rotted\"")[0])
    assert _run("--check", "--rev", "WORKTREE", "--toml", str(good)).returncode == 0


# ---- mutants in code this CPU cannot execute: "not run here", never survived or killed ----

import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("vt_mutation_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_bf16_tile_mutant_needs_avx512bf16_and_every_needs_is_an_isa(runner):
    muts = runner.load(RUN.parent / "mutations.toml")
    needs = {m["name"]: runner.needs_of(m) for m in muts}
    bf16 = [n for n in needs if n.startswith(("attn-bf16dot-", "int4-bf16dot-"))]
    assert len(bf16) >= 20 and all(needs[n] == "avx512bf16" for n in bf16), {n: needs[n] for n in bf16}
    for m in muts:
        files = [e["file"] for e in m["edits"]]
        if any("avx512bf16" in f for f in files):
            assert needs[m["name"]] == "avx512bf16", m["name"]
        elif any("avx512" in f for f in files):
            assert needs[m["name"]] in ("avx512", "avx512bf16", "avx512vbmi"), m["name"]
        assert needs[m["name"]] in runner.ISA_LEVELS + (runner.VBMI,), m["name"]
    assert needs["pth-round-half-even-avx512"] == "avx512"  # from its find text's intrinsics
    assert needs["store-kv-swapped"] == "scalar"


def test_what_this_cpu_runs_comes_from_its_flags_lowered_by_vtinfer_isa_and_the_option(runner, tmp_path):
    def cpu(flags):
        f = tmp_path / "cpuinfo"
        f.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        return str(f)

    avx2 = "fpu sse4_2 avx avx2 fma f16c"
    full = avx2 + " avx512f avx512bw avx512vl avx512dq avx512_bf16"
    assert runner.machine_level(cpu("fpu sse4_2")) == "scalar"
    assert runner.machine_level(cpu(avx2)) == "avx2"
    assert runner.machine_level(cpu(full.replace(" avx512_bf16", ""))) == "avx512"
    assert runner.machine_level(cpu(full)) == "avx512bf16"
    assert runner.machine_level(cpu(full), vtinfer_isa="avx2") == "avx2"
    assert runner.machine_level(cpu(full), vtinfer_isa="avx512") == "avx512bf16"  # avx512 keeps the BF16 tile
    assert runner.machine_level(cpu(full), cap="avx512") == "avx512"
    assert runner.machine_level(cpu(avx2), cap="avx512bf16") == "avx2"  # --isa only lowers
    assert runner.runs_here("avx512bf16", "avx512bf16") and not runner.runs_here("avx512bf16", "avx512")
    assert runner.runs_here("avx512vbmi", "avx512", True) and not runner.runs_here("avx512vbmi", "avx512bf16", False)
    assert not runner.runs_here("avx512vbmi", "avx2", True)  # VTINFER_ISA=avx2 runs no AVX-512 kernel
    assert runner.machine_vbmi("avx512", cpu(full + " avx512vbmi")) and not runner.machine_vbmi("avx512", cpu(full))
    assert not runner.machine_vbmi("avx2", cpu(full + " avx512vbmi"))


def _bf16_toml(runner, tmp_path) -> Path:
    m = next(m for m in runner.load(RUN.parent / "mutations.toml") if m["name"] == "attn-bf16dot-wrong-key-column")
    toml = tmp_path / "bf16.toml"
    q = json.dumps  # a JSON string is a TOML basic string (\\, \", \n, \uXXXX)
    toml.write_text(f'[[mutant]]\nname = "tile-mutant"\nfile = {q(m["file"])}\nfind = {q(m["find"])}\n'
                    f'replace = {q(m["replace"])}\ntests = ["tests/numerics/test_attention.py"]\nfast = true\n')
    return toml


@pytest.mark.parametrize("how", ["--isa", "VTINFER_ISA"])
def test_a_mutant_this_cpu_cannot_run_is_not_run_here_and_the_run_passes(runner, tmp_path, how):
    toml = _bf16_toml(runner, tmp_path)
    args, env = (["--isa", "avx2"], {}) if how == "--isa" else ([], {"VTINFER_ISA": "avx2"})
    p = subprocess.run([sys.executable, str(RUN), "--fast", "--rev", "WORKTREE", "--toml", str(toml), *args],
                       capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "tile-mutant: not run here: needs avx512bf16 (this CPU runs avx2)" in p.stdout, p.stdout
    assert "| tile-mutant | not run here |" in p.stdout and "killed 0/0" in p.stdout, p.stdout
    assert "SURVIVED" not in p.stdout and "survivors" not in p.stdout and "base built" not in p.stdout


def test_list_marks_the_mutants_a_lower_cpu_cannot_run(runner):
    p = _run("--list", "--isa", "avx2", "--rev", "WORKTREE")
    assert p.returncode == 0 and "this CPU runs: avx2" in p.stdout, p.stdout
    marked = {ln.split()[0] for ln in p.stdout.splitlines() if "(not run here: needs " in ln}
    assert {"attn-bf16dot-wrong-key-column", "attn-bf16dot-transpose-wrong-block",
            "attn-bf16dot-v-interleave-swapped", "attn-bf16dot-k-descale-dropped",
            "avx512-pth-avx2-instances-dropped"} <= marked, marked
    assert not marked & {"store-kv-swapped", "attn-avx2-logit-unsaturated"}


# ---- a mutant's copy: hard links to the base, except the C tests' build folder ----


def test_a_copy_rewrites_its_c_test_objects_without_touching_the_base(runner, tmp_path):
    base = tmp_path / "base"
    obj = base / "tests" / "c" / "build" / "opt" / "core" / "attn.o"
    src = base / "csrc" / "core" / "attn.c"
    for p, data in ((obj, b"base object"), (src, b"int x;")):
        p.parent.mkdir(parents=True)
        p.write_bytes(data)
    os.utime(obj, (1_000_000, 1_000_000))
    dest = tmp_path / "copy"
    runner.clone(base, dest)
    copy_obj = dest / obj.relative_to(base)
    # a tool that rewrites an object in place must not reach the base's
    assert copy_obj.stat().st_ino != obj.stat().st_ino
    assert copy_obj.stat().st_mtime == 1_000_000  # kept: make rebuilds only what a mutated file reaches
    with open(copy_obj, "r+b") as f:
        f.write(b"MUTANT")
    assert obj.read_bytes() == b"base object"
    # the sources stay hard links (a copy costs no disk; the mutant unlinks a file before editing it)
    assert (dest / src.relative_to(base)).stat().st_ino == src.stat().st_ino
