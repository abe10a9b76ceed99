"""vtinfer's optional packages: what each is for and the pip command that installs it.

``import vtinfer`` needs only numpy, ml_dtypes and safetensors. The demo, the
GGUF converter, the torch ops and some tests need more; when one is missing
the message names it and says how to install it (:func:`missing_message`),
on the command line (one line, exit status 2) and in the test suite's skip
reasons (tests/conftest.py).
"""

from __future__ import annotations

import os

#: The CPU build of torch (the public index's default wheel is the ~2.7 GB CUDA build).
TORCH_CPU = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

#: import name -> (what needs it, pip command)
OPTIONAL: dict[str, tuple[str, str]] = {
    "torch": ("torch tensors and torch.ops.vtinfer", TORCH_CPU),
    "gguf": ("reading GGUF files (the demo's model)", "pip install gguf  (or pip install -e '.[demo]')"),
    "tokenizers": ("the demo's tokenizer", "pip install tokenizers  (or pip install -e '.[demo]')"),
    "tqdm": ("progress bars", "pip install tqdm  (or pip install -e '.[demo]')"),
    "matplotlib": ("vtinfer demo --plot", "pip install matplotlib  (or pip install -e '.[plot]')"),
    "transformers": ("the Hugging Face reference model in the tests", "pip install transformers"),
    "triton": ("vLLM's Triton kernels in the interpreter (tests)", "pip install triton==3.9.0"),
    "llmcompressor": ("llm-compressor's checkpoints (tests)", "pip install 'llmcompressor==0.14.*'"),
    "compressed_tensors": ("compressed-tensors' loaders (tests)", "pip install 'llmcompressor==0.14.*'"),
    "vllm": ("vLLM itself (the engine tests)", "pip install vllm"),
}


def top_name(module: str | None) -> str:
    """``"torch"`` for ``"torch.nn"``; ``""`` for None."""
    return (module or "").split(".")[0]


def install_hint(module: str) -> str:
    """The pip command for ``module``'s package (a generic one for a package not in :data:`OPTIONAL`)."""
    top = top_name(module)
    return OPTIONAL[top][1] if top in OPTIONAL else f"pip install {top}"


def missing_message(module: str) -> str:
    """One line: ``needs the optional package 'gguf' (not installed): pip install gguf ...``."""
    top = top_name(module)
    what = f", for {OPTIONAL[top][0]}" if top in OPTIONAL else ""
    return f"needs the optional package '{top}'{what}; it is not installed: {install_hint(top)}"


def explain_import_error(exc: BaseException) -> str | None:
    """:func:`missing_message` when ``exc`` is a ModuleNotFoundError for an
    optional package (``exc.name``), else None (any other import failure keeps
    its own message)."""
    if isinstance(exc, ModuleNotFoundError) and top_name(exc.name) in OPTIONAL:
        return missing_message(exc.name or "")
    return None


def require_variable(module: str) -> str:
    """``VTINFER_REQUIRE_TORCH`` for ``torch``: set to 1, a test that needs the
    package fails instead of skipping when it is missing (CI sets them)."""
    return "VTINFER_REQUIRE_" + top_name(module).upper()


def required(module: str) -> bool:
    """True when :func:`require_variable` is set (to anything but "" or "0")."""
    return os.environ.get(require_variable(module), "") not in ("", "0")
