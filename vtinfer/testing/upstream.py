"""Upstream vLLM's own Python functions, extracted from its source with ``ast``.

vLLM is never imported and none of its files are committed: the source is
read from (in this order) a tree named by ``VTINFER_VLLM_SOURCE`` (a folder
holding ``vllm/``, or the ``vllm`` package folder itself), an installed
``vllm`` distribution found without importing it, or the pinned wheel
fetched with ``pip download --no-deps vllm==<VLLM_PIN>`` (about 321 MiB, once;
said on the terminal before it starts) into a cache folder (``VTINFER_CACHE_DIR``,
default ``vllm/`` in vtinfer's cache: ``$VTINFER_CACHE``, else
``$XDG_CACHE_HOME/vtinfer``, else ``~/.cache/vtinfer``) and read with
:mod:`zipfile`. Named functions are pulled out with :mod:`ast` and executed
with small stubs (a logger, the tables they read).

Use in your own pytest files::

    from vtinfer.testing import upstream
    src = upstream.locate()                 # or upstream.locate_or_skip() in a fixture
    fns = upstream.resolver_functions(src)
    fns.resolve("auto", {"quantization_config": {...}})
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import linecache
import os
import re
import subprocess
import sys
import time
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vtinfer._notice import notice

#: The one place the vLLM release vtinfer mirrors is pinned.
VLLM_PIN = "0.33.0"

# Where each mirrored function lives inside the vllm package.
F_CONVERTOR = "vllm/transformers_utils/model_arch_config_convertor.py"
F_TORCH_UTILS = "vllm/utils/torch_utils.py"
F_CONFIG = "vllm/transformers_utils/config.py"
F_WEIGHT_UTILS = "vllm/model_executor/model_loader/weight_utils.py"
F_CACHE = "vllm/config/cache.py"
F_TRITON_STORE = "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py"
F_INT4_PTH = "vllm/v1/attention/ops/int4_per_token_head.py"
F_MATH_UTILS = "vllm/utils/math_utils.py"
F_KV_CACHE = "vllm/model_executor/layers/quantization/kv_cache.py"
F_TQ_STORE = "vllm/v1/attention/ops/triton_turboquant_store.py"
F_TQ_DECODE = "vllm/v1/attention/ops/triton_turboquant_decode.py"
F_TQ_CONFIG = "vllm/model_executor/layers/quantization/turboquant/config.py"
F_TQ_CENTROIDS = "vllm/model_executor/layers/quantization/turboquant/centroids.py"
F_UQ_FORMAT = "vllm/v1/attention/ops/ultraquant/format.py"
F_UQ_REFERENCE = "vllm/v1/attention/ops/ultraquant/reference.py"
F_NVFP4_EMULATION = "vllm/model_executor/layers/quantization/utils/nvfp4_emulation_utils.py"
F_UQ_STORE = "vllm/v1/attention/ops/ultraquant/triton_store.py"
F_OCTAVE = "vllm/v1/attention/ops/rocm_octave.py"


class UpstreamUnavailable(RuntimeError):
    """vLLM's source could not be located or fetched (the reason is the message)."""


class Source:
    """Read-only access to ``vllm/...`` files of one vLLM release."""

    def __init__(self, origin: str, reader: Callable[[str], str], version: str | None) -> None:
        self.origin = origin
        self.version = version
        self._reader = reader
        self._cache: dict[str, str] = {}

    def read(self, relpath: str) -> str:
        """The text of ``relpath`` (``"vllm/utils/torch_utils.py"``)."""
        if relpath not in self._cache:
            self._cache[relpath] = self._reader(relpath)
        return self._cache[relpath]

    def __repr__(self) -> str:
        return f"Source({self.origin!r}, version={self.version!r})"


#: The pinned wheel's size in MiB, said before it is fetched (vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl,
#: 336,361,138 bytes).
WHEEL_MIB = 321


def cache_dir() -> Path:
    """Where the pinned wheel is kept: ``$VTINFER_CACHE_DIR``, else ``vllm/`` in vtinfer's cache."""
    env = os.environ.get("VTINFER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from vtinfer.models.store import cache_dir as vtinfer_cache

    return vtinfer_cache() / "vllm"


def _cached_wheel() -> Path | None:
    d = cache_dir()
    found = sorted(d.glob(f"vllm-{VLLM_PIN}-*.whl")) if d.is_dir() else []
    return found[0] if found else None


def describe() -> str:
    """One line: where the differential tests' vLLM source will come from, without fetching anything."""
    env = os.environ.get("VTINFER_VLLM_SOURCE")
    if env:
        return f"vLLM source: the tree {env} (VTINFER_VLLM_SOURCE)"
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        try:
            if importlib.metadata.version("vllm") == VLLM_PIN:
                return f"vLLM {VLLM_PIN} source: the installed vllm package"
        except importlib.metadata.PackageNotFoundError:
            pass
    w = _cached_wheel()
    if w is not None:
        return f"vLLM {VLLM_PIN} source: {w} ({w.stat().st_size / 2**20:.0f} MiB, cached)"
    return (f"vLLM {VLLM_PIN} wheel not cached: the differential tests first download it, about {WHEEL_MIB} MiB "
            f"(pip download --no-deps vllm=={VLLM_PIN}), into {cache_dir()}; later runs reuse it")


def _from_tree(root: Path) -> Source:
    base = root if (root / "vllm").is_dir() else root.parent
    if not (base / "vllm").is_dir():
        raise UpstreamUnavailable(f"VTINFER_VLLM_SOURCE={root} holds no vllm/ package")
    return Source(str(base), lambda rel: (base / rel).read_text(encoding="utf-8"), None)


def _from_wheel(path: Path) -> Source:
    zf = zipfile.ZipFile(path)
    return Source(str(path), lambda rel: zf.read(rel).decode("utf-8"), VLLM_PIN)


def wheel_path(download: bool = True) -> Path:
    """The pinned wheel in the cache folder, fetched with pip when missing."""
    d = cache_dir()
    cached = _cached_wheel()
    if cached is not None:
        return cached
    if not download:
        raise UpstreamUnavailable(f"no vllm-{VLLM_PIN} wheel in {d}")
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={VLLM_PIN}", "-d", str(d)]
    notice(f"downloading vLLM {VLLM_PIN}'s wheel for the differential tests (about {WHEEL_MIB} MiB, once; its "
           f"Python files are read, it is never installed): {' '.join(cmd[2:])}")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(d.glob(f"vllm-{VLLM_PIN}-*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UpstreamUnavailable(f"`{' '.join(cmd)}` failed: {tail[0]}")
    notice(f"downloaded {found[0]} ({found[0].stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - t0:.0f} s")
    return found[0]


def locate(download: bool = True) -> Source:
    """Find vLLM's source (see the module docstring for the order).

    Raises
    ------
    UpstreamUnavailable
        With the reason, when no source is found and the download fails.
    """
    env = os.environ.get("VTINFER_VLLM_SOURCE")
    if env:
        return _from_tree(Path(env))
    spec = importlib.util.find_spec("vllm")  # locates a top-level package without running it
    if spec is not None and spec.submodule_search_locations:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version == VLLM_PIN:
            return _from_tree(Path(list(spec.submodule_search_locations)[0]))
    return _from_wheel(wheel_path(download))


# ---- extraction ---------------------------------------------------------------


def find_node(tree: ast.Module, qualname: str) -> ast.AST:
    """The def / class / assignment named ``qualname`` (``"Cls.method"``)."""
    parts = qualname.split(".")
    body = tree.body
    node: ast.AST | None = None
    for i, part in enumerate(parts):
        node = None
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part:
                node = n
            elif isinstance(n, (ast.Assign, ast.AnnAssign)) and i == len(parts) - 1:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    node = n
        if node is None:
            raise LookupError(f"{qualname} not found")
        body = getattr(node, "body", [])
    assert node is not None
    return node


class _Logger:
    """Stub for vLLM's logger: records what would be logged."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def _log(self, level: str, msg: str, *args: Any, **_: Any) -> None:
        self.records.append((level, msg % args if args else msg))

    def warning(self, msg: str, *a: Any, **k: Any) -> None:
        self._log("warning", msg, *a, **k)

    warning_once = warning

    def info(self, msg: str, *a: Any, **k: Any) -> None:
        self._log("info", msg, *a, **k)

    info_once = info

    def debug(self, msg: str, *a: Any, **k: Any) -> None:
        self._log("debug", msg, *a, **k)

    debug_once = debug


def extract(source_text: str, names: list[str], namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compile the named top-level functions / assignments (or methods, as
    plain functions, with ``"Cls.method"``) of ``source_text`` into one
    namespace and return it. ``namespace`` supplies the stubs."""
    tree = ast.parse(source_text)
    ns: dict[str, Any] = {"__name__": "vtinfer_upstream", "Any": Any}
    ns.update(namespace or {})
    for q in names:
        node = find_node(tree, q)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []  # staticmethod/classmethod and friends
            node.returns = None
            for a in node.args.args + node.args.kwonlyargs:
                a.annotation = None
        mod = ast.Module(body=[node], type_ignores=[])
        exec(compile(mod, f"<vllm {q}>", "exec"), ns)
        if "." in q:
            ns[q] = ns.pop(q.split(".")[-1])
    return ns



def triton_kernels(src: Source, relpath: str, names: list[str], namespace: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The ``@triton.jit`` functions ``names`` of ``relpath`` compiled as
    written (decorators and ``tl.constexpr`` / ``tl.int64`` annotations
    kept) against the installed triton, into one namespace holding ``tl``,
    ``triton``, ``namespace`` and each other (a kernel may call a jit helper
    compiled before it). Returns that namespace.

    The file's text is registered with :mod:`linecache` under a synthetic
    name so that triton's ``inspect.getsource`` finds the kernels' lines.
    Set ``TRITON_INTERPRET=1`` before importing triton to run them on CPU
    tensors. Raises ImportError when triton is missing."""
    import triton
    import triton.language as tl

    text = src.read(relpath)
    fname = f"<vllm {src.version or 'tree'} {relpath}>"
    linecache.cache[fname] = (len(text), None, text.splitlines(True), fname)
    tree = ast.parse(text)
    ns: dict[str, Any] = {"__name__": "vtinfer_upstream_triton", "tl": tl, "triton": triton}
    ns.update(namespace or {})
    for name in names:
        exec(compile(ast.Module(body=[find_node(tree, name)], type_ignores=[]), fname, "exec"), ns)
    return ns


def triton_kernel(src: Source, relpath: str, name: str) -> Any:
    """One kernel of :func:`triton_kernels`."""
    return triton_kernels(src, relpath, [name])[name]


def cache_dtype_literal(src: Source) -> list[str]:
    """The values of ``CacheDType`` (vLLM's accepted --kv-cache-dtype)."""
    node = find_node(ast.parse(src.read(F_CACHE)), "CacheDType")
    assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript)
    sl = node.value.slice
    elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
    return [ast.literal_eval(e) for e in elts]


GET_CONFIG_SNIPPETS = (
    'quantization_config = config_dict.get("quantization_config", None)',
    "if quantization_config is None and file_or_path_exists(",
    '"hf_quant_config.json", model, revision',
    "config.quantization_config = quantization_config",
    'scale_fmt = quantization_config.get("scale_fmt", None)',
)


@dataclass
class ResolverFunctions:
    """vLLM's resolver chain, extracted; see :func:`resolver_functions`."""

    normalize: Callable[..., Any]
    kv_algo_string: Callable[..., Any]
    resolve_string: Callable[..., Any]
    logger: _Logger
    kv_cache_dtypes: list[str] = field(default_factory=list)

    def resolve(self, kv_cache_dtype: str, config: dict, hf_quant_config: Any = None, *, has_hf_quant: bool = False) -> str:
        """vLLM's answer for ``config`` (a config.json dict, mutated in place
        as vLLM mutates it) and an optional hf_quant_config.json document.

        Mirrors get_config's inline-vs-file block (whose lines are checked
        against the pinned source by :func:`resolver_functions`), then
        ``get_quantization_config`` (normalize, text_config fallback), then
        ``resolve_kv_cache_dtype_string``.
        """
        hf = types.SimpleNamespace()
        for k, v in config.items():
            setattr(hf, k, v)
        qc = config.get("quantization_config", None)
        if qc is None and has_hf_quant:
            qc = hf_quant_config
        if qc is not None:
            hf.quantization_config = qc
            qc.get("scale_fmt", None)
        q = self.normalize(None, hf)
        text = getattr(hf, "text_config", None)
        if q is None and text:
            if isinstance(text, dict):
                t = types.SimpleNamespace()
                for k, v in text.items():
                    setattr(t, k, v)
                text = t
            self.normalize(None, text)
        return self.resolve_string(kv_cache_dtype, types.SimpleNamespace(hf_config=hf))


def resolver_functions(src: Source) -> ResolverFunctions:
    """Extract ``_normalize_quantization_config``,
    ``get_kv_cache_quant_algo_string`` and ``resolve_kv_cache_dtype_string``
    (plus the table they read) from ``src``."""
    cfg_text = src.read(F_CONFIG)
    missing = [s for s in GET_CONFIG_SNIPPETS if s not in cfg_text]
    if missing:
        raise UpstreamUnavailable(f"get_config changed upstream; lines not found: {missing}")
    logger = _Logger()
    conv = extract(src.read(F_CONVERTOR), ["ModelArchConfigConvertorBase._normalize_quantization_config"],
                   {"logger": logger})
    tu = extract(src.read(F_TORCH_UTILS),
                 ["MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP", "get_kv_cache_quant_algo_string",
                  "resolve_kv_cache_dtype_string"],
                 {"logger": logger, "ModelConfig": object})
    return ResolverFunctions(
        normalize=conv["ModelArchConfigConvertorBase._normalize_quantization_config"],
        kv_algo_string=tu["get_kv_cache_quant_algo_string"],
        resolve_string=tu["resolve_kv_cache_dtype_string"],
        logger=logger,
        kv_cache_dtypes=cache_dtype_literal(src),
    )


def remap_function(src: Source) -> tuple[Callable[[str, dict], str | None], _Logger]:
    """Extract ``maybe_remap_kv_scale_name`` (its ``import regex as re`` is
    served by the standard :mod:`re`, which accepts the patterns used)."""
    logger = _Logger()
    real_import = __import__

    def _import(name: str, *a: Any, **k: Any) -> Any:
        return re if name == "regex" else real_import(name, *a, **k)

    import builtins

    b = dict(vars(builtins))
    b["__import__"] = _import
    ns = extract(src.read(F_WEIGHT_UTILS), ["maybe_remap_kv_scale_name"], {"logger": logger, "__builtins__": b})
    return ns["maybe_remap_kv_scale_name"], logger


def require() -> bool:
    """True when a missing upstream must fail (``VTINFER_REQUIRE_UPSTREAM=1``, set by CI)."""
    return os.environ.get("VTINFER_REQUIRE_UPSTREAM", "") not in ("", "0")


def locate_or_skip() -> Source:
    """For pytest fixtures: the source, or a skip with the reason (a failure
    when ``VTINFER_REQUIRE_UPSTREAM=1``)."""
    import pytest

    try:
        return locate()
    except UpstreamUnavailable as e:
        if require():
            pytest.fail(f"vLLM {VLLM_PIN} source required (VTINFER_REQUIRE_UPSTREAM=1): {e}")
        pytest.skip(f"vLLM {VLLM_PIN} source unavailable: {e}")


F_CT = "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py"


def _inner_function(tree: ast.Module, qualname: str, inner: str) -> ast.FunctionDef:
    outer = find_node(tree, qualname)
    for n in ast.walk(outer):
        if isinstance(n, ast.FunctionDef) and n.name == inner:
            return n
    raise LookupError(f"{qualname}.<locals>.{inner} not found")


def tp_aware_loader(src: Source) -> Callable[..., Any]:
    """compressed-tensors' ``_tp_aware_loader`` (a closure inside
    ``CompressedTensorsKVCacheMethod.create_weights``), extracted and run with
    torch. Returns ``load(loaded, kind, *, total_num_heads, total_num_kv_heads,
    tensor_parallel_size, rank, param_type="scale")``: the float64 NumPy
    array vLLM copies into the rank's ``[num_kv_heads_per_rank]`` parameter,
    or None for a zero point (ignored upstream). Needs torch."""
    import torch

    node = _inner_function(ast.parse(src.read(F_CT)), "CompressedTensorsKVCacheMethod.create_weights",
                           "_tp_aware_loader")
    node.returns = None
    for a in node.args.args + node.args.kwonlyargs:
        a.annotation = None
    code = compile(ast.Module(body=[node], type_ignores=[]), "<vllm _tp_aware_loader>", "exec")

    def load(loaded: Any, kind: str, *, total_num_heads: int, total_num_kv_heads: int,
             tensor_parallel_size: int = 1, rank: int = 0, param_type: str = "scale") -> Any:
        per_rank = max(1, total_num_kv_heads // tensor_parallel_size)
        ns: dict[str, Any] = {
            "torch": torch,
            "self": types.SimpleNamespace(quant_config=types.SimpleNamespace(
                total_num_heads=total_num_heads, total_num_kv_heads=total_num_kv_heads)),
            "layer": types.SimpleNamespace(num_kv_heads=per_rank),
            "get_tensor_model_parallel_rank": lambda: rank,
            "get_tensor_model_parallel_world_size": lambda: tensor_parallel_size,
        }
        exec(code, ns)
        param = torch.nn.Parameter(torch.full((per_rank,), -7.0, dtype=torch.float32), requires_grad=False)
        w = torch.as_tensor(np.asarray(loaded)).to(torch.float32)
        ns["_tp_aware_loader"](param, w, kind=kind, param_type=param_type)
        out = param.detach().numpy().astype(np.float64)
        return None if bool((out == -7.0).all()) else out

    return load


def scalar_scale_loader(src: Source) -> Callable[[Any], float]:
    """``KVCacheScaleParameter.weight_loader`` (vLLM's base KV method: one
    element or ValueError), run with torch; returns the loaded float."""
    import torch

    ns = extract(src.read(F_KV_CACHE), ["KVCacheScaleParameter.weight_loader"], {"torch": torch})
    fn = ns["KVCacheScaleParameter.weight_loader"]

    def load(loaded: Any) -> float:
        p = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)
        fn(p, torch.as_tensor(np.asarray(loaded, dtype=np.float32)))
        return float(p.item())

    return load


F_PLATFORM = "vllm/platforms/interface.py"


def heterogeneous_alignment(src: Source) -> Callable[..., tuple[int, int | None]]:
    """``Platform._align_heterogeneous_kv_block_size`` (the block-size
    alignment vLLM runs when ``kv_cache_dtype_skip_layers`` is set), run with
    stubs: dtypes are vtinfer names with their element sizes, the backend
    packs a page as ``2 * H_kv * D * elem`` per token (FlashAttention), its
    kernel blocks are ``MultipleOf(kernel_block)``. Returns ``align(
    block_size, cache_dtype, model_dtype, num_kv_heads, head_size,
    skip_layers, kernel_block=16) -> (block_size, skip_page_size_padded)``;
    vLLM's AssertionError passes through."""
    import builtins

    node = find_node(ast.parse(src.read(F_PLATFORM)), "Platform._align_heterogeneous_kv_block_size")
    assert isinstance(node, ast.FunctionDef)
    node.decorator_list = []
    node.returns = None
    for a in node.args.args + node.args.kwonlyargs:
        a.annotation = None
    code = compile(ast.Module(body=[node], type_ignores=[]), "<vllm _align_heterogeneous_kv_block_size>", "exec")
    elem = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

    class MultipleOf:
        def __init__(self, base: int) -> None:
            self.base = base

    def align(block_size: int, cache_dtype: str, model_dtype: str, num_kv_heads: int, head_size: int,
              skip_layers: list[str], kernel_block: int = 16) -> tuple[int, int | None]:
        class Spec:
            def __init__(self, block_size: int, num_kv_heads: int, head_size: int, dtype: str,
                         kv_quant_mode: Any) -> None:
                self.page_size_bytes = 2 * block_size * num_kv_heads * head_size * elem[dtype]

        fake = {
            "vllm.config.vllm": types.SimpleNamespace(set_current_vllm_config=lambda cfg: _Null()),
            "vllm.utils.math_utils": types.SimpleNamespace(cdiv=lambda a, b: -(a // -b)),
            "vllm.utils.torch_utils": types.SimpleNamespace(STR_DTYPE_TO_TORCH_DTYPE={k: k for k in elem}),
            "vllm.v1.attention.backend": types.SimpleNamespace(MultipleOf=MultipleOf),
            "vllm.v1.kv_cache_interface": types.SimpleNamespace(FullAttentionSpec=Spec,
                                                                get_kv_quant_mode=lambda d: None),
        }
        real_import = builtins.__import__

        def _import(name: str, *a: Any, **k: Any) -> Any:
            return fake[name] if name in fake else real_import(name, *a, **k)

        b = dict(vars(builtins))
        b["__import__"] = _import
        logger = _Logger()
        ns: dict[str, Any] = {"__builtins__": b, "logger": logger}
        exec(code, ns)
        cache = types.SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size,
                                      kv_cache_dtype_skip_layers=list(skip_layers), skip_page_size_padded=None,
                                      mamba_page_size_padded=None)
        model = types.SimpleNamespace(dtype=model_dtype, get_num_kv_heads=lambda pc: num_kv_heads,
                                      get_head_size=lambda: head_size)
        cfg = types.SimpleNamespace(cache_config=cache, model_config=model, parallel_config=None)
        backend = types.SimpleNamespace(customize_spec=lambda spec: spec,
                                        get_supported_kernel_block_sizes=lambda: [MultipleOf(kernel_block)])
        ns["_align_heterogeneous_kv_block_size"](None, cfg, backend)
        return cache.block_size, cache.skip_page_size_padded

    return align


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None
