"""vLLM 0.32 v1 attention backend whose store and attention are vtinfer's kernels.

``VtinferAttentionBackend`` stands in for vLLM's ``CPU_ATTN`` (see
:mod:`vtinfer.vllm`): it answers vLLM's questions about dtypes, block sizes,
the KV cache layout and the page (``customize_spec``), and hands vLLM the
metadata builder and :class:`vtinfer.vllm.impl.VtinferAttentionImpl`.
The metadata is vLLM's own, unchanged: vtinfer's ``flash_attn_varlen_func``
takes query start locations, sequence lengths and block tables as vLLM
builds them, so mixed prefill/decode batches, chunked prefill, prefix caching
and preemption need nothing of their own here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_interface import AttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from vtinfer.vllm import layout


class VtinferAttentionBackend(AttentionBackend):
    """vtinfer's paged attention as a vLLM attention backend (CPU)."""

    # The store runs in do_kv_cache_update, before forward (as CPU_ATTN and Triton).
    forward_includes_kv_cache_update: bool = False
    accept_output_buffer: bool = True

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = layout.supported_kv_cache_dtypes()

    @staticmethod
    def get_name() -> str:
        # The Attention layer looks its backend up as AttentionBackendEnum[get_name()];
        # vtinfer is registered as CPU_ATTN's class path, so it answers to that member.
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls() -> type:
        from vtinfer.vllm.impl import VtinferAttentionImpl

        return VtinferAttentionImpl

    @staticmethod
    def get_builder_cls() -> type:
        return VtinferMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        # vtinfer's kernels take any block size; 16 keeps vLLM's Triton/TurboQuant pages (multiples of 16).
        return [MultipleOf(16)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size % 16 == 0

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        # Token-major blocks: kv_cache.transpose(1, 2) is the NHD cache vtinfer's ops take.
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """The Triton backend's per-token-head page and the TurboQuant slot page; plain pages unchanged."""
        if spec.state_content_bytes is not None:
            return spec
        from vllm.utils.torch_utils import get_dtype_size

        name = _dtype_name(spec)
        content = layout.content_bytes(name, spec.head_size, spec.head_size_v, get_dtype_size(spec.dtype))
        return spec if content is None else replace(spec, state_content_bytes=content)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_per_head_quant_scales(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


def _dtype_name(spec: AttentionSpec) -> str:
    """The kv_cache_dtype string of a spec, from its quant mode (vLLM keeps the string on the layer only)."""
    from vllm.v1.kv_cache_interface import KVQuantMode

    mode = spec.kv_quant_mode
    if mode == KVQuantMode.NONE:
        return "auto"
    if mode == KVQuantMode.FP8_PER_TENSOR:
        return "fp8"
    return mode.name.lower()


@dataclass
class VtinferAttentionMetadata:
    """vLLM's per-batch metadata, as vtinfer's ops read it (CPU tensors, never copied)."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor  # int32 [B + 1]
    max_seq_len: int
    seq_lens: torch.Tensor  # int32 [B]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    causal: bool = True


class VtinferMetadataBuilder(AttentionMetadataBuilder[VtinferAttentionMetadata]):
    """Passes vLLM's common metadata through; nothing is reordered or recomputed."""

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: Any,
                 device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> VtinferAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError(
                "vtinfer attention backend: per-request (tensor) causal flags are not supported; "
                "unset VTINFER_VLLM to use vLLM's CPU_ATTN for this model")
        return VtinferAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens, max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc, max_seq_len=m.max_seq_len, seq_lens=m.seq_lens,
            block_table=m.block_table_tensor, slot_mapping=m.slot_mapping, causal=bool(m.causal))
