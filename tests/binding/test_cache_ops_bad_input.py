"""Bad input to vLLM's cache ops and to attention's vLLM-surface arguments (fp8 q,
q_descale, cu_seqlens_k): an
exception of the right type whose message names the argument, and nothing
written (every output's bytes are compared before and after)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

NB, BS, H, D = 6, 4, 2, 16


def swap_args():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, (NB, BS, H, D), dtype=np.uint8)
    return dict(src=src, dst=np.zeros_like(src), block_size_in_bytes=BS * H * D,
                block_mapping=np.array([[0, 1], [2, 3]], np.int64))


def convert_args():
    return dict(output=np.zeros((3, 8), np.uint8), input=np.ones((3, 8), np.float32), scale=0.5, kv_dtype="fp8")


def gather_args():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 100, (NB, BS, H, D), dtype=np.uint8)
    cu = np.array([0, 3, 7], np.int32)
    return dict(src_cache=src, dst=np.zeros((7, H, D), np.float32), block_table=np.array([[0, 1], [2, 3]], np.int32),
                cu_seq_lens=cu, token_to_seq=np.array([0, 0, 0, 1, 1, 1, 1], np.int32), num_tokens=7,
                kv_cache_dtype="fp8", scale=1.0)


def cp_args():
    a = gather_args()
    for key in ("token_to_seq", "num_tokens", "kv_cache_dtype", "scale"):
        del a[key]
    a["dst"] = np.zeros((7, H, D), np.uint8)
    a["batch_size"] = 2
    return a


def merge_args():
    rng = np.random.default_rng(2)
    T = 5
    return dict(output=np.zeros((T, H, D), np.float32), prefix_output=rng.standard_normal((T, H, D)).astype(np.float32),
                prefix_lse=np.zeros((H, T), np.float32), suffix_output=rng.standard_normal((T, H, D)).astype(np.float32),
                suffix_lse=np.zeros((H, T), np.float32), output_lse=np.zeros((H, T), np.float32))


def mla_args():
    rng = np.random.default_rng(4)
    T = 3
    return dict(kv_c=rng.standard_normal((T, 512)).astype(ml_dtypes.bfloat16),
                k_pe=rng.standard_normal((T, 64)).astype(ml_dtypes.bfloat16),
                kv_cache=np.zeros((NB, BS, 656), np.uint8), slot_mapping=np.array([0, 5, 9], np.int64),
                kv_cache_dtype="fp8_ds_mla", scale=1.0)


def mla_fp8_args():
    a = mla_args()
    a.update(kv_cache=np.zeros((NB, BS, 576), np.uint8), kv_cache_dtype="fp8", scale=0.5)
    return a


def mask_args():
    return dict(lse=np.zeros((H, 7), np.float32), query_start_loc=np.array([0, 3, 7], np.int32),
                context_start_loc=np.array([0, 0, 4], np.int32))


FNS = {
    "mla": (vt.concat_and_cache_mla, mla_args, ("kv_cache",)),
    "mla8": (vt.concat_and_cache_mla, mla_fp8_args, ("kv_cache",)),
    "mask": (vt.mask_empty_context_lse, mask_args, ("lse",)),
    "swap": (vt.swap_blocks, swap_args, ("dst",)),
    "convert": (vt.convert_fp8, convert_args, ("output",)),
    "gather": (vt.gather_and_maybe_dequant_cache, gather_args, ("dst",)),
    "cp": (vt.cp_gather_cache, cp_args, ("dst",)),
    "merge": (vt.merge_attn_states, merge_args, ("output", "output_lse")),
}

U8 = np.zeros((NB, BS, H, D), np.uint8)
CASES = [
    # swap_blocks
    ("swap", "block_past_src", dict(block_mapping=np.array([[0, 1], [NB, 2]], np.int64)), IndexError,
     r"block_mapping\[1\]\[0\]"),
    ("swap", "block_past_dst", dict(block_mapping=np.array([[0, NB]], np.int64)), IndexError, r"block_mapping\[0\]\[1\]"),
    ("swap", "block_negative", dict(block_mapping=np.array([[-1, 0]], np.int64)), IndexError, r"block_mapping\[0\]\[0\]"),
    ("swap", "mapping_int32", dict(block_mapping=np.array([[0, 1]], np.int32)), TypeError, "block_mapping"),
    ("swap", "mapping_shape", dict(block_mapping=np.array([[0, 1, 2]], np.int64)), ValueError, "block_mapping"),
    ("swap", "block_bytes_zero", dict(block_size_in_bytes=0), ValueError, "block_size_in_bytes"),
    ("swap", "block_bytes_float", dict(block_size_in_bytes=8.0), TypeError, "block_size_in_bytes"),
    ("swap", "dst_readonly", dict(dst=np.broadcast_to(np.zeros((1, BS, H, D), np.uint8), (NB, BS, H, D))),
     ValueError, "dst"),
    ("swap", "src_list", dict(src=[[1, 2]]), TypeError, "src"),
    # a view's blocks are stride(0) bytes apart (vLLM's addressing): what that cannot describe is refused
    ("swap", "block_bytes_past_block_stride", dict(src=np.zeros((NB, 2, 32), np.uint8)[:, 1],
                                                   dst=np.zeros((NB, 2, 32), np.uint8)[:, 1], block_size_in_bytes=65),
     ValueError, "block_size_in_bytes must be <= src's block stride"),
    ("swap", "src_blocks_with_gaps", dict(src=np.zeros((NB, BS, H, 2 * D), np.uint8)[..., ::2]), ValueError,
     "src must have each block's elements in one run"),
    ("swap", "dst_blocks_with_gaps", dict(dst=np.zeros((NB, BS, 2 * H, D), np.uint8)[:, :, ::2]), ValueError,
     "dst must have each block's elements in one run"),
    ("swap", "src_0d", dict(src=np.zeros((), np.uint8)), ValueError, "src must have >= 1 dimension"),
    ("swap", "block_past_the_view_inside_its_allocation", dict(src=np.zeros((NB, BS, H, D), np.uint8)[:2]),
     IndexError, r"block_mapping\[1\]\[0\] must be in \[0, 2\)"),
    ("swap", "dst_empty_view_of_an_allocation", dict(dst=np.zeros((NB, BS, H, D), np.uint8)[:0]), IndexError,
     r"block_mapping\[0\]\[1\]"),
    # convert_fp8
    ("convert", "shape", dict(input=np.ones((3, 9), np.float32)), ValueError, "input"),
    ("convert", "both_codes", dict(input=np.ones((3, 8), np.uint8)), TypeError, "output and input"),
    ("convert", "scale_zero", dict(scale=0.0), ValueError, "scale"),
    ("convert", "scale_nan", dict(scale=float("nan")), ValueError, "scale"),
    ("convert", "kv_dtype_unknown", dict(kv_dtype="int8"), ValueError, "kv_dtype"),
    ("convert", "kv_dtype_auto_codes", dict(kv_dtype="auto"), TypeError, "kv_dtype"),
    ("convert", "float8_kind", dict(output=np.zeros((3, 8), ml_dtypes.float8_e5m2)), TypeError, "output"),
    ("convert", "input_float64", dict(input=np.ones((3, 8))), TypeError, "input"),
    ("convert", "output_strided", dict(output=np.zeros((3, 16), np.uint8)[:, ::2]), ValueError, "output"),
    # gather_and_maybe_dequant_cache
    ("gather", "block_id", dict(block_table=np.array([[0, 1], [NB, 3]], np.int32)), IndexError, r"block_table\[1, 0\]"),
    ("gather", "table_narrow", dict(block_table=np.zeros((2, 0), np.int32)), IndexError, "block_table"),
    ("gather", "token_to_seq_range", dict(token_to_seq=np.array([0, 0, 0, 1, 1, 1, 2], np.int32)), IndexError,
     r"token_to_seq\[6\]"),
    ("gather", "token_before_its_seq", dict(token_to_seq=np.array([1, 0, 0, 1, 1, 1, 1], np.int32)), ValueError,
     r"token_to_seq\[0\]"),
    ("gather", "token_to_seq_short", dict(num_tokens=8), ValueError, "token_to_seq"),
    ("gather", "cu_decreasing", dict(cu_seq_lens=np.array([0, 5, 3], np.int32)), ValueError, "cu_seq_lens"),
    ("gather", "cu_int64", dict(cu_seq_lens=np.array([0, 3, 7], np.int64)), TypeError, "cu_seq_lens"),
    ("gather", "dst_entry", dict(dst=np.zeros((7, H, D + 1), np.float32)), ValueError, "dst"),
    ("gather", "dst_short", dict(dst=np.zeros((6, H, D), np.float32)), ValueError, "dst"),
    ("gather", "dst_codes", dict(dst=np.zeros((7, H, D), np.uint8)), TypeError, "dst"),
    ("gather", "auto_dtype_mismatch", dict(kv_cache_dtype="auto"), TypeError, "dst"),
    ("gather", "fp8_float_cache", dict(src_cache=np.zeros((NB, BS, H, D), np.float32)), TypeError, "src_cache"),
    ("gather", "scale_negative", dict(scale=-1.0), ValueError, "scale"),
    ("gather", "scale_two", dict(scale=np.ones(2, np.float32)), TypeError, "scale"),
    ("gather", "kv_cache_dtype", dict(kv_cache_dtype="fp4"), ValueError, "kv_cache_dtype"),
    ("gather", "seq_starts_negative", dict(seq_starts=np.array([-1, 0], np.int32)), ValueError, r"seq_starts\[0\]"),
    ("gather", "seq_starts_past_table", dict(seq_starts=np.array([0, 5], np.int32)), IndexError, "block_table"),
    ("gather", "src_rank", dict(src_cache=np.zeros((NB, BS), np.uint8)), ValueError, "src_cache"),
    ("gather", "num_tokens_negative", dict(num_tokens=-1), ValueError, "num_tokens"),
    # cp_gather_cache
    ("cp", "dtype_mismatch", dict(dst=np.zeros((7, H, D), np.float32)), TypeError, "dst"),
    ("cp", "batch_size_big", dict(batch_size=3), ValueError, "cu_seq_lens"),
    ("cp", "seq_starts_short", dict(seq_starts=np.array([0], np.int32)), ValueError, "seq_starts"),
    ("cp", "block_id", dict(block_table=np.array([[-1, 1], [2, 3]], np.int32)), IndexError, r"block_table\[0, 0\]"),
    # merge_attn_states
    ("merge", "prefix_shape", dict(prefix_output=np.zeros((5, H, D + 1), np.float32)), ValueError, "prefix_output"),
    ("merge", "lse_shape", dict(suffix_lse=np.zeros((5, H), np.float32)), ValueError, "suffix_lse"),
    ("merge", "lse_float16", dict(prefix_lse=np.zeros((H, 5), np.float16)), TypeError, "prefix_lse"),
    ("merge", "dtypes_differ", dict(suffix_output=np.zeros((5, H, D), np.float16)), TypeError, "suffix_output"),
    ("merge", "ptc_big", dict(prefill_tokens_with_context=6), ValueError, "prefill_tokens_with_context"),
    ("merge", "ptc_negative", dict(prefill_tokens_with_context=-1), ValueError, "prefill_tokens_with_context"),
    ("merge", "fp8_no_scale", dict(output=np.zeros((5, H, D), ml_dtypes.float8_e4m3fn)), TypeError, "output_scale"),
    ("merge", "scale_float_out", dict(output_scale=0.5), TypeError, "output"),
    ("merge", "output_lse_rank", dict(output_lse=np.zeros(5, np.float32)), ValueError, "output_lse"),
    ("merge", "output_int", dict(output=np.zeros((5, H, D), np.int32)), TypeError, "output"),
    # concat_and_cache_mla: fp8_ds_mla's geometry, element formats, slots
    ("mla", "ds_rank_256", dict(kv_c=np.zeros((3, 256), ml_dtypes.bfloat16)), ValueError, "kv_lora_rank must be 512"),
    ("mla", "ds_pe_32", dict(k_pe=np.zeros((3, 32), ml_dtypes.bfloat16)), ValueError, "pe_dim 64"),
    ("mla", "ds_float32_input", dict(kv_c=np.zeros((3, 512), np.float32), k_pe=np.zeros((3, 64), np.float32)),
     TypeError, "float16 or bfloat16 for kv_cache_dtype 'fp8_ds_mla'"),
    ("mla", "ds_entry_576", dict(kv_cache=np.zeros((NB, BS, 576), np.uint8)), ValueError, "656 bytes"),
    ("mla", "ds_cache_float8", dict(kv_cache=np.zeros((NB, BS, 656), ml_dtypes.float8_e4m3fn)), TypeError,
     "kv_cache must be uint8"),
    ("mla", "slot_past_cache", dict(slot_mapping=np.array([0, NB * BS, 1], np.int64)), IndexError,
     r"slot_mapping\[1\] must be < num_blocks \* block_size = 24"),
    ("mla", "slot_int32", dict(slot_mapping=np.array([0, 1, 2], np.int32)), TypeError, "slot_mapping"),
    ("mla", "slots_more_than_rows", dict(slot_mapping=np.arange(4, dtype=np.int64)), ValueError,
     "at least slot_mapping.shape"),
    ("mla", "k_pe_dtype", dict(k_pe=np.zeros((3, 64), np.float16)), TypeError, "k_pe must have kv_c's dtype"),
    ("mla", "kv_cache_dtype_unknown", dict(kv_cache_dtype="nvfp4_ds_mla"), ValueError, "'fp8_ds_mla'; got"),
    ("mla", "kv_cache_dtype_not_str", dict(kv_cache_dtype=8), TypeError, "kv_cache_dtype must be a str"),
    ("mla", "cache_strided_entries", dict(kv_cache=np.zeros((NB, BS, 1312), np.uint8)[..., ::2]), ValueError,
     "kv_cache must have a contiguous last dimension"),
    ("mla", "cache_readonly", dict(kv_cache=np.broadcast_to(np.zeros((1, BS, 656), np.uint8), (NB, BS, 656))),
     ValueError, "kv_cache"),
    ("mla", "skip_scale_int", dict(skip_scale=1), TypeError, "skip_scale must be a bool"),
    ("mla", "scale_zero", dict(scale=0.0), ValueError, "scale"),
    ("mla8", "entry_not_rank_plus_pe", dict(kv_cache=np.zeros((NB, BS, 577), np.uint8)), ValueError,
     "kv_lora_rank \\+ pe_dim = 576"),
    ("mla8", "auto_cache_other_dtype", dict(kv_cache_dtype="auto"), TypeError, "kv_cache must have kv_c's dtype"),
    ("mla8", "e5m2_reads_e4m3_cache", dict(kv_cache=np.zeros((NB, BS, 576), ml_dtypes.float8_e4m3fn),
                                            kv_cache_dtype="fp8_e5m2"), TypeError, "kv_cache"),
    ("mla8", "float_cache_for_fp8", dict(kv_cache=np.zeros((NB, BS, 576), np.float32)), TypeError,
     "fp8 codes"),
    # mask_empty_context_lse
    ("mask", "qsl_decreasing", dict(query_start_loc=np.array([0, 5, 3], np.int32)), ValueError,
     r"query_start_loc\[2\] = 3 after 5"),
    ("mask", "qsl_past_tokens", dict(query_start_loc=np.array([0, 3, 8], np.int32)), ValueError,
     "at most lse.shape\\[1\\] = 7"),
    ("mask", "qsl_negative", dict(query_start_loc=np.array([-1, 3, 7], np.int32)), ValueError, "query_start_loc"),
    ("mask", "lengths_differ", dict(context_start_loc=np.array([0, 0], np.int32)), ValueError,
     "num_reqs \\+ 1"),
    ("mask", "lse_float64", dict(lse=np.zeros((H, 7))), TypeError, "lse"),
    ("mask", "qsl_int64", dict(query_start_loc=np.array([0, 3, 7], np.int64)), TypeError, "query_start_loc"),
]


@pytest.mark.parametrize("fn_key,name,over,exc,frag", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input_names_the_argument_and_writes_nothing(fn_key, name, over, exc, frag):
    fn, make, outs = FNS[fn_key]
    a = make()
    a.update(over)
    before = {k: np.array(a[k], copy=True) for k in outs if isinstance(a.get(k), np.ndarray)}
    with pytest.raises(exc, match=frag):
        fn(**a)
    for k, b in before.items():
        assert np.array_equal(np.asarray(a[k]).view(np.uint8), b.view(np.uint8)), f"{k} was written"


@pytest.mark.parametrize("fn_key", sorted(FNS))
def test_good_calls_run(fn_key):
    fn, make, _ = FNS[fn_key]
    fn(**make())


def attn_args():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    k = rng.standard_normal((NB, BS, 2, 16)).astype(np.float32)
    return dict(q=q, k=k, v=k.copy(), cu_seqlens_q=np.array([0, 1, 3], np.int32), seqused_k=np.array([5, 4], np.int32),
                block_table=np.array([[0, 1], [2, 3]], np.int32))


ATTN_CASES = [
    ("cu_k_with_seqused", dict(cu_seqlens_k=np.array([0, 5, 9], np.int32)), ValueError, "cu_seqlens_k"),
    ("table_without_seqused", dict(seqused_k=None), TypeError, "seqused_k"),
    ("nothing_for_k", dict(seqused_k=None, block_table=None), TypeError, "cu_seqlens_k"),
    ("cu_k_length", dict(seqused_k=None, block_table=None, cu_seqlens_k=np.array([0, 5], np.int32),
                         k=np.zeros((9, 2, 16), np.float32), v=np.zeros((9, 2, 16), np.float32)), ValueError,
     "cu_seqlens_k"),
    ("cu_k_past_k", dict(seqused_k=None, block_table=None, cu_seqlens_k=np.array([0, 5, 10], np.int32),
                         k=np.zeros((9, 2, 16), np.float32), v=np.zeros((9, 2, 16), np.float32)), ValueError,
     "cu_seqlens_k"),
    ("cu_k_int64", dict(seqused_k=None, block_table=None, cu_seqlens_k=np.array([0, 5, 9], np.int64),
                        k=np.zeros((9, 2, 16), np.float32), v=np.zeros((9, 2, 16), np.float32)), TypeError,
     "cu_seqlens_k"),
    ("uint8_q_no_format", dict(q=np.zeros((3, 4, 16), np.uint8)), TypeError, "q_dtype"),
    ("q_dtype_unknown", dict(q=np.zeros((3, 4, 16), np.uint8), q_dtype="int8"), ValueError, "q_dtype"),
    ("q_dtype_float_q", dict(q_dtype="fp8"), TypeError, "q_dtype"),
    ("q_dtype_kind", dict(q=np.zeros((3, 4, 16), ml_dtypes.float8_e5m2), q_dtype="fp8_e4m3"), TypeError, "q_dtype"),
    ("q_descale_shape", dict(q=np.zeros((3, 4, 16), ml_dtypes.float8_e4m3fn), q_descale=np.ones((3, 2), np.float32)),
     ValueError, "q_descale"),
    ("q_descale_zero", dict(q=np.zeros((3, 4, 16), ml_dtypes.float8_e4m3fn), q_descale=0.0), ValueError, "q_descale"),
    ("fp8_q_float_out", dict(q=np.zeros((3, 4, 16), ml_dtypes.float8_e4m3fn), out=np.zeros((3, 4, 16), np.float32)),
     TypeError, "out"),
]


@pytest.mark.parametrize("name,over,exc,frag", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_attention_bad_input_names_the_argument(name, over, exc, frag):
    a = attn_args()
    a.update(over)
    a = {k: v for k, v in a.items() if v is not None}
    out = a.get("out")
    before = None if out is None else out.copy()
    with pytest.raises(exc, match=frag):
        vt.flash_attn_varlen_func(**a)
    if before is not None:
        assert np.array_equal(out, before)
