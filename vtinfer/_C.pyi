# Hand-written stub of the C extension vtinfer._C. tests/python/test_stub.py
# keeps it honest: every public name of the module is here and vice versa,
# and the dtype names below equal the C dtype table.
from typing import Any

import numpy as np

class VtinferError(Exception): ...
class ConfigError(VtinferError, ValueError): ...

# dtype names of the C dtype table, in table order (checked by tests)
DTYPE_TABLE_NAMES: tuple[str, ...]  # = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact")

def build_info() -> dict[str, Any]: ...
def dtype_table() -> tuple[dict[str, Any], ...]: ...
def dtype_slot_bytes(dtype: str, head_size: int, rope_dim: int | None = None, /) -> int: ...
def dtype_head_size_error(dtype: str, head_size: int, /) -> str | None: ...
def kv_cache_flags() -> tuple[str, ...]: ...
def set_isa(isa: str, /) -> None: ...
def isa() -> str: ...
def fp8_quantize(
    x: Any, scale: float = 1.0, fmt: Any = "e4m3", *, out: np.ndarray | None = None, num_threads: int | None = None
) -> np.ndarray: ...
def fp8_dequantize(
    codes: Any,
    scale: float = 1.0,
    fmt: Any = None,
    dtype: Any = None,
    *,
    out: np.ndarray | None = None,
    num_threads: int | None = None,
) -> np.ndarray: ...
def convert(x: Any, dtype: Any, *, out: np.ndarray | None = None, num_threads: int | None = None) -> np.ndarray: ...
def nvfp4_quantize(x: Any, scale: float = 1.0, *, four_over_six: bool = False) -> tuple[np.ndarray, np.ndarray]: ...
def nvfp4_dequantize(codes: Any, block_scales: Any, scale: float = 1.0) -> np.ndarray: ...

# resolver: csrc/binding/resolver_binding.c
def json_loads(text: bytes, name: str | None = None, *, max_depth: int = 0, max_bytes: int = 0) -> Any: ...
def resolve_kv_cache_dtype(
    kv_cache_dtype: str, config: bytes | str, hf_quant_config: bytes | str | None = None, *, layers: bool = True
) -> dict[str, Any]: ...
def vllm_kv_cache_dtypes() -> tuple[str, ...]: ...
def vllm_kv_cache_dtypes_unstored() -> dict[str, str]: ...

# kv-cache: csrc/binding/kvcache_binding.c
class PagedKVCache:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str
    layout: str
    page_bytes: int
    nbytes: int
    element_size: int
    rope_dim: int
    exports: int
    released: bool
    k_scale: np.ndarray
    v_scale: np.ndarray
    def __new__(
        cls,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: str,
        layout: str = "NHD",
        k_scale: Any = 1.0,
        v_scale: Any = 1.0,
        *,
        model_dtype: str | None = None,
        rope_dim: int | None = None,
    ) -> PagedKVCache: ...
    def key_cache(self, layer: int, /) -> np.ndarray: ...
    def value_cache(self, layer: int, /) -> np.ndarray: ...
    def k_scale_cache(self, layer: int, /) -> np.ndarray: ...
    def v_scale_cache(self, layer: int, /) -> np.ndarray: ...
    def store(self, layer: int, key: Any, value: Any, slot_mapping: Any, *, num_threads: int | None = None) -> None: ...
    def gather(self, layer: int, slots: Any, *, rotated: bool = False) -> tuple[np.ndarray, np.ndarray]: ...
    def release(self) -> None: ...
    def _dlpack(self, layer: int | None = None, which: int = -1, max_version: Any = None) -> Any: ...
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

def turboquant_store(
    key: Any, value: Any, kv_cache: Any, slot_mapping: Any, kv_cache_dtype: str, midpoints: Any = None
) -> None: ...
def turboquant_gather(
    kv_cache: Any, slots: Any, kv_cache_dtype: str, centroids: Any, k_out: np.ndarray, v_out: np.ndarray, *,
    num_threads: int | None = None,
) -> None: ...
def nvfp4_store(
    key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, k_scale: float, v_scale: float, *,
    four_over_six: bool = False, num_threads: int | None = None,
) -> None: ...
def nvfp4_read_pages(
    key_cache: Any, value_cache: Any, blocks: Any, k_scale: float, v_scale: float, *, num_threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray]: ...
def reshape_and_cache_flash(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str,
    k_scale: Any,
    v_scale: Any,
    *,
    layout: str | None = None,
    num_threads: int | None = None,
    k_scale_cache: Any = None,
    v_scale_cache: Any = None,
) -> None: ...
def reshape_and_cache(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str,
    k_scale: Any,
    v_scale: Any,
    *,
    num_threads: int | None = None,
) -> None: ...

# --- attention ---
def flash_attn_varlen_func(
    q: Any,
    k: Any,
    v: Any,
    *,
    cu_seqlens_q: Any,
    seqused_k: Any,
    block_table: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Any = None,
    s_aux: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
    kv_cache_dtype: str = "auto",
    out: np.ndarray | None = None,
    return_lse: bool = False,
    num_threads: int | None = None,
    k_scale_cache: Any = None,
    v_scale_cache: Any = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...

# ---- vLLM's cache ops (csrc/binding/cacheops_binding.c) ----
def swap_blocks(
    src: Any, dst: Any, block_size_in_bytes: int, block_mapping: Any, *,
    src_extent: int | None = None, dst_extent: int | None = None, num_threads: int | None = None,
) -> None: ...
def convert_fp8(output: Any, input: Any, scale: float = 1.0, kv_dtype: str = "fp8", *, num_threads: int | None = None) -> None: ...
def gather_and_maybe_dequant_cache(
    src_cache: Any, dst: Any, block_table: Any, cu_seq_lens: Any, token_to_seq: Any, num_tokens: int,
    kv_cache_dtype: str, scale: float | None, seq_starts: Any = None, *, num_threads: int | None = None,
) -> None: ...
def cp_gather_cache(
    src_cache: Any, dst: Any, block_table: Any, cu_seq_lens: Any, batch_size: int, seq_starts: Any = None, *,
    num_threads: int | None = None,
) -> None: ...
def merge_attn_states(
    output: Any, prefix_output: Any, prefix_lse: Any, suffix_output: Any, suffix_lse: Any, output_lse: Any = None,
    prefill_tokens_with_context: int | None = None, output_scale: float | None = None, *, num_threads: int | None = None,
) -> None: ...
def concat_and_cache_mla(
    kv_c: Any, k_pe: Any, kv_cache: Any, slot_mapping: Any, kv_cache_dtype: str, scale: float, skip_scale: bool = False,
) -> None: ...
def mask_empty_context_lse(lse: Any, query_start_loc: Any, context_start_loc: Any) -> None: ...
