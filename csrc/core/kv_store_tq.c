/* vLLM 0.33's TurboQuant store and dequantized read on a caller-owned slot cache
 * (vtinfer/turboquant.h; the rules with vLLM's file and line: .agents/specs/kv-formats.md).
 * Scalar C11, one thread. */
#include <math.h>
#include <stdint.h>

#include "vt_internal.h"
#include "vtinfer/turboquant.h"

#define TQ_FN "turboquant_store"
#define TQ_MAX_D 4096 /* the rotation's stack row */


static vt_status check_cache(const vt_tq_cache *c, const char *fn, vt_error *err) {
    const vt_dtype_info *t = vt_dtype_get(c->dtype);
    if (!t || t->page_layout != VT_PAGE_SLOTS)
        return vt_error_set(err, VT_ERR_VALUE, "%s: kv_cache_dtype must be a TurboQuant format (turboquant_k8v4, "
                            "turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc); got dtype id %d", fn,
                            c->dtype);
    if (c->num_blocks <= 0 || c->block_size <= 0 || c->num_kv_heads <= 0 || c->head_size <= 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: num_blocks, block_size, num_kv_heads and head_size must be > 0; "
                            "got %lld, %lld, %lld, %lld", fn, (long long)c->num_blocks, (long long)c->block_size,
                            (long long)c->num_kv_heads, (long long)c->head_size);
    vt_status gst = vt_dtype_check_head_size(c->dtype, c->head_size, fn, "head_size", NULL, err); /* <= TQ_MAX_D */
    if (gst != VT_OK) return gst;
    if (!c->data) return vt_error_set(err, VT_ERR_VALUE, "%s: kv_cache must not be NULL", fn);
    if (t->key_bits != 8 && (!c->centroids || !c->midpoints))
        return vt_error_set(err, VT_ERR_VALUE, "%s: the codebook (centroids, midpoints) must be given for "
                            "kv_cache_dtype '%s'", fn, t->name);
    size_t slots;
    if (vt_size_mul((size_t)c->num_blocks, (size_t)c->block_size, &slots) != 0 || slots > (size_t)INT64_MAX)
        return vt_error_set(err, VT_ERR_OVERFLOW, "%s: num_blocks * block_size must fit in 64 bits; got %lld * %lld",
                            fn, (long long)c->num_blocks, (long long)c->block_size);
    return VT_OK;
}

static float load(int src, const void *row, int64_t i) {
    if (src == VT_DTYPE_F32) return ((const float *)row)[i];
    if (src == VT_DTYPE_F16) return vt_f16_to_f32(((const uint16_t *)row)[i]);
    return vt_bf16_to_f32(((const uint16_t *)row)[i]);
}

static void put_f16(uint8_t *dst, float x) {
    uint16_t h = vt_f16_from_f32(x);
    dst[0] = (uint8_t)(h & 0xFF), dst[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *src) { return vt_f16_to_f32((uint16_t)(src[0] | (src[1] << 8))); }

/* Codes q[0..d) of `bits` (3 or 4) into dst: 4-bit two per byte (even element low); 3-bit per group
 * of 8 one 24-bit little-endian word (element i at bit 3i), d / 8 groups. */
static void pack(const uint8_t *q, int64_t d, int bits, uint8_t *dst) {
    if (bits == 4) {
        for (int64_t j = 0; j < d / 2; j++) dst[j] = (uint8_t)(q[2 * j] | (q[2 * j + 1] << 4));
        return;
    }
    for (int64_t g = 0; g < d / 8; g++) {
        uint32_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint32_t)q[8 * g + i] << (3 * i);
        for (int b = 0; b < 3; b++) dst[3 * g + b] = (uint8_t)(w >> (8 * b));
    }
}

/* Code i of a packed row: the 16 bits from byte bit / 8 (vLLM's read). */
static unsigned unpack_one(const uint8_t *src, int64_t nbytes, int64_t i, int bits) {
    int64_t bit = i * bits, byte = bit / 8;
    unsigned w = src[byte] | (byte + 1 < nbytes ? (unsigned)src[byte + 1] << 8 : 0u);
    return (w >> (bit % 8)) & ((1u << bits) - 1u);
}

/* Values: min / max, scale floored at 1e-8, codes by division (not a reciprocal), then fp16 scale, fp16 min. */
static void store_values(const float *v, int64_t d, int bits, uint8_t *dst, int64_t vdb) {
    uint8_t q[TQ_MAX_D];
    const int top = (1 << bits) - 1;
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < d; i++) {
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    float scale = (hi - lo) / (float)top;
    if (!(scale > 1e-8f)) scale = 1e-8f;
    for (int64_t i = 0; i < d; i++) {
        float t = (v[i] - lo) / scale + 0.5f;
        q[i] = !isfinite(t) || t < 0.0f ? 0 : t >= (float)top ? (uint8_t)top : (uint8_t)(int32_t)t;
    }
    pack(q, d, bits, dst);
    put_f16(dst + vdb, scale);
    put_f16(dst + vdb + 2, lo);
}

/* In place: x <- x H_sylvester (unnormalised, +-1), double. */
static void fwht(double *x, int64_t d) {
    for (int64_t h = 1; h < d; h *= 2)
        for (int64_t i = 0; i < d; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                double a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
}

/* MSE key: norm (float32 squares summed in double), unit row, rotation y = x_hat H / sqrt(D) (products
 * exact in double, rounded once to float32), index = count of midpoints <= y, packed, then fp16 norm. */
static void store_key_mse(const vt_tq_cache *c, const float *k, int bits, uint8_t *dst) {
    const int64_t d = c->head_size;
    double y[TQ_MAX_D], sum = 0.0;
    uint8_t q[TQ_MAX_D];
    for (int64_t i = 0; i < d; i++) {
        float sq = k[i] * k[i];
        sum += (double)sq;
    }
    const float norm = (float)sqrt(sum);
    const float den = norm + 1e-8f;
    for (int64_t i = 0; i < d; i++) y[i] = (double)(k[i] / den);
    fwht(y, d);
    const double h = (double)(1.0f / (float)sqrt((double)d));
    const int n_mid = (1 << bits) - 1;
    for (int64_t i = 0; i < d; i++) {
        float yi = (float)(y[i] * h);
        int idx = 0;
        if (yi == yi)
            while (idx < n_mid && yi >= c->midpoints[idx]) idx++;
        q[i] = (uint8_t)idx;
    }
    pack(q, d, bits, dst);
    put_f16(dst + (d * bits + 7) / 8, norm);
}

vt_status vt_tq_store(const vt_tq_cache *c, int src_dtype, const void *key, int64_t key_stride_token,
                      int64_t key_stride_head, const void *value, int64_t value_stride_token,
                      int64_t value_stride_head, const int64_t *slot_mapping, int64_t num_tokens, vt_error *err) {
    vt_status st = check_cache(c, TQ_FN, err);
    if (st != VT_OK) return st;
    if (vt_float_index(src_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, TQ_FN ": key must be float32, float16 or bfloat16; got dtype id %d",
                            src_dtype);
    if (num_tokens < 0 || (num_tokens > 0 && (!key || !value || !slot_mapping)))
        return vt_error_set(err, VT_ERR_VALUE, TQ_FN ": key, value and slot_mapping must be given for %lld tokens",
                            (long long)num_tokens);
    const int64_t limit = c->num_blocks * c->block_size;
    for (int64_t t = 0; t < num_tokens; t++)
        if (slot_mapping[t] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, TQ_FN ": slot_mapping[%lld] must be < num_blocks * block_size = "
                                "%lld (or negative to skip); got %lld", (long long)t, (long long)limit,
                                (long long)slot_mapping[t]);
    const vt_dtype_info *t = vt_dtype_get(c->dtype);
    const int64_t d = c->head_size;
    const int64_t kps = t->key_bits == 8 ? d : (d * t->key_bits + 7) / 8 + 2;
    const int64_t vdb = (d * t->value_bits + 7) / 8;
    float kr[TQ_MAX_D], vr[TQ_MAX_D];
    for (int64_t tok = 0; tok < num_tokens; tok++) {
        const int64_t s = slot_mapping[tok];
        if (s < 0) continue;
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            uint8_t *slot = c->data + (s / c->block_size) * c->stride_block + (s % c->block_size) * c->stride_pos +
                            h * c->stride_head;
            const char *krow = (const char *)key + tok * key_stride_token + h * key_stride_head;
            const char *vrow = (const char *)value + tok * value_stride_token + h * value_stride_head;
            for (int64_t i = 0; i < d; i++) kr[i] = load(src_dtype, krow, i), vr[i] = load(src_dtype, vrow, i);
            if (t->key_bits == 8)
                for (int64_t i = 0; i < d; i++) slot[i] = vt_fp8_e4m3_from_f32(kr[i]); /* saturating, nearest even */
            else
                store_key_mse(c, kr, t->key_bits, slot);
            store_values(vr, d, t->value_bits, slot + kps, vdb);
        }
    }
    return VT_OK;
}

vt_status vt_tq_gather(const vt_tq_cache *c, const int64_t *slots, int64_t n, float *k_out, float *v_out,
                       vt_error *err) {
    vt_status st = check_cache(c, "turboquant_gather", err);
    if (st != VT_OK) return st;
    if (n < 0 || (n > 0 && (!slots || !k_out || !v_out)))
        return vt_error_set(err, VT_ERR_VALUE, "turboquant_gather: slots and both outputs must be given for %lld "
                            "slots", (long long)n);
    const int64_t limit = c->num_blocks * c->block_size;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, "turboquant_gather: slots[%lld] must be in [0, num_blocks * "
                                "block_size = %lld); got %lld", (long long)i, (long long)limit, (long long)slots[i]);
    const vt_dtype_info *t = vt_dtype_get(c->dtype);
    const int64_t d = c->head_size, H = c->num_kv_heads;
    const int64_t mse = (d * t->key_bits + 7) / 8;
    const int64_t kps = t->key_bits == 8 ? d : mse + 2;
    const int64_t vdb = (d * t->value_bits + 7) / 8;
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) {
            const uint8_t *slot = c->data + (slots[i] / c->block_size) * c->stride_block +
                                  (slots[i] % c->block_size) * c->stride_pos + h * c->stride_head;
            float *ko = k_out + (i * H + h) * d, *vo = v_out + (i * H + h) * d;
            if (t->key_bits == 8) {
                for (int64_t j = 0; j < d; j++) ko[j] = vt_fp8_e4m3_to_f32(slot[j]);
            } else {
                for (int64_t j = 0; j < d; j++) ko[j] = c->centroids[unpack_one(slot, mse, j, t->key_bits)];
                if (t->norm_correction) {
                    float ss = 0.0f;
                    for (int64_t j = 0; j < d; j++) ss += ko[j] * ko[j];
                    const float r = 1.0f / sqrtf(ss + 1e-16f);
                    for (int64_t j = 0; j < d; j++) ko[j] *= r;
                }
                const float nrm = get_f16(slot + mse);
                for (int64_t j = 0; j < d; j++) ko[j] = nrm * ko[j];
            }
            const uint8_t *vq = slot + kps;
            const float scale = get_f16(vq + vdb), zero = get_f16(vq + vdb + 2);
            for (int64_t j = 0; j < d; j++) vo[j] = (float)unpack_one(vq, vdb, j, t->value_bits) * scale + zero;
        }
    return VT_OK;
}
