/* vtinfer public C API: paged attention on the CPU (decode and varlen
 * prefill over block tables), with the meaning of vLLM's FlashAttention
 * backend (`flash_attn_varlen_func`).
 *
 * One plain params struct is the kernel ABI. The caller owns every array;
 * the kernels never allocate: scratch comes from the caller, sized by
 * vt_attn_scratch_size for the same params and thread count.
 *
 * Semantics, per sequence b with q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]
 * queries and k_len = seqused_k[b] keys, query i at key position
 * p = k_len - q_len + i (bottom-right alignment):
 *   s_j   = (q . K_j) * softmax_scale * k_descale[b, g]   (K_j decoded exactly)
 *   s_j   = softcap * tanh(s_j / softcap)                  when softcap > 0
 *   s_j  += -alibi_slopes[h] * |j - p|                     when alibi_slopes
 *   key j is visible iff (!causal || j <= p), (window_left < 0 || j >= p - window_left),
 *                        (window_right < 0 || j <= p + window_right)
 *   out   = sum_j e^{s_j} V_j * v_descale[b, g] / (sum_j e^{s_j} + e^{s_aux[h]})
 *   lse   = log(sum_j e^{s_j} + e^{s_aux[h]})   (-inf and out = 0 for a row with nothing)
 * Edges: a row whose q holds a NaN and that sees at least one key gets NaN
 * (out and lse). The logit multiplier softmax_scale * k_descale and every
 * logit saturate at +-FLT_MAX, so a scale near float32's range never turns
 * a finite result into NaN (keys whose logits saturate tie).
 * Head h reads KV head g = h / (num_heads / num_kv_heads). Accumulation is
 * float32; out is written in q's dtype (nearest even). */
#ifndef VTINFER_ATTENTION_H
#define VTINFER_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/dtype.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vt_attn_params {
    /* q [total_q, num_heads, head_size], read. Element strides in BYTES;
     * the head_size dimension is contiguous. */
    const void *q;
    vt_dtype q_dtype; /* F32, F16 or BF16 */
    int64_t total_q;
    int64_t q_stride_tok, q_stride_head;

    /* Paged caches [num_blocks, block_size, num_kv_heads, head_size] by
     * strides (NHD, HND or any permutation of the first three dims), read.
     * Byte strides; head_size contiguous. kv_dtype F32/F16/BF16 or an fp8
     * format (the bytes are codes). */
    const void *k, *v;
    vt_dtype kv_dtype;
    int64_t num_blocks, block_size;
    int64_t k_stride_block, k_stride_tok, k_stride_head;
    int64_t v_stride_block, v_stride_tok, v_stride_head;
    int num_heads, num_kv_heads, head_size;

    /* Sequences: cu_seqlens_q [batch + 1], seqused_k [batch], block_table
     * [batch, max_blocks] with row stride bt_stride (elements), read. */
    int batch;
    const int32_t *cu_seqlens_q;
    const int32_t *seqused_k;
    const int32_t *block_table;
    int64_t max_blocks, bt_stride;

    float softmax_scale; /* finite */
    int causal;          /* 0 or 1 */
    int window_left, window_right; /* -1: unlimited */
    float softcap;       /* 0: off; else finite > 0 */
    const float *alibi_slopes; /* [num_heads] or NULL, finite */
    const float *s_aux;        /* [num_heads] or NULL: sink logits, finite */

    /* Descales (K/V dequantization scales), finite > 0, or NULL for 1.
     * Element (b, g) is at descale[b * stride_b + g * stride_h]: per-tensor
     * strides (0, 0), per KV head (0, 1), per sequence and KV head
     * (num_kv_heads, 1). */
    const float *k_descale, *v_descale;
    int64_t k_descale_stride_b, k_descale_stride_h;
    int64_t v_descale_stride_b, v_descale_stride_h;

    /* out [total_q, num_heads, head_size] in q_dtype, written (rows of q
     * outside [cu_seqlens_q[0], cu_seqlens_q[batch]) are not touched).
     * Byte strides; head_size contiguous. Must not overlap the inputs. */
    void *out;
    int64_t out_stride_tok, out_stride_head;
    /* lse [num_heads, total_q] float32 (FlashAttention's layout), element
     * strides; NULL: not computed. */
    float *lse;
    int64_t lse_stride_head, lse_stride_tok;

    /* Per-token-head caches only (kv_dtype whose table row has scale_kind
     * VT_SCALE_TOKEN_HEAD: int8 or e4m3 codes): the float32 scale of the key
     * in slot (block, offset) of KV head g is at k_scale_cache +
     * block*ks_stride_block + offset*ks_stride_tok + g*ks_stride_head (bytes),
     * V's likewise (vLLM's [num_blocks, block_size, num_kv_heads] scale
     * caches, any strides). K_j = code_j * ks_j folds into the logit,
     * s_j = (q . code_j) * (softmax_scale * ks_j); V_j = code_j * vs_j folds
     * into the weight, out = sum_j (e^{s_j} vs_j) code_j / (sum_j e^{s_j} + ...)
     * (vLLM's triton_unified_attention). k_descale/v_descale must be NULL. */
    const void *k_scale_cache, *v_scale_cache;
    int64_t ks_stride_block, ks_stride_tok, ks_stride_head;
    int64_t vs_stride_block, vs_stride_tok, vs_stride_head;

    /* Slot formats only (kv_dtype whose row has read_family VT_READ_SLOTS: TurboQuant, UltraQuant, Octave):
     * k and v both point at the uint8 slot cache [num_blocks, block_size, num_kv_heads, slot_bytes] (k's
     * strides are used), each slot holding one (token, KV head)'s K and V. q is in the model's basis: the read
     * puts each query row in the key basis the row names (key_basis HADAMARD: q H / sqrt(D), the butterflies in
     * double rounded once to float32) and applies the row's query rounding (query_dtype); the output is in V's
     * basis (the model's). slot_rope_dim: the rotary dims of rows with rope_block > 0 (Octave),
     * ignored otherwise; slot_centroids: an MSE preset's 2^key_bits centroids, NULL for the core's own
     * (vt_tq_codebook, solved once per (dtype, head size)). Descales and scale caches must be NULL. */
    int64_t slot_rope_dim;
    const float *slot_centroids;
} vt_attn_params;

/* Bytes of scratch vt_attn_varlen needs for `p` and `num_threads`
 * (<= 0: one thread); reads the index arrays (they must be valid: the
 * size of an invalid call is whatever vt_attn_varlen refuses anyway).
 * Status: VT_OK; VT_ERR_VALUE / VT_ERR_INDEX / VT_ERR_TYPE as
 * vt_attn_varlen; VT_ERR_OVERFLOW when the size overflows. */
VT_API vt_status vt_attn_scratch_size(const vt_attn_params *p, int num_threads, size_t *bytes, vt_error *err);

/* Run attention. `scratch` holds at least vt_attn_scratch_size bytes
 * (64-byte aligned is best; any alignment of 4 works), owned by the
 * caller, contents undefined on return.
 * Every argument is checked before anything is written. Status: VT_OK;
 * VT_ERR_TYPE (a dtype is not allowed); VT_ERR_VALUE (shapes, heads not
 * divisible, cu_seqlens_q not non-decreasing from >= 0 or past total_q,
 * seqused_k negative or beyond the blocks the table gives, more queries
 * than keys in a causal sequence, a scale/softcap/slope/sink not finite or
 * a descale not > 0, scratch too small); VT_ERR_INDEX (a block id outside
 * [0, num_blocks)). Argument names in messages are the Python ones. */
VT_API vt_status vt_attn_varlen(const vt_attn_params *p, void *scratch, size_t scratch_bytes, int num_threads,
                                vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_ATTENTION_H */
