"""vtinfer's kernels as torch custom ops: ``torch.ops.vtinfer.*``.

Importing this module (it imports torch; ``import vtinfer`` never does)
registers, with ``torch.library.custom_op`` (Python only, no C++ built
against torch):

==================================  ===============================================
op                                  schema (mutated arguments marked ``!``)
==================================  ===============================================
``reshape_and_cache_flash``         ``(key, value, key_cache!, value_cache!,
                                    slot_mapping, kv_cache_dtype, k_scale, v_scale)``
``reshape_and_cache``               the same, x-split caches
``flash_attn_varlen_func``          ``(q, k, v, cu_seqlens_q, seqused_k,
                                    block_table, ...) -> (out, softmax_lse)``
``fp8_quantize``                    ``(x, scale, fmt) -> float8 codes``
``fp8_dequantize``                  ``(codes, scale, fmt, dtype) -> values``
``swap_blocks``                     ``(src, dst!, block_size_in_bytes, block_mapping)``
``convert_fp8``                     ``(output!, input, scale, kv_dtype)``
``gather_and_maybe_dequant_cache``  ``(src_cache, dst!, block_table, cu_seq_lens,
                                    token_to_seq, num_tokens, kv_cache_dtype,
                                    scale, seq_starts)``
``cp_gather_cache``                 ``(src_cache, dst!, block_table, cu_seq_lens,
                                    batch_size, seq_starts)``
``merge_attn_states``               ``(output!, prefix_output, prefix_lse,
                                    suffix_output, suffix_lse, output_lse!, ...)``
``concat_and_cache_mla``            ``(kv_c, k_pe, kv_cache!, slot_mapping,
                                    kv_cache_dtype, scale, skip_scale)``
``mask_empty_context_lse``          ``(lse!, query_start_loc, context_start_loc)``
==================================  ===============================================

Each op has a fake (meta) implementation that gives the output shapes and
dtypes without computing, so ``torch.compile`` traces through the ops and
``torch.library.opcheck`` accepts them. Arguments keep vLLM's names and
order (``vllm/_custom_ops.py``); the bytes are those of the NumPy API
(:func:`vtinfer.reshape_and_cache_flash`, ...), which the ops call on the
tensors' memory through DLPack. CPU tensors only (CUDA tensors go to the
CUDA arm through the functional API).

>>> import torch, vtinfer.torch  # doctest: +SKIP
>>> torch.ops.vtinfer.fp8_quantize(torch.tensor([1.0, 1000.0]), 2.0).float()  # doctest: +SKIP
tensor([  0.5000, 448.0000])
"""

import functools
import inspect
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from vtinfer import _attention, _cache_ops, _codec, _kvcache

__all__ = ["FP8_TORCH_DTYPES", "concat_and_cache_mla", "convert_fp8", "cp_gather_cache", "flash_attn_varlen_func",
           "fp8_dequantize", "fp8_quantize", "gather_and_maybe_dequant_cache", "mask_empty_context_lse",
           "merge_attn_states", "reshape_and_cache", "reshape_and_cache_flash", "swap_blocks"]

#: torch dtype of fp8 codes for each vtinfer fp8 format.
FP8_TORCH_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _fp8_dtype(fmt: str) -> torch.dtype:
    return torch.float8_e5m2 if "e5m2" in fmt.lower() else torch.float8_e4m3fn


def _fake(op: Any) -> Callable[[Callable[..., Any]], Any]:
    """``op.register_fake`` for a fake implementation that also refuses meta tensors passed eagerly.

    torch runs the fake implementation for meta tensors, so without this an
    eager call on meta tensors would return having computed nothing; under
    tracing (torch.compile, opcheck) the arguments are FakeTensors and pass.
    """
    def register(impl: Callable[..., Any]) -> Any:
        name = str(op._name).rsplit("::", 1)[-1]
        signature = inspect.signature(impl)

        @functools.wraps(impl)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for arg, x in signature.bind(*args, **kwargs).arguments.items():
                if isinstance(x, Tensor) and x.device.type == "meta" and not isinstance(x, FakeTensor):
                    raise ValueError(f"{name}: {arg} must be a CPU tensor with data; got a meta tensor (vtinfer's "
                                     "ops compute, they do not only propagate shapes)")
            return impl(*args, **kwargs)

        return op.register_fake(checked)

    return register


# ---- stores: mutate the caches, return nothing ----------------------------------


@torch.library.custom_op("vtinfer::reshape_and_cache_flash",
                         mutates_args=("key_cache", "value_cache", "k_scale_cache", "v_scale_cache"),
                         device_types="cpu")
def reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                            slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor, v_scale: Tensor,
                            k_scale_cache: Optional[Tensor] = None, v_scale_cache: Optional[Tensor] = None) -> None:
    """vLLM's ``reshape_and_cache_flash``: see :func:`vtinfer.reshape_and_cache_flash`.

    key, value: ``[num_tokens, H_kv, D]``; key_cache, value_cache:
    ``[num_blocks, block_size, H_kv, D]`` (HND as a permuted view), uint8 or
    float8 for fp8, int8 / uint8 codes for the per-token-head formats;
    k_scale, v_scale: one element or ``[H_kv]``; k_scale_cache,
    v_scale_cache: float32 ``[num_blocks, block_size, H_kv]``, written, for
    the per-token-head formats only.
    """
    _kvcache.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                     k_scale, v_scale, k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache)


@_fake(reshape_and_cache_flash)
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, k_scale_cache=None,
      v_scale_cache=None):
    return None


@torch.library.custom_op("vtinfer::reshape_and_cache", mutates_args=("key_cache", "value_cache"), device_types="cpu")
def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                      kv_cache_dtype: str, k_scale: Tensor, v_scale: Tensor) -> None:
    """vLLM's ``reshape_and_cache`` (x-split caches): see :func:`vtinfer.reshape_and_cache`.

    key_cache: ``[num_blocks, H_kv, D // x, block_size, x]``; value_cache:
    ``[num_blocks, H_kv, D, block_size]``.
    """
    _kvcache.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


@_fake(reshape_and_cache)
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    return None


# ---- attention: allocates out and the log-sum-exp -------------------------------


@torch.library.custom_op("vtinfer::flash_attn_varlen_func", mutates_args=(), device_types="cpu")
def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    seqused_k: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: Optional[float] = None,
    causal: bool = True,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    s_aux: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    kv_cache_dtype: str = "auto",
    cu_seqlens_k: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_scale_cache: Optional[Tensor] = None,
    v_scale_cache: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Paged attention: see :func:`vtinfer.flash_attn_varlen_func`.

    Returns ``(out, softmax_lse)``: out ``[total_q, H, D]`` of q's dtype,
    softmax_lse float32 ``[H, total_q]``; an fp8 q (float8, or uint8
    codes with an fp8 ``kv_cache_dtype``) gives a bfloat16 out, as
    FlashAttention-3 does. ``window_size`` is split into ``window_left`` /
    ``window_right`` (-1: unlimited). Packed (non-paged) K/V: pass
    ``seqused_k = block_table = None`` and ``cu_seqlens_k``.
    """
    out, lse = _attention.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, s_aux=s_aux, k_descale=k_descale, v_descale=v_descale,
        kv_cache_dtype=kv_cache_dtype, return_lse=True, cu_seqlens_k=cu_seqlens_k, q_descale=q_descale,
        k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
    )
    return out, lse


@_fake(flash_attn_varlen_func)
def _(q, k, v, cu_seqlens_q, seqused_k, block_table, softmax_scale=None, causal=True, window_left=-1,
      window_right=-1, softcap=0.0, alibi_slopes=None, s_aux=None, k_descale=None, v_descale=None,
      kv_cache_dtype="auto", cu_seqlens_k=None, q_descale=None, k_scale_cache=None, v_scale_cache=None):
    total_q, heads = q.shape[0], q.shape[1]
    fp8_q = q.dtype in FP8_TORCH_DTYPES.values() or q.dtype == torch.uint8
    out_dtype = torch.bfloat16 if fp8_q else q.dtype
    return q.new_empty(q.shape, dtype=out_dtype), q.new_empty((heads, total_q), dtype=torch.float32)


# ---- fp8 codecs ------------------------------------------------------------------


@torch.library.custom_op("vtinfer::fp8_quantize", mutates_args=(), device_types="cpu")
def fp8_quantize(x: Tensor, scale: float = 1.0, fmt: str = "e4m3") -> Tensor:
    """``encode(x / scale)`` as torch float8 codes (see :func:`vtinfer.fp8_quantize`).

    fmt ``"e4m3"`` gives ``torch.float8_e4m3fn``, ``"e5m2"`` ``torch.float8_e5m2``.
    """
    return _codec.fp8_quantize(x.contiguous(), scale, fmt)


@_fake(fp8_quantize)
def _(x, scale=1.0, fmt="e4m3"):
    return x.new_empty(x.shape, dtype=_fp8_dtype(fmt))


@torch.library.custom_op("vtinfer::fp8_dequantize", mutates_args=(), device_types="cpu")
def fp8_dequantize(codes: Tensor, scale: float = 1.0, fmt: Optional[str] = None,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """``decode(codes) * scale`` in ``dtype`` (see :func:`vtinfer.fp8_dequantize`).

    codes: torch float8 or uint8 (then ``fmt`` names the format, default e4m3).
    """
    return _codec.fp8_dequantize(codes.contiguous(), scale, fmt, dtype)


@_fake(fp8_dequantize)
def _(codes, scale=1.0, fmt=None, dtype=torch.float32):
    return codes.new_empty(codes.shape, dtype=dtype)


# ---- vLLM's cache ops: all write into caller-owned tensors -----------------------


@torch.library.custom_op("vtinfer::swap_blocks", mutates_args=("dst",), device_types="cpu")
def swap_blocks(src: Tensor, dst: Tensor, block_size_in_bytes: int, block_mapping: Tensor) -> None:
    """vLLM's ``swap_blocks``: see :func:`vtinfer.swap_blocks` (block_mapping int64 ``[n, 2]``)."""
    _cache_ops.swap_blocks(src, dst, block_size_in_bytes, block_mapping)


@_fake(swap_blocks)
def _(src, dst, block_size_in_bytes, block_mapping):
    return None


@torch.library.custom_op("vtinfer::convert_fp8", mutates_args=("output",), device_types="cpu")
def convert_fp8(output: Tensor, input: Tensor, scale: float = 1.0, kv_dtype: str = "fp8") -> None:
    """vLLM's ``convert_fp8`` (either direction, by dtype): see :func:`vtinfer.convert_fp8`."""
    _cache_ops.convert_fp8(output, input, scale, kv_dtype)


@_fake(convert_fp8)
def _(output, input, scale=1.0, kv_dtype="fp8"):
    return None


@torch.library.custom_op("vtinfer::gather_and_maybe_dequant_cache", mutates_args=("dst",), device_types="cpu")
def gather_and_maybe_dequant_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor,
                                   token_to_seq: Tensor, num_tokens: int, kv_cache_dtype: str, scale: Tensor,
                                   seq_starts: Optional[Tensor] = None) -> None:
    """vLLM's ``gather_and_maybe_dequant_cache``: see :func:`vtinfer.gather_and_maybe_dequant_cache`."""
    _cache_ops.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                              kv_cache_dtype, scale, seq_starts)


@_fake(gather_and_maybe_dequant_cache)
def _(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale, seq_starts=None):
    return None


@torch.library.custom_op("vtinfer::cp_gather_cache", mutates_args=("dst",), device_types="cpu")
def cp_gather_cache(src_cache: Tensor, dst: Tensor, block_table: Tensor, cu_seq_lens: Tensor, batch_size: int,
                    seq_starts: Optional[Tensor] = None) -> None:
    """vLLM's ``cp_gather_cache`` (bytes copied, codes stay codes): see :func:`vtinfer.cp_gather_cache`."""
    _cache_ops.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)


@_fake(cp_gather_cache)
def _(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
    return None


@torch.library.custom_op("vtinfer::merge_attn_states", mutates_args=("output", "output_lse"), device_types="cpu")
def merge_attn_states(output: Tensor, prefix_output: Tensor, prefix_lse: Tensor, suffix_output: Tensor,
                      suffix_lse: Tensor, output_lse: Optional[Tensor] = None,
                      prefill_tokens_with_context: Optional[int] = None,
                      output_scale: Optional[Tensor] = None) -> None:
    """vLLM's ``merge_attn_states`` (``vllm/_custom_ops.py`` order): see :func:`vtinfer.merge_attn_states`.

    output ``[T, H, D]`` and output_lse float32 ``[H, T]`` are written.
    """
    _cache_ops.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                                 prefill_tokens_with_context, output_scale)


@_fake(merge_attn_states)
def _(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
      prefill_tokens_with_context=None, output_scale=None):
    return None


@torch.library.custom_op("vtinfer::concat_and_cache_mla", mutates_args=("kv_cache",), device_types="cpu")
def concat_and_cache_mla(kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, kv_cache_dtype: str,
                         scale: Tensor, skip_scale: bool = False) -> None:
    """vLLM's ``concat_and_cache_mla`` (auto, fp8, fp8_ds_mla): see :func:`vtinfer.concat_and_cache_mla`."""
    _cache_ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale)


@_fake(concat_and_cache_mla)
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False):
    return None


@torch.library.custom_op("vtinfer::mask_empty_context_lse", mutates_args=("lse",), device_types="cpu")
def mask_empty_context_lse(lse: Tensor, query_start_loc: Tensor, context_start_loc: Tensor) -> None:
    """vLLM's ``mask_empty_context_lse``: see :func:`vtinfer.mask_empty_context_lse`."""
    _cache_ops.mask_empty_context_lse(lse, query_start_loc, context_start_loc)


@_fake(mask_empty_context_lse)
def _(lse, query_start_loc, context_start_loc):
    return None
