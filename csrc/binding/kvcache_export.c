/* Zero-copy exports of a PagedKVCache: NumPy views of a layer's K/V (and
 * scale planes) and DLPack capsules of the cache, a layer or one of its
 * K/V. Each export holds a reference to the cache and one count of
 * KVCacheObject.exports (atomic: dropped by DLPack deleters that may run
 * on any thread), so release() refuses while one is alive. */
#include "vt_kvcache_type.h"
#include "vt_signature.h"

#include <string.h>

/* An export pin: a capsule whose destructor releases the cache's count. */
static void export_pin_destroy(PyObject *cap) {
    KVCacheObject *self = PyCapsule_GetPointer(cap, "vtinfer.kv_export");
    if (!self) {
        PyErr_Clear();
        return;
    }
    vt_kv_exports_add(self, -1);
    Py_DECREF(self);
}

static PyObject *export_pin_new(KVCacheObject *self) {
    PyObject *cap = PyCapsule_New(self, "vtinfer.kv_export", export_pin_destroy);
    if (!cap) return NULL;
    Py_INCREF(self);
    vt_kv_exports_add(self, 1);
    return cap;
}

/* A writable C-contiguous NumPy array of descr d (reference stolen) over the cache's bytes at data, holding an
 * export pin on the cache for its lifetime. */
static PyObject *pinned_view(KVCacheObject *self, PyArray_Descr *d, int nd, npy_intp *dims, void *data) {
    PyObject *pin = export_pin_new(self);
    if (!pin) {
        Py_DECREF(d);
        return NULL;
    }
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, data, NPY_ARRAY_CARRAY, NULL);
    if (!a) {
        Py_DECREF(pin);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)a, pin) < 0) { /* steals pin */
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* NumPy view of K (which 0) or V (1) of a layer: the layout's shape,
 * contiguous, writable, uint8 for fp8 (and for int4's packed codes, last dimension D / 2; for a slot format the
 * one slot cache, last dimension the slot bytes, the same storage for K and V). */
static PyObject *kv_view(KVCacheObject *self, PyObject *layer_obj, int which) {
    const char *fn = which ? "PagedKVCache.value_cache" : "PagedKVCache.key_cache";
    vt_module_state *st = vt_state_from_type(Py_TYPE(self));
    int64_t layer;
    if (!st || vt_kv_require_storage(self, fn) < 0 || vt_kv_layer_arg(self, layer_obj, fn, &layer) < 0) return NULL;
    const vt_kv_cache_config *g = vt_kv_cache_get_config(self->c);
    /* the last dimension: D elements, or D / 2 bytes of packed int4 codes */
    npy_intp dims[4] = {(npy_intp)g->num_blocks, (npy_intp)g->block_size, (npy_intp)g->num_kv_heads,
                        (npy_intp)(vt_kv_cache_row_bytes(self->c) / vt_kv_cache_elem_bytes(self->c))};
    if (g->layout == VT_KV_LAYOUT_HND) {
        dims[1] = (npy_intp)g->num_kv_heads;
        dims[2] = (npy_intp)g->block_size;
    }
    PyArray_Descr *d;
    switch (g->dtype) {
    case VT_DTYPE_F32: d = PyArray_DescrFromType(NPY_FLOAT32); break;
    case VT_DTYPE_F16: d = PyArray_DescrFromType(NPY_FLOAT16); break;
    case VT_DTYPE_BF16: d = st->descr_bf16; Py_INCREF(d); break;
    default: d = PyArray_DescrFromType(vt_dtype_get(g->dtype)->is_int ? NPY_INT8 : NPY_UINT8); break;
    }
    return pinned_view(self, d, 4, dims, vt_kv_cache_layer_data(self->c, layer, which));
}

/* Zero-copy float32 [num_blocks, block_size, H_kv] view of a per-token-head layer's K/V scale plane. */
static PyObject *kv_scale_view(KVCacheObject *self, PyObject *layer_obj, int which) {
    const char *fn = which ? "PagedKVCache.v_scale_cache" : "PagedKVCache.k_scale_cache";
    vt_module_state *st = vt_state_from_type(Py_TYPE(self));
    int64_t layer;
    if (!st || vt_kv_require_storage(self, fn) < 0 || vt_kv_layer_arg(self, layer_obj, fn, &layer) < 0) return NULL;
    const vt_kv_cache_config *g = vt_kv_cache_get_config(self->c);
    if (!vt_dtype_per_token_head(g->dtype)) {
        PyErr_Format(PyExc_ValueError, "%s: the cache must have a per-token-head dtype; got '%s'", fn,
                     vt_dtype_get(g->dtype)->name);
        return NULL;
    }
    npy_intp dims[3] = {(npy_intp)g->num_blocks, (npy_intp)g->block_size, (npy_intp)g->num_kv_heads};
    return pinned_view(self, PyArray_DescrFromType(NPY_FLOAT32), 3, dims, vt_kv_cache_scale_data(self->c, layer, which));
}

PyObject *vt_kv_k_scale_cache(PyObject *self, PyObject *layer) {
    return kv_scale_view((KVCacheObject *)self, layer, 0);
}
PyObject *vt_kv_v_scale_cache(PyObject *self, PyObject *layer) {
    return kv_scale_view((KVCacheObject *)self, layer, 1);
}

PyObject *vt_kv_key_cache(PyObject *self, PyObject *layer) { return kv_view((KVCacheObject *)self, layer, 0); }
PyObject *vt_kv_value_cache(PyObject *self, PyObject *layer) { return kv_view((KVCacheObject *)self, layer, 1); }

/* ---- DLPack export ---- */

typedef struct dl_export {
    vt_dl_managed legacy;
    vt_dl_managed_versioned versioned;
    int is_versioned;
    int64_t shape[6], strides[6];
    KVCacheObject *owner;
} dl_export;

static void dl_export_free(dl_export *e) {
    PyGILState_STATE g = PyGILState_Ensure();
    vt_kv_exports_add(e->owner, -1);
    Py_DECREF(e->owner);
    PyMem_RawFree(e);
    PyGILState_Release(g);
}

static void dl_deleter_legacy(vt_dl_managed *m) { dl_export_free((dl_export *)m->manager_ctx); }
static void dl_deleter_versioned(vt_dl_managed_versioned *m) { dl_export_free((dl_export *)m->manager_ctx); }

static void dl_capsule_destroy(PyObject *cap) {
    /* Only a capsule nobody consumed still carries its original name. */
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        vt_dl_managed_versioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        vt_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
    PyErr_Clear();
}

/* layer -1: the whole cache [L, 2, ...]; which -1: [2, ...] of a layer;
 * which 0/1: K or V of a layer. */
static PyObject *kv_dlpack_capsule(KVCacheObject *self, int64_t layer, int which, int versioned) {
    const vt_kv_cache *c = self->c;
    const vt_kv_cache_config *g = vt_kv_cache_get_config(c);
    const int64_t es = (int64_t)vt_kv_cache_elem_bytes(c), region = (int64_t)(vt_kv_cache_region_bytes(c) / vt_kv_cache_elem_bytes(c));
    dl_export *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    int64_t inner[4] = {g->num_blocks, g->block_size, g->num_kv_heads, (int64_t)vt_kv_cache_row_bytes(c) / es};
    if (g->layout == VT_KV_LAYOUT_HND) {
        inner[1] = g->num_kv_heads;
        inner[2] = g->block_size;
    }
    int nd = 0;
    /* a slot format keeps K and V in one slot cache: one region per layer, the K / V axis of stride 0 */
    const int64_t kv_stride = vt_dtype_get(g->dtype)->page_layout == VT_PAGE_SLOTS ? 0 : region;
    if (layer < 0) {
        e->shape[nd] = g->num_layers;
        e->strides[nd++] = region + kv_stride;
    }
    if (which < 0) {
        e->shape[nd] = 2;
        e->strides[nd++] = kv_stride;
    }
    int64_t stride = 1;
    for (int i = 3; i >= 0; i--) {
        e->shape[nd + i] = inner[i];
        e->strides[nd + i] = stride;
        stride *= inner[i];
    }
    nd += 4;
    vt_dl_tensor t;
    memset(&t, 0, sizeof t);
    t.data = vt_kv_cache_layer_data(c, layer < 0 ? 0 : layer, which < 0 ? 0 : which);
    t.device.device_type = VT_DL_CPU;
    t.device.device_id = 0;
    t.ndim = nd;
    t.dtype.lanes = 1;
    t.dtype.bits = (uint8_t)(es * 8);
    const vt_dtype_info *di = vt_dtype_get(g->dtype);
    t.dtype.code = g->dtype == VT_DTYPE_BF16           ? VT_DL_BFLOAT
                   : di->is_int                        ? VT_DL_INT
                   : di->scale_kind != VT_SCALE_NONE   ? VT_DL_UINT
                                                       : VT_DL_FLOAT;
    t.shape = e->shape;
    t.strides = e->strides;
    e->owner = self;
    e->is_versioned = versioned;
    PyObject *cap;
    if (versioned) {
        e->versioned.version.major = 1;
        e->versioned.version.minor = 0;
        e->versioned.manager_ctx = e;
        e->versioned.deleter = dl_deleter_versioned;
        e->versioned.dl_tensor = t;
        cap = PyCapsule_New(&e->versioned, "dltensor_versioned", dl_capsule_destroy);
    } else {
        e->legacy.manager_ctx = e;
        e->legacy.deleter = dl_deleter_legacy;
        e->legacy.dl_tensor = t;
        cap = PyCapsule_New(&e->legacy, "dltensor", dl_capsule_destroy);
    }
    if (!cap) {
        PyMem_RawFree(e);
        return NULL;
    }
    Py_INCREF(self);
    vt_kv_exports_add(self, 1);
    return cap;
}

/* max_version None or a tuple (major, minor): versioned when major >= 1. */
static int want_versioned(PyObject *mv) {
    if (!mv || mv == Py_None) return 0;
    if (!PyTuple_Check(mv) || PyTuple_GET_SIZE(mv) < 1) return 0;
    int overflow = 0;
    long major = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(mv, 0), &overflow);
    if (major == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return overflow > 0 || major >= 1; /* a major past C's long is a future version, not an error */
}

VT_SIGNATURE(dunder_dlpack_sig, "__dlpack__", VT_KV_DLPACK_NPOS, VT_KV_DLPACK_ARGS);
VT_SIGNATURE(private_dlpack_sig, "_dlpack", VT_KV_PRIVATE_DLPACK_NPOS, VT_KV_PRIVATE_DLPACK_ARGS);
char vt_kv_dunder_dlpack_doc[512], vt_kv_private_dlpack_doc[512];

void vt_kv_export_docs(void) {
    vt_signature_doc_as(&dunder_dlpack_sig, "$self", "The whole cache as [num_layers, 2, ...] in the layout's order "
                        "(uint8 for fp8).", vt_kv_dunder_dlpack_doc, sizeof vt_kv_dunder_dlpack_doc);
    vt_signature_doc_as(&private_dlpack_sig, "$self", "A DLPack capsule of the cache, a layer ([2, ...]) or one of its "
                        "K (which=0) / V (which=1).", vt_kv_private_dlpack_doc, sizeof vt_kv_private_dlpack_doc);
}

PyObject *vt_kv_dunder_dlpack(PyObject *op, PyObject *args, PyObject *kw) {
    KVCacheObject *self = (KVCacheObject *)op;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&dunder_dlpack_sig, args, kw, a) < 0) return NULL;
    PyObject *mv = vt_arg_or_none(a[1]), *copy = vt_arg_or_none(a[3]); /* stream, dl_device: CPU memory, none */
    if (vt_kv_require_storage(self, "PagedKVCache.__dlpack__") < 0) return NULL;
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "PagedKVCache.__dlpack__: copy must be None or False; got True");
        return NULL;
    }
    return kv_dlpack_capsule(self, -1, -1, want_versioned(mv));
}

PyObject *vt_kv_private_dlpack(PyObject *op, PyObject *args, PyObject *kw) {
    KVCacheObject *self = (KVCacheObject *)op;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&private_dlpack_sig, args, kw, a) < 0) return NULL;
    PyObject *layer_obj = a[0], *mv = vt_arg_or_none(a[2]);
    int64_t which64 = -1;
    if (a[1] && vt_int_arg(a[1], "PagedKVCache._dlpack", "which", -1, 1, &which64) < 0) return NULL;
    int which = (int)which64;
    if (vt_kv_require_storage(self, "PagedKVCache._dlpack") < 0) return NULL;
    int64_t layer = -1;
    if (layer_obj && layer_obj != Py_None && vt_kv_layer_arg(self, layer_obj, "PagedKVCache._dlpack", &layer) < 0)
        return NULL;
    if (layer < 0 && which >= 0) {
        PyErr_SetString(PyExc_ValueError, "PagedKVCache._dlpack: which needs a layer");
        return NULL;
    }
    return kv_dlpack_capsule(self, layer, which, want_versioned(mv));
}

PyObject *vt_kv_dlpack_device(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(ii)", VT_DL_CPU, 0);
}

