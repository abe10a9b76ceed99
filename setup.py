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
    sources=rel("csrc/core/*.c") + rel("csrc/binding/*.c"),
    include_dirs=[os.path.join("csrc", "include"), os.path.join("csrc", "core"), numpy.get_include()],
    define_macros=[("_GNU_SOURCE", "1")],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    libraries=["m"],
    depends=rel("csrc/include/vtinfer/*.h") + rel("csrc/core/*.h") + rel("csrc/binding/*.h"),
)

setup(ext_modules=[ext])
