/* vtinfer public C API: vLLM 0.33's slot KV formats (the rows of page_layout VT_PAGE_SLOTS: TurboQuant's
 * turboquant_k8v4, turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc; UltraQuant; Octave; NVFP4): the
 * store and the dequantized read of one packed slot cache. The TurboQuant rules are below; UltraQuant's, Octave's
 * and NVFP4's open their files (csrc/core/kv_store_uq.c, kv_store_octave.c, nvfp4.c).
 *
 * One uint8 slot of vt_dtype_slot_bytes(dtype, D) bytes per (token, KV head), at
 *   cache + block * stride_block + pos * stride_pos + head * stride_head
 * (vLLM's physical [num_blocks, block_size, num_kv_heads, slot] after kv_cache.transpose(1, 2)),
 * holding [key part | value codes | fp16 value scale | fp16 value zero | (pad)]:
 *   key, key_bits 8: the D elements as e4m3fn (nearest even, saturating to +-448);
 *   key, key_bits 3 / 4 ("MSE"): the Lloyd-Max index of each element of the rotated unit key
 *     y = (k / (||k|| + 1e-8)) H (H the Sylvester Hadamard / sqrt(D), D a power of two): the number
 *     of the 2^key_bits - 1 midpoints <= y, packed, then ||k|| as fp16;
 *   value: min / max of the row, scale (max - min) / (2^value_bits - 1) floored at 1e-8, codes
 *     trunc((v - min) / scale + 0.5) clamped, packed, then fp16 scale and fp16 min.
 * Packing: 4-bit byte j = c[2j] | c[2j+1] << 4; 3-bit: per group of 8 elements a 24-bit word
 * sum c[8g+i] << 3i in 3 little-endian bytes, D / 8 groups (a D % 8 tail is not written).
 * Bytes the rules do not write (the pad byte, a 3-bit tail) are left as they were.
 *
 * The codebook (centroids and midpoints, float32) is the caller's: vtinfer computes it in Python
 * (vtinfer/_turboquant.py, vLLM's Lloyd-Max solve in float64, then float32). The rules and their
 * vLLM sources: .agents/specs/kv-formats.md (TurboQuant). C11 + libc; never prints or aborts. Every
 * argument and slot is checked before the first byte is written. */
#ifndef VTINFER_TURBOQUANT_H
#define VTINFER_TURBOQUANT_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/dtype.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The slot cache and the format. */
typedef struct vt_tq_cache {
    int dtype;                   /* a row of page_layout VT_PAGE_SLOTS (VT_DTYPE_TQ_*) */
    int64_t num_blocks, block_size, num_kv_heads, head_size;
    uint8_t *data;               /* slot bytes contiguous; the read only reads */
    int64_t stride_block, stride_pos, stride_head; /* bytes */
    const float *centroids;      /* MSE presets: 2^key_bits ascending float32 (read) */
    const float *midpoints;      /* MSE presets: 2^key_bits - 1 float32, (c[i] + c[i+1]) / 2 (store) */
    int64_t rope_dim;            /* rows with rope_block > 0 (Octave): the model's rotary dims, a multiple of
                                  * rope_block in [0, head_size], which place the 4-bit K codes and size the slot
                                  * (vt_dtype_slot_bytes_rope); other rows ignore it */
    float k_scale, v_scale;      /* rows with global_scale (NVFP4): the layer's K and V scales, finite and > 0;
                                  * other rows ignore them */
} vt_tq_cache;

/* Store num_tokens tokens: key / value [num_tokens, num_kv_heads, head_size] of src_dtype (float32,
 * float16 or bfloat16; widened to float32), last dimension contiguous, token / head strides in
 * bytes; slot_mapping[t] < 0 skips token t. The last duplicate slot wins. */
VT_API vt_status vt_tq_store(const vt_tq_cache *c, int src_dtype, const void *key, int64_t key_stride_token,
                             int64_t key_stride_head, const void *value, int64_t value_stride_token,
                             int64_t value_stride_head, const int64_t *slot_mapping, int64_t num_tokens,
                             vt_error *err);

/* Dequantize the slots slots[0..n): k_out, v_out [n, num_kv_heads, head_size] float32 C-contiguous, on
 * num_threads threads (<= 1: the calling thread; the slots split evenly, so the bytes never depend on it).
 * V = code * float(scale16) + float(zero16). K: key_bits 8 the e4m3 value; MSE presets the key in
 * the rotated basis, float(norm16) * c[index] (norm-correction presets first scale c by
 * 1 / sqrt(sum c^2 + 1e-16), the sum in float32 in element order), as vLLM's dequant kernel; K in
 * the model's basis is K_rot H. Every slot must be in [0, num_blocks * block_size). */
VT_API vt_status vt_tq_gather(const vt_tq_cache *c, const int64_t *slots, int64_t n, float *k_out, float *v_out,
                              int num_threads, vt_error *err);

/* The Lloyd-Max codebook an MSE preset's keys index, as vLLM 0.33 solves it (centroids.py) for N(0, 1 /
 * head_size): centroids [2^key_bits] ascending and midpoints [2^key_bits - 1] (float32 means of neighbouring
 * float32 centroids). The solve is float64 and deterministic (the same bits on every build). VT_ERR_VALUE for
 * a dtype whose row needs no codebook or head_size <= 0. */
VT_API vt_status vt_tq_codebook(int dtype, int64_t head_size, float *centroids, float *midpoints, vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_TURBOQUANT_H */
