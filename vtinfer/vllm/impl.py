"""The per-layer attention implementation: vtinfer's store and paged attention on vLLM's tensors."""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionType

import vtinfer as vt
from vtinfer.vllm import announce, layout


def _refuse(what: str) -> NotImplementedError:
    return NotImplementedError(f"vtinfer attention backend: {what} (unset VTINFER_VLLM to use vLLM's own CPU backend)")


class VtinferAttentionImpl(AttentionImpl):
    """One attention layer: ``do_kv_cache_update`` stores, ``forward`` attends (vLLM calls them in that order)."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None,
                 **unsupported: Any) -> None:
        announce()  # vLLM's log names vtinfer once per process, whenever its logging came up
        if attn_type != AttentionType.DECODER:
            raise _refuse(f"attention type must be decoder; got {attn_type} (encoder and cross attention "
                          "have no vtinfer path yet)")
        extra = {k: v for k, v in unsupported.items() if v not in (None, False, -1)}
        if extra:
            raise _refuse(f"unsupported attention arguments {sorted(extra)}")
        self.family = layout.family(kv_cache_dtype)  # refuses dtypes vtinfer does not store
        self.global_scale = kv_cache_dtype != "auto" and vt.dtype_info(kv_cache_dtype).global_scale
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        # vLLM's sliding_window w keeps w keys including the current one: FlashAttention's (w - 1, 0).
        self.window_size = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, 0)
        self.sliding_window = sliding_window
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.sinks = sinks
        if sinks is not None and sinks.shape[0] != num_heads:
            raise _refuse(f"sinks must have one logit per query head ({num_heads}); got shape {tuple(sinks.shape)}")
        self._views_key: tuple[int, tuple[int, ...]] | None = None
        self._views: layout.KVViews | None = None

    # vLLM binds one cache tensor per layer for the engine's lifetime; the views are built once per tensor.
    def _kv(self, kv_cache: torch.Tensor) -> layout.KVViews:
        key = (kv_cache.data_ptr(), tuple(kv_cache.shape))
        if self._views_key != key:
            self._views = layout.kv_views(kv_cache, self.kv_cache_dtype, self.head_size)
            self._views_key = key
        assert self._views is not None
        return self._views

    def _descales(self, layer: Any) -> tuple[Any, Any]:
        # fp8's descales; NVFP4's global scales (its slot read decodes with them)
        if self.family != "fp8" and not self.global_scale:
            return None, None
        return layer._k_scale, layer._v_scale

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """Store this step's K/V at ``slot_mapping`` (negative slots skipped), vtinfer's store rules."""
        if kv_cache.numel() == 0:
            return
        v = self._kv(kv_cache)
        threads = torch.get_num_threads()
        kwargs = {}
        if self.family == "per_token_head":
            kwargs = {"k_scale_cache": v.k_scale_cache, "v_scale_cache": v.v_scale_cache}
        # TurboQuant keeps its scales in each slot: the layer's k/v scales are ignored, as vLLM's TurboQuant does;
        # NVFP4's slots take them as the global scales.
        ignored = self.family == "turboquant" and not self.global_scale
        scales = (None, None) if ignored else (layer._k_scale, layer._v_scale)
        vt.reshape_and_cache_flash(key, value, v.key_cache, v.value_cache, slot_mapping, self.kv_cache_dtype,
                                   *scales, num_threads=threads, **kwargs)

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Attend ``query[:num_actual_tokens]`` over the paged cache into ``output`` (in place)."""
        if output_scale is not None or output_block_scale is not None:
            raise _refuse("fused output quantization is not supported")
        if attn_metadata is None:  # vLLM's profiling / warm-up run
            return output
        m = attn_metadata
        n = m.num_actual_tokens
        v = self._kv(kv_cache)
        threads = torch.get_num_threads()
        k_descale, v_descale = self._descales(layer)
        kwargs = {}
        if self.family == "per_token_head":
            kwargs = {"k_scale_cache": v.k_scale_cache, "v_scale_cache": v.v_scale_cache}
        # vLLM's query is a view into the fused QKV projection; vtinfer's attention reads a
        # contiguous q (one copy of num_tokens * H * D elements; K/V are stored from their views).
        vt.flash_attn_varlen_func(
            query[:n].contiguous(), v.key_cache, v.value_cache, cu_seqlens_q=m.query_start_loc, seqused_k=m.seq_lens,
            block_table=m.block_table, max_seqlen_q=m.max_query_len, max_seqlen_k=m.max_seq_len,
            softmax_scale=self.scale, causal=m.causal, window_size=self.window_size, softcap=self.logits_soft_cap,
            alibi_slopes=self.alibi_slopes, s_aux=self.sinks, k_descale=k_descale, v_descale=v_descale,
            kv_cache_dtype=self.kv_cache_dtype, out=output[:n], num_threads=threads, **kwargs)
        return output
