/* The paged KV cache: geometry with overflow checks, one aligned
 * allocation, per-layer/per-head scales, and store/gather through the one
 * store kernel (kv_store.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache_internal.h"
#include "vt_internal.h"
#include "vtinfer/turboquant.h"

#define KV_ALIGN ((size_t)64)

static vt_status mul(const char *fn, size_t a, size_t b, size_t *out, vt_error *err) {
    if (vt_size_mul(a, b, out) != 0 || *out > (size_t)PTRDIFF_MAX)
        return vt_error_set(err, VT_ERR_OVERFLOW,
                            "%s: the cache size must fit in 64 bits (num_layers * num_blocks * block_size * "
                            "num_kv_heads * head_size * element bytes * 2); got a product that overflows",
                            fn);
    return VT_OK;
}

/* Bytes of one float32 scale plane [num_blocks, block_size, num_kv_heads], rounded up to 64, for a
 * per-token-head dtype; 0 for the others. Dimensions already checked > 0. */
static vt_status scale_region(const vt_kv_cache_config *cfg, const char *fn, size_t *out, vt_error *err) {
    *out = 0;
    if (vt_dtype_get(cfg->dtype)->page_layout != VT_PAGE_SCALE_PLANES) return VT_OK;
    size_t n;
    vt_status st;
    if ((st = mul(fn, (size_t)cfg->num_blocks, (size_t)cfg->block_size, &n, err)) ||
        (st = mul(fn, n, (size_t)cfg->num_kv_heads, &n, err)) || (st = mul(fn, n, 4, &n, err)))
        return st;
    if (vt_size_add(n, KV_ALIGN - 1, &n) != 0) return mul(fn, SIZE_MAX, 2, &n, err);
    *out = n & ~(KV_ALIGN - 1);
    return VT_OK;
}

vt_status vt_kv_cache_sizes(const vt_kv_cache_config *cfg, const char *fn, size_t *kv_bytes, size_t *region_bytes,
                            size_t *page_bytes, size_t *nbytes, vt_error *err) {
    if (!fn) fn = "vt_kv_cache_sizes";
    const struct { const char *name; int64_t v; } dims[5] = {
        {"num_layers", cfg->num_layers},     {"num_blocks", cfg->num_blocks}, {"block_size", cfg->block_size},
        {"num_kv_heads", cfg->num_kv_heads}, {"head_size", cfg->head_size},
    };
    for (int i = 0; i < 5; i++)
        if (dims[i].v <= 0)
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be > 0; got %lld", fn, dims[i].name,
                                (long long)dims[i].v);
    const vt_dtype_info *di = vt_dtype_get(cfg->dtype);
    if (!di) return vt_error_set(err, VT_ERR_VALUE, "%s: dtype must be a storage dtype; got id %d", fn, (int)cfg->dtype);
    vt_status gst = vt_dtype_check_head_size(cfg->dtype, cfg->head_size, fn, "head_size", "dtype", err);
    if (gst != VT_OK) return gst;
    if (cfg->layout != VT_KV_LAYOUT_NHD && cfg->layout != VT_KV_LAYOUT_HND)
        return vt_error_set(err, VT_ERR_VALUE, "%s: layout must be 'NHD' or 'HND'; got id %d", fn, (int)cfg->layout);
    if (di->rope_block > 0 && (cfg->rope_dim < 0 || cfg->rope_dim > cfg->head_size || cfg->rope_dim % di->rope_block))
        return vt_error_set(err, VT_ERR_VALUE, "%s: rope_dim must be a multiple of %d in [0, head_size = %lld] for "
                            "dtype '%s'; got %lld", fn, di->rope_block, (long long)cfg->head_size, di->name,
                            (long long)cfg->rope_dim);
    size_t row, blk, kv, page, region, total;
    vt_status st;
    const size_t regions = vt_kv_regions(cfg->dtype);
    /* Bytes of one head row: D * elem_bytes, D / 2 for int4 (two codes per byte), a slot format's whole slot. */
    if (di->page_layout == VT_PAGE_SLOTS)
        row = vt_dtype_slot_bytes_rope(cfg->dtype, (size_t)cfg->head_size, (size_t)cfg->rope_dim);
    else
        row = (size_t)cfg->head_size * (size_t)di->elem_bits / 8;
    if ((st = mul(fn, (size_t)cfg->num_kv_heads, row, &row, err)) ||
        (st = mul(fn, row, (size_t)cfg->block_size, &blk, err)) ||
        (st = mul(fn, blk, (size_t)cfg->num_blocks, &kv, err)) ||
        (st = mul(fn, blk, (size_t)cfg->num_layers, &page, err)) || (st = mul(fn, page, regions, &page, err)))
        return st;
    if (vt_size_add(kv, KV_ALIGN - 1, &region) != 0) return mul(fn, SIZE_MAX, 2, &region, err);
    region &= ~(KV_ALIGN - 1);
    if ((st = mul(fn, region, (size_t)cfg->num_layers, &total, err)) || (st = mul(fn, total, regions, &total, err)))
        return st;
    size_t sregion = 0;
    if ((st = scale_region(cfg, fn, &sregion, err))) return st;
    if (sregion) {
        /* The scale planes: 4 bytes per (slot, head) for each of K and V, in the page and the allocation. */
        size_t spage, stotal;
        if ((st = mul(fn, (size_t)cfg->block_size * (size_t)cfg->num_kv_heads, 8, &spage, err)) ||
            (st = mul(fn, spage, (size_t)cfg->num_layers, &spage, err)) ||
            (st = mul(fn, sregion, 2 * (size_t)cfg->num_layers, &stotal, err)))
            return st;
        if (vt_size_add(page, spage, &page) != 0 || vt_size_add(total, stotal, &total) != 0 ||
            total > (size_t)PTRDIFF_MAX)
            return mul(fn, SIZE_MAX, 2, &page, err);
    }
    if (kv_bytes) *kv_bytes = kv;
    if (region_bytes) *region_bytes = region;
    if (page_bytes) *page_bytes = page;
    if (nbytes) *nbytes = total;
    return VT_OK;
}

vt_status vt_kv_cache_create(const vt_kv_cache_config *cfg, vt_kv_cache **out, vt_error *err) {
    static const char fn[] = "PagedKVCache";
    *out = NULL;
    size_t kv, region, page, total, nscale;
    vt_status st = vt_kv_cache_sizes(cfg, fn, &kv, &region, &page, &total, err);
    if (st != VT_OK) return st;
    if ((st = mul(fn, (size_t)cfg->num_layers, (size_t)cfg->num_kv_heads, &nscale, err))) return st;
    vt_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return vt_error_set(err, VT_ERR_NOMEM, "%s: memory must be available; got an allocation failure", fn);
    c->cfg = *cfg;
    c->elem_bytes = vt_dtype_get(cfg->dtype)->elem_bytes;
    c->row_bytes = vt_dtype_get(cfg->dtype)->page_layout == VT_PAGE_SLOTS
                       ? vt_dtype_slot_bytes_rope(cfg->dtype, (size_t)cfg->head_size, (size_t)cfg->rope_dim)
                       : vt_dtype_row_bytes(cfg->dtype, (size_t)cfg->head_size);
    c->kv_bytes = kv;
    c->region_bytes = region;
    c->page_bytes = page;
    c->nbytes = total;
    if ((st = scale_region(cfg, fn, &c->scale_region_bytes, err))) {
        free(c);
        return st;
    }
    const vt_dtype_info *row = vt_dtype_get(cfg->dtype);
    if (row->slot && row->slot->needs_codebook(row)) {
        if ((st = vt_tq_codebook(cfg->dtype, cfg->head_size, c->centroids, c->midpoints, err))) {
            free(c);
            return st;
        }
        c->has_codebook = 1;
    }
    c->k_scale_mode = c->v_scale_mode = VT_KV_SCALE_TENSOR;
    c->k_scale = malloc(nscale * sizeof(float));
    c->v_scale = malloc(nscale * sizeof(float));
    /* total is a multiple of KV_ALIGN, as C11 aligned_alloc requires. */
    void *data = (c->k_scale && c->v_scale) ? aligned_alloc(KV_ALIGN, total) : NULL;
    if (!data) {
        vt_kv_cache_free(c);
        return vt_error_set(err, VT_ERR_NOMEM, "%s: %zu bytes must be available for the cache; got an allocation "
                            "failure", fn, total);
    }
    memset(data, 0, total);
    c->data = data;
    for (size_t i = 0; i < nscale; i++) c->k_scale[i] = c->v_scale[i] = 1.0f;
    if (c->scale_region_bytes) { /* per-token-head scale planes start at 1.0, as vLLM fills its scale caches */
        float *sp = vt_kv_cache_scale_data(c, 0, 0);
        size_t ns = c->scale_region_bytes / sizeof(float) * 2 * (size_t)cfg->num_layers;
        for (size_t i = 0; i < ns; i++) sp[i] = 1.0f;
    }
    *out = c;
    return VT_OK;
}

void vt_kv_cache_release(vt_kv_cache *c) {
    if (!c) return;
    free(c->data);
    c->data = NULL;
}

void vt_kv_cache_free(vt_kv_cache *c) {
    if (!c) return;
    free(c->data);
    free(c->k_scale);
    free(c->v_scale);
    free(c);
}

vt_status vt_kv_cache_set_scales(vt_kv_cache *c, vt_kv_scale_mode k_mode, const float *k,
                                 vt_kv_scale_mode v_mode, const float *v, vt_error *err) {
    static const char fn[] = "PagedKVCache";
    const int64_t L = c->cfg.num_layers, H = c->cfg.num_kv_heads;
    const float *src[2] = {k, v};
    const vt_kv_scale_mode mode[2] = {k_mode, v_mode};
    static const char *const names[2] = {"k_scale", "v_scale"};
    for (int s = 0; s < 2; s++) {
        if (!src[s]) continue;
        int64_t n = mode[s] == VT_KV_SCALE_TENSOR ? 1
                    : mode[s] == VT_KV_SCALE_LAYER ? L
                    : mode[s] == VT_KV_SCALE_HEAD  ? L * H
                                                   : -1;
        if (n < 0)
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s mode must be 0, 1 or 2; got %d", fn, names[s], (int)mode[s]);
        const vt_dtype_info *row = vt_dtype_get(c->cfg.dtype);
        if (mode[s] == VT_KV_SCALE_HEAD && row->global_scale)
            return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be one number or one per layer for kv_cache_dtype '%s' "
                                "(its global scale is per tensor); got one per KV head", fn, names[s], row->name);
        for (int64_t i = 0; i < n; i++)
            if (!vt_scale_ok(src[s][i]))
                return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be finite and > 0; got %g at flat index %lld", fn,
                                    names[s], (double)src[s][i], (long long)i);
    }
    float *dst[2] = {c->k_scale, c->v_scale};
    vt_kv_scale_mode *mode_out[2] = {&c->k_scale_mode, &c->v_scale_mode};
    for (int s = 0; s < 2; s++) {
        if (!src[s]) continue;
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                dst[s][l * H + h] = mode[s] == VT_KV_SCALE_TENSOR ? src[s][0]
                                    : mode[s] == VT_KV_SCALE_LAYER ? src[s][l]
                                                                    : src[s][l * H + h];
        *mode_out[s] = mode[s];
    }
    return VT_OK;
}

size_t vt_kv_regions(vt_dtype dtype) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->page_layout == VT_PAGE_SLOTS ? 1 : 2;
}

void *vt_kv_cache_layer_data(const vt_kv_cache *c, int64_t layer, int which) {
    if (!c || !c->data || layer < 0 || layer >= c->cfg.num_layers || (which != 0 && which != 1)) return NULL;
    const size_t regions = vt_kv_regions(c->cfg.dtype); /* a slot cache: K and V share one region */
    return c->data + ((size_t)layer * regions + (regions == 2 ? (size_t)which : 0)) * c->region_bytes;
}

float *vt_kv_cache_scale_data(const vt_kv_cache *c, int64_t layer, int which) {
    if (!c || !c->data || !c->scale_region_bytes || layer < 0 || layer >= c->cfg.num_layers ||
        (which != 0 && which != 1))
        return NULL;
    return (float *)(void *)(c->data + 2 * (size_t)c->cfg.num_layers * c->region_bytes +
                             ((size_t)layer * 2 + (size_t)which) * c->scale_region_bytes);
}

/* Destination of a layer's K or V scale plane ([NB, BS, H] float32, contiguous). */
static vt_kv_dst scale_dst(const vt_kv_cache *c, int64_t layer, int which) {
    vt_kv_dst d;
    memset(&d, 0, sizeof d);
    d.base = vt_kv_cache_scale_data(c, layer, which);
    d.stride_head = 4;
    d.stride_slot = 4 * c->cfg.num_kv_heads;
    d.stride_block = d.stride_slot * c->cfg.block_size;
    d.chunk = 1;
    return d;
}

/* Destination strides of a layer's K or V storage in the cache's layout. */
static vt_kv_dst layer_dst(const vt_kv_cache *c, int64_t layer, int which) {
    const int64_t bs = c->cfg.block_size, H = c->cfg.num_kv_heads, D = c->cfg.head_size;
    const int64_t row = (int64_t)c->row_bytes; /* D * elem bytes; D / 2 for int4 */
    vt_kv_dst d;
    d.base = vt_kv_cache_layer_data(c, layer, which);
    d.stride_block = bs * H * row;
    if (c->cfg.layout == VT_KV_LAYOUT_NHD) {
        d.stride_slot = H * row;
        d.stride_head = row;
    } else {
        d.stride_slot = row;
        d.stride_head = bs * row;
    }
    d.stride_chunk = 0;
    d.chunk = D;
    return d;
}

static vt_status check_layer(const vt_kv_cache *c, const char *fn, int64_t layer, vt_error *err) {
    if (!c->data)
        return vt_error_set(err, VT_ERR_VALUE, "%s: the cache must hold storage; got a released cache", fn);
    if (layer < 0 || layer >= c->cfg.num_layers)
        return vt_error_set(err, VT_ERR_INDEX, "%s: layer must be in [0, %lld); got %lld", fn,
                            (long long)c->cfg.num_layers, (long long)layer);
    return VT_OK;
}

/* A slot format's layer as the slot loops take it, with the cache's codebook where the row needs one. */
static vt_tq_cache slot_cache(const vt_kv_cache *c, int64_t layer) {
    const vt_kv_dst d = layer_dst(c, layer, 0);
    vt_tq_cache t;
    memset(&t, 0, sizeof t);
    t.dtype = c->cfg.dtype;
    t.num_blocks = c->cfg.num_blocks, t.block_size = c->cfg.block_size;
    t.num_kv_heads = c->cfg.num_kv_heads, t.head_size = c->cfg.head_size;
    t.rope_dim = c->cfg.rope_dim;
    t.data = d.base;
    t.stride_block = d.stride_block, t.stride_pos = d.stride_slot, t.stride_head = d.stride_head;
    if (c->has_codebook) t.centroids = c->centroids, t.midpoints = c->midpoints;
    /* a global-scale row's scales are per tensor or layer (vt_kv_cache_set_scales): head 0's is the layer's */
    t.k_scale = c->k_scale[layer * c->cfg.num_kv_heads], t.v_scale = c->v_scale[layer * c->cfg.num_kv_heads];
    return t;
}

vt_status vt_kv_cache_store(const vt_kv_cache *c, int64_t layer, const void *key, int64_t key_stride_token,
                            int64_t key_stride_head, const void *value, int64_t value_stride_token,
                            int64_t value_stride_head, vt_dtype src_dtype, const int64_t *slot_mapping,
                            int64_t num_tokens, int num_threads, vt_error *err) {
    static const char fn[] = "PagedKVCache.store";
    vt_status st = check_layer(c, fn, layer, err);
    if (st != VT_OK) return st;
    if (vt_kv_regions(c->cfg.dtype) == 1) {
        const vt_tq_cache t = slot_cache(c, layer);
        return vt_tq_store_named(fn, &t, src_dtype, key, key_stride_token, key_stride_head, value,
                                 value_stride_token, value_stride_head, slot_mapping, num_tokens, err);
    }
    vt_kv_store_params p;
    memset(&p, 0, sizeof p);
    p.fn = fn;
    p.key = key;
    p.value = value;
    p.key_stride_token = key_stride_token;
    p.key_stride_head = key_stride_head;
    p.value_stride_token = value_stride_token;
    p.value_stride_head = value_stride_head;
    p.key_cache = layer_dst(c, layer, 0);
    p.value_cache = layer_dst(c, layer, 1);
    p.slot_mapping = slot_mapping;
    p.num_tokens = num_tokens;
    p.num_kv_heads = c->cfg.num_kv_heads;
    p.head_size = c->cfg.head_size;
    p.block_size = c->cfg.block_size;
    p.num_blocks = c->cfg.num_blocks;
    p.src_dtype = src_dtype;
    p.cache_dtype = c->cfg.dtype;
    p.k_scale = c->k_scale + layer * c->cfg.num_kv_heads;
    p.v_scale = c->v_scale + layer * c->cfg.num_kv_heads;
    p.scale_per_head = 1;
    if (c->scale_region_bytes) {
        p.k_scale_cache = scale_dst(c, layer, 0);
        p.v_scale_cache = scale_dst(c, layer, 1);
    }
    return vt_kv_store(&p, num_threads, err);
}

vt_status vt_kv_cache_gather(const vt_kv_cache *c, int64_t layer, const int64_t *slots, int64_t n, float *k_out,
                             float *v_out, vt_error *err) {
    return vt_kv_cache_gather_basis(c, layer, slots, n, k_out, v_out, 0, err);
}

vt_status vt_kv_cache_gather_basis(const vt_kv_cache *c, int64_t layer, const int64_t *slots, int64_t n,
                                   float *k_out, float *v_out, int rotated, vt_error *err) {
    static const char fn[] = "PagedKVCache.gather";
    vt_status st = check_layer(c, fn, layer, err);
    if (st != VT_OK) return st;
    if (vt_kv_regions(c->cfg.dtype) == 1 && !rotated) {
        const vt_tq_cache t = slot_cache(c, layer);
        return vt_tq_gather_named(fn, &t, slots, n, k_out, v_out, 1, err);
    }
    const int int4 = vt_dtype_get(c->cfg.dtype)->read_family == VT_READ_INT4_ROTATED;
    if (rotated && !int4) {
        char names[128] = ""; /* the table's formats that store rotated codes */
        for (int d = 0; d < VT_DTYPE_COUNT; d++)
            if (vt_dtype_get(d)->read_family == VT_READ_INT4_ROTATED)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "",
                         vt_dtype_get(d)->name);
        return vt_error_set(err, VT_ERR_VALUE, "%s: rotated must be False for dtype '%s' (only %s stores rotated "
                            "codes); got True", fn, vt_dtype_get(c->cfg.dtype)->name, names);
    }
    /* int4: the inverse of the store's rotation (vt_int4_rht_back). */
    const int64_t bs = c->cfg.block_size, H = c->cfg.num_kv_heads, D = c->cfg.head_size;
    const int64_t limit = bs * c->cfg.num_blocks; /* fits: the allocation exists */
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= limit)
            return vt_error_set(err, VT_ERR_INDEX, "%s: slots[%lld] must be in [0, %lld); got %lld", fn, (long long)i,
                                (long long)limit, (long long)slots[i]);
    const vt_codec_kernels *k = vt_codec_active();
    const int f = vt_fp8_index(c->cfg.dtype);
    for (int which = 0; which < 2; which++) {
        vt_kv_dst d = layer_dst(c, layer, which);
        const float *scales = (which ? c->v_scale : c->k_scale) + layer * H;
        float *out = which ? v_out : k_out;
        for (int64_t i = 0; i < n; i++) {
            const int64_t b = slots[i] / bs, o = slots[i] % bs;
            for (int64_t h = 0; h < H; h++) {
                const char *src = (const char *)d.base + b * d.stride_block + o * d.stride_slot + h * d.stride_head;
                float *dst = out + (i * H + h) * D;
                if (c->scale_region_bytes) { /* per-token-head: code * that (token, head)'s scale */
                    const vt_kv_dst sd = scale_dst(c, layer, which);
                    float sc;
                    memcpy(&sc, (const char *)sd.base + b * sd.stride_block + o * sd.stride_slot + h * sd.stride_head,
                           sizeof sc);
                    vt_pth_dequant_row(c->cfg.dtype, (const uint8_t *)src, dst, D, sc);
                    if (int4 && !rotated) vt_int4_rht_back(dst, D);
                } else if (f >= 0) {
                    k->dequant[f][VT_DTYPE_F32]((const uint8_t *)src, dst, (size_t)D, scales[h]);
                } else {
                    k->convert[c->cfg.dtype][VT_DTYPE_F32](src, dst, (size_t)D);
                }
            }
        }
    }
    return VT_OK;
}

/* ---- accessors (vt_kv_cache is opaque outside the core) ---- */

const vt_kv_cache_config *vt_kv_cache_get_config(const vt_kv_cache *c) { return &c->cfg; }
size_t vt_kv_cache_elem_bytes(const vt_kv_cache *c) { return c->elem_bytes; }
size_t vt_kv_cache_row_bytes(const vt_kv_cache *c) { return c->row_bytes; }
size_t vt_kv_cache_kv_bytes(const vt_kv_cache *c) { return c->kv_bytes; }
size_t vt_kv_cache_region_bytes(const vt_kv_cache *c) { return c->region_bytes; }
size_t vt_kv_cache_page_bytes(const vt_kv_cache *c) { return c->page_bytes; }
size_t vt_kv_cache_nbytes(const vt_kv_cache *c) { return c->nbytes; }
int vt_kv_cache_is_released(const vt_kv_cache *c) { return c->data == NULL; }

const float *vt_kv_cache_scales(const vt_kv_cache *c, int which, vt_kv_scale_mode *mode) {
    if (mode) *mode = which ? c->v_scale_mode : c->k_scale_mode;
    return which ? c->v_scale : c->k_scale;
}
