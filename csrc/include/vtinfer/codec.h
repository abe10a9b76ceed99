/* vtinfer public C API: float8 / bfloat16 / float16 codecs.
 *
 * Store semantics are vLLM's CUDA path (__nv_cvt_float_to_fp8 with
 * __NV_SATFINITE): code = encode(x / scale) with a true float32 division,
 * round to nearest even, |v| beyond max finite (and +-inf) saturate to
 * +-max finite, -0.0 keeps its sign, tiny values round into the subnormal
 * grid (e4m3fn 2^-9, e5m2 2^-16). A NaN becomes the canonical NaN 0x7F: the
 * CUDA conversion canonicalises every NaN input to positive before
 * encoding, so the sign of a NaN is not kept.
 * Read semantics: decode(code) * scale in float32; decode is exact for all
 * 256 codes (0x7F/0xFF decode to NaN in e4m3fn; e5m2 has +-inf and NaNs). */
#ifndef VTINFER_CODEC_H
#define VTINFER_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/dtype.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- scalar codecs (always compiled, the reference twins) ---- */
VT_API uint8_t vt_fp8_e4m3_from_f32(float x);
VT_API uint8_t vt_fp8_e5m2_from_f32(float x);
VT_API float vt_fp8_e4m3_to_f32(uint8_t code);
VT_API float vt_fp8_e5m2_to_f32(uint8_t code);
VT_API uint16_t vt_bf16_from_f32(float x); /* round to nearest even, NaN stays quiet NaN */
VT_API float vt_bf16_to_f32(uint16_t h);
VT_API uint16_t vt_f16_from_f32(float x);  /* IEEE binary16, round to nearest even */
VT_API float vt_f16_to_f32(uint16_t h);

/* The 256-entry decode table of an fp8 dtype (NULL for other dtypes). */
VT_API const float *vt_fp8_decode_table(vt_dtype fmt);

/* ---- bulk codecs ----
 * vt_fp8_quantize: src  [n] elements of src_dtype (F32, F16 or BF16), read;
 *                  dst  [n] bytes, written; scale finite and > 0;
 *                  fmt  VT_DTYPE_FP8_E4M3 or VT_DTYPE_FP8_E5M2.
 * vt_fp8_dequantize: src [n] codes, read; dst [n] elements of dst_dtype
 *                  (F32, F16 or BF16), written.
 * num_threads <= 0 means one thread. The arrays must not overlap.
 * Status: VT_OK; VT_ERR_VALUE (scale not finite and > 0, NULL pointer with
 * n > 0); VT_ERR_TYPE (dtype not allowed). Nothing is written on error. */
VT_API vt_status vt_fp8_quantize(const void *src, vt_dtype src_dtype, uint8_t *dst, size_t n,
                                 float scale, vt_dtype fmt, int num_threads, vt_error *err);
VT_API vt_status vt_fp8_dequantize(const uint8_t *src, vt_dtype fmt, void *dst, vt_dtype dst_dtype,
                                   size_t n, float scale, int num_threads, vt_error *err);

/* Plain conversion between F32/F16/BF16 (same dtype: a copy). Same
 * conventions as above. */
VT_API vt_status vt_convert(const void *src, vt_dtype src_dtype, void *dst, vt_dtype dst_dtype,
                            size_t n, int num_threads, vt_error *err);

/* ---- row kernels of the active ISA, for other kernels (store, attention) ----
 * Each converts n contiguous elements; no checks, no threads. Pointers are
 * chosen once by vt_runtime_init/vt_isa_set and stay valid for the life of
 * the process. Index [s] of quant/convert/dequant is a float dtype
 * F32/F16/BF16 (0..2); [f] is 0 for e4m3, 1 for e5m2. */
typedef void (*vt_quant_row_fn)(const void *src, uint8_t *dst, size_t n, float scale);
typedef void (*vt_dequant_row_fn)(const uint8_t *src, void *dst, size_t n, float scale);
typedef void (*vt_convert_row_fn)(const void *src, void *dst, size_t n);
/* x[n] in place: per block of `block` elements (a power of two dividing n) the Walsh-Hadamard butterflies
 * (strides 1, 2, 4, ..: y[i] = a + c, y[i + h] = a - c in float32), then each element times
 * float32(1 / sqrt(block)): Octave's rotation (its sign flips aside). */
typedef void (*vt_fwht_row_fn)(float *x, size_t n, size_t block);
/* out[i] = levels[code i] for n codes (a multiple of 8) of 4 bits at src: per 8 codes a 4-byte word whose byte j
 * holds code j (low nibble) and code j + 4 (high); levels has 16 entries. Octave's 4-bit packing. */
typedef void (*vt_levels4_row_fn)(const uint8_t *src, size_t n, const float *levels, float *out);
/* out[i] = levels[code i] for n codes (a multiple of 32) of 3 bits in two planes: code 32w + 4i + j has its low
 * two bits at bits 2i..2i+1 of the 16 bits lo[8w + j] | lo[8w + 4 + j] << 8 and its high bit at bit i of
 * hi[4w + j]; levels has 8 entries. Octave's 3-bit packing. */
typedef void (*vt_levels3_row_fn)(const uint8_t *lo, const uint8_t *hi, size_t n, const float *levels, float *out);
/* out[i] = levels[code i] for n codes (a multiple of 8) of 3 bits packed 8 to 3 bytes: code 8g + e is bits
 * 3e..3e+2 of the little-endian 24 bits src[3g] | src[3g + 1] << 8 | src[3g + 2] << 16 (reads 3n / 8 bytes);
 * levels has 8 entries. TurboQuant's 3-bit packing. */
typedef void (*vt_packed3_row_fn)(const uint8_t *src, size_t n, const float *levels, float *out);
/* out[i] = levels[code i] * scales[i / group] for n codes of 4 bits at src, two a byte (code 2j the low nibble
 * of src[j], 2j + 1 the high); levels has 16 entries, scales n / group (rounded up). TurboQuant's and
 * UltraQuant's 4-bit packing. */
typedef void (*vt_nibbles_row_fn)(const uint8_t *src, size_t n, const float *levels, const float *scales,
                                  size_t group, float *out);

typedef struct vt_codec_kernels {
    vt_quant_row_fn quant[3][2];     /* [src dtype][fmt] */
    vt_dequant_row_fn dequant[2][3]; /* [fmt][dst dtype] */
    vt_convert_row_fn convert[3][3]; /* [src dtype][dst dtype] */
    vt_fwht_row_fn fwht;
    vt_levels4_row_fn levels4;
    vt_levels3_row_fn levels3;
    vt_nibbles_row_fn nibbles;
    vt_packed3_row_fn packed3; /* new row kernels go last: an existing field keeps its offset */
    vt_fwht_row_fn fwht_raw;   /* fwht's butterflies without the multiply by float32(1 / sqrt(block)) */
} vt_codec_kernels;

/* Kernels of the active ISA. Never NULL. */
VT_API const vt_codec_kernels *vt_codec_active(void);


/* ---- NVFP4 (vLLM 0.33's nvfp4 / nvfp4_4over6 KV-cache encoding, its SM100 store kernel) ----
 * Groups of 16 consecutive elements. Per group, with a = max |x| over the group's non-NaN elements
 * (NaN never enters it; +-inf does), gs = 1 / scale and d = 6 (nvfp4) in float32:
 *   sf = e4m3(gs * (a * (1 / d)))          round to nearest even, saturating at 448 (vt_fp8_e4m3_from_f32)
 *   m  = sf != 0 ? 1 / (sf * (1 / gs)) : 0  (every step one float32 rounding)
 *   code of x = E2M1 round-to-nearest-even of x * m, saturating at 6: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6
 *   at indices 0-7, bit 3 the sign of x * m (so -0 and small negatives keep it); a NaN element gives 0x7.
 * four_over_six (nvfp4_4over6): both d = 6 and d = 4 are tried and d = 4 is kept when its squared error
 * sum((q_i * (1 / m) - x_i)^2) (q_i the E2M1 value of x_i * m; m == 0: sum(x_i^2)), summed in float32 over
 * element pairs (e += dx * dx + dy * dy, unfused), is strictly below d = 6's.
 * Codes are packed two per byte, element 2j in the low nibble; one scale byte (e4m3fn) per group.
 * Read: (E2M1 value * float(sf)) * scale in float32 (the product of the first two is exact). */
/* src [n] of src_dtype (F32, F16, BF16), n a multiple of 16; codes [n / 2], block_scales [n / 16];
 * scale finite and > 0 (the checkpoint's k_scale / v_scale). Nothing is written on error. */
VT_API vt_status vt_nvfp4_quantize(const void *src, vt_dtype src_dtype, size_t n, float scale, int four_over_six,
                                   uint8_t *codes, uint8_t *block_scales, vt_error *err);
/* codes [n / 2], block_scales [n / 16] -> dst [n] float32; n a multiple of 16; scale finite and > 0. */
VT_API vt_status vt_nvfp4_dequantize(const uint8_t *codes, const uint8_t *block_scales, size_t n, float scale,
                                     float *dst, vt_error *err);
/* One group: x[16] float32 -> codes[8], *sf_byte (the rule above). */
VT_API void vt_nvfp4_quantize_group(const float *x, float scale, int four_over_six, uint8_t *codes,
                                    uint8_t *sf_byte);


/* vLLM's NVFP4 pages: per block [K data | K scales | V data | V scales], each side
 * num_kv_heads * block_size * (D / 2 + D / 16) dense bytes, codes then e4m3 scales, head-major (hnd = 1:
 * head stride block_size * row, token stride row) or token-major (hnd = 0: token stride num_kv_heads * row,
 * head stride row) with row = D / 2 for codes and D / 16 for scales. K scales are linear; V scale s of
 * token t sits at row 4 * (t / 4) + s / (S / 4), column (s % (S / 4)) * 4 + t % 4 of its head's
 * [block_size, S] scale matrix (S = D / 16; the SM100 store's swizzle). */
typedef struct vt_nvfp4_pages {
    uint8_t *k, *v;        /* block 0's K side and V side; the read only reads */
    int64_t page_stride;   /* bytes from one block's side to the next's */
    int64_t num_blocks, block_size, num_kv_heads, head_size;
    int hnd;
} vt_nvfp4_pages;
/* key / value [num_tokens, num_kv_heads, D] of src_dtype (F32, F16, BF16), last dimension contiguous,
 * token / head strides in bytes; slot_mapping[t] < 0 skips token t, the last duplicate wins. Every slot
 * is checked before anything is written; (side, head) pairs split across num_threads threads. */
VT_API vt_status vt_nvfp4_store(const vt_nvfp4_pages *c, int src_dtype, const void *key, int64_t key_stride_token,
                                int64_t key_stride_head, const void *value, int64_t value_stride_token,
                                int64_t value_stride_head, const int64_t *slot_mapping, int64_t num_tokens,
                                float k_scale, float v_scale, int four_over_six, int num_threads, vt_error *err);
/* K and V of blocks[0..n) dequantized: k_out, v_out float32 [n, block_size, num_kv_heads, D], C-contiguous,
 * on num_threads threads. Every block must be in [0, num_blocks). */
VT_API vt_status vt_nvfp4_read_pages(const vt_nvfp4_pages *c, const int64_t *blocks, int64_t n, float k_scale,
                                     float v_scale, float *k_out, float *v_out, int num_threads, vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_CODEC_H */
