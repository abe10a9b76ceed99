/* The slot formats' store and dequantized read on a caller-owned slot cache (vtinfer/turboquant.h): the
 * checks and the loops over tokens and heads, shared by every row of page_layout VT_PAGE_SLOTS; the format's
 * own rules are its row's slot codec (kv_store_tq.c: TurboQuant, kv_store_uq.c: UltraQuant). Scalar C11;
 * the store runs on the calling thread (a repeated slot keeps the last token), the read on the pool. */
#include <stdint.h>

#include "vt_internal.h"
#include "vtinfer/turboquant.h"

static vt_status check_cache(const vt_tq_cache *c, const char *fn, vt_error *err) {
    const vt_dtype_info *t = vt_dtype_get(c->dtype);
    if (!t || t->page_layout != VT_PAGE_SLOTS || !t->slot)
        return vt_error_set(err, VT_ERR_VALUE, "%s: kv_cache_dtype must be a slot format (a dtype row of page layout "
                            "slots); got dtype id %d", fn, c->dtype);
    if (c->num_blocks <= 0 || c->block_size <= 0 || c->num_kv_heads <= 0 || c->head_size <= 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: num_blocks, block_size, num_kv_heads and head_size must be > 0; "
                            "got %lld, %lld, %lld, %lld", fn, (long long)c->num_blocks, (long long)c->block_size,
                            (long long)c->num_kv_heads, (long long)c->head_size);
    /* the row's geometry bounds head_size by VT_SLOT_MAX_D (the codecs' stack rows) */
    vt_status gst = vt_dtype_check_head_size(c->dtype, c->head_size, fn, "head_size", NULL, err);
    if (gst != VT_OK) return gst;
    if (t->rope_block > 0 && (c->rope_dim < 0 || c->rope_dim > c->head_size || c->rope_dim % t->rope_block != 0))
        return vt_error_set(err, VT_ERR_VALUE, "%s: rope_dim must be a multiple of %d in [0, head_size = %lld] for "
                            "kv_cache_dtype '%s'; got %lld", fn, t->rope_block, (long long)c->head_size, t->name,
                            (long long)c->rope_dim);
    if (!c->data) return vt_error_set(err, VT_ERR_VALUE, "%s: kv_cache must not be NULL", fn);
    if (t->global_scale && (!vt_scale_ok(c->k_scale) || !vt_scale_ok(c->v_scale)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: k_scale and v_scale must be finite and > 0 for kv_cache_dtype "
                            "'%s' (its global scales); got %g, %g", fn, t->name, (double)c->k_scale,
                            (double)c->v_scale);
    if (t->slot->needs_codebook(t) && (!c->centroids || !c->midpoints))
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

static uint8_t *slot_at(const vt_tq_cache *c, int64_t s, int64_t h) {
    return c->data + (s / c->block_size) * c->stride_block + (s % c->block_size) * c->stride_pos +
           h * c->stride_head;
}

vt_status vt_tq_store(const vt_tq_cache *c, int src_dtype, const void *key, int64_t key_stride_token,
                      int64_t key_stride_head, const void *value, int64_t value_stride_token,
                      int64_t value_stride_head, const int64_t *slot_mapping, int64_t num_tokens, vt_error *err) {
    return vt_tq_store_named("turboquant_store", c, src_dtype, key, key_stride_token, key_stride_head, value,
                             value_stride_token, value_stride_head, slot_mapping, num_tokens, err);
}

vt_status vt_tq_store_named(const char *fn, const vt_tq_cache *c, int src_dtype, const void *key,
                            int64_t key_stride_token, int64_t key_stride_head, const void *value,
                            int64_t value_stride_token, int64_t value_stride_head, const int64_t *slot_mapping,
                            int64_t num_tokens, vt_error *err) {
    if (!c) return vt_error_set(err, VT_ERR_VALUE, "%s: the cache must not be NULL", fn);
    vt_status st = check_cache(c, fn, err);
    if (st != VT_OK) return st;
    if (vt_float_index(src_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: key must be float32, float16 or bfloat16; got dtype id %d", fn,
                            src_dtype);
    if (num_tokens < 0 || (num_tokens > 0 && (!key || !value || !slot_mapping)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: key, value and slot_mapping must be given for %lld tokens", fn,
                            (long long)num_tokens);
    const int64_t limit = c->num_blocks * c->block_size;
    for (int64_t t = 0; t < num_tokens; t++)
        if (slot_mapping[t] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, "%s: slot_mapping[%lld] must be < num_blocks * block_size = %lld "
                                "(or negative to skip); got %lld", fn, (long long)t, (long long)limit,
                                (long long)slot_mapping[t]);
    const vt_dtype_info *t = vt_dtype_get(c->dtype);
    const int64_t d = c->head_size;
    float kr[VT_SLOT_MAX_D], vr[VT_SLOT_MAX_D];
    for (int64_t tok = 0; tok < num_tokens; tok++) {
        const int64_t s = slot_mapping[tok];
        if (s < 0) continue;
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            const char *krow = (const char *)key + tok * key_stride_token + h * key_stride_head;
            const char *vrow = (const char *)value + tok * value_stride_token + h * value_stride_head;
            for (int64_t i = 0; i < d; i++) kr[i] = load(src_dtype, krow, i), vr[i] = load(src_dtype, vrow, i);
            t->slot->store(c, t, kr, vr, slot_at(c, s, h));
        }
    }
    return VT_OK;
}

typedef struct gather_job {
    const vt_tq_cache *c;
    const vt_dtype_info *t;
    const int64_t *slots;
    int64_t n;
    float *k_out, *v_out;
} gather_job;

static void gather_task(void *ctx, int ith, int nth) {
    const gather_job *j = ctx;
    const vt_tq_cache *c = j->c;
    const int64_t d = c->head_size, H = c->num_kv_heads;
    size_t b, e;
    vt_split_range((size_t)j->n, 1, ith, nth, &b, &e);
    for (int64_t i = (int64_t)b; i < (int64_t)e; i++)
        for (int64_t h = 0; h < H; h++)
            j->t->slot->read(c, j->t, slot_at(c, j->slots[i], h), j->k_out + (i * H + h) * d,
                             j->v_out + (i * H + h) * d);
}

/* Slots read per thread at the least (a slot is a few hundred bytes). */
#define GATHER_SLOTS_PER_THREAD 1024

vt_status vt_tq_gather(const vt_tq_cache *c, const int64_t *slots, int64_t n, float *k_out, float *v_out,
                       int num_threads, vt_error *err) {
    return vt_tq_gather_named("turboquant_gather", c, slots, n, k_out, v_out, num_threads, err);
}

vt_status vt_tq_gather_named(const char *fn, const vt_tq_cache *c, const int64_t *slots, int64_t n, float *k_out,
                             float *v_out, int num_threads, vt_error *err) {
    if (!c) return vt_error_set(err, VT_ERR_VALUE, "%s: the cache must not be NULL", fn);
    vt_status st = check_cache(c, fn, err);
    if (st != VT_OK) return st;
    if (n < 0 || (n > 0 && (!slots || !k_out || !v_out)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: slots and both outputs must be given for %lld slots", fn,
                            (long long)n);
    const int64_t limit = c->num_blocks * c->block_size;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, "%s: slots[%lld] must be in [0, num_blocks * block_size = %lld); "
                                "got %lld", fn, (long long)i, (long long)limit, (long long)slots[i]);
    gather_job j = {.c = c, .t = vt_dtype_get(c->dtype), .slots = slots, .n = n, .k_out = k_out, .v_out = v_out};
    vt_parallel_for(gather_task, &j,
                     vt_useful_threads(num_threads, n * c->num_kv_heads, GATHER_SLOTS_PER_THREAD, VT_MAX_THREADS));
    return VT_OK;
}
