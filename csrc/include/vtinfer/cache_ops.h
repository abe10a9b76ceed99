/* vtinfer public C API: vLLM's cache operations on the CPU.
 *
 * Each op takes one plain params struct, checks every argument and every
 * index before it writes a byte, and never allocates. Names in messages
 * are the Python ones (`fn` names the function; NULL: the C name).
 *
 *   swap_blocks        for pair i in order, with Ss / Sd the byte distance between blocks (the
 *                      view's stride(0); B where 0) and B = block_bytes:
 *                        dst[m[i,1]*Sd : m[i,1]*Sd + B] = src[m[i,0]*Ss : m[i,0]*Ss + B]   (bytes)
 *   convert_fp8        float -> codes: code = encode(x / scale) (RNE, saturating; the codec's store rule)
 *                      codes -> float: x = decode(code) * scale (exact decode, float32 product, rounded to dst)
 *                      float -> float: a plain conversion (scale ignored, as vLLM's "auto")
 *   gather_cache       for token t in [0, num_tokens) of sequence b (token_to_seq[t], or the b with
 *                      cu_seq_lens[b] <= t < cu_seq_lens[b+1]), position pos = t - cu_seq_lens[b]
 *                      + seq_starts[b] (0 without seq_starts):
 *                        dst[t] = dequant(src[block_table[b, pos / block_size], pos % block_size]) * scale
 *                      (fp8 codes), or the entry converted/copied (plain dtypes). A t with
 *                      t >= cu_seq_lens[b+1] is skipped (vLLM's padding tokens).
 *   merge_attn_states  per token t and head h, with p = prefix_lse[h, t], s = suffix_lse[h, t], each
 *                      +inf read as -inf (FlashAttention-2's empty row), m = max(p, s):
 *                        t >= prefill_tokens_with_context: out = suffix_out, out_lse = suffix_lse (as read)
 *                        m = -inf:                         out = 0, out_lse = -inf
 *                        otherwise: a = e^(p-m), b = e^(s-m),
 *                          out = prefix_out * a/(a+b) + suffix_out * b/(a+b), out_lse = log(a+b) + m
 *                      computed in float32, rounded to out's dtype (fp8: encode(out / output_scale)).
 *   concat_and_cache_mla  for token t with slot s = slot_mapping[t] >= 0 (negative: skipped), the entry
 *                      e = cache[s / block_size, s % block_size]:
 *                        auto:        e = kv_c[t] ++ k_pe[t]                  (the cache's dtype is the input's)
 *                        fp8 formats: e = encode((kv_c[t] ++ k_pe[t]) / scale)
 *                        fp8_ds_mla (656 bytes; kv_lora_rank 512, pe_dim 64, 16-bit input): per tile j of
 *                          128 kv_c elements, s_j = max(max|x| / 448, FLT_MIN) (float32; a NaN is ignored
 *                          by the max), bytes [128j, 128j + 128) = e4m3(x / s_j); bytes [512, 528) the four
 *                          s_j as float32; bytes [528, 656) k_pe's 64 16-bit values as given.
 *   mask_empty_context_lse  for request r whose context is empty (context_start_loc[r] ==
 *                      context_start_loc[r + 1]): lse[h, t] = -inf for every head h and query token t in
 *                      [query_start_loc[r], query_start_loc[r + 1]). */
#ifndef VTINFER_CACHE_OPS_H
#define VTINFER_CACHE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/dtype.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vt_swap_blocks_params {
    const char *fn;
    /* src: read, src_extent bytes readable from src; dst: written,
     * dst_extent bytes writable from dst. */
    const void *src;
    int64_t src_extent;
    void *dst;
    int64_t dst_extent;
    int64_t block_bytes; /* > 0 */
    /* block_mapping [num_pairs, 2] int64, element strides; read. */
    const int64_t *block_mapping;
    int64_t num_pairs;
    int64_t map_stride_pair, map_stride_col;
    /* Bytes from one block to the next (a view's stride(0) times its
     * element size; vLLM's swap_blocks addresses blocks this way), >= 0;
     * 0 means block_bytes (blocks packed back to back). */
    int64_t src_block_stride, dst_block_stride;
    /* Blocks the src / dst views hold (block ids must be below them as well
     * as inside the extent); 0 means no limit beyond the extent. */
    int64_t src_num_blocks, dst_num_blocks;
} vt_swap_blocks_params;

/* Status: VT_OK; VT_ERR_VALUE (block_bytes <= 0, a negative block stride,
 * NULL pointers); VT_ERR_INDEX (a block id negative, not below the view's
 * block count, or whose bytes end past the extent). Pairs are copied
 * in order (memmove), so chains within one buffer behave as vLLM's
 * sequential copies; threads split each block's bytes, never the order. */
VT_API vt_status vt_swap_blocks(const vt_swap_blocks_params *p, int num_threads, vt_error *err);

typedef struct vt_convert_fp8_params {
    const char *fn;
    const void *src; /* [n] elements of src_dtype, read */
    vt_dtype src_dtype;
    void *dst;       /* [n] elements of dst_dtype, written; must not overlap src */
    vt_dtype dst_dtype;
    size_t n;
    float scale;     /* finite > 0 */
    /* The fp8 format of the code side (VT_DTYPE_FP8_E4M3 / _E5M2). With
     * src and dst both F32/F16/BF16 it is ignored. Codes are passed with
     * src_dtype/dst_dtype = the fp8 format. */
    vt_dtype fmt;
} vt_convert_fp8_params;

/* Status: VT_OK; VT_ERR_TYPE (dtype pair not float<->codes or
 * float<->float, or codes whose format differs from fmt); VT_ERR_VALUE
 * (scale). */
VT_API vt_status vt_convert_fp8(const vt_convert_fp8_params *p, int num_threads, vt_error *err);

typedef struct vt_gather_cache_params {
    const char *fn;
    /* src [num_blocks, block_size, entry_rows, row_len], read. Byte strides;
     * row_len elements contiguous. src_dtype: F32/F16/BF16 or an fp8
     * format (the bytes are codes). */
    const void *src;
    vt_dtype src_dtype;
    int64_t num_blocks, block_size, entry_rows, row_len;
    int64_t src_stride_block, src_stride_tok, src_stride_row;
    /* dst [dst_tokens, entry_rows, row_len], written (rows of tokens that
     * are skipped are not touched). Byte strides; row_len contiguous. */
    void *dst;
    vt_dtype dst_dtype;
    int64_t dst_tokens;
    int64_t dst_stride_tok, dst_stride_row;
    /* Sequences: cu_seq_lens [batch + 1], block_table [batch, max_blocks]
     * (row stride bt_stride elements), seq_starts [batch] or NULL,
     * token_to_seq [num_tokens] or NULL (then every sequence's tokens
     * cu_seq_lens[b] .. cu_seq_lens[b+1]-1 are gathered, as cp_gather_cache
     * does; num_tokens is ignored). All read. */
    int64_t batch;
    const int32_t *cu_seq_lens;
    const int32_t *block_table;
    int64_t max_blocks, bt_stride;
    const int32_t *seq_starts;
    const int32_t *token_to_seq;
    int64_t num_tokens;
    /* Dequantization scale of an fp8 src (one element, finite > 0); NULL
     * means 1. Ignored for plain dtypes. */
    const float *scale;
} vt_gather_cache_params;

/* A plain src must have dst's dtype (the bytes are copied); an fp8 src is
 * decoded to a F32/F16/BF16 dst. Status: VT_OK; VT_ERR_TYPE (dtypes);
 * VT_ERR_VALUE (shapes, cu_seq_lens not non-decreasing from >= 0, a token
 * outside its sequence, a gathered row past dst_tokens, scale);
 * VT_ERR_INDEX (token_to_seq outside [0, batch), a position past the
 * block table row, a block id outside [0, num_blocks)). */
VT_API vt_status vt_gather_cache(const vt_gather_cache_params *p, int num_threads, vt_error *err);

typedef struct vt_merge_attn_params {
    const char *fn;
    int64_t num_tokens, num_heads, head_size;
    /* prefix_output, suffix_output [num_tokens, num_heads, head_size] in
     * in_dtype (F32/F16/BF16), read. Byte strides; head_size contiguous. */
    const void *prefix_output, *suffix_output;
    vt_dtype in_dtype;
    int64_t prefix_stride_tok, prefix_stride_head;
    int64_t suffix_stride_tok, suffix_stride_head;
    /* prefix_lse, suffix_lse [num_heads, num_tokens] float32, element
     * strides, read. */
    const float *prefix_lse, *suffix_lse;
    int64_t prefix_lse_stride_head, prefix_lse_stride_tok;
    int64_t suffix_lse_stride_head, suffix_lse_stride_tok;
    /* output [num_tokens, num_heads, head_size] in out_dtype (F32/F16/BF16,
     * or an fp8 format with output_scale), written; byte strides. */
    void *output;
    vt_dtype out_dtype;
    int64_t out_stride_tok, out_stride_head;
    /* output_lse [num_heads, num_tokens] float32 or NULL, written. */
    float *output_lse;
    int64_t out_lse_stride_head, out_lse_stride_tok;
    /* Tokens [prefill_tokens_with_context, num_tokens) copy the suffix;
     * in [0, num_tokens]. */
    int64_t prefill_tokens_with_context;
    /* One element, finite > 0, for an fp8 output; NULL otherwise. */
    const float *output_scale;
} vt_merge_attn_params;

/* Status: VT_OK; VT_ERR_TYPE (dtypes, fp8 output without output_scale or
 * output_scale with a float output); VT_ERR_VALUE (shapes, NULL pointers,
 * prefill_tokens_with_context out of range, output_scale). */
VT_API vt_status vt_merge_attn_states(const vt_merge_attn_params *p, int num_threads, vt_error *err);

/* The MLA cache formats of concat_and_cache_mla beyond the element ones. */
#define VT_MLA_DS_MLA (-2)                 /* fp8_ds_mla's 656-byte entry */
#define VT_MLA_DS_ENTRY_BYTES 656
#define VT_MLA_DS_RANK 512
#define VT_MLA_DS_PE 64
#define VT_MLA_DS_TILE 128

typedef struct vt_concat_mla_params {
    const char *fn;
    /* kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, pe_dim] in
     * in_dtype (F32/F16/BF16), read; byte distance between tokens; each
     * row contiguous. */
    const void *kv_c, *k_pe;
    vt_dtype in_dtype;
    int64_t kv_c_stride, k_pe_stride;
    int64_t num_tokens, kv_lora_rank, pe_dim;
    /* slot_mapping [num_tokens] int64, element stride; read. */
    const int64_t *slot_mapping;
    int64_t slot_stride;
    /* kv_cache [num_blocks, block_size, entry], written: byte strides of a
     * block and an entry; entry_bytes the bytes of one entry (each entry
     * contiguous). */
    void *kv_cache;
    int64_t num_blocks, block_size, block_stride, entry_stride, entry_bytes;
    /* VT_DTYPE_AUTO (the cache holds in_dtype), VT_DTYPE_FP8_E4M3 /
     * VT_DTYPE_FP8_E5M2 (codes of x / scale), or VT_MLA_DS_MLA. */
    int cache_format;
    /* fp8 formats: finite > 0. Ignored otherwise (fp8_ds_mla computes its
     * tile scales). */
    float scale;
} vt_concat_mla_params;

/* Status: VT_OK; VT_ERR_TYPE (in_dtype, cache_format); VT_ERR_VALUE
 * (fp8_ds_mla geometry, an entry_bytes that is not the entry's, scale,
 * NULL pointers, a negative count); VT_ERR_OVERFLOW (num_blocks *
 * block_size); VT_ERR_INDEX (a slot >= num_blocks * block_size). Nothing
 * is written on error. Tokens are stored in order (a repeated slot keeps
 * the last token). */
VT_API vt_status vt_concat_and_cache_mla(const vt_concat_mla_params *p, vt_error *err);

typedef struct vt_mask_lse_params {
    const char *fn;
    /* lse [num_heads, num_tokens] float32, element strides; written. */
    float *lse;
    int64_t num_heads, num_tokens, stride_head, stride_tok;
    /* query_start_loc, context_start_loc [num_reqs + 1] int32, element
     * strides; read. */
    const int32_t *query_start_loc, *context_start_loc;
    int64_t num_reqs, qsl_stride, csl_stride;
} vt_mask_lse_params;

/* Status: VT_OK; VT_ERR_VALUE (query_start_loc not non-decreasing from
 * >= 0 or past num_tokens, NULL pointers). Nothing is written on error. */
VT_API vt_status vt_mask_empty_context_lse(const vt_mask_lse_params *p, vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_CACHE_OPS_H */
