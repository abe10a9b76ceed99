/* The store's argument layer, shared by vtinfer._C and vtinfer._cuda
 * (Python.h, no NumPy): reshape_and_cache_flash / reshape_and_cache
 * arguments -> vt_kv_store_params, with every type, rank, shape, dtype,
 * contiguity and overlap rule in one place. The extensions differ only in
 * how a tensor is pinned (their front door and device check) and in where
 * the slot and scale values live (host copies on CUDA). */
#ifndef VTINFER_BINDING_STORE_ARGS_H
#define VTINFER_BINDING_STORE_ARGS_H

#include "vt_import.h"
#include "vtinfer/kvcache.h"

typedef struct vt_store_call {
    const char *fn;   /* "reshape_and_cache_flash" or "reshape_and_cache" */
    int xsplit, hnd;  /* x-split paged layout; HND flash layout */
    int kv_flag;      /* kv_cache_dtype as parsed (VT_DTYPE_AUTO for "auto") */
    vt_memory mem;
    vt_tensor key, value, key_cache, value_cache, slots;
    vt_tensor k_scale_cache, v_scale_cache; /* per-token-head only: float32 [num_blocks, block_size, H_kv]; owner NULL when None */
    float *scales;    /* owned: k then v, each 1 or num_kv_heads values (host) */
    vt_kv_store_params p; /* filled by vt_store_check; slot_mapping and scales point at the tensors' memory */
} vt_store_call;

/* A dtype name of the table or "auto": TypeError/ValueError naming arg. */
int vt_parse_dtype_name(PyObject *obj, const char *fn, const char *arg, int *out);
/* layout None / "NHD" (0) / "HND" (1): ValueError otherwise. */
int vt_parse_layout(PyObject *obj, const char *fn, int *hnd);

/* Pin and check key, value [T, H, D] (float, one dtype), slot_mapping
 * int64 [n <= T]; H, D < 0: from key. Inputs only: no cache. */
int vt_store_pin_inputs(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *key, PyObject *value, PyObject *slots,
                        int64_t H, int64_t D);
/* Pin the two caches (writable, no conversion) and check their rank. */
int vt_store_pin_caches(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *key_cache, PyObject *value_cache);
/* Pin k_scale_cache / v_scale_cache (None: left empty; else writable,
 * no conversion, float32, 3 dimensions). Which dtypes need them, their
 * shape and their overlap are vt_store_check's. */
int vt_store_pin_scale_caches(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *k_scale_cache,
                              PyObject *v_scale_cache);
/* Inputs with a contiguous last dimension (after any front-door copy). */
int vt_store_check_inputs_contiguous(const vt_store_call *c);
/* Shapes, the caches' dtype against kv_cache_dtype, their strides, and
 * overlap (shared elements: caches with each other, inputs with caches);
 * fills c->p but the scales. A per-token-head kv_cache_dtype takes code
 * caches of the table's element whose last dimension is D or vLLM's
 * padded D + 4 (the 4 bytes where its scale views live; never written),
 * and requires both scale caches, [num_blocks, block_size, H_kv] of any
 * strides, sharing no element with the inputs, the codes or each other. */
int vt_store_check(vt_store_call *c);
/* The scales: k/v hold nk/nv host values (each 1 or num_kv_heads; a
 * one-value scale beside a per-head one is expanded), used for fp8 only. */
int vt_store_set_scales(vt_store_call *c, const float *k, int64_t nk, const float *v, int64_t nv);
void vt_store_release(vt_store_call *c);

#endif /* VTINFER_BINDING_STORE_ARGS_H */
