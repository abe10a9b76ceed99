/* Python surface of the paged KV cache (the type):
 *
 *   class _C.PagedKVCache:
 *       __new__(num_layers, num_blocks, block_size, num_kv_heads, head_size, dtype,
 *               layout="NHD", k_scale=1.0, v_scale=1.0, *, model_dtype=None, rope_dim=None)
 *       key_cache(layer) / value_cache(layer) -> ndarray view (uint8 for fp8)
 *       store(layer, key, value, slot_mapping, *, num_threads=None)
 *       gather(layer, slots, *, rotated=False) -> (k float32 [n, H, D], v float32 [n, H, D])
 *       release()                       # frees the storage; BufferError while views live
 *       _dlpack(layer=-1, which=-1, max_version=None) -> capsule
 *       __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)
 *       __dlpack_device__() -> (1, 0)
 *       k_scale, v_scale (get/set arrays), num_layers, ..., dtype, layout, page_bytes, nbytes, exports
 *
 * The views and DLPack exports live in kvcache_export.c, the functional
 * stores in store_binding.c. */
#include "vt_kvcache_type.h"
#include "vt_signature.h"

#include <string.h>

static const char *layout_name(vt_kv_layout l) { return l == VT_KV_LAYOUT_HND ? "HND" : "NHD"; }

/* ---------------------------------------------------------------- scales */

/* Cache scales: a number, [num_layers] or [num_layers, num_kv_heads]. */
static int cache_scale_parse(const vt_kv_cache *c, PyObject *obj, const char *arg, PyArrayObject **out,
                             vt_kv_scale_mode *mode) {
    static const char fn[] = "PagedKVCache";
    PyArrayObject *a = vt_scale_array(obj, fn, arg);
    if (!a) return -1;
    int nd = PyArray_NDIM(a);
    npy_intp *sh = PyArray_DIMS(a);
    const vt_kv_cache_config *g = vt_kv_cache_get_config(c);
    const int64_t L = g->num_layers, H = g->num_kv_heads;
    if (nd == 0) *mode = VT_KV_SCALE_TENSOR;
    else if (nd == 1 && sh[0] == L) *mode = VT_KV_SCALE_LAYER;
    else if (nd == 1 && sh[0] == 1) *mode = VT_KV_SCALE_TENSOR;
    else if (nd == 2 && sh[0] == L && sh[1] == H) *mode = VT_KV_SCALE_HEAD;
    else {
        PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
        PyErr_Format(PyExc_ValueError,
                     "%s: %s must be a number, shape [num_layers] = [%lld] or [num_layers, num_kv_heads] = "
                     "[%lld, %lld]; got shape %R",
                     fn, arg, (long long)L, (long long)L, (long long)H, shape ? shape : Py_None);
        Py_XDECREF(shape);
        Py_DECREF(a);
        return -1;
    }
    *out = a;
    return 0;
}

static int cache_set_scales(vt_module_state *st, vt_kv_cache *c, PyObject *k_obj, PyObject *v_obj) {
    PyArrayObject *k = NULL, *v = NULL;
    vt_kv_scale_mode km = VT_KV_SCALE_TENSOR, vm = VT_KV_SCALE_TENSOR;
    if (k_obj && cache_scale_parse(c, k_obj, "k_scale", &k, &km) < 0) return -1;
    if (v_obj && cache_scale_parse(c, v_obj, "v_scale", &v, &vm) < 0) {
        Py_XDECREF(k);
        return -1;
    }
    vt_error err;
    vt_status s = vt_kv_cache_set_scales(c, km, k ? (const float *)PyArray_DATA(k) : NULL, vm,
                                         v ? (const float *)PyArray_DATA(v) : NULL, &err);
    Py_XDECREF(k);
    Py_XDECREF(v);
    if (s != VT_OK) {
        vt_raise(st, &err);
        return -1;
    }
    return 0;
}

static PyObject *cache_get_scales(const vt_kv_cache *c, int which) {
    vt_kv_scale_mode mode;
    const float *src = vt_kv_cache_scales(c, which, &mode);
    const vt_kv_cache_config *g = vt_kv_cache_get_config(c);
    const int64_t L = g->num_layers, H = g->num_kv_heads;
    npy_intp dims[2] = {(npy_intp)L, (npy_intp)H};
    int nd = mode == VT_KV_SCALE_TENSOR ? 0 : mode == VT_KV_SCALE_LAYER ? 1 : 2;
    PyObject *a = PyArray_SimpleNew(nd, dims, NPY_FLOAT32);
    if (!a) return NULL;
    float *d = PyArray_DATA((PyArrayObject *)a);
    if (nd == 0) d[0] = src[0];
    else if (nd == 1)
        for (int64_t l = 0; l < L; l++) d[l] = src[l * H];
    else memcpy(d, src, (size_t)(L * H) * sizeof(float));
    return a;
}

/* ---------------------------------------------------------- the type */

VT_SIGNATURE(kv_new_sig, "PagedKVCache", VT_KV_NEW_NPOS, VT_KV_NEW_ARGS);
VT_SIGNATURE(kv_store_sig, "store", VT_KV_STORE_NPOS, VT_KV_STORE_ARGS);
VT_SIGNATURE(kv_gather_sig, "gather", VT_KV_GATHER_NPOS, VT_KV_GATHER_ARGS);

static PyObject *kv_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static const char fn[] = "PagedKVCache";
    vt_module_state *st = vt_state_from_type(type);
    if (!st) return NULL;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&kv_new_sig, args, kw, a) < 0) return NULL;
    PyObject *const *dims_obj = a;
    char *const *kwlist = kv_new_sig.kwlist;
    int64_t dims[5];
    PyObject *dtype_obj = a[5], *layout_obj = a[6], *k_obj = a[7], *v_obj = a[8], *model_obj = vt_arg_or_none(a[9]);
    PyObject *rope_obj = vt_arg_or_none(a[10]);
    for (int i = 0; i < 5; i++) /* the core refuses values < 1 by name; here only what is not a 64-bit int */
        if (vt_int_arg(dims_obj[i], fn, kwlist[i], INT64_MIN, INT64_MAX, &dims[i]) < 0) return NULL;
    const int64_t L = dims[0], nb = dims[1], bs = dims[2], H = dims[3], D = dims[4];
    int dtype;
    if (vt_parse_dtype_name(dtype_obj, fn, "dtype", &dtype) < 0) return NULL;
    if (dtype == VT_DTYPE_AUTO) {
        if (model_obj == Py_None) {
            PyErr_Format(PyExc_ValueError, "%s: model_dtype must be given when dtype is 'auto'; got None", fn);
            return NULL;
        }
        if (vt_parse_dtype_name(model_obj, fn, "model_dtype", &dtype) < 0) return NULL;
        if (dtype == VT_DTYPE_AUTO || vt_dtype_get(dtype)->scale_kind != VT_SCALE_NONE) {
            PyErr_Format(PyExc_ValueError, "%s: model_dtype must be float32, float16 or bfloat16; got %R", fn,
                         model_obj);
            return NULL;
        }
    }
    vt_kv_layout layout = VT_KV_LAYOUT_NHD;
    if (layout_obj && layout_obj != Py_None) {
        const char *s = PyUnicode_Check(layout_obj) ? PyUnicode_AsUTF8(layout_obj) : NULL;
        if (s && strcmp(s, "NHD") == 0) layout = VT_KV_LAYOUT_NHD;
        else if (s && strcmp(s, "HND") == 0) layout = VT_KV_LAYOUT_HND;
        else {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s: layout must be 'NHD' or 'HND'; got %R", fn, layout_obj);
            return NULL;
        }
    }
    int64_t rope = D; /* no rope_dim: every dim rotary (vLLM's rule without a partial_rotary_factor) */
    if (rope_obj != Py_None && vt_int_arg(rope_obj, fn, "rope_dim", INT64_MIN, INT64_MAX, &rope) < 0) return NULL;
    vt_kv_cache_config cfg = {L, nb, bs, H, D, (vt_dtype)dtype, layout, rope};
    vt_error err;
    vt_kv_cache *c = NULL;
    /* Check the geometry (and overflow) before scales so that a bad size is
     * reported as such; create allocates and zero-fills. */
    if (vt_kv_cache_sizes(&cfg, fn, NULL, NULL, NULL, NULL, &err) != VT_OK) return vt_raise(st, &err);
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_kv_cache_create(&cfg, &c, &err);
    Py_END_ALLOW_THREADS
    if (s != VT_OK) return vt_raise(st, &err);
    if (cache_set_scales(st, c, k_obj, v_obj) < 0) {
        vt_kv_cache_free(c);
        return NULL;
    }
    KVCacheObject *self = (KVCacheObject *)type->tp_alloc(type, 0);
    if (!self) {
        vt_kv_cache_free(c);
        return NULL;
    }
    self->c = c;
    atomic_init(&self->exports, 0);
    return (PyObject *)self;
}

static void kv_dealloc(PyObject *op) {
    KVCacheObject *self = (KVCacheObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    vt_kv_cache_free(self->c); /* no export can be alive: each holds a reference */
    self->c = NULL;
    tp->tp_free(op);
    Py_DECREF(tp);
}

int vt_kv_require_storage(KVCacheObject *self, const char *fn) {
    if (vt_kv_cache_is_released(self->c)) {
        PyErr_Format(PyExc_ValueError, "%s: the cache must hold storage; got a released cache", fn);
        return -1;
    }
    return 0;
}

int vt_kv_layer_arg(KVCacheObject *self, PyObject *obj, const char *fn, int64_t *layer) {
    int64_t v;
    if (vt_int_arg(obj, fn, "layer", INT64_MIN, INT64_MAX, &v) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
        PyErr_Clear(); /* beyond 64 bits: out of range like any other layer number */
        v = -1;
    }
    if (v < 0 || v >= vt_kv_cache_get_config(self->c)->num_layers) {
        PyErr_Format(PyExc_IndexError, "%s: layer must be in [0, %lld); got %R", fn,
                     (long long)vt_kv_cache_get_config(self->c)->num_layers, obj);
        return -1;
    }
    *layer = v;
    return 0;
}

/* ---- store / gather ---- */

/* vtinfer._C's front door for the shared argument layer. */
static int cpu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    return vt_tensor_from_object((vt_module_state *)ctx, obj, fn, arg, flags, t);
}

/* The layer's K or V storage as a flat byte tensor, for the overlap test. */
static void layer_region(const KVCacheObject *self, int64_t layer, int which, vt_tensor *t) {
    memset(t, 0, sizeof *t);
    t->data = vt_kv_cache_layer_data(self->c, layer, which);
    t->elem = VT_ELEM_U8;
    t->itemsize = 1;
    t->ndim = 1;
    t->shape[0] = (int64_t)vt_kv_cache_kv_bytes(self->c);
    t->strides[0] = 1;
}

/* An input that is a view into the layer it is stored into is refused. */
static int refuse_inputs_in_layer(const KVCacheObject *self, const char *fn, int64_t layer, const vt_store_call *in) {
    vt_tensor kr, vr;
    layer_region(self, layer, 0, &kr);
    layer_region(self, layer, 1, &vr);
    return vt_refuse_shared(fn, &in->key, "key", &kr, "the layer's key cache") < 0 ||
                   vt_refuse_shared(fn, &in->key, "key", &vr, "the layer's value cache") < 0 ||
                   vt_refuse_shared(fn, &in->value, "value", &kr, "the layer's key cache") < 0 ||
                   vt_refuse_shared(fn, &in->value, "value", &vr, "the layer's value cache") < 0 ||
                   vt_refuse_shared(fn, &in->slots, "slot_mapping", &kr, "the layer's key cache") < 0 ||
                   vt_refuse_shared(fn, &in->slots, "slot_mapping", &vr, "the layer's value cache") < 0
               ? -1
               : 0;
}

static PyObject *kv_store(PyObject *op, PyObject *args, PyObject *kw) {
    static const char fn[] = "PagedKVCache.store";
    KVCacheObject *self = (KVCacheObject *)op;
    vt_module_state *st = vt_state_from_type(Py_TYPE(op));
    PyObject *a[VT_SIG_MAX_ARGS];
    if (!st || vt_sig_parse(&kv_store_sig, args, kw, a) < 0) return NULL;
    PyObject *layer_obj = a[0], *k_obj = a[1], *v_obj = a[2], *s_obj = a[3], *nt_obj = vt_arg_or_none(a[4]);
    int64_t layer;
    int nth;
    if (vt_kv_require_storage(self, fn) < 0 || vt_kv_layer_arg(self, layer_obj, fn, &layer) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_store_call in = {.fn = fn, .mem = VT_MEMORY_CPU};
    if (vt_store_pin_inputs(&in, cpu_pin, st, k_obj, v_obj, s_obj, vt_kv_cache_get_config(self->c)->num_kv_heads,
                            vt_kv_cache_get_config(self->c)->head_size) < 0 ||
        vt_copy_inputs_contiguous(st, &in) < 0 || refuse_inputs_in_layer(self, fn, layer, &in) < 0) {
        vt_store_release(&in);
        return NULL;
    }
    vt_error err;
    vt_status s;
    vt_kv_exports_add(self, 1); /* a concurrent release() must wait for the kernel */
    Py_BEGIN_ALLOW_THREADS
    s = vt_kv_cache_store(self->c, layer, in.key.data, in.key.strides[0], in.key.strides[1], in.value.data,
                          in.value.strides[0], in.value.strides[1], (vt_dtype)in.key.elem, in.slots.data,
                          in.slots.shape[0], nth, &err);
    Py_END_ALLOW_THREADS
    vt_kv_exports_add(self, -1);
    vt_store_release(&in);
    if (s != VT_OK) return vt_raise(st, &err);
    Py_RETURN_NONE;
}

static PyObject *kv_gather(PyObject *op, PyObject *args, PyObject *kw) {
    static const char fn[] = "PagedKVCache.gather";
    KVCacheObject *self = (KVCacheObject *)op;
    vt_module_state *st = vt_state_from_type(Py_TYPE(op));
    PyObject *a[VT_SIG_MAX_ARGS];
    if (!st || vt_sig_parse(&kv_gather_sig, args, kw, a) < 0) return NULL;
    PyObject *layer_obj = a[0], *s_obj = a[1], *rot_obj = a[2] ? a[2] : Py_False;
    if (!PyBool_Check(rot_obj)) {
        PyErr_Format(PyExc_TypeError, "%s: rotated must be a bool; got %s", fn, Py_TYPE(rot_obj)->tp_name);
        return NULL;
    }
    const int rotated = rot_obj == Py_True;
    int64_t layer;
    if (vt_kv_require_storage(self, fn) < 0 || vt_kv_layer_arg(self, layer_obj, fn, &layer) < 0) return NULL;
    PyObject *sl = PyArray_FromAny(s_obj, NULL, 0, 0, 0, NULL);
    if (!sl) return NULL;
    if (PyArray_NDIM((PyArrayObject *)sl) != 1) {
        PyErr_Format(PyExc_ValueError, "%s: slots must have 1 dimensions; got %d", fn,
                     PyArray_NDIM((PyArrayObject *)sl));
        Py_DECREF(sl);
        return NULL;
    }
    if (!PyArray_ISINTEGER((PyArrayObject *)sl)) {
        PyErr_Format(PyExc_TypeError, "%s: slots must be integers; got %S", fn,
                     (PyObject *)PyArray_DESCR((PyArrayObject *)sl));
        Py_DECREF(sl);
        return NULL;
    }
    PyObject *s64 = PyArray_FromAny(sl, PyArray_DescrFromType(NPY_INT64), 0, 1, NPY_ARRAY_CARRAY | NPY_ARRAY_FORCECAST,
                                    NULL);
    Py_DECREF(sl);
    if (!s64) return NULL;
    npy_intp n = PyArray_SIZE((PyArrayObject *)s64);
    const vt_kv_cache_config *g = vt_kv_cache_get_config(self->c);
    npy_intp dims[3] = {n, (npy_intp)g->num_kv_heads, (npy_intp)g->head_size};
    PyObject *k = PyArray_SimpleNew(3, dims, NPY_FLOAT32);
    PyObject *v = k ? PyArray_SimpleNew(3, dims, NPY_FLOAT32) : NULL;
    if (!v) {
        Py_XDECREF(k);
        Py_DECREF(s64);
        return NULL;
    }
    vt_error err;
    vt_status s;
    vt_kv_exports_add(self, 1); /* a concurrent release() must wait for the kernel */
    Py_BEGIN_ALLOW_THREADS
    s = vt_kv_cache_gather_basis(self->c, layer, PyArray_DATA((PyArrayObject *)s64), (int64_t)n,
                                 PyArray_DATA((PyArrayObject *)k), PyArray_DATA((PyArrayObject *)v), rotated, &err);
    Py_END_ALLOW_THREADS
    vt_kv_exports_add(self, -1);
    Py_DECREF(s64);
    if (s != VT_OK) {
        Py_DECREF(k);
        Py_DECREF(v);
        return vt_raise(st, &err);
    }
    return Py_BuildValue("(NN)", k, v);
}

static PyObject *kv_release(PyObject *op, PyObject *unused) {
    (void)unused;
    KVCacheObject *self = (KVCacheObject *)op;
    const long live = atomic_load(&self->exports);
    if (live > 0) {
        PyErr_Format(PyExc_BufferError,
                     "PagedKVCache.release: the cache must have no live views or DLPack exports; got %ld", live);
        return NULL;
    }
    vt_kv_cache_release(self->c);
    Py_RETURN_NONE;
}

static PyObject *kv_repr(PyObject *op) {
    KVCacheObject *self = (KVCacheObject *)op;
    const vt_kv_cache *c = self->c;
    const vt_kv_cache_config *g = vt_kv_cache_get_config(c);
    static const char *const modes[3] = {"per-tensor", "per-layer", "per-layer-and-head"};
    vt_kv_scale_mode km, vm;
    (void)vt_kv_cache_scales(c, 0, &km);
    (void)vt_kv_cache_scales(c, 1, &vm);
    char buf[512], scales[96], codes[40] = "";
    const vt_dtype_info *di = vt_dtype_get(g->dtype);
    if (di->elem_bits < 8)
        snprintf(codes, sizeof codes, ", codes=%d per byte%s", 8 / di->elem_bits,
                 di->read_family == VT_READ_INT4_ROTATED ? " (rotated)" : "");
    if (vt_dtype_per_token_head(g->dtype)) /* the tensor scales are unused: say where the scales are */
        snprintf(scales, sizeof scales, "scales=per-token-head float32 planes%s", codes);
    else if (di->page_layout == VT_PAGE_SLOTS && di->rope_block > 0)
        snprintf(scales, sizeof scales, "scales=in-slot, slot_bytes=%zu, rope_dim=%lld", vt_kv_cache_row_bytes(c),
                 (long long)g->rope_dim);
    else if (di->page_layout == VT_PAGE_SLOTS && di->global_scale) /* block scales in the slot, global ones here */
        snprintf(scales, sizeof scales, "slot_bytes=%zu, k_scale=%s, v_scale=%s", vt_kv_cache_row_bytes(c),
                 modes[km], modes[vm]);
    else if (di->page_layout == VT_PAGE_SLOTS)
        snprintf(scales, sizeof scales, "scales=in-slot, slot_bytes=%zu", vt_kv_cache_row_bytes(c));
    else
        snprintf(scales, sizeof scales, "k_scale=%s, v_scale=%s", modes[km], modes[vm]);
    snprintf(buf, sizeof buf,
             "PagedKVCache(num_layers=%lld, num_blocks=%lld, block_size=%lld, num_kv_heads=%lld, head_size=%lld, "
             "dtype='%s', layout='%s', page_bytes=%zu, nbytes=%zu, %s%s)",
             (long long)g->num_layers, (long long)g->num_blocks, (long long)g->block_size,
             (long long)g->num_kv_heads, (long long)g->head_size, vt_dtype_get(g->dtype)->name, layout_name(g->layout),
             vt_kv_cache_page_bytes(c), vt_kv_cache_nbytes(c), scales, vt_kv_cache_is_released(c) ? ", released" : "");
    return PyUnicode_FromString(buf);
}

/* ---- getters ---- */

#define KV_INT_GETTER(name, expr)                                        \
    static PyObject *kv_get_##name(PyObject *op, void *closure) {        \
        (void)closure;                                                   \
        const vt_kv_cache *c = ((KVCacheObject *)op)->c;                 \
        (void)c;                                                         \
        return PyLong_FromLongLong((long long)(expr));                   \
    }
KV_INT_GETTER(num_layers, vt_kv_cache_get_config(c)->num_layers)
KV_INT_GETTER(num_blocks, vt_kv_cache_get_config(c)->num_blocks)
KV_INT_GETTER(block_size, vt_kv_cache_get_config(c)->block_size)
KV_INT_GETTER(num_kv_heads, vt_kv_cache_get_config(c)->num_kv_heads)
KV_INT_GETTER(head_size, vt_kv_cache_get_config(c)->head_size)
KV_INT_GETTER(page_bytes, vt_kv_cache_page_bytes(c))
KV_INT_GETTER(nbytes, vt_kv_cache_nbytes(c))
KV_INT_GETTER(element_size, vt_kv_cache_elem_bytes(c))
KV_INT_GETTER(rope_dim, vt_kv_cache_get_config(c)->rope_dim)
KV_INT_GETTER(exports, atomic_load(&((KVCacheObject *)op)->exports))

static PyObject *kv_get_dtype(PyObject *op, void *closure) {
    (void)closure;
    return PyUnicode_FromString(vt_dtype_get(vt_kv_cache_get_config(((KVCacheObject *)op)->c)->dtype)->name);
}
static PyObject *kv_get_layout(PyObject *op, void *closure) {
    (void)closure;
    return PyUnicode_FromString(layout_name(vt_kv_cache_get_config(((KVCacheObject *)op)->c)->layout));
}
static PyObject *kv_get_released(PyObject *op, void *closure) {
    (void)closure;
    return PyBool_FromLong(vt_kv_cache_is_released(((KVCacheObject *)op)->c));
}
static PyObject *kv_get_k_scale(PyObject *op, void *closure) {
    (void)closure;
    return cache_get_scales(((KVCacheObject *)op)->c, 0);
}
static PyObject *kv_get_v_scale(PyObject *op, void *closure) {
    (void)closure;
    return cache_get_scales(((KVCacheObject *)op)->c, 1);
}
static int kv_set_scale(PyObject *op, PyObject *value, int which) {
    if (!value) {
        PyErr_Format(PyExc_AttributeError, "PagedKVCache: %s cannot be deleted", which ? "v_scale" : "k_scale");
        return -1;
    }
    vt_module_state *st = vt_state_from_type(Py_TYPE(op));
    if (!st) return -1;
    return cache_set_scales(st, ((KVCacheObject *)op)->c, which ? NULL : value, which ? value : NULL);
}
static int kv_set_k_scale(PyObject *op, PyObject *value, void *closure) {
    (void)closure;
    return kv_set_scale(op, value, 0);
}
static int kv_set_v_scale(PyObject *op, PyObject *value, void *closure) {
    (void)closure;
    return kv_set_scale(op, value, 1);
}

static PyGetSetDef kv_getset[] = {
    {"num_layers", kv_get_num_layers, NULL, "Number of layers.", NULL},
    {"num_blocks", kv_get_num_blocks, NULL, "Blocks per layer.", NULL},
    {"block_size", kv_get_block_size, NULL, "Tokens per block.", NULL},
    {"num_kv_heads", kv_get_num_kv_heads, NULL, "KV heads (H_kv).", NULL},
    {"head_size", kv_get_head_size, NULL, "Head size (D).", NULL},
    {"dtype", kv_get_dtype, NULL, "Storage dtype name from the dtype table ('fp8_e4m3', 'bfloat16', ...).", NULL},
    {"layout", kv_get_layout, NULL, "'NHD' or 'HND'.", NULL},
    {"page_bytes", kv_get_page_bytes, NULL, "Bytes of one block over all layers, K and V.", NULL},
    {"nbytes", kv_get_nbytes, NULL, "Bytes of the allocation (each layer's K and V padded to 64 bytes).", NULL},
    {"element_size", kv_get_element_size, NULL, "Bytes per stored element.", NULL},
    {"rope_dim", kv_get_rope_dim, NULL,
     "The rotary dims the slot layout was sized for (Octave reads them; head_size unless given).", NULL},
    {"exports", kv_get_exports, NULL, "Live NumPy views and DLPack exports pinning the storage.", NULL},
    {"released", kv_get_released, NULL, "True after release().", NULL},
    {"k_scale", kv_get_k_scale, kv_set_k_scale,
     "K scales as float32: shape () per tensor, [num_layers], or [num_layers, num_kv_heads]. Settable.", NULL},
    {"v_scale", kv_get_v_scale, kv_set_v_scale, "V scales, as k_scale.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static char kv_store_doc[512], kv_gather_doc[512], kv_doc[512];

static PyMethodDef kv_methods[] = {
    {"key_cache", vt_kv_key_cache, METH_O,
     "key_cache($self, layer, /)\n--\n\nZero-copy view of a layer's K storage ([num_blocks, block_size, H_kv, D] for "
     "NHD, [num_blocks, H_kv, block_size, D] for HND; uint8 codes for fp8)."},
    {"value_cache", vt_kv_value_cache, METH_O, "value_cache($self, layer, /)\n--\n\nAs key_cache, for V."},
    {"k_scale_cache", vt_kv_k_scale_cache, METH_O,
     "k_scale_cache($self, layer, /)\n--\n\nZero-copy float32 [num_blocks, block_size, H_kv] view of a "
     "per-token-head layer's K scales (vLLM's k_scale_cache); ValueError for other dtypes."},
    {"v_scale_cache", vt_kv_v_scale_cache, METH_O, "v_scale_cache($self, layer, /)\n--\n\nAs k_scale_cache, for V."},
    {"store", (PyCFunction)(void (*)(void))kv_store, METH_VARARGS | METH_KEYWORDS, kv_store_doc},
    {"gather", (PyCFunction)(void (*)(void))kv_gather, METH_VARARGS | METH_KEYWORDS, kv_gather_doc},
    {"release", kv_release, METH_NOARGS,
     "release($self, /)\n--\n\nFree the storage now; BufferError while a view or DLPack export is alive."},
    {"_dlpack", (PyCFunction)(void (*)(void))vt_kv_private_dlpack, METH_VARARGS | METH_KEYWORDS, vt_kv_private_dlpack_doc},
    {"__dlpack__", (PyCFunction)(void (*)(void))vt_kv_dunder_dlpack, METH_VARARGS | METH_KEYWORDS, vt_kv_dunder_dlpack_doc},
    {"__dlpack_device__", vt_kv_dlpack_device, METH_NOARGS, "__dlpack_device__($self, /)\n--\n\n(1, 0): CPU."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot kv_slots[] = {
    {Py_tp_new, kv_new},
    {Py_tp_dealloc, kv_dealloc},
    {Py_tp_repr, kv_repr},
    {Py_tp_methods, kv_methods},
    {Py_tp_getset, kv_getset},
    {Py_tp_doc, kv_doc},
    {0, NULL},
};

static PyType_Spec kv_spec = {
    .name = "vtinfer._C.PagedKVCache",
    .basicsize = sizeof(KVCacheObject),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = kv_slots,
};

int vt_kvcache_exec(PyObject *m, vt_module_state *st) {
    vt_signature_doc_as(&kv_store_sig, "$self", "Store key/value [num_tokens, H_kv, D] at slot_mapping (int64; "
                        "negative skips).", kv_store_doc, sizeof kv_store_doc);
    vt_signature_doc_as(&kv_gather_sig, "$self", "Read slots back as float32 (k, v), each [n, H_kv, D]; "
                        "int4_per_token_head: rotated back to the stored basis unless rotated=True.", kv_gather_doc,
                        sizeof kv_gather_doc);
    vt_signature_doc_as(&kv_new_sig, NULL, "A vLLM-compatible paged KV cache.", kv_doc, sizeof kv_doc);
    vt_kv_export_docs();
    PyObject *type = PyType_FromModuleAndSpec(m, &kv_spec, NULL);
    if (!type) return -1;
    st->slots[VT_SLOT_KVCACHE_TYPE] = type;
    if (PyModule_AddObjectRef(m, "PagedKVCache", type) < 0) return -1;
    return 0;
}
