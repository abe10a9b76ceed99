/* vtinfer public C API: the paged KV cache and the store (vLLM's
 * reshape_and_cache_flash / reshape_and_cache).
 *
 * One mechanism stores tokens: vt_kv_store, driven by a plain params struct
 * of pointers and byte strides. vt_kv_cache (the PagedKVCache) fills that
 * struct for one of its layers; the functional forms fill it from the
 * caller's arrays. Each head row is converted by the codec row kernels of
 * the active ISA (vt_codec_active), so the stored bytes equal
 * vt_fp8_quantize of the same row and scale, bit for bit.
 *
 * Every slot is checked before the first byte is written: a refused call
 * leaves the caches unchanged. C11 + libc only. */
#ifndef VTINFER_KVCACHE_H
#define VTINFER_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/dtype.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Physical order of one layer's K (or V) storage. */
typedef enum vt_kv_layout {
    VT_KV_LAYOUT_NHD = 0, /* [num_blocks, block_size, num_kv_heads, head_size] (vLLM's default) */
    VT_KV_LAYOUT_HND = 1  /* [num_blocks, num_kv_heads, block_size, head_size] */
} vt_kv_layout;

/* ---- the store kernel ----
 *
 * Destination of one cache (K or V): element (block b, offset o, head h,
 * dim d) lives at
 *   base + b*stride_block + o*stride_slot + h*stride_head
 *        + (d / chunk)*stride_chunk + (d % chunk)*elem_bytes
 * chunk == head_size (stride_chunk unused) describes the flash layouts
 * (NHD, HND, any strides with a contiguous last dimension); chunk == x
 * describes vLLM's x-split key cache [blocks, H, D/x, block_size, x];
 * chunk == 1 its value cache [blocks, H, D, block_size]. */
typedef struct vt_kv_dst {
    void *base;
    int64_t stride_block, stride_slot, stride_head, stride_chunk; /* bytes */
    int64_t chunk;                                                 /* elements; divides head_size */
} vt_kv_dst;

typedef struct vt_kv_store_params {
    const char *fn;           /* function name for messages ("reshape_and_cache_flash"); NULL: "vt_kv_store" */
    const void *key, *value;  /* [num_tokens, num_kv_heads, head_size] of src_dtype, read */
    int64_t key_stride_token, key_stride_head;     /* bytes; the last dimension is contiguous */
    int64_t value_stride_token, value_stride_head; /* bytes */
    vt_kv_dst key_cache, value_cache;              /* written */
    const int64_t *slot_mapping; /* [num_tokens], read; negative = skip the token */
    int64_t num_tokens, num_kv_heads, head_size, block_size, num_blocks;
    vt_dtype src_dtype;   /* F32, F16 or BF16 */
    vt_dtype cache_dtype; /* F32, F16, BF16 (plain conversion) or FP8_E4M3 / FP8_E5M2 */
    const float *k_scale, *v_scale; /* fp8 only: 1 element, or num_kv_heads when scale_per_head */
    int scale_per_head;
    /* Per-token-head caches (cache_dtype whose table row has scale_kind VT_SCALE_TOKEN_HEAD) only:
     * where the float32 scale of (block b, offset o, head h) is written, at base + b*stride_block +
     * o*stride_slot + h*stride_head (bytes; chunk unused). vLLM's [num_blocks, block_size,
     * num_kv_heads] scale caches with any strides. The code rows go through key_cache/value_cache
     * (chunk must equal head_size). */
    vt_kv_dst k_scale_cache, v_scale_cache;
} vt_kv_store_params;

/* Check everything vt_kv_store would write through: dtypes, sizes > 0 (and
 * num_tokens >= 0), chunk dividing head_size, scales finite and > 0, and
 * every slot < num_blocks * block_size. Writes nothing.
 * Status: VT_OK; VT_ERR_VALUE (a size, a scale, a NULL pointer);
 * VT_ERR_TYPE (a dtype); VT_ERR_INDEX (a slot out of range; the message
 * names the token: "slot_mapping[i] must be < N; got s");
 * VT_ERR_OVERFLOW (num_blocks * block_size overflows). */
VT_API vt_status vt_kv_store_check(const vt_kv_store_params *p, vt_error *err);

/* Store every token whose slot is >= 0: K and V rows of token t go to slot
 * slot_mapping[t] (block slot / block_size, offset slot % block_size).
 * Runs vt_kv_store_check first and writes nothing when it fails. Threads
 * (num_threads <= 0: one) split the work by slot, each walking the tokens
 * in order, so when two tokens name the same slot the later token's
 * values are the ones kept, whatever the thread count. Same statuses as
 * vt_kv_store_check. */
VT_API vt_status vt_kv_store(const vt_kv_store_params *p, int num_threads, vt_error *err);

/* ---- the paged KV cache ---- */

typedef struct vt_kv_cache_config {
    int64_t num_layers, num_blocks, block_size, num_kv_heads, head_size; /* each > 0 */
    vt_dtype dtype;
    vt_kv_layout layout;
    /* Rows with rope_block > 0 (Octave): the model's rotary dims, a multiple of rope_block in [0, head_size],
     * which size the slot (vt_dtype_slot_bytes_rope); ignored by every other dtype. */
    int64_t rope_dim;
} vt_kv_cache_config;
/* A slot format (page_layout VT_PAGE_SLOTS: TurboQuant, UltraQuant, Octave, NVFP4) holds one uint8 slot cache per
 * layer, K and V together (NVFP4's codes also take the layer's k_scale / v_scale, one per tensor or layer):
 * [num_blocks, block_size, num_kv_heads, slot_bytes] (NHD) or [num_blocks, num_kv_heads, block_size, slot_bytes]
 * (HND), row_bytes = the slot bytes; vt_kv_cache_layer_data gives the same storage for K (which 0) and V (1),
 * page_bytes = num_layers * block_size * num_kv_heads * slot_bytes. Its store and gather are vt_tq_store /
 * vt_tq_gather on that storage (the MSE presets of TurboQuant need the caller's codebook, which the cache does not
 * hold: vt_kv_cache_store / gather refuse them; store through vt_tq_store). */

/* Scale shapes. */
typedef enum vt_kv_scale_mode {
    VT_KV_SCALE_TENSOR = 0,   /* one value for every layer and head */
    VT_KV_SCALE_LAYER = 1,    /* [num_layers] */
    VT_KV_SCALE_HEAD = 2      /* [num_layers, num_kv_heads] */
} vt_kv_scale_mode;

/* A paged KV cache: one 64-byte aligned allocation, zero-filled, laid out
 * as [num_layers][2 (K, V)][region] with each K and V region 64-byte
 * aligned (a per-token-head dtype adds one float32 scale plane per layer
 * and K/V after the codes). Opaque: read it through the accessors below
 * (the definition is the core's, csrc/core/kvcache_internal.h). */
typedef struct vt_kv_cache vt_kv_cache;

/* Accessors; c must be a cache from vt_kv_cache_create (released or not). */
VT_API const vt_kv_cache_config *vt_kv_cache_get_config(const vt_kv_cache *c); /* the geometry it was made with */
VT_API size_t vt_kv_cache_elem_bytes(const vt_kv_cache *c);   /* bytes of one stored element */
VT_API size_t vt_kv_cache_row_bytes(const vt_kv_cache *c);    /* bytes of one head row: D * elem (D / 2 for int4) */
VT_API size_t vt_kv_cache_kv_bytes(const vt_kv_cache *c);     /* one layer's K (or V): blocks*block_size*H*row_bytes */
VT_API size_t vt_kv_cache_region_bytes(const vt_kv_cache *c); /* kv_bytes rounded up to 64 (layer_data's spacing) */
VT_API size_t vt_kv_cache_page_bytes(const vt_kv_cache *c);   /* one block over all layers, K and V (+ scale planes) */
VT_API size_t vt_kv_cache_nbytes(const vt_kv_cache *c);       /* the whole allocation */
VT_API int vt_kv_cache_is_released(const vt_kv_cache *c);     /* 1 after vt_kv_cache_release */
/* The K (which = 0) or V (which = 1) scales, always expanded to
 * [num_layers * num_kv_heads] (read-only; valid until the next
 * vt_kv_cache_set_scales or vt_kv_cache_free); *mode (may be NULL)
 * receives the shape they were given in. */
VT_API const float *vt_kv_cache_scales(const vt_kv_cache *c, int which, vt_kv_scale_mode *mode);

/* The K (which = 0) or V (which = 1) scale plane of `layer` of a per-token-head cache
 * (float32 [num_blocks, block_size, num_kv_heads], contiguous); NULL for other dtypes, out of
 * range, or released. */
VT_API float *vt_kv_cache_scale_data(const vt_kv_cache *c, int64_t layer, int which);

/* Sizes of a geometry without allocating: fills kv_bytes, region_bytes,
 * page_bytes, nbytes (any may be NULL). `fn` names the caller in messages.
 * Status: VT_OK; VT_ERR_VALUE (a size <= 0, a dtype that is not a storage
 * dtype, an unknown layout); VT_ERR_OVERFLOW (a product overflows 64 bits
 * or exceeds PTRDIFF_MAX). */
VT_API vt_status vt_kv_cache_sizes(const vt_kv_cache_config *cfg, const char *fn, size_t *kv_bytes,
                                   size_t *region_bytes, size_t *page_bytes, size_t *nbytes, vt_error *err);

/* Create a cache (scales 1.0, per tensor). *out receives a cache owned by
 * the caller (vt_kv_cache_free). Status: as vt_kv_cache_sizes, plus
 * VT_ERR_NOMEM. */
VT_API vt_status vt_kv_cache_create(const vt_kv_cache_config *cfg, vt_kv_cache **out, vt_error *err);

/* Free the storage and the struct. NULL is fine. */
VT_API void vt_kv_cache_free(vt_kv_cache *c);

/* Free the storage only (data becomes NULL); later calls that need it fail
 * with VT_ERR_VALUE. */
VT_API void vt_kv_cache_release(vt_kv_cache *c);

/* Set the K and V scales. k (v) holds 1, num_layers or num_layers *
 * num_kv_heads values as k_mode (v_mode) says; NULL leaves that one as it
 * is. Status: VT_OK; VT_ERR_VALUE (a scale not finite and > 0; the message
 * names k_scale or v_scale and the flat index; an unknown mode). Nothing
 * changes on error. */
VT_API vt_status vt_kv_cache_set_scales(vt_kv_cache *c, vt_kv_scale_mode k_mode, const float *k,
                                        vt_kv_scale_mode v_mode, const float *v, vt_error *err);

/* K (which = 0) or V (which = 1) storage of `layer`; NULL when out of range
 * or released. */
VT_API void *vt_kv_cache_layer_data(const vt_kv_cache *c, int64_t layer, int which);

/* Store tokens into `layer`: key/value [num_tokens, H, D] of src_dtype with
 * the given byte strides (last dimension contiguous), slot_mapping
 * [num_tokens]. Uses the layer's scales. Status: VT_ERR_INDEX (layer out of
 * range, a slot out of range), VT_ERR_VALUE (released storage), and those
 * of vt_kv_store. Nothing is written on error. */
VT_API vt_status vt_kv_cache_store(const vt_kv_cache *c, int64_t layer, const void *key, int64_t key_stride_token,
                                   int64_t key_stride_head, const void *value, int64_t value_stride_token,
                                   int64_t value_stride_head, vt_dtype src_dtype, const int64_t *slot_mapping,
                                   int64_t num_tokens, int num_threads, vt_error *err);

/* Read slots of `layer` back as float32: k_out and v_out [n, H, D]
 * contiguous, written (dequantized with the layer's scales for fp8; code *
 * scale for a per-token-head dtype; for int4_per_token_head (code - zp) *
 * scale rotated back to the stored basis, s ⊙ (H y) / b in float32).
 * Status: VT_ERR_INDEX (layer or a slot out of range, negative slots
 * included), VT_ERR_VALUE (released storage). Nothing is written on
 * error. */
VT_API vt_status vt_kv_cache_gather(const vt_kv_cache *c, int64_t layer, const int64_t *slots, int64_t n,
                                    float *k_out, float *v_out, vt_error *err);
/* vt_kv_cache_gather; rotated = 1 keeps int4_per_token_head's values in the rotated basis the codes are
 * stored in (VT_ERR_VALUE for any other dtype). */
VT_API vt_status vt_kv_cache_gather_basis(const vt_kv_cache *c, int64_t layer, const int64_t *slots, int64_t n,
                                          float *k_out, float *v_out, int rotated, vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_KVCACHE_H */
