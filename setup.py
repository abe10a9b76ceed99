"""Build of vtinfer's C extension ``vtinfer._C`` (CPython C API + NumPy C API).

Environment:
  VTINFER_WERROR=1   turn compiler warnings into errors (CI sets it)
  VTINFER_CUDA       auto|0|1: build the optional CUDA arm (see csrc/cuda)
  VTINFER_SANITIZE   address,undefined: build the extension with sanitizers
"""

import glob
import os
import sysconfig

import numpy
from setuptools import Extension, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def rel(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


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
    depends=rel("csrc/include/vtinfer/*.h") + rel("csrc/core/*.h") + rel("csrc/binding/*.h") + rel("csrc/binding/common/*.h"),
)



# ---- the optional CUDA arm: vtinfer._cuda (csrc/cuda/*.cu + csrc/binding/cuda/) ----
# VTINFER_CUDA=auto (default): build it when nvcc is found; 0: never; 1: always
# (fail clearly without nvcc). No torch import: only nvcc and the CUDA runtime.


def find_nvcc():
    import shutil

    for cand in [os.environ.get("NVCC"), shutil.which("nvcc")] + sorted(glob.glob("/usr/local/cuda*/bin/nvcc"))[::-1]:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.realpath(cand)
    return None


NVCC_FLAGS = [
    "-std=c++17", "-O3", "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90",
    "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall,-Wextra", "--Werror", "all-warnings",
]  # no --use_fast_math: the store divides exactly (__fdiv_rn), attention uses expf/tanhf


cuda_mode = os.environ.get("VTINFER_CUDA", "auto")
if cuda_mode not in ("auto", "0", "1"):
    raise SystemExit(f"VTINFER_CUDA must be auto, 0 or 1; got {cuda_mode!r}")
nvcc = find_nvcc() if cuda_mode != "0" else None
if cuda_mode == "1" and not nvcc:
    raise SystemExit("VTINFER_CUDA=1: nvcc was not found (PATH, $NVCC, /usr/local/cuda*/bin); install the CUDA toolkit")
exts = [ext]
cmdclass = {}
if nvcc:
    from setuptools.command.build_ext import build_ext

    def find_cuda_home():
        homes = [os.path.dirname(os.path.dirname(nvcc)), os.environ.get("CUDA_HOME", "")]
        homes += sorted(glob.glob("/usr/local/cuda*"))[::-1]
        for h in homes:
            for lib in ("lib64", "lib", "targets/x86_64-linux/lib"):
                if h and os.path.isfile(os.path.join(h, lib, "libcudart_static.a")):
                    return h, os.path.join(h, lib)
        raise SystemExit(f"vtinfer: nvcc is {nvcc} but no libcudart_static.a was found (set CUDA_HOME)")

    cuda_home, cuda_lib = find_cuda_home()
    cuda_sources = rel("csrc/cuda/*.cu")

    class BuildExtCuda(build_ext):
        """Compiles the .cu files with nvcc into objects linked into vtinfer._cuda."""

        def build_extension(self, e):
            if e.name == "vtinfer._cuda":
                import subprocess

                objs = []
                werror = ["-Xcompiler", "-Werror"] if os.environ.get("VTINFER_WERROR") == "1" else []
                for src in cuda_sources:
                    obj = os.path.join(self.build_temp, "cuda", os.path.basename(src) + ".o")
                    os.makedirs(os.path.dirname(obj), exist_ok=True)
                    cmd = [nvcc, *NVCC_FLAGS, *werror, "-Icsrc/include", "-Icsrc/core", "-Icsrc/cuda", "-c", src, "-o", obj]
                    print(" ".join(cmd))
                    subprocess.check_call(cmd, cwd=ROOT)
                    objs.append(obj)
                e.extra_objects = objs
            super().build_extension(e)

    cmdclass["build_ext"] = BuildExtCuda
    exts.append(
        Extension(
            "vtinfer._cuda",
            sources=rel("csrc/core/*.c") + rel("csrc/binding/common/*.c") + rel("csrc/binding/cuda/*.c"),
            include_dirs=[os.path.join("csrc", "include"), os.path.join("csrc", "core"), os.path.join("csrc", "binding"),
                          os.path.join("csrc", "cuda")],
            define_macros=[("_GNU_SOURCE", "1")],
            extra_compile_args=compile_args,
            extra_link_args=link_args + ["-L" + cuda_lib],
            libraries=["cudart_static", "dl", "rt", "stdc++", "m"],
            depends=rel("csrc/cuda/*") + rel("csrc/include/vtinfer/*.h") + rel("csrc/binding/cuda/*.c"),
        )
    )
elif cuda_mode == "auto":
    print("vtinfer: nvcc not found, the CUDA arm (vtinfer._cuda) is not built (VTINFER_CUDA=1 requires it)")

setup(ext_modules=exts, cmdclass=cmdclass)
