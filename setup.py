"""Build of vtinfer's C extension ``vtinfer._C`` (CPython C API + NumPy C API).

Environment:
  VTINFER_WERROR=1   turn compiler warnings into errors (CI sets it)
  VTINFER_CUDA       auto|0|1: the optional CUDA arm vtinfer._cuda (csrc/cuda). auto (the
                     default) builds it only where a GPU is present (nvidia-smi -L lists one, or
                     /dev/nvidia0 exists) and nvcc is found; 1 always (nvcc required); 0 never
  VTINFER_SANITIZE   address,undefined: build the extension with sanitizers

The build says what it builds, and how long that took, on the terminal even
under pip (which shows a build's output only with -v): see ``say``.
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import time

ROOT = os.path.dirname(os.path.abspath(__file__))


def rel(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def say(msg, tty="/dev/tty"):
    """``msg`` on stdout (pip's log, shown with -v) and on the controlling terminal when there is one
    (pip captures a build's output, so stdout alone is never seen by someone waiting for it)."""
    line = f"vtinfer build: {msg}"
    print(line, flush=True)
    if sys.stdout.isatty():
        return
    try:
        with open(tty, "w", encoding="utf-8", errors="replace") as t:
            t.write(line + "\n")
    except OSError:  # no controlling terminal (CI, a daemon): stdout is all there is
        pass


# ---- the optional CUDA arm: vtinfer._cuda (csrc/cuda/*.cu + csrc/binding/cuda/) ----
# No torch import: only nvcc and the CUDA runtime.


def find_nvcc():
    for cand in [os.environ.get("NVCC"), shutil.which("nvcc")] + sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))[::-1]:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    return None


def gpu_present(dev="/dev/nvidia0", smi="nvidia-smi"):
    """True where an NVIDIA GPU can be seen: ``dev`` exists, or ``smi -L`` lists a GPU."""
    if os.path.exists(dev):
        return True
    exe = shutil.which(smi)
    if not exe:
        return False
    try:
        r = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def cuda_choice(mode, nvcc, gpu):
    """(build vtinfer._cuda?, why) for VTINFER_CUDA=``mode``, ``nvcc`` (a path or None) and ``gpu``
    (:func:`gpu_present`). Raises SystemExit for a bad mode, or for mode "1" without nvcc."""
    if mode not in ("auto", "0", "1"):
        raise SystemExit(f"VTINFER_CUDA must be auto, 0 or 1; got {mode!r}")
    if mode == "0":
        return False, "VTINFER_CUDA=0"
    if mode == "1":
        if not nvcc:
            raise SystemExit("VTINFER_CUDA=1: nvcc was not found (PATH, $NVCC, /usr/local/cuda*/bin); "
                             "install the CUDA toolkit")
        return True, f"VTINFER_CUDA=1 (nvcc {nvcc})"
    if gpu and nvcc:
        return True, f"a GPU is present and nvcc is {nvcc} (VTINFER_CUDA=0 skips it)"
    if gpu:
        return False, "a GPU is present but nvcc was not found (install the CUDA toolkit, then VTINFER_CUDA=1)"
    if nvcc:
        return False, f"no GPU found (nvidia-smi -L, /dev/nvidia0) though nvcc is {nvcc}: VTINFER_CUDA=1 builds it"
    return False, "no GPU and no nvcc (VTINFER_CUDA=1 builds it where nvcc exists)"


NVCC_FLAGS = [
    "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90",
    "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall,-Wextra", "--Werror", "all-warnings",
]  # no --use_fast_math: the store divides exactly (__fdiv_rn), attention uses expf/tanhf


def find_cuda_home(nvcc):
    homes = [os.path.dirname(os.path.dirname(nvcc)), os.environ.get("CUDA_HOME", "")]
    homes += sorted(glob.glob("/usr/local/cuda*"))[::-1]
    for h in homes:
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
            if h and os.path.isfile(os.path.join(h, lib, "libcudart_static.a")):
                return h, os.path.join(h, lib)
    raise SystemExit(f"vtinfer: nvcc is {nvcc} but no libcudart_static.a was found (set CUDA_HOME)")


def jobs():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def main():
    import numpy
    from setuptools import Extension, setup
    from setuptools.command.build_ext import build_ext

    warnings = ["-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes"]
    if os.environ.get("VTINFER_WERROR") == "1":
        warnings.append("-Werror")

    compile_args = ["-std=c11", "-O3", "-fvisibility=hidden", "-fno-strict-aliasing"] + warnings
    link_args = ["-pthread"]
    sanitize = os.environ.get("VTINFER_SANITIZE", "")
    if sanitize:
        compile_args += ["-fsanitize=" + sanitize, "-fno-omit-frame-pointer", "-O1", "-g"]
        link_args += ["-fsanitize=" + sanitize]

    # Python's own CFLAGS may carry -Wno-... or -O settings; ours come last and win.
    sysconfig.get_config_vars()

    ext = Extension(
        "vtinfer._C",
        sources=rel("csrc/core/*.c") + rel("csrc/binding/*.c") + rel("csrc/binding/common/*.c"),
        include_dirs=[os.path.join("csrc", "include"), os.path.join("csrc", "core"), os.path.join("csrc", "binding"),
                      numpy.get_include()],
        define_macros=[("_GNU_SOURCE", "1")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        libraries=["m"],
        depends=rel("csrc/include/vtinfer/*.h") + rel("csrc/core/*.h") + rel("csrc/binding/*.h")
        + rel("csrc/binding/common/*.h"),
    )
    exts = [ext]

    nvcc = find_nvcc() if os.environ.get("VTINFER_CUDA", "auto") != "0" else None
    build_cuda, why = cuda_choice(os.environ.get("VTINFER_CUDA", "auto"), nvcc, gpu_present())
    cuda_sources = rel("csrc/cuda/*.cu")
    if build_cuda:
        cuda_home, cuda_lib = find_cuda_home(nvcc)
        exts.append(
            Extension(
                "vtinfer._cuda",
                sources=rel("csrc/core/*.c") + rel("csrc/binding/common/*.c") + rel("csrc/binding/cuda/*.c"),
                include_dirs=[os.path.join("csrc", "include"), os.path.join("csrc", "core"),
                              os.path.join("csrc", "binding"), os.path.join("csrc", "cuda")],
                define_macros=[("_GNU_SOURCE", "1")],
                extra_compile_args=compile_args,
                extra_link_args=link_args + ["-L" + cuda_lib],
                libraries=["cudart_static", "dl", "rt", "stdc++", "m"],
                depends=rel("csrc/cuda/*") + rel("csrc/include/vtinfer/*.h") + rel("csrc/binding/cuda/*.c"),
            )
        )

    class BuildExt(build_ext):
        """Says what it builds and how long it took; compiles an extension's C files in parallel
        (one per CPU); compiles the .cu files with nvcc into objects linked into vtinfer._cuda."""

        def run(self):
            n = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else jobs()
            self._jobs = n
            say(f"compiling vtinfer._C ({len(ext.sources)} C files, {n} at a time; about 1-3 minutes on 2 cores)")
            if build_cuda:
                say(f"and the CUDA arm vtinfer._cuda ({len(cuda_sources)} .cu files for sm_90 with nvcc, one at a "
                    f"time; about half a minute more, minutes on a loaded machine): {why}")
            else:
                say(f"not building the CUDA arm vtinfer._cuda: {why}")
            t0 = time.monotonic()
            super().run()
            say(f"done in {time.monotonic() - t0:.0f} s")

        def build_extension(self, e):
            if e.name == "vtinfer._cuda":
                objs = []
                werror = ["-Xcompiler", "-Werror"] if os.environ.get("VTINFER_WERROR") == "1" else []
                for src in cuda_sources:
                    obj = os.path.join(self.build_temp, "cuda", os.path.basename(src) + ".o")
                    os.makedirs(os.path.dirname(obj), exist_ok=True)
                    cmd = [nvcc, *NVCC_FLAGS, *werror, "-Icsrc/include", "-Icsrc/core", "-Icsrc/cuda", "-c", src,
                           "-o", obj]
                    print(" ".join(cmd))
                    t0 = time.monotonic()
                    subprocess.check_call(cmd, cwd=ROOT)
                    say(f"nvcc {src}: {time.monotonic() - t0:.0f} s")
                    objs.append(obj)
                e.extra_objects = objs
            compile_parallel(self.compiler, getattr(self, "_jobs", 1))
            super().build_extension(e)

    setup(ext_modules=exts, cmdclass={"build_ext": BuildExt})


def compile_parallel(compiler, n):
    """Make ``compiler.compile`` (distutils' CCompiler, which compiles one file at a time) compile
    ``n`` files at a time; the objects, flags and up-to-date checks are its own."""
    if n <= 1 or getattr(compiler, "_vt_parallel", False):
        return
    from concurrent.futures import ThreadPoolExecutor

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(max_workers=n) as ex:
            list(ex.map(one, [o for o in objects if o in build]))
        return objects

    compiler.compile = compile
    compiler._vt_parallel = True


if __name__ == "__main__":
    main()
