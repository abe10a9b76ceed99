/* The PagedKVCache object, shared by the files of its binding:
 * kvcache_binding.c (the type, store/gather, getters) and
 * kvcache_export.c (NumPy views, DLPack). */
#ifndef VTINFER_BINDING_KVCACHE_TYPE_H
#define VTINFER_BINDING_KVCACHE_TYPE_H

#include <stdatomic.h>

#include "vt_binding.h"
#include "vt_dlpack.h"
#include "vtinfer/kvcache.h"

typedef struct {
    PyObject_HEAD
    vt_kv_cache *c;
    /* Live NumPy views and DLPack capsules, plus one per running kernel.
     * Atomic: DLPack deleters and GIL-free kernels change it off the GIL
     * (and a free-threaded build has no GIL at all). */
    atomic_long exports;
} KVCacheObject;

static inline void vt_kv_exports_add(KVCacheObject *self, long d) { atomic_fetch_add(&self->exports, d); }

/* ValueError naming fn when the cache was released. Returns 0 or -1. */
int vt_kv_require_storage(KVCacheObject *self, const char *fn);
/* A layer argument: an int in [0, num_layers) (TypeError / IndexError). */
int vt_kv_layer_arg(KVCacheObject *self, PyObject *obj, const char *fn, int64_t *layer);

/* Methods defined in kvcache_export.c (PyMethodDef signatures). */
PyObject *vt_kv_key_cache(PyObject *self, PyObject *layer);
PyObject *vt_kv_value_cache(PyObject *self, PyObject *layer);
PyObject *vt_kv_k_scale_cache(PyObject *self, PyObject *layer);
PyObject *vt_kv_v_scale_cache(PyObject *self, PyObject *layer);
PyObject *vt_kv_dunder_dlpack(PyObject *op, PyObject *args, PyObject *kw);
PyObject *vt_kv_private_dlpack(PyObject *op, PyObject *args, PyObject *kw);
/* The two DLPack methods' docstrings, from their signature tables (vt_kv_export_docs fills them). */
extern char vt_kv_dunder_dlpack_doc[512], vt_kv_private_dlpack_doc[512];
void vt_kv_export_docs(void);
PyObject *vt_kv_dlpack_device(PyObject *self, PyObject *unused);

#endif /* VTINFER_BINDING_KVCACHE_TYPE_H */
