"""vtinfer: a vLLM-compatible paged KV cache, fp8 KV-cache dtype resolver and
fast paged attention kernels, with a C core.

>>> import numpy as np, vtinfer as vt
>>> codes = vt.fp8_quantize(np.array([1.0, 1000.0], np.float32), scale=2.0)
>>> vt.fp8_dequantize(codes, scale=2.0)
array([  1., 896.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

try:
    from vtinfer import _C
except ValueError as _e:  # a bad VTINFER_ISA is refused where it is read, with the way out
    if "VTINFER_ISA" not in str(_e):
        raise
    raise ImportError(f"vtinfer: {_e} (unset VTINFER_ISA to use the best kernels this CPU has)") from None
from vtinfer._C import ConfigError, VtinferError
from vtinfer._attention import flash_attn_varlen_func
from vtinfer._cache_ops import (
    concat_and_cache_mla,
    convert_fp8,
    cp_gather_cache,
    gather_and_maybe_dequant_cache,
    mask_empty_context_lse,
    merge_attn_states,
    swap_blocks,
)
from vtinfer._codec import convert, fp8_dequantize, fp8_quantize, nvfp4_dequantize, nvfp4_quantize
from vtinfer._dtypes import (
    DTYPES,
    FP8_DTYPES,
    KV_CACHE_DTYPES,
    KV_CACHE_DTYPES_NOT_STORED,
    PER_TOKEN_HEAD_DTYPES,
    NVFP4_DTYPES,
    SLOT_DTYPES,
    TURBOQUANT_DTYPES,
    VLLM_KV_CACHE_DTYPES,
    DtypeInfo,
    dtype_info,
)
from vtinfer._kvcache import KVLayer, PagedKVCache, reshape_and_cache, reshape_and_cache_flash
from vtinfer.blocks import BlockAllocator
from vtinfer.checkpoint import Checkpoint
from vtinfer.hf_config import AttentionSpec, ModelGeometry
from vtinfer.resolve import Resolution, resolve_kv_cache_dtype
from vtinfer.scales import LayerScales, load_kv_scales
from vtinfer.sizing import KVCachePlan, kv_cache_args, plan_kv_cache
from vtinfer._turboquant import (
    turboquant_attention,
    turboquant_codebook,
    turboquant_gather,
    turboquant_slot_bytes,
    turboquant_store,
)

__version__ = "0.1.0"


def build_info() -> dict[str, Any]:
    """What this build of vtinfer is and runs on.

    Returns
    -------
    dict
        ``version``, ``isa`` (the kernels in use: scalar, avx2, avx512),
        ``isa_best`` (the best this CPU allows), ``cpu_features``,
        ``compiler``, ``cuda_built`` and ``cuda`` (a one-line status of the
        CUDA extension ``vtinfer._cuda``: "CUDA extension not built",
        "CUDA extension built, no CUDA device" or "... built, N CUDA devices").
    """
    info = dict(_C.build_info())
    try:  # the CUDA extension is separate, built only where nvcc was found
        from vtinfer import _cuda
    except ImportError:
        _cuda = None
    if _cuda is None:
        info["cuda"] = "CUDA extension built, no CUDA device" if info["cuda_built"] else "CUDA extension not built"
    else:
        n = _cuda.device_count()  # never raises: 0 when the runtime finds no device
        info["cuda_built"] = True
        info["cuda_devices"] = n
        info["cuda"] = (f"CUDA extension built, {n} CUDA device{'s' if n != 1 else ''}" if n
                        else "CUDA extension built, no CUDA device")
    return info


__all__ = [
    "AttentionSpec",
    "BlockAllocator",
    "Checkpoint",
    "KVCachePlan",
    "LayerScales",
    "ModelGeometry",
    "Resolution",
    "kv_cache_args",
    "load_kv_scales",
    "plan_kv_cache",
    "resolve_kv_cache_dtype",
    "KVLayer",
    "PagedKVCache",
    "ConfigError",
    "DTYPES",
    "DtypeInfo",
    "FP8_DTYPES",
    "PER_TOKEN_HEAD_DTYPES",
    "SLOT_DTYPES",
    "NVFP4_DTYPES",
    "TURBOQUANT_DTYPES",
    "VLLM_KV_CACHE_DTYPES",
    "KV_CACHE_DTYPES",
    "KV_CACHE_DTYPES_NOT_STORED",
    "VtinferError",
    "build_info",
    "concat_and_cache_mla",
    "convert",
    "convert_fp8",
    "cp_gather_cache",
    "dtype_info",
    "flash_attn_varlen_func",
    "fp8_dequantize",
    "fp8_quantize",
    "nvfp4_quantize",
    "nvfp4_dequantize",
    "gather_and_maybe_dequant_cache",
    "mask_empty_context_lse",
    "merge_attn_states",
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "swap_blocks",
    "turboquant_attention",
    "turboquant_codebook",
    "turboquant_gather",
    "turboquant_slot_bytes",
    "turboquant_store",
]
