#!/usr/bin/env python3
"""run.py [--fast] [--rev REV] [--keep] [--list] [NAME ...]

Mutation runner: every entry of tests/mutation/mutations.toml
plants one defect and names the tests that must go red.  For each mutant:

1. a private copy of the tree at REV (default HEAD: ``git archive``, so
   the engineers' uncommitted work in the shared tree never leaks in) is
   hard-linked from a pristine base copy into /tmp/vtmut/<run>/<n>-<name>;
2. each edit's ``find`` text must occur exactly once in its file; it is
   replaced (the file is unlinked first, so the base copy is untouched) and
   the runner checks the bytes really changed;
3. the extension is rebuilt in the copy: the mutated C sources (or every
   source that includes a mutated header) are recompiled, the rest reuse
   the base objects, and ``vtinfer/_C*.so`` is relinked.  A mutant that
   does not build is an ERROR, never a kill;
4. the named tests run with the copy as cwd and first on sys.path (the
   runner checks that ``vtinfer`` is imported from the copy): pytest node
   ids, and ``c:<name>`` for a plain-C test of tests/c, built there with
   its Makefile (the base builds every named C test once; a copy gets its
   own copy of tests/c/build, timestamps kept, so make recompiles only the
   core objects a mutated file reaches).  pytest exit 1 (failures) or a killed process is a kill;
   exit 0 is a survivor; any other exit (collection error, no tests) is an
   ERROR;
5. the shared tree's copy of every mutated file is hashed (sha256) before
   and after: restoration is proven, not assumed.

Before any mutant, the union of the selected tests must pass on the
unmutated copy (else the run stops: a red baseline proves nothing).

Ends with ``killed N/N``; exit 0 only when every mutant was killed and
there was no error.  ``--fast`` runs the entries marked ``fast = true``
(what .ci/run calls).  Before anything is built, every mutant of the whole
list (not only the selected ones) must still apply: a ``find`` text that no
longer occurs exactly once prints ``STALE ...`` and fails the run (exit 1).
``--check`` does only that check (``--rev WORKTREE`` reads the files on disk;
tests/mutation/test_runner_check.py runs it with the suite).  The build mirrors setup.py's flags (C11, -fPIC,
-fvisibility=hidden, -fno-strict-aliasing, the include folders, _GNU_SOURCE)
at -O2 and without -Werror: a mutant may warn.

The CUDA glue: a mutant with ``cuda = true`` (implied by an
edit under csrc/binding/cuda/) also gets ``vtinfer/_cuda*.so`` in its copy,
so that tests which drive the CUDA extension without a device (the
argument layers refuse before the runtime: tests/binding/
test_cpu_cuda_same_errors.py) can go red.  The base then compiles
csrc/cuda/*.cu once with nvcc (setup.py's flags; a mutant never edits a
.cu: no test here could run a kernel) and csrc/binding/cuda/*.c; _cuda links
the same core/common objects as _C plus those and the static CUDA runtime.
Without nvcc such a mutant is an ERROR.  Other mutants get no _cuda: its
tests skip there, as on a machine without nvcc.

ISAs: a mutant in code this CPU cannot execute (the AVX512-BF16 tile on an
AVX2-only CPU) can neither be killed nor survive here: it is reported
``not run here: needs <ISA>`` and counts as neither.  What a mutant needs is
``needs = "avx2" | "avx512" | "avx512bf16" | "avx512vbmi"`` when its entry says so, else
derived from the files it edits (attn_avx512bf16.c and its scalar twin
attn_bf16dot_ref.c: avx512bf16; a name with avx512: avx512; with avx2: avx2)
and from its find text (AVX-512 / AVX2 intrinsics), the highest of these;
anything else runs on any CPU.  What this CPU runs is read from
/proc/cpuinfo's flags (AVX2 = avx2+fma+f16c; AVX-512 = avx512f/bw/vl/dq;
avx512_bf16), lowered by ``VTINFER_ISA`` (scalar / avx2; avx512 keeps the
BF16 tile, as the kernels do) and by ``--isa`` (to pretend a lower CPU).
AVX512-VBMI (the AVX-512 fp8 tile's byte-lookup instances) is no step of
that order (CPUs have it without BF16 and BF16 without it): a mutant that
needs "avx512vbmi" runs where the level is avx512 or higher and the flags
hold avx512vbmi (the kernel's name for the flag).

The vLLM plugin: a mutant with ``vllm = true`` (implied by an
edit under vtinfer/vllm/) names tests that import vLLM, which skip where it
is not installed.  Its tests run with ``VTINFER_REQUIRE_VLLM=1`` (a skip
cannot pass), so the runner must be started by a python that has vLLM (the
vLLM venv's); with any other python such a mutant is an ERROR, never a
survivor, and its tests leave the baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOML = HERE / "mutations.toml"
WORK = Path(os.environ.get("VTMUT_DIR", "/tmp/vtmut"))


ISA_LEVELS = ("scalar", "avx2", "avx512", "avx512bf16")
VBMI = "avx512vbmi"  # beside the levels: see the module docstring


def file_isa(path: str) -> str:
    """The ISA a file's code needs to execute (see the module docstring)."""
    name = os.path.basename(path)
    if "avx512bf16" in name or name.startswith("attn_bf16dot_ref"):
        return "avx512bf16"  # the twin is compared with the tile, which only a BF16 CPU runs
    if "avx512" in name:
        return "avx512"
    if "avx2" in name:
        return "avx2"
    return "scalar"


def text_isa(text: str) -> str:
    """The ISA of the intrinsics in a find text."""
    if re.search(r"_mm512_(dpbf16|cvtne2?ps_pbh)|__m512bh|__m256bh", text):
        return "avx512bf16"
    if re.search(r"_mm512_|__m512|__mmask|_mm(256)?_mask", text):
        return "avx512"
    if re.search(r"_mm256_|__m256|_mm_", text):
        return "avx2"
    return "scalar"


def needs_of(m: dict) -> str:
    """The ISA a mutant's code needs: its ``needs`` field, else the highest of its edits'."""
    if "needs" in m:
        return m["needs"]
    levels = [max(file_isa(e["file"]), text_isa(e["find"]), key=ISA_LEVELS.index) for e in m["edits"]]
    return max(levels, key=ISA_LEVELS.index)


def cpu_level(flags: set[str]) -> str:
    """The highest ISA level a CPU with these /proc/cpuinfo flags runs."""
    if not {"avx2", "fma", "f16c"} <= flags:
        return "scalar"
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx2"
    return "avx512bf16" if "avx512_bf16" in flags else "avx512"


def machine_level(cpuinfo: str = "/proc/cpuinfo", vtinfer_isa: str | None = None, cap: str | None = None) -> str:
    """What this machine runs: the CPU's level, lowered by VTINFER_ISA and by ``cap`` (--isa)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    level = cpu_level(set(line.split(":", 1)[-1].split()))
    env_cap = {"scalar": "scalar", "avx2": "avx2", "avx512": "avx512bf16"}.get(vtinfer_isa or "")
    for c in (env_cap, cap):
        if c and ISA_LEVELS.index(c) < ISA_LEVELS.index(level):
            level = c
    return level


def machine_vbmi(level: str, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this machine, at ``level`` (machine_level), runs the AVX512-VBMI kernels."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return ISA_LEVELS.index(level) >= ISA_LEVELS.index("avx512") and "avx512vbmi" in line.split(":", 1)[-1].split()


def runs_here(needs: str, level: str, vbmi: bool = False) -> bool:
    if needs == VBMI:
        return vbmi and ISA_LEVELS.index(level) >= ISA_LEVELS.index("avx512")
    return ISA_LEVELS.index(needs) <= ISA_LEVELS.index(level)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "(missing)"


def load(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    muts = data.get("mutant", [])
    seen = set()
    for m in muts:
        for key in ("name", "tests"):
            if key not in m:
                raise SystemExit(f"mutations.toml: an entry lacks {key!r}: {m}")
        if m["name"] in seen:
            raise SystemExit(f"mutations.toml: duplicate name {m['name']!r}")
        seen.add(m["name"])
        edits = [{"file": m["file"], "find": m["find"], "replace": m["replace"]}] if "file" in m else []
        edits += m.get("also", [])
        if not edits:
            raise SystemExit(f"mutations.toml: {m['name']}: no edit (file/find/replace)")
        for e in edits:
            if e["find"] == e["replace"]:
                raise SystemExit(f"mutations.toml: {m['name']}: find == replace")
        if "needs" in m and m["needs"] not in ISA_LEVELS[1:] + (VBMI,):
            raise SystemExit(f"mutations.toml: {m['name']}: needs must be one of {ISA_LEVELS[1:] + (VBMI,)}; "
                             f"got {m['needs']!r}")
        m["edits"] = edits
    return muts


def stale_mutants(muts: list[dict], rev: str) -> list[str]:
    """``name: file: find text occurs N times`` for every edit that does not
    apply at ``rev`` (``WORKTREE``: the files on disk)."""
    bad = []
    cache: dict[str, str | None] = {}
    for m in muts:
        for e in m["edits"]:
            f = e["file"]
            if f not in cache:
                if rev == "WORKTREE":
                    p = REPO / f
                    cache[f] = p.read_text(encoding="utf-8") if p.is_file() else None
                else:
                    r = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{f}"], capture_output=True)
                    cache[f] = r.stdout.decode("utf-8") if r.returncode == 0 else None
            text = cache[f]
            n = text.count(e["find"]) if text is not None else -1
            if n != 1:
                bad.append(f"{m['name']}: {f}: find text occurs {n if n >= 0 else 'no file, 0'} times (want 1)")
    return bad


# ---------------------------------------------------------------- building


def compiler() -> tuple[list[str], list[str], list[str]]:
    """(cc argv, compile flags, link argv prefix) mirroring setup.py."""
    import numpy

    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    inc = sysconfig.get_paths()["include"]
    flags = ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing", "-pthread",
             "-D_GNU_SOURCE=1", "-Icsrc/include", "-Icsrc/core", "-Icsrc/binding", f"-I{inc}", f"-I{numpy.get_include()}"]
    link = cc + ["-shared", "-pthread"]
    return cc, flags, link


def sources(root: Path) -> list[Path]:
    return sorted(root.glob("csrc/core/*.c")) + sorted(root.glob("csrc/binding/*.c")) + sorted(
        root.glob("csrc/binding/common/*.c"))


def cuda_glue_sources(root: Path) -> list[Path]:
    """The C sources only vtinfer._cuda has (it shares core/ and common/ with _C)."""
    return sorted(root.glob("csrc/binding/cuda/*.c"))


def obj_of(root: Path, src: Path) -> Path:
    return root / "build" / "vtmut-obj" / (src.parent.name + "__" + src.stem + ".o")


def compile_one(root: Path, src: Path) -> tuple[bool, str]:
    cc, flags, _ = compiler()
    out = obj_of(root, src)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()  # may be a hard link to the base object
    extra = ["-Icsrc/cuda"] if src.parent.name == "cuda" else []
    r = subprocess.run(cc + flags + extra + ["-c", str(src.relative_to(root)), "-o", str(out)], cwd=root,
                       capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def so_name() -> str:
    return "_C" + sysconfig.get_config_var("EXT_SUFFIX")


def link(root: Path) -> tuple[bool, str]:
    _, _, ld = compiler()
    so = root / "vtinfer" / so_name()
    if so.exists():
        so.unlink()
    objs = [str(obj_of(root, s)) for s in sources(root)]
    r = subprocess.run(ld + objs + ["-lm", "-o", str(so)], cwd=root, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def nvcc_and_cudart() -> tuple[str, str] | None:
    """(nvcc, folder of libcudart_static.a) as setup.py finds them, or None."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        found = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))
        nvcc = str(found[-1]) if found else None
    if not nvcc:
        return None
    nvcc = os.path.realpath(nvcc)
    homes = [Path(nvcc).parent.parent] + [Path(h) for h in [os.environ.get("CUDA_HOME")] if h]
    homes += sorted(Path("/usr/local").glob("cuda*"))[::-1]
    for lib in (h / sub for h in homes for sub in ("lib64", "lib", "targets/x86_64-linux/lib")):
        if (lib / "libcudart_static.a").is_file():
            return nvcc, str(lib)
    return None


def cuda_objects(root: Path) -> list[Path]:
    return sorted((root / "build" / "vtmut-cuda").glob("*.o"))


def compile_cuda_kernels(root: Path, nvcc: str, jobs: int) -> tuple[bool, str]:
    """csrc/cuda/*.cu -> build/vtmut-cuda/*.o (base only: mutants reuse them)."""
    out = root / "build" / "vtmut-cuda"
    out.mkdir(parents=True, exist_ok=True)
    flags = ["-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler",
             "-fPIC,-fvisibility=hidden", "-Icsrc/include", "-Icsrc/core", "-Icsrc/cuda"]

    def one(src: Path) -> tuple[bool, str]:
        r = subprocess.run([nvcc, *flags, "-c", str(src.relative_to(root)), "-o", str(out / (src.name + ".o"))],
                           cwd=root, capture_output=True, text=True)
        return r.returncode == 0, r.stderr

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(one, sorted(root.glob("csrc/cuda/*.cu"))))
    errs = "".join(e for ok, e in results if not ok)
    return not errs, errs


def link_cuda(root: Path, cudart: str) -> tuple[bool, str]:
    _, _, ld = compiler()
    so = root / "vtinfer" / ("_cuda" + sysconfig.get_config_var("EXT_SUFFIX"))
    if so.exists():
        so.unlink()
    shared = [s for s in sources(root) if s.parent.name != "binding"]  # core/ and common/: _C's objects
    objs = [str(obj_of(root, s)) for s in shared + cuda_glue_sources(root)] + [str(o) for o in cuda_objects(root)]
    r = subprocess.run(ld + objs + ["-L" + cudart, "-lcudart_static", "-ldl", "-lrt", "-lstdc++", "-lm", "-o",
                                    str(so)], cwd=root, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def build(root: Path, srcs: list[Path], jobs: int, cudart: str | None = None) -> tuple[bool, str]:
    """Compile srcs, link _C, and with cudart (a CUDA mutant or its base) _cuda."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(lambda s: compile_one(root, s), srcs))
    errs = "".join(e for ok, e in results if not ok)
    if errs:
        return False, errs
    ok, log = link(root)
    if ok and cudart:
        ok, log = link_cuda(root, cudart)
    return ok, log


def affected_sources(root: Path, rel: str) -> list[Path]:
    """The C sources to recompile after `rel` changed."""
    if rel.endswith(".c") and rel.startswith(("csrc/core/", "csrc/binding/")):
        return [root / rel]
    if rel.endswith(".h"):
        base = os.path.basename(rel)
        srcs = sources(root) + cuda_glue_sources(root)
        pat = re.compile(r'#\s*include\s*[<"]([^>"]*/)?' + re.escape(base) + r'[>"]')
        direct = [s for s in srcs if pat.search(s.read_text(encoding="utf-8", errors="replace"))]
        # headers including the header: include their users too (one level is enough here)
        hdrs = [h for h in list(root.glob("csrc/**/*.h")) if pat.search(h.read_text(encoding="utf-8"))]
        for h in hdrs:
            hp = re.compile(r'#\s*include\s*[<"]([^>"]*/)?' + re.escape(h.name) + r'[>"]')
            direct += [s for s in srcs if hp.search(s.read_text(encoding="utf-8", errors="replace"))]
        return sorted(set(direct))
    return []


def needs_cuda(m: dict) -> bool:
    return bool(m.get("cuda")) or any(e["file"].startswith("csrc/binding/cuda/") for e in m["edits"])


def needs_vllm(m: dict) -> bool:
    return bool(m.get("vllm")) or any(e["file"].startswith("vtinfer/vllm/") for e in m["edits"])


HAVE_VLLM = importlib.util.find_spec("vllm") is not None


# ---------------------------------------------------------------- testing


def env_for(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["VTINFER_CUDA"] = "0"
    env["VTINFER_WERROR"] = "1"  # as CI builds: a mutant whose C tests only build with warnings allowed is an ERROR here too
    if HAVE_VLLM:  # the vLLM plugin's tests may not skip under a python that has vLLM
        env["VTINFER_REQUIRE_VLLM"] = "1"
    env.pop("RECORDS_CHECKER", None)
    return env


def check_import(root: Path) -> str | None:
    r = subprocess.run([sys.executable, "-c", "import vtinfer, vtinfer._C as c; print(vtinfer.__file__); "
                        "print(c.__file__)"], cwd=root, env=env_for(root), capture_output=True, text=True)
    if r.returncode != 0:
        return f"import failed: {r.stderr.strip()[-400:]}"
    for line in r.stdout.split():
        if not Path(line).resolve().is_relative_to(root.resolve()):
            return f"vtinfer imported from outside the copy: {line}"
    return None


def make_c_tests(root: Path, names: list[str], jobs: int) -> subprocess.CompletedProcess:
    """Build the plain-C tests `names` (tests/c/build/opt/<name>) in root with make."""
    return subprocess.run(["make", "-s", f"-j{max(1, jobs)}", "-C", "tests/c", *(f"build/opt/{n}" for n in names)],
                          cwd=root, env=env_for(root), capture_output=True, text=True)


def run_tests(root: Path, tests: list[str], timeout: float, jobs: int = 1) -> tuple[str, str]:
    """('red' | 'green' | 'error', detail)."""
    py = [t for t in tests if not t.startswith("c:")]
    cts = [t[2:] for t in tests if t.startswith("c:")]
    details = []
    red = False
    for name in cts:
        mk = make_c_tests(root, [name], jobs)
        if mk.returncode != 0:
            return "error", f"c:{name} did not build: {mk.stderr.strip()[-600:]}"
        try:
            r = subprocess.run([f"./build/opt/{name}"], cwd=root / "tests" / "c", capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            red = True
            details.append(f"c:{name} timed out")
            continue
        if r.returncode != 0:
            red = True
            fails = len(re.findall(r"FAIL", r.stdout + r.stderr))
            details.append(f"c:{name} rc={r.returncode} ({fails} FAIL lines)")
        else:
            details.append(f"c:{name} green")
    if py:
        cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "-x", *py]
        try:
            r = subprocess.run(cmd, cwd=root, env=env_for(root), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "red", "; ".join(details + ["pytest timed out (treated as red: a hang)"])
        if r.returncode == 1 or r.returncode < 0:
            red = True
            failed = re.findall(r"^FAILED (\S+)", r.stdout, re.M)
            what = failed[0] if failed else f"crash rc={r.returncode}"
            details.append(f"pytest red: {what}")
        elif r.returncode == 0:
            details.append("pytest green")
        else:
            return "error", f"pytest exit {r.returncode}: {(r.stdout + r.stderr).strip()[-800:]}"
    return ("red" if red else "green"), "; ".join(details)


# ---------------------------------------------------------------- main


def make_base(rev: str, run_dir: Path, jobs: int, cuda: tuple[str, str] | None, c_tests: list[str]) -> Path:
    """The tree at rev, built (with cuda = (nvcc, cudart): the CUDA objects too, not linked; and the
    plain-C tests c_tests, whose core objects every copy then reuses)."""
    base = run_dir / "base"
    base.mkdir(parents=True)
    arch = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(base)], input=arch.stdout, check=True)
    t0 = time.time()
    ok, log = build(base, sources(base) + (cuda_glue_sources(base) if cuda else []), jobs)
    if ok and cuda:
        ok, log = compile_cuda_kernels(base, cuda[0], jobs)
    if ok and c_tests:
        mk = make_c_tests(base, c_tests, jobs)
        ok, log = mk.returncode == 0, mk.stderr
    if not ok:
        raise SystemExit(f"the unmutated tree at {rev} does not build:\n{log}")
    print(f"base built at {rev} in {time.time() - t0:.0f}s{' (with the CUDA objects)' if cuda else ''}: {base}",
          flush=True)
    return base


def clone(base: Path, dest: Path) -> None:
    """dest: hard links to base's files, except tests/c/build, a real copy with base's timestamps: make
    rebuilds there only what a mutated file reaches, and a tool that rewrote an object in place (GNU as
    replaces its output file; the runner does not rely on every compiler doing so) cannot reach the base."""
    subprocess.run(["cp", "-al", str(base), str(dest)], check=True)
    cbuild = Path("tests") / "c" / "build"
    if (base / cbuild).is_dir():
        shutil.rmtree(dest / cbuild)
        subprocess.run(["cp", "-a", str(base / cbuild), str(dest / cbuild)], check=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--fast", action="store_true", help="only the entries marked fast = true")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--keep", action="store_true", help="keep the copies under " + str(WORK))
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per test command")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutant of the list still applies (its find text occurs once)")
    ap.add_argument("--toml", type=Path, default=TOML, help=argparse.SUPPRESS)
    ap.add_argument("--isa", choices=ISA_LEVELS,
                    help="pretend this CPU runs at most ISA (mutants needing more: not run here)")
    args = ap.parse_args(argv)

    muts = load(args.toml)
    # A mutant whose find text is gone (or is no longer unique) has
    # rotted: it fails the run up front, for the whole list, even with --fast
    # or a selection, so that CI's fast subset notices every stale entry.
    stale = stale_mutants(muts, args.rev)
    if stale:
        print("\n".join("STALE " + b for b in stale))
        print(f"{len(stale)} mutant edit(s) of {len(muts)} mutants no longer apply: re-point them "
              f"(tests/mutation/mutations.toml)")
        return 1
    if args.check:
        print(f"all {len(muts)} mutants apply (every find text occurs exactly once at {args.rev})")
        return 0
    if args.names:
        unknown = set(args.names) - {m["name"] for m in muts}
        if unknown:
            raise SystemExit(f"unknown mutants: {sorted(unknown)}")
        muts = [m for m in muts if m["name"] in args.names]
    elif args.fast:
        muts = [m for m in muts if m.get("fast")]
    level = machine_level(vtinfer_isa=os.environ.get("VTINFER_ISA"), cap=args.isa)
    vbmi = machine_vbmi(level)
    for m in muts:
        m["needs_isa"] = needs_of(m)
    if args.list:
        print(f"this CPU runs: {level}")
        for m in muts:
            where = "" if runs_here(m["needs_isa"], level, vbmi) else f" (not run here: needs {m['needs_isa']})"
            print(f"{m['name']:40s} {'fast' if m.get('fast') else '    '} {m['needs_isa']:10s} "
                  f"{', '.join(e['file'] for e in m['edits'])}{where}")
        return 0
    not_here = [m for m in muts if not runs_here(m["needs_isa"], level, vbmi)]
    muts = [m for m in muts if runs_here(m["needs_isa"], level, vbmi)]
    for m in not_here:
        print(f"{m['name']}: not run here: needs {m['needs_isa']} (this CPU runs {level})", flush=True)

    start = time.time()
    files = sorted({e["file"] for m in muts for e in m["edits"]})
    shared_before = {f: sha256(REPO / f) for f in files}
    WORK.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=WORK))
    results: list[tuple[str, str, str, float]] = [
        (m["name"], "not run here", f"needs {m['needs_isa']}; this CPU runs {level}", 0.0) for m in not_here]
    try:
        if not muts:
            raise _NothingToRun
        cuda = nvcc_and_cudart() if any(needs_cuda(m) for m in muts) else None
        c_tests = sorted({t[2:] for m in muts for t in m["tests"] if t.startswith("c:")})
        base = make_base(args.rev, run_dir, args.jobs, cuda, c_tests)
        # every find text must occur exactly once in the tree at REV
        bad = []
        for m in muts:
            for e in m["edits"]:
                p = base / e["file"]
                n = p.read_text(encoding="utf-8").count(e["find"]) if p.exists() else -1
                if n != 1:
                    bad.append(f"{m['name']}: {e['file']}: find text occurs {n} times (want 1)")
        if bad:
            print("\n".join("ERROR " + b for b in bad))
            bad_names = {b.split(":")[0] for b in bad}
            for m in muts:
                if m["name"] in bad_names:
                    results.append((m["name"], "error", "find text not found exactly once", 0.0))
            muts = [m for m in muts if m["name"] not in bad_names]

        union = list(dict.fromkeys(t for m in muts for t in m["tests"] if HAVE_VLLM or not needs_vllm(m)))
        ref = run_dir / "unmutated"
        clone(base, ref)
        if cuda:  # the baseline runs every named test, a CUDA mutant's too
            ok, log = link_cuda(ref, cuda[1])
            if not ok:
                raise SystemExit(f"baseline: vtinfer._cuda does not link:\n{log}")
        why = check_import(ref)
        if why:
            raise SystemExit(f"baseline: {why}")
        t0 = time.time()
        verdict, detail = run_tests(ref, union, args.timeout, args.jobs)
        print(f"baseline (unmutated, {len(union)} test ids): {verdict} in {time.time() - t0:.0f}s: {detail}",
              flush=True)
        if verdict != "green":
            print("the unmutated tree is not green on the named tests: nothing can be concluded")
            return 2
        if not args.keep:
            shutil.rmtree(ref)

        for i, m in enumerate(muts, 1):
            t0 = time.time()
            d = run_dir / f"{i:02d}-{m['name']}"
            clone(base, d)
            status, detail = "error", ""
            try:
                changed, recompile = [], set()
                for e in m["edits"]:
                    p = d / e["file"]
                    old = p.read_text(encoding="utf-8")
                    new = old.replace(e["find"], e["replace"], 1)
                    before = hashlib.sha256(old.encode()).hexdigest()
                    p.unlink()  # break the hard link: the base copy keeps its bytes
                    p.write_text(new, encoding="utf-8")
                    if sha256(p) == before:
                        raise RuntimeError(f"{e['file']}: the edit did not change the file")
                    changed.append(e["file"])
                    recompile.update(affected_sources(d, e["file"]))
                if needs_cuda(m) and not cuda:
                    raise RuntimeError("a CUDA-glue mutant needs nvcc and libcudart_static.a (not found)")
                if needs_vllm(m) and not HAVE_VLLM:
                    raise RuntimeError("a vLLM-plugin mutant needs vllm importable by this python "
                                       "(run the runner with the vLLM venv's python)")
                cudart = cuda[1] if needs_cuda(m) else None
                if recompile or cudart:
                    ok, log = build(d, sorted(recompile), args.jobs, cudart)
                    if not ok:
                        raise RuntimeError("mutant does not build: " + log.strip()[-600:])
                why = check_import(d)
                if why:
                    raise RuntimeError(why)
                verdict, detail = run_tests(d, m["tests"], args.timeout, args.jobs)
                status = {"red": "killed", "green": "SURVIVED", "error": "error"}[verdict]
            except RuntimeError as exc:
                detail = str(exc)
            finally:
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
            dt = time.time() - t0
            results.append((m["name"], status, detail, dt))
            print(f"[{i}/{len(muts)}] {m['name']}: {status} ({dt:.0f}s) {detail}", flush=True)
    except _NothingToRun:
        print(f"no selected mutant runs on this CPU ({level}): nothing built")
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)

    shared_after = {f: sha256(REPO / f) for f in files}
    # The runner never writes into the shared tree.  A file that changed
    # there during the run was edited by someone else (a shared tree); it is
    # a leak of ours only if it now holds a mutant's replacement text that
    # its old bytes did not.
    moved = [f for f in files if shared_before[f] != shared_after[f]]
    leaked = []
    for f in moved:
        now = (REPO / f).read_text(encoding="utf-8") if (REPO / f).exists() else ""
        for m in muts:
            for e in m["edits"]:
                if e["file"] == f and e["replace"] in now and e["find"] not in now:
                    leaked.append(f"{f} ({m['name']})")
    print()
    print("| mutant | result | seconds | evidence |")
    print("|---|---|---|---|")
    for name, status, detail, dt in results:
        print(f"| {name} | {status} | {dt:.0f} | {detail.replace('|', '/')} |")
    print()
    for f in files:
        print(f"shared tree {f}: sha256 {shared_after[f][:16]} "
              f"{'unchanged' if f not in moved else 'changed during the run by another engineer (no mutant text in it)'}")
    ran = [r for r in results if r[1] != "not run here"]
    killed = sum(1 for r in ran if r[1] == "killed")
    survived = [r[0] for r in ran if r[1] == "SURVIVED"]
    errors = [r[0] for r in ran if r[1] == "error"]
    if survived:
        print(f"survivors: {survived}")
    if errors:
        print(f"errors (neither kill nor survivor): {errors}")
    print(f"total {time.time() - start:.0f}s")
    if not_here:
        by = {}
        for m in not_here:
            by.setdefault(m["needs_isa"], []).append(m["name"])
        print(f"not run here ({level} CPU; neither killed nor survived): {len(not_here)}: "
              + "; ".join(f"needs {k}: {len(v)}" for k, v in sorted(by.items())))
    print(f"killed {killed}/{len(ran)}")
    if leaked:
        print(f"MUTANT TEXT FOUND IN THE SHARED TREE: {leaked}")
    return 0 if killed == len(ran) and results and not leaked else 1


class _NothingToRun(Exception):
    """Every selected mutant needs an ISA this CPU lacks."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
