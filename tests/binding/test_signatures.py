"""Each signature is written once: the C tables
(csrc/binding/vt_signature.h) make the docstrings, hence
inspect.signature of the C functions; the stub (_C.pyi), the Python
wrappers and the CUDA extension must say the same, or this fails."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import vtinfer as vt
from vtinfer import _C

STUB = Path(vt.__file__).with_name("_C.pyi")
FUNCS = ["flash_attn_varlen_func", "reshape_and_cache_flash", "reshape_and_cache", "concat_and_cache_mla",
         "mask_empty_context_lse", "swap_blocks", "convert_fp8", "gather_and_maybe_dequant_cache", "cp_gather_cache",
         "merge_attn_states", "fp8_quantize", "fp8_dequantize", "convert"]


def _shape(sig: inspect.Signature):
    """(name, kind, default) of each parameter; defaults compared by value."""
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def _stub_signature(name: str) -> list:
    tree = ast.parse(STUB.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    pdefaults = [inspect.Parameter.empty] * (len(pos) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    for arg, d in zip(pos, pdefaults):
        kind = inspect.Parameter.POSITIONAL_ONLY if arg in a.posonlyargs else inspect.Parameter.POSITIONAL_OR_KEYWORD
        out.append((arg.arg, kind, d))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    return out


@pytest.mark.parametrize("name", FUNCS)
def test_c_signature_equals_stub(name):
    assert _shape(inspect.signature(getattr(_C, name))) == _stub_signature(name)


# Deliberate differences between a Python wrapper and its C function; any
# other difference is drift. flash_attn_varlen_func: the wrapper handles the
# non-paged varlen form (cu_seqlens_k, then seqused_k / block_table are
# optional) and the fp8-query arguments before calling the C function.
WRAPPER_ONLY = {"flash_attn_varlen_func": {"cu_seqlens_k", "q_descale", "q_dtype", "return_softmax_lse"}}
WRAPPER_DEFAULTS = {"flash_attn_varlen_func": {"seqused_k": None, "block_table": None},
                    "fp8_dequantize": {"dtype": __import__("numpy").float32}}  # the wrapper names C's None
# C-only keywords the wrapper computes itself (swap_blocks: each tensor's allocation extent).
C_ONLY = {"swap_blocks": {"src_extent", "dst_extent"}}


@pytest.mark.parametrize("name", FUNCS)
def test_c_signature_equals_python_wrapper(name):
    c = _shape(inspect.signature(getattr(_C, name)))
    only, dflt = WRAPPER_ONLY.get(name, set()), WRAPPER_DEFAULTS.get(name, {})
    py = [(n, k, d) for n, k, d in _shape(inspect.signature(getattr(vt, name))) if n not in only]
    c = [(n, k, dflt.get(n, d)) for n, k, d in c if n not in C_ONLY.get(name, set())]
    assert py == c
    assert only <= {n for n, _, _ in _shape(inspect.signature(getattr(vt, name)))}, "stale allow-list entry"


def _cuda_of_this_build():
    """vtinfer._cuda when it was built beside this vtinfer._C, else skip."""
    try:
        from vtinfer import _cuda
    except ImportError:
        pytest.skip("vtinfer._cuda not built")
    import os
    if os.path.dirname(_cuda.__file__) != os.path.dirname(_C.__file__):
        # an editable install can resolve _cuda to another tree's build (e.g. .ci/sanitize_python's
        # private copy, built without CUDA): comparing two builds would test nothing about this one
        pytest.skip(f"vtinfer._cuda ({_cuda.__file__}) is not from the build of vtinfer._C ({_C.__file__})")
    return _cuda


def test_cuda_store_signature_equals_cpu():
    _cuda = _cuda_of_this_build()
    assert _shape(inspect.signature(_cuda.reshape_and_cache_flash)) == _shape(
        inspect.signature(_C.reshape_and_cache_flash))


def test_cuda_attention_signature_equals_cpu():
    _cuda = _cuda_of_this_build()
    cuda = _shape(inspect.signature(_cuda.flash_attn_varlen_func))
    # the CUDA arm's one extra: validate (skips the host-side checks of the index arrays' values)
    assert cuda == _shape(inspect.signature(_C.flash_attn_varlen_func)) + [
        ("validate", inspect.Parameter.KEYWORD_ONLY, True)]
    from vtinfer import _cuda_ops

    assert _shape(inspect.signature(_cuda_ops.flash_attn_varlen_func)) == cuda
