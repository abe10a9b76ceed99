/* NVFP4 codec: vLLM 0.33's nvfp4 / nvfp4_4over6 group encoding (vtinfer/codec.h states the rule).
 * Scalar C11: the store-side codec and its read, one group of 16 elements at a time. */
#include <math.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/codec.h"
#include "vtinfer/turboquant.h"

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

/* codes [n / 2] and block scales [n / 16] -> (E2M1 value * block scale) * scale, n float32 values. */
static void dequant(const uint8_t *codes, const uint8_t *block_scales, size_t n, float scale, float *dst) {
    for (size_t g = 0; g < n / NV_GROUP; g++) {
        const float sf = vt_fp8_e4m3_to_f32(block_scales[g]);
        const uint8_t *c = codes + g * (NV_GROUP / 2);
        float *o = dst + g * NV_GROUP;
        for (int i = 0; i < NV_GROUP / 2; i++) {
            o[2 * i] = e2m1_value(c[i] & 0xFu) * sf * scale;
            o[2 * i + 1] = e2m1_value(c[i] >> 4) * sf * scale;
        }
    }
}

vt_status vt_nvfp4_dequantize(const uint8_t *codes, const uint8_t *block_scales, size_t n, float scale, float *dst,
                              vt_error *err) {
    static const char fn[] = "vt_nvfp4_dequantize";
    vt_error_clear(err);
    vt_status s = check(fn, n, scale, codes && block_scales && dst, err);
    if (s != VT_OK) return s;
    dequant(codes, block_scales, n, scale, dst);
    return VT_OK;
}

/* ---- The slot codec (PagedKVCache's nvfp4 / nvfp4_4over6: page_layout VT_PAGE_SLOTS) ----
 * One slot per (token, KV head), D + D / 8 bytes: [K codes D / 2 | K scales D / 16 | V codes D / 2 | V scales D / 16],
 * each side the rule above with the layer's global scale (c->k_scale, c->v_scale); the scales in element order
 * (vLLM's page swizzles its V scales across 4 tokens; a slot holds one token). The loops and checks are
 * kv_slots.c's. */

static size_t nv_slot_bytes(const vt_dtype_info *t, size_t d, size_t rope_dim) {
    (void)t, (void)rope_dim;
    return d + d / 8;
}

static int nv_needs_codebook(const vt_dtype_info *t) {
    (void)t;
    return 0;
}

static void nv_store_side(const float *x, int64_t d, float scale, int four_over_six, uint8_t *dst) {
    for (int64_t g = 0; g < d / NV_GROUP; g++)
        vt_nvfp4_quantize_group(x + g * NV_GROUP, scale, four_over_six, dst + g * (NV_GROUP / 2), dst + d / 2 + g);
}

static void nv_store(const vt_tq_cache *c, const vt_dtype_info *t, const float *k, const float *v, uint8_t *slot) {
    (void)t;
    const int64_t d = c->head_size;
    nv_store_side(k, d, c->k_scale, 0, slot);
    nv_store_side(v, d, c->v_scale, 0, slot + d / 2 + d / 16);
}

static void nv_store_4over6(const vt_tq_cache *c, const vt_dtype_info *t, const float *k, const float *v,
                            uint8_t *slot) {
    (void)t;
    const int64_t d = c->head_size;
    nv_store_side(k, d, c->k_scale, 1, slot);
    nv_store_side(v, d, c->v_scale, 1, slot + d / 2 + d / 16);
}

/* The E2M1 values by code (bit 3 the sign), for the ISA's 4-bit lookup. */
static const float e2m1_levels[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* One half of a slot, d values: E2M1 * block scale by the ISA's nibble kernel (exact: at most 2 x 4 significant
 * bits), then times the global scale, one rounding: the bits of (E2M1 * sf) * scale, as dequant gives them. */
static void read_half(const uint8_t *src, int64_t d, float scale, float *out) {
    float sf[VT_SLOT_MAX_D / NV_GROUP];
    for (int64_t g = 0; g < d / NV_GROUP; g++) sf[g] = vt_fp8_e4m3_to_f32(src[d / 2 + g]);
    vt_kernels_active()->codec->nibbles(src, (size_t)d, e2m1_levels, sf, NV_GROUP, out);
    if (scale != 1.0f)
        for (int64_t i = 0; i < d; i++) out[i] *= scale;
}

static void nv_read(const vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k, float *v) {
    (void)t;
    const int64_t d = c->head_size;
    read_half(slot, d, c->k_scale, k);
    read_half(slot + d / 2 + d / 16, d, c->v_scale, v);
}

const vt_slot_codec vt_slot_nvfp4 = {
    .slot_bytes = nv_slot_bytes, .needs_codebook = nv_needs_codebook, .store = nv_store, .read = nv_read,
};
const vt_slot_codec vt_slot_nvfp4_4over6 = {
    .slot_bytes = nv_slot_bytes, .needs_codebook = nv_needs_codebook, .store = nv_store_4over6, .read = nv_read,
};

/* ---- vLLM's NVFP4 pages ---- */

static vt_status check_pages(const vt_nvfp4_pages *c, const char *fn, vt_error *err) {
    if (!c || !c->k || !c->v)
        return vt_error_set(err, VT_ERR_VALUE, "%s: the pages and both sides must be non-NULL", fn);
    const int64_t d = c->head_size, bs = c->block_size, h = c->num_kv_heads;
    /* the head size: the table row's rule (nvfp4 and nvfp4_4over6 share it) */
    vt_status gst = vt_dtype_check_head_size(VT_DTYPE_NVFP4, d, fn, "head_size", NULL, err);
    if (gst != VT_OK) return gst;
    if (bs < 4 || bs % 4 || bs > 65536 || h < 1 || h > 65536 || c->num_blocks < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: NVFP4 pages need a block size that is a multiple of 4 (the V "
                            "scales' 4-token swizzle) and at least one KV head; got block size %lld, %lld heads", fn,
                            (long long)bs, (long long)h);
    const int64_t side = h * bs * (d / 2 + d / 16);
    if (c->num_blocks > 1 && c->page_stride < side)
        return vt_error_set(err, VT_ERR_VALUE, "%s: the page stride %lld is below one side's %lld bytes", fn,
                            (long long)c->page_stride, (long long)side);
    return VT_OK;
}

static vt_status check_scales(const char *fn, float k_scale, float v_scale, vt_error *err) {
    for (int kv = 0; kv < 2; kv++) {
        const float sc = kv ? v_scale : k_scale;
        if (!(sc > 0.0f) || isinf(sc))
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be finite and > 0; got %g", fn,
                                kv ? "v_scale" : "k_scale", (double)sc);
    }
    return VT_OK;
}

/* Byte offsets inside a side: the codes row and the scale byte of (token t, head h, scale column s). */
static int64_t code_off(const vt_nvfp4_pages *c, int64_t t, int64_t h) {
    const int64_t row = c->head_size / 2;
    return c->hnd ? (h * c->block_size + t) * row : (t * c->num_kv_heads + h) * row;
}

static int64_t scale_off(const vt_nvfp4_pages *c, int64_t t, int64_t h, int64_t s, int swizzled) {
    const int64_t S = c->head_size / 16, g = S / 4;
    int64_t tt = t, ss = s;
    if (swizzled) tt = (t / 4) * 4 + s / g, ss = (s % g) * 4 + t % 4;
    const int64_t base = c->num_kv_heads * c->block_size * (c->head_size / 2);
    return base + (c->hnd ? (h * c->block_size + tt) * S : (tt * c->num_kv_heads + h) * S) + ss;
}

static void load_row(const uint8_t *p, int src_dtype, int64_t d, float *x) {
    for (int64_t i = 0; i < d; i++) {
        if (src_dtype == VT_DTYPE_F32) {
            memcpy(&x[i], p + 4 * i, 4);
        } else {
            uint16_t u;
            memcpy(&u, p + 2 * i, 2);
            x[i] = src_dtype == VT_DTYPE_F16 ? vt_f16_to_f32(u) : vt_bf16_to_f32(u);
        }
    }
}

typedef struct {
    const vt_nvfp4_pages *c;
    int src_dtype, four_over_six;
    const uint8_t *src[2];
    int64_t stride_token[2], stride_head[2];
    const int64_t *slots;
    int64_t num_tokens;
    float scale[2];
} store_job;

/* Units (side, head) split across the threads; each unit walks the tokens in order, so the last of two
 * tokens with one slot wins whatever the thread count. */
static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    const vt_nvfp4_pages *c = j->c;
    const int64_t H = c->num_kv_heads, S = c->head_size / 16;
    const size_t esz = j->src_dtype == VT_DTYPE_F32 ? 4 : 2;
    size_t lo, hi;
    vt_split_range((size_t)(2 * H), 1, ith, nth, &lo, &hi);
    float x[NV_GROUP];
    for (int64_t u = (int64_t)lo; u < (int64_t)hi; u++) {
        const int kv = (int)(u / H);
        const int64_t h = u % H;
        for (int64_t t = 0; t < j->num_tokens; t++) { /* in token order: the last duplicate wins */
            const int64_t slot = j->slots[t];
            if (slot < 0) continue;
            const int64_t b = slot / c->block_size, pos = slot % c->block_size;
            uint8_t *side = (kv ? c->v : c->k) + b * c->page_stride;
            const uint8_t *src = j->src[kv] + t * j->stride_token[kv] + h * j->stride_head[kv];
            uint8_t *codes = side + code_off(c, pos, h);
            for (int64_t g = 0; g < S; g++) {
                load_row(src + (size_t)(g * NV_GROUP) * esz, j->src_dtype, NV_GROUP, x);
                vt_nvfp4_quantize_group(x, j->scale[kv], j->four_over_six, codes + g * (NV_GROUP / 2),
                                        side + scale_off(c, pos, h, g, kv));
            }
        }
    }
}

vt_status vt_nvfp4_store(const vt_nvfp4_pages *c, int src_dtype, const void *key, int64_t key_stride_token,
                         int64_t key_stride_head, const void *value, int64_t value_stride_token,
                         int64_t value_stride_head, const int64_t *slot_mapping, int64_t num_tokens, float k_scale,
                         float v_scale, int four_over_six, int num_threads, vt_error *err) {
    static const char fn[] = "nvfp4_store";
    vt_error_clear(err);
    vt_status s = check_pages(c, fn, err);
    if (s != VT_OK) return s;
    if (src_dtype != VT_DTYPE_F32 && src_dtype != VT_DTYPE_F16 && src_dtype != VT_DTYPE_BF16)
        return vt_error_set(err, VT_ERR_TYPE, "%s: key and value must be float32, float16 or bfloat16; got dtype id "
                            "%d", fn, src_dtype);
    if (num_tokens < 0 || (num_tokens > 0 && (!key || !value || !slot_mapping)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: key, value and slot_mapping must be given for %lld tokens", fn,
                            (long long)num_tokens);
    if ((s = check_scales(fn, k_scale, v_scale, err)) != VT_OK) return s;
    const int64_t limit = c->num_blocks * c->block_size;
    for (int64_t t = 0; t < num_tokens; t++)
        if (slot_mapping[t] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, "%s: slot_mapping[%lld] must be < num_blocks * block_size = %lld; "
                                "got %lld", fn, (long long)t, (long long)limit, (long long)slot_mapping[t]);
    store_job job = {.c = c, .src_dtype = src_dtype, .four_over_six = four_over_six,
                     .src = {(const uint8_t *)key, (const uint8_t *)value},
                     .stride_token = {key_stride_token, value_stride_token},
                     .stride_head = {key_stride_head, value_stride_head}, .slots = slot_mapping,
                     .num_tokens = num_tokens, .scale = {k_scale, v_scale}};
    int nth = num_threads < 1 ? 1 : (num_threads > VT_MAX_THREADS ? VT_MAX_THREADS : num_threads);
    if (nth > 2 * c->num_kv_heads) nth = (int)(2 * c->num_kv_heads);
    if (num_tokens * c->num_kv_heads < 64) nth = 1; /* a decode step: not worth waking the pool */
    vt_parallel_for(store_task, &job, nth);
    return VT_OK;
}

typedef struct {
    const vt_nvfp4_pages *c;
    const int64_t *blocks;
    int64_t n;
    float k_scale, v_scale;
    float *k_out, *v_out;
    float pair[256][2]; /* the two E2M1 values of each code byte, low nibble first */
} read_job;

static void read_task(void *ctx, int ith, int nth) {
    const read_job *j = ctx;
    const vt_nvfp4_pages *c = j->c;
    const int64_t d = c->head_size, S = d / 16, H = c->num_kv_heads, bs = c->block_size;
    size_t lo, hi;
    vt_split_range((size_t)j->n, 1, ith, nth, &lo, &hi);
    for (int64_t i = (int64_t)lo; i < (int64_t)hi; i++)
        for (int kv = 0; kv < 2; kv++) {
            const uint8_t *side = (kv ? c->v : c->k) + j->blocks[i] * c->page_stride;
            const float sc = kv ? j->v_scale : j->k_scale;
            float *out = (kv ? j->v_out : j->k_out) + i * bs * H * d;
            for (int64_t t = 0; t < bs; t++)
                for (int64_t h = 0; h < H; h++) {
                    const uint8_t *codes = side + code_off(c, t, h);
                    float *o = out + (t * H + h) * d;
                    for (int64_t g = 0; g < S; g++) {
                        const float f = vt_fp8_e4m3_to_f32(side[scale_off(c, t, h, g, kv)]);
                        const uint8_t *cg = codes + g * (NV_GROUP / 2);
                        float *og = o + g * NV_GROUP;
                        for (int e = 0; e < NV_GROUP / 2; e++) { /* (E2M1 * sf) is exact, then one rounding */
                            og[2 * e] = j->pair[cg[e]][0] * f * sc;
                            og[2 * e + 1] = j->pair[cg[e]][1] * f * sc;
                        }
                    }
                }
        }
}

vt_status vt_nvfp4_read_pages(const vt_nvfp4_pages *c, const int64_t *blocks, int64_t n, float k_scale,
                              float v_scale, float *k_out, float *v_out, int num_threads, vt_error *err) {
    static const char fn[] = "nvfp4_read_pages";
    vt_error_clear(err);
    vt_status s = check_pages(c, fn, err);
    if (s != VT_OK) return s;
    if (n < 0 || (n > 0 && (!blocks || !k_out || !v_out)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: blocks and both outputs must be given for %lld blocks", fn,
                            (long long)n);
    if ((s = check_scales(fn, k_scale, v_scale, err)) != VT_OK) return s;
    for (int64_t i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= c->num_blocks)
            return vt_error_set(err, VT_ERR_INDEX, "%s: blocks[%lld] must be in [0, %lld); got %lld", fn,
                                (long long)i, (long long)c->num_blocks, (long long)blocks[i]);
    read_job job = {.c = c, .blocks = blocks, .n = n, .k_scale = k_scale, .v_scale = v_scale, .k_out = k_out,
                    .v_out = v_out};
    for (unsigned b = 0; b < 256; b++) job.pair[b][0] = e2m1_value(b & 0xFu), job.pair[b][1] = e2m1_value(b >> 4);
    int nth = num_threads < 1 ? 1 : (num_threads > VT_MAX_THREADS ? VT_MAX_THREADS : num_threads);
    if (nth > n) nth = n < 1 ? 1 : (int)n;
    vt_parallel_for(read_task, &job, nth);
    return VT_OK;
}
