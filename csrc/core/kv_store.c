/* The store: one kernel behind PagedKVCache.store, reshape_and_cache_flash
 * and reshape_and_cache. Checks first (every slot), then scatters head
 * rows through the codec row kernels of the active ISA, which are the SIMD
 * part (scalar twins in codec_scalar.c, AVX2/AVX-512 variants beside it). */
#include <stdint.h>

#include "vt_internal.h"
#include "vtinfer/kvcache.h"

/* Calls with fewer elements than this run on one thread. */
#define STORE_PARALLEL_MIN_ELEMS ((int64_t)1 << 15)
/* Elements converted at once into the stack buffer for chunked layouts. */
#define STORE_PIECE 256

static const char *fn_name(const vt_kv_store_params *p) { return p->fn ? p->fn : "vt_kv_store"; }

static vt_status check_scales(const char *fn, const char *arg, const float *s, int64_t n, vt_error *err) {
    if (!s) return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be given for an fp8 cache; got NULL", fn, arg);
    for (int64_t i = 0; i < n; i++)
        if (!vt_scale_ok(s[i]))
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be finite and > 0; got %g at index %lld", fn, arg,
                                (double)s[i], (long long)i);
    return VT_OK;
}

vt_status vt_kv_store_check(const vt_kv_store_params *p, vt_error *err) {
    const char *fn = fn_name(p);
    if (vt_float_index(p->src_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: key must be float32, float16 or bfloat16; got dtype id %d", fn,
                            (int)p->src_dtype);
    if (!vt_dtype_get(p->cache_dtype))
        return vt_error_set(err, VT_ERR_TYPE, "%s: key_cache must have a storage dtype; got dtype id %d", fn,
                            (int)p->cache_dtype);
    const vt_store_kernel *sk = vt_dtype_get(p->cache_dtype)->store;
    if (!sk) /* a slot format: one K+V slot cache, stored by its codec (kv_slots.c) */
        return vt_error_set(err, VT_ERR_UNSUPPORTED, "%s: kv_cache_dtype '%s' packs K and V into one slot cache; "
                            "store it with vt_tq_store (vt.turboquant_store)", fn, vt_dtype_get(p->cache_dtype)->name);
    if (p->num_kv_heads <= 0 || p->head_size <= 0 || p->block_size <= 0 || p->num_blocks <= 0)
        return vt_error_set(err, VT_ERR_VALUE,
                            "%s: num_kv_heads, head_size, block_size and num_blocks must be > 0; got %lld, %lld, "
                            "%lld, %lld",
                            fn, (long long)p->num_kv_heads, (long long)p->head_size, (long long)p->block_size,
                            (long long)p->num_blocks);
    if (p->num_tokens < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: num_tokens must be >= 0; got %lld", fn, (long long)p->num_tokens);
    const vt_kv_dst *d[2] = {&p->key_cache, &p->value_cache};
    static const char *const names[2] = {"key_cache", "value_cache"};
    for (int i = 0; i < 2; i++) {
        if (d[i]->chunk <= 0 || p->head_size % d[i]->chunk != 0)
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s chunk must divide head_size %lld; got %lld", fn, names[i],
                                (long long)p->head_size, (long long)d[i]->chunk);
        if (p->num_tokens > 0 && !d[i]->base)
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be non-NULL; got NULL", fn, names[i]);
    }
    if (p->num_tokens > 0 && (!p->key || !p->value || !p->slot_mapping))
        return vt_error_set(err, VT_ERR_VALUE, "%s: key, value and slot_mapping must be non-NULL; got NULL", fn);
    vt_status st = sk->check(p, fn, err);
    if (st != VT_OK) return st;
    size_t slots;
    if (vt_size_mul((size_t)p->num_blocks, (size_t)p->block_size, &slots) != 0 || slots > (size_t)INT64_MAX)
        return vt_error_set(err, VT_ERR_OVERFLOW, "%s: num_blocks * block_size must fit in 64 bits; got %lld * %lld",
                            fn, (long long)p->num_blocks, (long long)p->block_size);
    const int64_t limit = (int64_t)slots;
    for (int64_t t = 0; t < p->num_tokens; t++) {
        int64_t s = p->slot_mapping[t];
        if (s >= limit)
            return vt_error_set(err, VT_ERR_INDEX,
                                "%s: slot_mapping[%lld] must be < num_blocks * block_size = %lld (or negative to "
                                "skip); got %lld",
                                fn, (long long)t, (long long)limit, (long long)s);
    }
    return VT_OK;
}

/* One row of head_size elements into a destination described by `d`. */
typedef struct row_writer {
    vt_quant_row_fn quant;     /* fp8 caches */
    vt_convert_row_fn convert; /* plain caches */
    size_t src_es, dst_es;
} row_writer;

static void write_row(const row_writer *w, const vt_kv_dst *d, const char *src, char *dst, int64_t head_size,
                      float scale) {
    if (d->chunk == head_size) { /* contiguous destination row */
        if (w->quant) w->quant(src, (uint8_t *)dst, (size_t)head_size, scale);
        else w->convert(src, dst, (size_t)head_size);
        return;
    }
    /* Chunked destination: convert a piece (whole chunks, at most
     * STORE_PIECE elements) into the stack, then scatter its chunks. A
     * chunk longer than STORE_PIECE is already contiguous: write it
     * directly. */
    _Alignas(64) unsigned char buf[STORE_PIECE * 4];
    const int64_t chunk = d->chunk;
    if (chunk > STORE_PIECE) {
        for (int64_t d0 = 0; d0 < head_size; d0 += chunk) {
            char *o = dst + (d0 / chunk) * d->stride_chunk;
            if (w->quant) w->quant(src + d0 * (int64_t)w->src_es, (uint8_t *)o, (size_t)chunk, scale);
            else w->convert(src + d0 * (int64_t)w->src_es, o, (size_t)chunk);
        }
        return;
    }
    const int64_t piece = (STORE_PIECE / chunk) * chunk;
    const size_t cb = (size_t)chunk * w->dst_es;
    for (int64_t d0 = 0; d0 < head_size; d0 += piece) {
        int64_t n = head_size - d0 < piece ? head_size - d0 : piece;
        if (w->quant) w->quant(src + d0 * (int64_t)w->src_es, buf, (size_t)n, scale);
        else w->convert(src + d0 * (int64_t)w->src_es, buf, (size_t)n);
        for (int64_t c = 0; c < n; c += chunk)
            memcpy(dst + ((d0 + c) / chunk) * d->stride_chunk, buf + (size_t)c * w->dst_es, cb);
    }
}

typedef struct store_job {
    const vt_kv_store_params *p;
    row_writer w;
    /* fused[0] (K) / fused[1] (V): the token's H head rows are contiguous in
     * the source and in the cache row (chunk = D, head strides = D elements)
     * and every head has the same scale, so the whole token is one row
     * kernel call of H * D elements with one plan (one reciprocal, one set
     * of constants) instead of H calls of D. */
    int fused[2];
} store_job;

/* 1 when token t's H heads of one side can be written by one call. */
static int can_fuse(const vt_kv_store_params *p, const row_writer *w, const vt_kv_dst *d, int64_t src_stride_head,
                    const float *scale) {
    const int64_t D = p->head_size, H = p->num_kv_heads;
    if (d->chunk != D || src_stride_head != D * (int64_t)w->src_es || d->stride_head != D * (int64_t)w->dst_es)
        return 0;
    if (w->quant && p->scale_per_head)
        for (int64_t h = 1; h < H; h++)
            if (scale[h] != scale[0]) return 0;
    return 1;
}

static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    const vt_kv_store_params *p = j->p;
    const int64_t bs = p->block_size, H = p->num_kv_heads, D = p->head_size;
    const float one = 1.0f;
    for (int64_t t = 0; t < p->num_tokens; t++) {
        const int64_t s = p->slot_mapping[t];
        if (s < 0) continue;
        const int64_t b = s / bs, o = s % bs;
        /* A block belongs to one thread: no two threads write one block, and
         * tokens are walked in order, so the last token naming a slot wins. */
        if (nth > 1 && (int)(b % nth) != ith) continue;
        const char *ks = (const char *)p->key + t * p->key_stride_token;
        const char *vs = (const char *)p->value + t * p->value_stride_token;
        char *kd = (char *)p->key_cache.base + b * p->key_cache.stride_block + o * p->key_cache.stride_slot;
        char *vd = (char *)p->value_cache.base + b * p->value_cache.stride_block + o * p->value_cache.stride_slot;
        if (j->fused[0] && j->fused[1]) {
            const float ksc = j->w.quant ? p->k_scale[0] : one, vsc = j->w.quant ? p->v_scale[0] : one;
            if (j->w.quant) {
                j->w.quant(ks, (uint8_t *)kd, (size_t)(H * D), ksc);
                j->w.quant(vs, (uint8_t *)vd, (size_t)(H * D), vsc);
            } else {
                j->w.convert(ks, kd, (size_t)(H * D));
                j->w.convert(vs, vd, (size_t)(H * D));
            }
            continue;
        }
        for (int64_t h = 0; h < H; h++) {
            float ksc = one, vsc = one;
            if (j->w.quant) {
                ksc = p->k_scale[p->scale_per_head ? h : 0];
                vsc = p->v_scale[p->scale_per_head ? h : 0];
            }
            write_row(&j->w, &p->key_cache, ks + h * p->key_stride_head, kd + h * p->key_cache.stride_head, D, ksc);
            write_row(&j->w, &p->value_cache, vs + h * p->value_stride_head, vd + h * p->value_cache.stride_head, D,
                      vsc);
        }
    }
}

/* The element formats' own check: per-tensor fp8 takes finite, positive scales (one, or one per KV head). */
static vt_status elements_check(const vt_kv_store_params *p, const char *fn, vt_error *err) {
    if (vt_fp8_index(p->cache_dtype) < 0) return VT_OK;
    const int64_t ns = p->scale_per_head ? p->num_kv_heads : 1;
    vt_status st;
    if ((st = check_scales(fn, "k_scale", p->k_scale, ns, err)) || (st = check_scales(fn, "v_scale", p->v_scale, ns, err)))
        return st;
    return VT_OK;
}

/* The element formats' store: the codec's convert (plain) or quantize (fp8) rows, scattered by slot. */
static void elements_run(const vt_kv_store_params *p, int num_threads) {
    const vt_codec_kernels *k = vt_codec_active();
    store_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.w.src_es = vt_dtype_get(p->src_dtype)->elem_bytes;
    j.w.dst_es = vt_dtype_get(p->cache_dtype)->elem_bytes;
    int f = vt_fp8_index(p->cache_dtype);
    if (f >= 0) j.w.quant = k->quant[p->src_dtype][f];
    else j.w.convert = k->convert[p->src_dtype][p->cache_dtype];
    j.fused[0] = can_fuse(p, &j.w, &p->key_cache, p->key_stride_head, p->k_scale);
    j.fused[1] = can_fuse(p, &j.w, &p->value_cache, p->value_stride_head, p->v_scale);
    int64_t elems = p->num_tokens * p->num_kv_heads; /* rows; bounded by the caller's arrays */
    int64_t work = elems > INT64_MAX / p->head_size ? INT64_MAX : elems * p->head_size;
    vt_parallel_for(store_task, &j, vt_useful_threads(num_threads, work, STORE_PARALLEL_MIN_ELEMS, p->num_blocks));
}

const vt_store_kernel vt_store_elements = {.check = elements_check, .run = elements_run};

vt_status vt_kv_store(const vt_kv_store_params *p, int num_threads, vt_error *err) {
    vt_status st = vt_kv_store_check(p, err);
    if (st != VT_OK) return st;
    if (p->num_tokens > 0) vt_dtype_get(p->cache_dtype)->store->run(p, num_threads);
    return VT_OK;
}
