/* The paged KV cache's definition, private to the core (the public
 * header kvcache.h declares vt_kv_cache opaque, with accessors). */
#ifndef VTINFER_KVCACHE_INTERNAL_H
#define VTINFER_KVCACHE_INTERNAL_H

#include "vtinfer/kvcache.h"

/* The storage: one 64-byte aligned allocation, zero-filled, laid out as
 * [num_layers][2 (K, V)][layer_stride_bytes / 2] with each K and V region
 * 64-byte aligned (kv_bytes rounded up to 64 bytes). */
struct vt_kv_cache {
    vt_kv_cache_config cfg;
    size_t elem_bytes;
    size_t row_bytes;       /* one head row: head_size * elem_bytes (head_size / 2 for int4_per_token_head) */
    size_t kv_bytes;        /* bytes of one layer's K (or V): num_blocks * block_size * H * row_bytes */
    size_t region_bytes;    /* kv_bytes rounded up to 64 */
    size_t page_bytes;      /* one block over all layers, K and V: 2 * L * block_size * H * row_bytes
                             * (+ 8 * L * block_size * H for the scale planes of a per-token-head dtype) */
    size_t nbytes;          /* the allocation: 2 * L * (region_bytes + scale_region_bytes) */
    unsigned char *data;    /* NULL after vt_kv_cache_release */
    vt_kv_scale_mode k_scale_mode, v_scale_mode; /* the shapes the scales were given in */
    float *k_scale, *v_scale; /* [num_layers * num_kv_heads] each, always expanded */
    /* Per-token-head dtypes (page_layout VT_PAGE_SCALE_PLANES): after the 2 * L code regions, one
     * float32 [num_blocks, block_size, num_kv_heads] plane per layer for K and one for V, each
     * scale_region_bytes (64-byte multiple) long, [L][K, V] order. 0 otherwise. */
    size_t scale_region_bytes;
    /* Slot formats whose keys index a codebook (TurboQuant's MSE presets): the cache's own Lloyd-Max codebook
     * for its head size (vt_tq_codebook), which its store and gather give the slot loops. */
    int has_codebook;
    float centroids[16], midpoints[15];
};

/* K and V regions per layer: 2, or 1 for a slot format (K and V in one slot cache). */
size_t vt_kv_regions(vt_dtype dtype);

#endif /* VTINFER_KVCACHE_INTERNAL_H */
