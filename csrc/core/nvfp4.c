/* NVFP4 codec: vLLM 0.33's nvfp4 / nvfp4_4over6 group encoding (vtinfer/codec.h states the rule).
 * Scalar C11: the store-side codec and its read, one group of 16 elements at a time. */
#include <math.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/codec.h"

#define NV_GROUP 16

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* |v| -> E2M1 magnitude index, round to nearest even, saturating (ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
 * 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4); NaN falls through to 7. */
static unsigned e2m1_index(float a) {
    if (a <= 0.25f) return 0;
    if (a < 0.75f) return 1;
    if (a <= 1.25f) return 2;
    if (a < 1.75f) return 3;
    if (a <= 2.5f) return 4;
    if (a < 3.5f) return 5;
    if (a <= 5.0f) return 6;
    return 7;
}

static unsigned e2m1_code(float v) {
    if (v != v) return 7u;
    return e2m1_index(fabsf(v)) | (signbit(v) ? 8u : 0u);
}

static float e2m1_value(unsigned code) {
    const float m = e2m1_mag[code & 7u];
    return (code & 8u) ? -m : m;
}

/* One candidate scale of denominator d: its e4m3 byte and the element multiplier m. */
static void candidate(float gs, float amax, float rden, uint8_t *sf_byte, float *mul) {
    const uint8_t b = vt_fp8_e4m3_from_f32(gs * (amax * rden));
    const float sf = vt_fp8_e4m3_to_f32(b);
    *sf_byte = b;
    *mul = sf != 0.0f ? 1.0f / (sf * (1.0f / gs)) : 0.0f;
}

/* The 4over6 rule's squared error of a candidate multiplier over the group. */
static float recon_error(const float *x, float mul) {
    const float dq = mul != 0.0f ? 1.0f / mul : 0.0f;
    float e = 0.0f;
    for (int i = 0; i < NV_GROUP; i += 2) {
        if (mul == 0.0f) {
            e += x[i] * x[i] + x[i + 1] * x[i + 1];
        } else {
            const float dx = e2m1_value(e2m1_code(x[i] * mul)) * dq - x[i];
            const float dy = e2m1_value(e2m1_code(x[i + 1] * mul)) * dq - x[i + 1];
            e += dx * dx + dy * dy;
        }
    }
    return e;
}

void vt_nvfp4_quantize_group(const float *x, float scale, int four_over_six, uint8_t *codes, uint8_t *sf_byte) {
    const float gs = 1.0f / scale;
    float amax = 0.0f;
    for (int i = 0; i < NV_GROUP; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) amax = a; /* a NaN never compares greater */
    }
    uint8_t b6;
    float m6;
    candidate(gs, amax, 1.0f / 6.0f, &b6, &m6);
    uint8_t b = b6;
    float mul = m6;
    if (four_over_six) {
        uint8_t b4;
        float m4;
        candidate(gs, amax, 0.25f, &b4, &m4);
        if (recon_error(x, m4) < recon_error(x, m6)) b = b4, mul = m4;
    }
    *sf_byte = b;
    for (int i = 0; i < NV_GROUP; i += 2)
        codes[i / 2] = (uint8_t)(e2m1_code(x[i] * mul) | (e2m1_code(x[i + 1] * mul) << 4));
}

static vt_status check(const char *fn, size_t n, float scale, int have_ptrs, vt_error *err) {
    if (n % NV_GROUP)
        return vt_error_set(err, VT_ERR_VALUE, "%s: the element count must be a multiple of 16 (one block scale per "
                            "16 elements); got %zu", fn, n);
    if (!(scale > 0.0f) || isinf(scale))
        return vt_error_set(err, VT_ERR_VALUE, "%s: scale must be finite and > 0; got %g", fn, (double)scale);
    if (n && !have_ptrs)
        return vt_error_set(err, VT_ERR_VALUE, "%s: the arrays must be non-NULL when n > 0; got NULL", fn);
    return VT_OK;
}

vt_status vt_nvfp4_quantize(const void *src, vt_dtype src_dtype, size_t n, float scale, int four_over_six,
                            uint8_t *codes, uint8_t *block_scales, vt_error *err) {
    static const char fn[] = "vt_nvfp4_quantize";
    vt_error_clear(err);
    vt_status s = check(fn, n, scale, src && codes && block_scales, err);
    if (s != VT_OK) return s;
    if (src_dtype != VT_DTYPE_F32 && src_dtype != VT_DTYPE_F16 && src_dtype != VT_DTYPE_BF16)
        return vt_error_set(err, VT_ERR_TYPE, "%s: src must be float32, float16 or bfloat16; got dtype id %d", fn,
                            (int)src_dtype);
    const size_t esz = src_dtype == VT_DTYPE_F32 ? 4 : 2;
    float x[NV_GROUP];
    for (size_t g = 0; g < n / NV_GROUP; g++) {
        const uint8_t *p = (const uint8_t *)src + g * NV_GROUP * esz;
        for (int i = 0; i < NV_GROUP; i++) {
            if (src_dtype == VT_DTYPE_F32) {
                memcpy(&x[i], p + 4 * i, 4);
            } else {
                uint16_t h;
                memcpy(&h, p + 2 * i, 2);
                x[i] = src_dtype == VT_DTYPE_F16 ? vt_f16_to_f32(h) : vt_bf16_to_f32(h);
            }
        }
        vt_nvfp4_quantize_group(x, scale, four_over_six, codes + g * (NV_GROUP / 2), block_scales + g);
    }
    return VT_OK;
}

vt_status vt_nvfp4_dequantize(const uint8_t *codes, const uint8_t *block_scales, size_t n, float scale, float *dst,
                              vt_error *err) {
    static const char fn[] = "vt_nvfp4_dequantize";
    vt_error_clear(err);
    vt_status s = check(fn, n, scale, codes && block_scales && dst, err);
    if (s != VT_OK) return s;
    for (size_t g = 0; g < n / NV_GROUP; g++) {
        const float sf = vt_fp8_e4m3_to_f32(block_scales[g]);
        const uint8_t *c = codes + g * (NV_GROUP / 2);
        float *o = dst + g * NV_GROUP;
        for (int i = 0; i < NV_GROUP / 2; i++) {
            o[2 * i] = e2m1_value(c[i] & 0xFu) * sf * scale;
            o[2 * i + 1] = e2m1_value(c[i] >> 4) * sf * scale;
        }
    }
    return VT_OK;
}
