"""The bad-input table: one row per hostile input across the
whole public API.  Each row asserts the exception type, that the message
names the argument, and that nothing was written (the bytes of every
array, cache and scale the call could have touched are compared before and
after).  Rows run in a child process, one batch per table, so that a crash
cannot take pytest down with it: the child announces each row before
running it, and a row whose verdict never arrives is reported as the
crashing row (the rest of the batch is re-run in a fresh child).
"""

from __future__ import annotations

import functools
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- the rows
# Each row is a function returning (call, exception type, fragment the
# message must contain, watched objects).  Watched: NumPy arrays (their
# bytes) or a PagedKVCache (every layer's K/V bytes and its scales).
# An exception type of None means the call must succeed and write nothing
# (zero-length inputs).


CACHE_ARGS = dict(num_layers=2, num_blocks=4, block_size=4, num_kv_heads=2, head_size=8, dtype="fp8_e4m3")


def _cache(dtype="fp8_e4m3", **kw):
    import vtinfer as vt

    args = {**CACHE_ARGS, "dtype": dtype, **kw}
    c = vt.PagedKVCache(**args)
    rng = np.random.default_rng(0)
    for layer in range(args["num_layers"]):
        c.store(layer, rng.standard_normal((16, 2, 8)).astype(np.float32),
                rng.standard_normal((16, 2, 8)).astype(np.float32), np.arange(16))
    return c


def _kv(n=3):
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, 2, 8)).astype(np.float32), rng.standard_normal((n, 2, 8)).astype(np.float32)


def _flash_caches(dtype=np.uint8):
    rng = np.random.default_rng(2)
    return (rng.integers(0, 100, (4, 4, 2, 8)).astype(dtype), rng.integers(0, 100, (4, 4, 2, 8)).astype(dtype))


def _fake(shape, **kw):
    sys.path.insert(0, str(REPO))
    from tests.binding.dlpack_fake import FakeTensor

    return FakeTensor(shape, **kw)


ROWS: dict[str, object] = {}


def row(fn):
    ROWS[fn.__name__] = fn
    return fn


def table_rows(make, table: dict[str, tuple]) -> None:
    """One row per table entry, in table order: the row named `name` is make(*table[name])."""
    for name, args in table.items():
        ROWS[name] = functools.partial(make, *args)


# --- codecs
@row
def codec_scale_nan():
    import vtinfer as vt
    x = np.ones(4, np.float32)
    return lambda: vt.fp8_quantize(x, scale=float("nan")), ValueError, "scale", [x]


@row
def codec_scale_inf():
    import vtinfer as vt
    x = np.ones(4, np.float32)
    return lambda: vt.fp8_quantize(x, scale=float("inf")), ValueError, "scale", [x]


@row
def codec_scale_zero():
    import vtinfer as vt
    x = np.ones(4, np.float32)
    return lambda: vt.fp8_dequantize(np.zeros(4, np.uint8), scale=0.0), ValueError, "scale", [x]


@row
def codec_scale_negative_out_untouched():
    import vtinfer as vt
    x, out = np.ones(4, np.float32), np.full(4, 7, np.uint8)
    return lambda: vt.fp8_quantize(x, scale=-1.0, out=out), ValueError, "scale", [x, out]


@row
def codec_int_input():
    import vtinfer as vt
    return lambda: vt.fp8_quantize(np.ones(4, np.int32)), TypeError, "x", []


@row
def codec_codes_float():
    import vtinfer as vt
    return lambda: vt.fp8_dequantize(np.ones(4, np.float32)), TypeError, "codes", []


@row
def codec_bad_fmt():
    import vtinfer as vt
    return lambda: vt.fp8_quantize(np.ones(4, np.float32), fmt="e9"), ValueError, "fmt", []


@row
def codec_out_read_only():
    import vtinfer as vt
    out = np.full(4, 9, np.uint8)
    out.flags.writeable = False
    return lambda: vt.fp8_quantize(np.ones(4, np.float32), out=out), ValueError, "out", [out]


@row
def codec_out_wrong_shape():
    import vtinfer as vt
    out = np.full(5, 9, np.uint8)
    return lambda: vt.fp8_quantize(np.ones(4, np.float32), out=out), ValueError, "out", [out]


@row
def codec_dlpack_size_overflows_64_bits():
    import vtinfer as vt
    t = _fake([2**62, 2**62])
    return lambda: vt.fp8_quantize(t), ValueError, "x", []


@row
def codec_zero_length():
    import vtinfer as vt
    x = np.ones(0, np.float32)
    return lambda: vt.fp8_quantize(x), None, "", [x]


# --- PagedKVCache construction and scales
def _cache_args_row(exc, frag, changes: dict):
    """A row: the PagedKVCache of CACHE_ARGS with `changes` in their place must raise exc naming frag."""
    import vtinfer as vt
    return lambda: vt.PagedKVCache(**{**CACHE_ARGS, **changes}), exc, frag, []


# name -> _cache_args_row's exception, message fragment and the arguments that differ from CACHE_ARGS
table_rows(_cache_args_row, {
    "cache_size_overflows_64_bits": (ValueError, "num_blocks", {"num_blocks": 2**60, "block_size": 2**10}),
    "cache_zero_blocks": (ValueError, "num_blocks", {"num_blocks": 0}),
    "cache_k_scale_inf": (ValueError, "k_scale", {"k_scale": float("inf")}),
    "cache_v_scale_zero_per_head": (ValueError, "v_scale", {"v_scale": np.array([[1, 1], [1, 0]], np.float32)}),
    "cache_bad_dtype": (ValueError, "dtype", {"dtype": "int8"}),
})


@row
def cache_set_k_scale_nan_keeps_old():
    c = _cache()
    return lambda: setattr(c, "k_scale", np.float32("nan")), ValueError, "k_scale", [c]


# --- PagedKVCache.store
def _store_row(exc, frag, layer: int, slots: list):
    """A row: storing _kv's 3 tokens into layer `layer` of _cache at `slots` must raise exc naming frag."""
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(layer, k, v, np.array(slots)), exc, frag, [c]


# name -> _store_row's exception, message fragment, layer and slot_mapping
table_rows(_store_row, {
    "store_layer_too_big": (IndexError, "layer", 2, [0, 1, 2]),
    "store_layer_negative": (IndexError, "layer", -1, [0, 1, 2]),
    "store_slot_one_past_end": (IndexError, "slot_mapping", 0, [0, 1, 16]),
    "store_slot_huge": (IndexError, "slot_mapping", 0, [0, 2**62, 1]),
    "store_slot_int64_max_after_negative": (IndexError, "slot_mapping", 0, [-2**63, -1, 2**63 - 1]),
    "store_slot_float": (TypeError, "slot_mapping", 0, [0.0, 1.0, 2.0]),
    # vLLM takes num_tokens from slot_mapping (key may be padded): more slots than tokens is the error
    "store_slot_wrong_length": (ValueError, "slot_mapping", 0, [0, 1, 2, 3]),
})


@row
def store_key_int():
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(0, k.astype(np.int32), v, np.array([0, 1, 2])), TypeError, "key", [c]


@row
def store_key_rank_2():
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(0, k[0], v[0], np.array([0, 1])), ValueError, "key", [c]


@row
def store_key_wrong_head_size():
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(0, k[:, :, :4], v[:, :, :4], np.array([0, 1, 2])), ValueError, "key", [c]


@row
def store_value_token_count():
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(0, k, v[:2], np.array([0, 1, 2])), ValueError, "value", [c]


@row
def store_dlpack_key_overflows():
    c = _cache()
    t = _fake([2**62, 2, 8])
    return lambda: c.store(0, t, t, np.array([0])), ValueError, "key", [c]


@row
def store_zero_tokens():
    c, (k, v) = _cache(), _kv(0)
    return lambda: c.store(0, k, v, np.zeros(0, np.int64)), None, "", [c]


@row
def store_after_release_with_view():
    c, (k, v) = _cache(), _kv()
    view = c.key_cache(0)
    return lambda: c.release(), BufferError, "", [view]


# --- reshape_and_cache_flash
@row
def flash_k_scale_nan():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches()
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 2]), "fp8_e4m3",
                                               np.float32("nan"), np.float32(1)), ValueError, "k_scale", [kc, vc])


@row
def flash_v_scale_zero_per_head():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches()
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 2]), "fp8_e4m3",
                                               np.ones(2, np.float32), np.array([1, 0], np.float32)),
            ValueError, "v_scale", [kc, vc])


@row
def flash_cache_read_only():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches()
    vc.flags.writeable = False
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 2]), "fp8_e4m3", 1.0, 1.0),
            ValueError, "value_cache", [kc, vc])


@row
def flash_bad_kv_cache_dtype():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches()
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 2]), "fp9", 1.0, 1.0),
            ValueError, "kv_cache_dtype", [kc, vc])


@row
def flash_slot_past_end():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches()
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 16]), "fp8_e4m3", 1.0, 1.0),
            IndexError, "slot_mapping", [kc, vc])


@row
def flash_cache_float_for_fp8():
    import vtinfer as vt
    (k, v), (kc, vc) = _kv(), _flash_caches(np.float64)
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, vc, np.array([0, 1, 2]), "fp8_e4m3", 1.0, 1.0),
            TypeError, "key_cache", [kc, vc])


# --- flash_attn_varlen_func
def _attn(**over):
    import vtinfer as vt

    rng = np.random.default_rng(3)
    a = dict(q=rng.standard_normal((3, 4, 8)).astype(np.float32),
             k=rng.standard_normal((4, 4, 2, 8)).astype(np.float32),
             v=rng.standard_normal((4, 4, 2, 8)).astype(np.float32),
             cu_seqlens_q=np.array([0, 1, 3], np.int32), seqused_k=np.array([8, 6], np.int32),
             block_table=np.array([[0, 1], [2, 3]], np.int32), out=np.full((3, 4, 8), 5, np.float32))
    a.update(over)
    q, k, v = a.pop("q"), a.pop("k"), a.pop("v")
    watched = [x for x in (q, k, v, a.get("out")) if isinstance(x, np.ndarray)]
    return (lambda: vt.flash_attn_varlen_func(q, k, v, **a)), watched


def _attn_row(exc, frag, **over):
    call, watched = _attn(**over)
    return call, exc, frag, watched


@row
def attn_block_id_negative():
    return _attn_row(IndexError, "block_table", block_table=np.array([[0, -1], [2, 3]], np.int32))


@row
def attn_block_id_huge():
    return _attn_row(IndexError, "block_table", block_table=np.array([[0, 2**31 - 1], [2, 3]], np.int32))


@row
def attn_block_id_one_past_end():
    return _attn_row(IndexError, "block_table", block_table=np.array([[0, 1], [2, 4]], np.int32))


@row
def attn_seqused_k_negative():
    # non-causal, so the causal "seqused_k >= query count" check cannot answer for the ">= 0" one
    return _attn_row(ValueError, "seqused_k must be >= 0", seqused_k=np.array([-1, 6], np.int32), causal=False)


@row
def attn_seqused_k_huge():
    return _attn_row(ValueError, "seqused_k", seqused_k=np.array([2**31 - 1, 6], np.int32))


@row
def attn_cu_seqlens_decreasing():
    return _attn_row(ValueError, "cu_seqlens_q", cu_seqlens_q=np.array([0, 3, 1], np.int32))


@row
def attn_cu_seqlens_huge_end():
    return _attn_row(ValueError, "cu_seqlens_q", cu_seqlens_q=np.array([0, 1, 2**31 - 1], np.int32))


@row
def attn_cu_seqlens_negative_start():
    return _attn_row(ValueError, "cu_seqlens_q", cu_seqlens_q=np.array([-1, 1, 3], np.int32))


@row
def attn_cu_seqlens_int64():
    return _attn_row(TypeError, "cu_seqlens_q", cu_seqlens_q=np.array([0, 1, 3], np.int64))


@row
def attn_k_descale_nan():
    return _attn_row(ValueError, "k_descale", k=np.zeros((4, 4, 2, 8), np.uint8), v=np.zeros((4, 4, 2, 8), np.uint8),
                     kv_cache_dtype="fp8_e4m3", k_descale=np.float32("nan"))


@row
def attn_v_descale_zero():
    return _attn_row(ValueError, "v_descale", k=np.zeros((4, 4, 2, 8), np.uint8), v=np.zeros((4, 4, 2, 8), np.uint8),
                     kv_cache_dtype="fp8_e4m3", v_descale=np.float32(0))


@row
def attn_q_int():
    return _attn_row(TypeError, "q", q=np.ones((3, 4, 8), np.int32))


@row
def attn_q_rank_2():
    return _attn_row(ValueError, "q", q=np.ones((3, 32), np.float32))


@row
def attn_q_heads_not_multiple():
    return _attn_row(ValueError, "q", q=np.ones((3, 3, 8), np.float32), out=np.full((3, 3, 8), 5, np.float32))


@row
def attn_out_read_only():
    out = np.full((3, 4, 8), 5, np.float32)
    out.flags.writeable = False
    return _attn_row(ValueError, "out", out=out)


@row
def attn_out_non_contiguous():
    return _attn_row(ValueError, "out", out=np.full((3, 4, 16), 5, np.float32)[:, :, ::2])


@row
def attn_softmax_scale_nan():
    return _attn_row(ValueError, "softmax_scale", softmax_scale=float("nan"))


@row
def attn_softcap_inf():
    return _attn_row(ValueError, "softcap", softcap=float("inf"))


@row
def attn_window_below_minus_one():
    return _attn_row(ValueError, "window_size", window_size=(-2, 0))


@row
def attn_s_aux_inf():
    return _attn_row(ValueError, "s_aux", s_aux=np.full(4, np.inf, np.float32))


@row
def attn_bad_kv_cache_dtype():
    return _attn_row(ValueError, "kv_cache_dtype", kv_cache_dtype="fp9")


@row
def attn_dlpack_q_overflows():
    return _attn_row(ValueError, "q", q=_fake([2**62, 2**40, 8]))


@row
def attn_zero_queries():
    return _attn_row(None, "", q=np.ones((0, 4, 8), np.float32), cu_seqlens_q=np.array([0, 0, 0], np.int32),
                     out=np.ones((0, 4, 8), np.float32))


# --- resolver, JSON and checkpoints
def _ckpt(config: bytes, hf_quant: bytes | None = None) -> str:
    d = tempfile.mkdtemp(prefix="vt-bad-")
    Path(d, "config.json").write_bytes(config)
    if hf_quant is not None:
        Path(d, "hf_quant_config.json").write_bytes(hf_quant)
    return d


def _resolve_row(exc, frag, config: bytes, hf_quant: bytes | None = None, flag="auto"):
    import vtinfer as vt
    d = _ckpt(config, hf_quant)
    return lambda: vt.resolve_kv_cache_dtype(flag, d), exc, frag, []


# name -> _resolve_row's exception, message fragment, config.json bytes [, hf_quant_config.json bytes]
table_rows(_resolve_row, {
    "json_bomb_nesting": (ValueError, "config.json", b"[" * 100000),
    "json_bomb_nesting_objects": (ValueError, "config.json", b'{"a":' * 5000 + b"1" + b"}" * 5000),
    "json_non_utf8": (ValueError, "config.json", b'{"a": "\xff\xfe"}'),
    "json_non_utf8_hf_quant_config": (ValueError, "hf_quant_config.json", b"{}", b'{"quant_method": "\xc3\x28"}'),
    "json_overlong_utf8": (ValueError, "config.json", b'{"a": "\xc0\xaf"}'),
    "json_raw_surrogate_bytes": (ValueError, "config.json", b'{"a": "\xed\xa0\x80"}'),
    "json_empty_file": (ValueError, "config.json", b""),
    "json_trailing_garbage": (ValueError, "config.json", b"{} x"),
    "json_huge_integer": (ValueError, "config.json",
                          b'{"quantization_config": {"num_bits": ' + b"9" * 5000 + b"}}"),
    # vLLM raises AttributeError (.get on a list); vtinfer maps it to TypeError (resolve.py docstring)
    "json_quantization_config_not_object": (TypeError, "quantization_config",
                                            b'{"quantization_config": [1, 2]}'),
    "json_unknown_modelopt_algo": (ValueError, "ModelOpt",
                                   b'{"quantization_config": {"producer": {"name": "modelopt"}, '
                                   b'"quantization": {"quant_algo": "INT3"}}}'),
})


@row
def resolve_bad_flag():
    return _resolve_row(ValueError, "kv_cache_dtype", b"{}", flag="fp9")


@row
def resolve_missing_dir():
    import vtinfer as vt
    return lambda: vt.resolve_kv_cache_dtype("auto", "/nonexistent/vt-bad"), FileNotFoundError, "path", []


def _shard(data: bytes) -> str:
    d = tempfile.mkdtemp(prefix="vt-bad-st-")
    p = Path(d, "model.safetensors")
    p.write_bytes(data)
    return str(p)


def _st(header: bytes, body: bytes = b"", declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header + body


def _scales_row(exc, frag, data: bytes):
    import vtinfer as vt
    p = _shard(data)
    return lambda: vt.load_kv_scales([p], 2, 2), exc, frag, []


@row
def safetensors_header_length_huge():
    return _scales_row(ValueError, "header", _st(b"{}", declared=2**63))


@row
def safetensors_header_length_past_eof():
    return _scales_row(ValueError, "header", _st(b"{}", declared=1000))


@row
def safetensors_truncated_length():
    return _scales_row(ValueError, "header", b"\x01\x02")


@row
def safetensors_header_not_json():
    return _scales_row(ValueError, "model.safetensors", _st(b"{not json"))


@row
def safetensors_offsets_past_eof():
    h = json.dumps({"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4000]}})
    return _scales_row(ValueError, "data_offsets", _st(h.encode(), b"\0" * 4))


@row
def safetensors_negative_offsets():
    h = json.dumps({"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [], "data_offsets": [-4, 0]}})
    return _scales_row(ValueError, "data_offsets", _st(h.encode(), b"\0" * 4))


@row
def safetensors_shape_mismatch():
    h = json.dumps({"model.layers.0.self_attn.k_scale": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 4]}})
    return _scales_row(ValueError, "shape", _st(h.encode(), b"\0" * 4))


# --- tensor parallelism, skip layers, per-head scales
def _tp_row(exc, frag, **kw):
    import vtinfer as vt
    from vtinfer.testing.checkpoints import make_modelopt_checkpoint
    d, _ = make_modelopt_checkpoint(tempfile.mkdtemp(prefix="vt-bad-tp-"))
    return lambda: vt.PagedKVCache.from_checkpoint(d, num_blocks=2, **kw), exc, frag, []


@row
def tp_size_not_dividing_heads():
    return _tp_row(ValueError, "must be divisible by tensor parallel size (3)", tensor_parallel_size=3)


@row
def tp_rank_negative():
    return _tp_row(ValueError, "rank must be an int in [0, 2); got -1", tensor_parallel_size=2, rank=-1)


@row
def tp_rank_huge():
    return _tp_row(ValueError, "rank must be an int in [0, 4); got 4", tensor_parallel_size=4, rank=4)


@row
def tp_size_zero():
    return _tp_row(ValueError, "tensor_parallel_size must be a positive int; got 0", tensor_parallel_size=0)


@row
def tp_skip_layers_int():
    return _tp_row(TypeError, "kv_cache_dtype_skip_layers must be a list of str", kv_cache_dtype_skip_layers=[0])


@row
def safetensors_per_head_scale_wrong_count():
    import vtinfer as vt
    from vtinfer.scales import write_safetensors
    d = tempfile.mkdtemp(prefix="vt-bad-ph-")
    p = str(Path(d, "model.safetensors"))
    write_safetensors(p, {"model.layers.0.self_attn.k_scale": np.ones((3, 1, 1), np.float32)})
    return (lambda: vt.load_kv_scales([p], 1, 2, per_head=True, num_heads=4), ValueError,
            "model.layers.0.self_attn.k_scale must hold 2 or 1 element(s)", [])


# --- thread counts beyond C's range, destinations whose blocks alias
@row
def threads_huge_codec():
    import vtinfer as vt
    x, out = np.ones(4, np.float32), np.full(4, 7, np.uint8)
    return lambda: vt.fp8_quantize(x, out=out, num_threads=2**40), ValueError, "num_threads must be <= 2147483647", [out]


@row
def threads_huge_attention():
    return _attn_row(ValueError, "num_threads must be <= 2147483647", num_threads=2**31)


@row
def threads_huge_store():
    c, (k, v) = _cache(), _kv()
    return lambda: c.store(0, k, v, np.array([0, 1, 2]), num_threads=2**70), ValueError, "num_threads", [c]


@row
def store_dest_blocks_alias_as_strided():
    import vtinfer as vt
    from numpy.lib.stride_tricks import as_strided
    kc, vc = np.zeros((4, 4, 2, 8), np.float32), np.zeros((4, 4, 2, 8), np.float32)
    alias = as_strided(kc, shape=kc.shape, strides=(0,) + kc.strides[1:])  # every block is block 0
    k, v = _kv()
    return (lambda: vt.reshape_and_cache_flash(k, v, alias, vc, np.array([0, 5, 9]), "auto", 1.0, 1.0),
            ValueError, "key_cache must not alias itself", [kc, vc])


@row
def store_dest_slots_interleave_as_strided():
    import vtinfer as vt
    from numpy.lib.stride_tricks import as_strided
    kc, vc = np.zeros((4, 4, 2, 8), np.float32), np.zeros((4, 4, 2, 8), np.float32)
    alias = as_strided(vc, shape=vc.shape, strides=(vc.strides[0], 16, 32, 4))  # slots overlap heads
    k, v = _kv()
    return (lambda: vt.reshape_and_cache_flash(k, v, kc, alias, np.array([0, 5, 9]), "auto", 1.0, 1.0),
            ValueError, "value_cache must not alias itself", [kc, vc])


@row
def attn_out_aliases_itself():
    from numpy.lib.stride_tricks import as_strided
    out = np.full((3, 4, 8), 5, np.float32)
    return _attn_row(ValueError, "out must not alias itself",
                     out=as_strided(out, shape=out.shape, strides=(0,) + out.strides[1:]))


# ---------------------------------------------------------------- the child


def _snapshot(objs):
    out = []
    for o in objs:
        if isinstance(o, np.ndarray):
            out.append(o.tobytes())
        elif hasattr(o, "key_cache"):
            parts = [np.asarray(o.k_scale).tobytes(), np.asarray(o.v_scale).tobytes()]
            for layer in range(o.num_layers):
                parts += [o.key_cache(layer).tobytes(), o.value_cache(layer).tobytes()]
            out.append(b"".join(parts))
        else:
            raise TypeError(f"cannot watch {type(o)}")
    return out


def _run_one(name: str) -> dict:
    try:
        call, exc, frag, watched = ROWS[name]()
        before = _snapshot(watched)
    except Exception as e:  # a broken row is a failure of the row, not of the API
        return {"ok": False, "detail": f"setup raised {type(e).__name__}: {e}"}
    try:
        call()
        raised = None
    except Exception as e:
        raised = e
    after = _snapshot(watched)
    problems = []
    if exc is None:
        if raised is not None:
            problems.append(f"expected success, got {type(raised).__name__}: {raised}")
    elif raised is None:
        problems.append(f"expected {exc.__name__}, nothing raised")
    elif not isinstance(raised, exc):
        problems.append(f"expected {exc.__name__}, got {type(raised).__name__}: {raised}")
    elif frag.lower() not in str(raised).lower():
        problems.append(f"message does not name {frag!r}: {raised}")
    if before != after:
        problems.append("something was written: watched bytes changed")
    return {"ok": not problems, "detail": "; ".join(problems) or f"{type(raised).__name__}: {raised}"}


def _child(names: list[str]) -> None:
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        res = _run_one(name)
        res["case"] = name
        print(json.dumps(res), flush=True)


# ---------------------------------------------------------------- pytest side

_RESULTS: dict[str, dict] = {}


def _run_batch() -> None:
    todo = [n for n in ROWS if n not in _RESULTS]
    while todo:
        code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.binding import test_bad_input as t; " \
               f"t._child({todo!r})"
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env,
                           timeout=600)
        started = None
        for line in r.stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                started = msg["start"]
            else:
                _RESULTS[msg["case"]] = msg
                started = None
        if started is not None:  # the child died inside this row
            _RESULTS[started] = {"ok": False, "detail": f"child process died (rc {r.returncode}) in this row: "
                                                        f"{r.stderr.strip()[-1500:]}"}
        elif r.returncode != 0 and any(n not in _RESULTS for n in todo):
            for n in todo:
                _RESULTS.setdefault(n, {"ok": False, "detail": f"child failed (rc {r.returncode}): {r.stderr[-800:]}"})
        todo = [n for n in ROWS if n not in _RESULTS]


# Rows expected to fail, each listed with its reason in .agents/specs/hardening.md (strict: a fix turns them green -> XPASS fails).
KNOWN: dict[str, str] = {}  # row name -> why it is an expected failure (none now)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True))
                                  if n in KNOWN else n for n in ROWS])
def test_bad_input_row(name):
    if name not in _RESULTS:
        _run_batch()
    res = _RESULTS[name]
    assert res["ok"], f"{name}: {res['detail']}"


def test_table_covers_the_issue_list():
    """Every kind of hostile input the issue lists has at least one row."""
    kinds = {"overflows": "64-bit overflow", "negative": "negative index", "huge": "huge index/number",
             "nan": "NaN scale", "inf": "Inf scale", "zero": "zero scale / zero length", "int": "wrong dtype",
             "rank": "wrong rank", "non_contiguous": "non-contiguous", "read_only": "read-only",
             "bomb": "JSON bomb", "utf8": "non-UTF-8", "surrogate": "unpaired surrogate",
             "safetensors": "corrupt safetensors"}
    missing = [v for k, v in kinds.items() if not any(k in n for n in ROWS)]
    assert not missing, missing
