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

typedef struct vt_codec_kernels {
    vt_quant_row_fn quant[3][2];     /* [src dtype][fmt] */
    vt_dequant_row_fn dequant[2][3]; /* [fmt][dst dtype] */
    vt_convert_row_fn convert[3][3]; /* [src dtype][dst dtype] */
} vt_codec_kernels;

/* Kernels of the active ISA. Never NULL. */
VT_API const vt_codec_kernels *vt_codec_active(void);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_CODEC_H */
