/* vtinfer._cuda: the CUDA arm's Python glue (a separate extension, built
 * only when nvcc is found or VTINFER_CUDA=1; links the CUDA runtime).
 *
 *   _cuda.device_count() -> int          0 on a machine without a device (never raises)
 *   _cuda.device_status() -> str         the runtime's answer, e.g. "cudaErrorNoDevice: ..."
 *   _cuda.runtime_version() -> int
 *   _cuda.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
 *                                 kv_cache_dtype, k_scale, v_scale, layout=None) -> None
 *   _cuda.flash_attn_varlen_func(q, k, v, cu_seqlens_q, seqused_k, block_table, out, lse,
 *                                max_seqlen_q, max_seqlen_k, softmax_scale, causal,
 *                                window_left, window_right, softcap, alibi_slopes, s_aux,
 *                                k_descale, v_descale, kv_cache_dtype, validate) -> None
 *   _cuda.CudaError                      (VtinferError, RuntimeError): the CUDA runtime failed
 *
 * Arrays are DLPack CUDA tensors (torch CUDA tensors), all on one device;
 * scales may also be Python floats. Every argument is checked before a
 * byte is written, on host copies of the index and scale arrays, by the
 * core's own checks (vt_kv_store_check, vt_attn_scratch_size): the same
 * exceptions and messages as the CPU path. No NumPy, no torch. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vt_cuda.h"
#include "vt_dlpack.h"
#include "vt_status_map.h"
#include "vtinfer/vtinfer.h"

typedef struct cu_state {
    PyObject *CudaError;
    PyObject *VtinferError;
} cu_state;

static cu_state *cu_get_state(PyObject *m) { return (cu_state *)PyModule_GetState(m); }

static PyObject *cu_raise(PyObject *m, int status, const vt_error *err) {
    PyObject *type = status == VT_CUDA_ERR_RUNTIME ? cu_get_state(m)->CudaError
                                                   : vt_status_exception(status, cu_get_state(m)->VtinferError, NULL);
    PyErr_SetString(type, err->message[0] ? err->message : "vtinfer._cuda: unknown error");
    return NULL;
}

/* ---- DLPack CUDA tensors ---- */

enum { E_F32 = VT_DTYPE_F32, E_F16 = VT_DTYPE_F16, E_BF16 = VT_DTYPE_BF16, E_E4M3 = VT_DTYPE_FP8_E4M3,
       E_E5M2 = VT_DTYPE_FP8_E5M2, E_U8 = 16, E_I32 = 17, E_I64 = 18, E_OTHER = 31 };

typedef struct cu_tensor {
    PyObject *capsule; /* owns the producer's memory until cu_release */
    char *data;
    int elem, itemsize, ndim, device;
    int64_t shape[8], strides[8]; /* strides in bytes */
} cu_tensor;

static const char *elem_name(int e) {
    switch (e) {
    case E_F32: return "float32";
    case E_F16: return "float16";
    case E_BF16: return "bfloat16";
    case E_E4M3: return "float8_e4m3fn";
    case E_E5M2: return "float8_e5m2";
    case E_U8: return "uint8";
    case E_I32: return "int32";
    case E_I64: return "int64";
    default: return "an unsupported dtype";
    }
}

static void cu_release(cu_tensor *t) {
    if (!t->capsule) return;
    PyObject *et, *ev, *tb; /* keep a pending exception */
    PyErr_Fetch(&et, &ev, &tb);
    vt_dl_managed *mt = PyCapsule_GetPointer(t->capsule, "used_dltensor");
    if (mt && mt->deleter) mt->deleter(mt);
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
    Py_CLEAR(t->capsule);
}

/* Pin obj (an object with __dlpack__ on a CUDA device). Returns 0 or -1 with an exception. */
static int cu_tensor_from(PyObject *obj, const char *fn, const char *arg, int ndim, cu_tensor *t) {
    memset(t, 0, sizeof *t);
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a CUDA tensor (an object with __dlpack__); got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap) return -1;
    vt_dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (!mt) {
        Py_DECREF(cap);
        return -1;
    }
    if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
        Py_DECREF(cap);
        return -1;
    }
    t->capsule = cap;
    const vt_dl_tensor *d = &mt->dl_tensor;
    if (d->device.device_type != VT_DL_CUDA) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be on a CUDA device; got DLPack device type %d", fn, arg,
                     (int)d->device.device_type);
        goto fail;
    }
    if (d->ndim > 8 || d->dtype.lanes != 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have at most 8 dimensions and one lane; got %d", fn, arg,
                     (int)d->ndim);
        goto fail;
    }
    int c = d->dtype.code, bits = d->dtype.bits;
    t->elem = c == VT_DL_FLOAT && bits == 32 ? E_F32
            : c == VT_DL_FLOAT && bits == 16 ? E_F16
            : c == VT_DL_BFLOAT && bits == 16 ? E_BF16
            : c == VT_DL_FLOAT8_E4M3FN && bits == 8 ? E_E4M3
            : c == VT_DL_FLOAT8_E5M2 && bits == 8 ? E_E5M2
            : c == VT_DL_UINT && bits == 8 ? E_U8
            : c == VT_DL_INT && bits == 32 ? E_I32
            : c == VT_DL_INT && bits == 64 ? E_I64 : E_OTHER;
    t->itemsize = bits / 8;
    t->ndim = d->ndim;
    t->device = d->device.device_id;
    t->data = (char *)d->data + d->byte_offset;
    int64_t st = t->itemsize;
    for (int i = d->ndim - 1; i >= 0; i--) {
        t->shape[i] = d->shape[i];
        t->strides[i] = d->strides ? d->strides[i] * t->itemsize : st;
        st *= d->shape[i];
    }
    if (ndim >= 0 && t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have %d dimensions; got %d", fn, arg, ndim, t->ndim);
        goto fail;
    }
    return 0;
fail:
    cu_release(t);
    return -1;
}

static int cu_numel(const cu_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return (int)n;
}

static int cu_contiguous(const cu_tensor *t) {
    int64_t st = t->itemsize;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != st) return 0;
        st *= t->shape[i];
    }
    return 1;
}

static int cu_dtype_err(const char *fn, const char *arg, const char *want, const cu_tensor *t) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be %s; got %s", fn, arg, want, elem_name(t->elem));
    return -1;
}

/* A small index/scale array (1-D or 2-D, contiguous) copied to host memory (malloc'd). */
static int cu_copy_host(PyObject *m, const cu_tensor *t, const char *fn, const char *arg, void **out) {
    if (!cu_contiguous(t)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be contiguous", fn, arg);
        return -1;
    }
    size_t n = (size_t)cu_numel(t) * (size_t)t->itemsize;
    *out = malloc(n ? n : 1);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_to_host(*out, t->data, n, fn, &err);
    if (st != VT_OK) {
        free(*out);
        *out = NULL;
        cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

/* ---- module functions ---- */

static PyObject *py_device_count(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    int n = 0;
    char msg[256];
    (void)vt_cuda_device_count(&n, msg, sizeof msg);
    return PyLong_FromLong(n);
}

static PyObject *py_device_status(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    int n = 0;
    char msg[256];
    (void)vt_cuda_device_count(&n, msg, sizeof msg);
    return PyUnicode_FromString(msg);
}

static PyObject *py_runtime_version(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    return Py_BuildValue("(ii)", vt_cuda_runtime_version(), vt_cuda_driver_version());
}

/* A scale argument: a Python float (host) or a CUDA float32 tensor of 1 or
 * n elements. host[] receives its values (for the checks); *dev is the
 * tensor's data or NULL for a float. */
typedef struct cu_scale {
    cu_tensor t;
    int is_tensor;
    int count;
    float *host;
    float value;
} cu_scale;

static void scale_release(cu_scale *s) {
    if (s->is_tensor) cu_release(&s->t);
    if (s->host != &s->value) free(s->host);
    s->host = NULL;
}

static int scale_arg(PyObject *m, PyObject *obj, const char *fn, const char *arg, cu_scale *s) {
    memset(s, 0, sizeof *s);
    if (PyFloat_Check(obj) || PyLong_Check(obj)) {
        s->value = (float)PyFloat_AsDouble(obj);
        if (PyErr_Occurred()) return -1;
        s->host = &s->value;
        s->count = 1;
        return 0;
    }
    if (cu_tensor_from(obj, fn, arg, -1, &s->t) < 0) return -1;
    s->is_tensor = 1;
    if (s->t.elem != E_F32) {
        cu_dtype_err(fn, arg, "float32", &s->t);
        goto fail;
    }
    s->count = cu_numel(&s->t);
    void *h = NULL;
    if (cu_copy_host(m, &s->t, fn, arg, &h) < 0) goto fail;
    s->host = h;
    return 0;
fail:
    scale_release(s);
    return -1;
}

/* Device copies of the host-valued scales (NULL when all are tensors). */
static int upload_floats(PyObject *m, const float *vals, int n, float **dev, const char *fn) {
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_malloc((void **)dev, (size_t)n * sizeof(float), fn, &err);
    if (st == VT_OK) st = vt_cuda_to_device(*dev, vals, (size_t)n * sizeof(float), fn, &err);
    if (st != VT_OK) {
        vt_cuda_free(*dev, fn, NULL);
        *dev = NULL;
        cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

static int same_device(const cu_tensor *a, const cu_tensor *b, const char *fn, const char *arg) {
    if (a->device == b->device) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s must be on cuda:%d like the first tensor; got cuda:%d", fn, arg, a->device,
                 b->device);
    return -1;
}

typedef struct slot_pair { int64_t slot, t; } slot_pair;

static int cmp_pair(const void *a, const void *b) {
    const slot_pair *x = a, *y = b;
    if (x->slot != y->slot) return x->slot < y->slot ? -1 : 1;
    return x->t < y->t ? -1 : (x->t > y->t);
}

/* Clear every token whose slot a later token names (the CPU keeps the later
 * token's values; the device has no order between tokens). Returns the
 * number of cleared tokens, or -1 (MemoryError set). */
static int64_t dedup_slots(int64_t *slots, int64_t n) {
    slot_pair *pairs = malloc((size_t)(n ? n : 1) * sizeof *pairs);
    if (!pairs) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t k = 0, cleared = 0;
    for (int64_t t = 0; t < n; t++)
        if (slots[t] >= 0) pairs[k++] = (slot_pair){slots[t], t};
    qsort(pairs, (size_t)k, sizeof *pairs, cmp_pair);
    for (int64_t i = 0; i + 1 < k; i++)
        if (pairs[i].slot == pairs[i + 1].slot) {
            slots[pairs[i].t] = -1;
            cleared++;
        }
    free(pairs);
    return cleared;
}

static PyObject *py_store(PyObject *m, PyObject *args, PyObject *kw) {
    static const char *fn = "reshape_and_cache_flash";
    static char *kwlist[] = {"key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype",
                             "k_scale", "v_scale", "layout", NULL};
    PyObject *ko, *vo, *kco, *vco, *smo, *kso, *vso;
    const char *dtype_name, *layout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOsOO|z:reshape_and_cache_flash", kwlist, &ko, &vo, &kco, &vco,
                                     &smo, &dtype_name, &kso, &vso, &layout))
        return NULL;
    int hnd = 0;
    if (layout && strcmp(layout, "NHD") != 0) {
        if (strcmp(layout, "HND") != 0) {
            PyErr_Format(PyExc_ValueError, "%s: layout must be None, 'NHD' or 'HND'; got '%.32s'", fn, layout);
            return NULL;
        }
        hnd = 1;
    }
    cu_tensor key = {0}, value = {0}, kc = {0}, vc = {0}, sm = {0};
    cu_scale ks = {0}, vs = {0};
    int64_t *slots = NULL;
    float *dev_scales = NULL, *dev_slots_f = NULL;
    PyObject *ret = NULL;
    vt_error err;
    vt_error_clear(&err);
    if (cu_tensor_from(ko, fn, "key", 3, &key) < 0 || cu_tensor_from(vo, fn, "value", 3, &value) < 0 ||
        cu_tensor_from(kco, fn, "key_cache", 4, &kc) < 0 || cu_tensor_from(vco, fn, "value_cache", 4, &vc) < 0 ||
        cu_tensor_from(smo, fn, "slot_mapping", 1, &sm) < 0)
        goto done;
    if (same_device(&key, &value, fn, "value") || same_device(&key, &kc, fn, "key_cache") ||
        same_device(&key, &vc, fn, "value_cache") || same_device(&key, &sm, fn, "slot_mapping"))
        goto done;
    const int64_t H = key.shape[1], D = key.shape[2];
    if (value.shape[0] != key.shape[0] || value.shape[1] != H || value.shape[2] != D) {
        PyErr_Format(PyExc_ValueError, "%s: value must have key's shape (%lld, %lld, %lld); got (%lld, %lld, %lld)", fn,
                     (long long)key.shape[0], (long long)H, (long long)D, (long long)value.shape[0],
                     (long long)value.shape[1], (long long)value.shape[2]);
        goto done;
    }
    const int ia = hnd ? 2 : 1, ih = hnd ? 1 : 2; /* cache dims: block, slot (ia), head (ih), dim */
    for (int w = 0; w < 2; w++) {
        const cu_tensor *c = w ? &vc : &kc;
        if (c->shape[ih] != H || c->shape[3] != D || (w && (vc.shape[0] != kc.shape[0] || vc.shape[ia] != kc.shape[ia]))) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (num_blocks, block_size, %lld, %lld)%s; got (%lld, "
                         "%lld, %lld, %lld)", fn, w ? "value_cache" : "key_cache", (long long)H, (long long)D,
                         hnd ? " in HND order" : "", (long long)c->shape[0], (long long)c->shape[1],
                         (long long)c->shape[2], (long long)c->shape[3]);
            goto done;
        }
    }
    if (sm.shape[0] > key.shape[0]) {
        PyErr_Format(PyExc_ValueError, "%s: slot_mapping must have at most key's %lld tokens; got %lld", fn,
                     (long long)key.shape[0], (long long)sm.shape[0]);
        goto done;
    }
    if (key.elem != E_F32 && key.elem != E_F16 && key.elem != E_BF16) {
        cu_dtype_err(fn, "key", "float32, float16 or bfloat16", &key);
        goto done;
    }
    if (value.elem != key.elem) {
        cu_dtype_err(fn, "value", elem_name(key.elem), &value);
        goto done;
    }
    if (sm.elem != E_I64) {
        cu_dtype_err(fn, "slot_mapping", "int64", &sm);
        goto done;
    }
    int cache_dt;
    if (vt_dtype_from_name(dtype_name, "kv_cache_dtype", &cache_dt, &err) != VT_OK) {
        cu_raise(m, err.status, &err);
        goto done;
    }
    if (cache_dt == VT_DTYPE_AUTO) cache_dt = key.elem;
    const int fp8 = cache_dt == VT_DTYPE_FP8_E4M3 || cache_dt == VT_DTYPE_FP8_E5M2;
    for (int w = 0; w < 2; w++) {
        const cu_tensor *c = w ? &vc : &kc;
        const char *arg = w ? "value_cache" : "key_cache";
        int ok = fp8 ? (c->elem == E_U8 || c->elem == cache_dt) : c->elem == cache_dt;
        if (!ok) {
            cu_dtype_err(fn, arg, fp8 ? "uint8 or the named float8 dtype" : elem_name(cache_dt), c);
            goto done;
        }
        if (c->strides[3] != c->itemsize || key.strides[2] != key.itemsize || value.strides[2] != value.itemsize) {
            PyErr_Format(PyExc_ValueError, "%s: %s, key and value must have a contiguous last dimension", fn, arg);
            goto done;
        }
    }
    if (scale_arg(m, kso, fn, "k_scale", &ks) < 0 || scale_arg(m, vso, fn, "v_scale", &vs) < 0) goto done;
    int per_head = 0;
    if (fp8) {
        for (int w = 0; w < 2; w++) {
            const cu_scale *s = w ? &vs : &ks;
            if (s->count != 1 && s->count != H) {
                PyErr_Format(PyExc_ValueError, "%s: %s must have 1 or num_kv_heads = %lld elements; got %d", fn,
                             w ? "v_scale" : "k_scale", (long long)H, s->count);
                goto done;
            }
        }
        if (ks.count != vs.count) {
            PyErr_Format(PyExc_ValueError, "%s: k_scale and v_scale must have the same number of elements; got %d and %d",
                         fn, ks.count, vs.count);
            goto done;
        }
        per_head = ks.count == H && H > 1;
    }
    void *hs = NULL;
    if (cu_copy_host(m, &sm, fn, "slot_mapping", &hs) < 0) goto done;
    slots = hs;
    vt_kv_store_params p;
    memset(&p, 0, sizeof p);
    p.fn = fn;
    p.key = key.data;
    p.value = value.data;
    p.key_stride_token = key.strides[0];
    p.key_stride_head = key.strides[1];
    p.value_stride_token = value.strides[0];
    p.value_stride_head = value.strides[1];
    p.key_cache = (vt_kv_dst){kc.data, kc.strides[0], kc.strides[ia], kc.strides[ih], 0, D};
    p.value_cache = (vt_kv_dst){vc.data, vc.strides[0], vc.strides[ia], vc.strides[ih], 0, D};
    p.slot_mapping = slots;
    p.num_tokens = sm.shape[0];
    p.num_kv_heads = H;
    p.head_size = D;
    p.block_size = kc.shape[ia];
    p.num_blocks = kc.shape[0];
    p.src_dtype = (vt_dtype)key.elem;
    p.cache_dtype = (vt_dtype)cache_dt;
    p.k_scale = ks.host;
    p.v_scale = vs.host;
    p.scale_per_head = per_head;
    int st = vt_kv_store_check(&p, &err); /* host copies: the CPU's checks and messages */
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    int64_t cleared = dedup_slots(slots, p.num_tokens);
    if (cleared < 0) goto done;
    if (vt_cuda_set_device(key.device, fn, &err) != VT_OK) {
        cu_raise(m, VT_CUDA_ERR_RUNTIME, &err);
        goto done;
    }
    /* Device copies: host scales, and the slots when duplicates were cleared. */
    const int nsc = fp8 ? ks.count : 1;
    float host_sc[2 * 1024];
    int need_scales = fp8 && (!ks.is_tensor || !vs.is_tensor);
    if (need_scales) {
        if (2 * nsc > 2048) {
            PyErr_Format(PyExc_ValueError, "%s: k_scale must be a CUDA tensor when it has more than 1024 elements", fn);
            goto done;
        }
        memcpy(host_sc, ks.host, (size_t)nsc * sizeof(float));
        memcpy(host_sc + nsc, vs.host, (size_t)nsc * sizeof(float));
        if (upload_floats(m, host_sc, 2 * nsc, &dev_scales, fn) < 0) goto done;
    }
    p.k_scale = fp8 ? (ks.is_tensor ? (const float *)ks.t.data : dev_scales) : NULL;
    p.v_scale = fp8 ? (vs.is_tensor ? (const float *)vs.t.data : dev_scales + nsc) : NULL;
    p.slot_mapping = (const int64_t *)sm.data;
    if (cleared > 0) {
        if (vt_cuda_malloc((void **)&dev_slots_f, (size_t)p.num_tokens * 8, fn, &err) != VT_OK ||
            vt_cuda_to_device(dev_slots_f, slots, (size_t)p.num_tokens * 8, fn, &err) != VT_OK) {
            cu_raise(m, err.status == VT_ERR_NOMEM ? VT_ERR_NOMEM : VT_CUDA_ERR_RUNTIME, &err);
            goto done;
        }
        p.slot_mapping = (const int64_t *)dev_slots_f;
    }
    Py_BEGIN_ALLOW_THREADS
    st = vt_cuda_kv_store(&p, NULL, &err);
    if (st == VT_OK && (dev_scales || dev_slots_f)) st = vt_cuda_synchronize(fn, &err); /* before the frees */
    Py_END_ALLOW_THREADS
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    vt_cuda_free(dev_scales, fn, NULL);
    vt_cuda_free(dev_slots_f, fn, NULL);
    free(slots);
    scale_release(&ks);
    scale_release(&vs);
    cu_release(&key);
    cu_release(&value);
    cu_release(&kc);
    cu_release(&vc);
    cu_release(&sm);
    return ret;
}

/* Optional small float array (alibi_slopes, s_aux): None, or a CUDA float32 tensor of n elements. */
static int opt_floats(PyObject *m, PyObject *obj, const char *fn, const char *arg, int n, cu_tensor *t, void **host) {
    *host = NULL;
    memset(t, 0, sizeof *t);
    if (obj == Py_None) return 0;
    if (cu_tensor_from(obj, fn, arg, 1, t) < 0) return -1;
    if (t->elem != E_F32) return cu_dtype_err(fn, arg, "float32", t);
    if (t->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have shape (%d,); got (%lld,)", fn, arg, n, (long long)t->shape[0]);
        return -1;
    }
    return cu_copy_host(m, t, fn, arg, host);
}

/* A descale: None, a float, or a CUDA float32 tensor of shape (), (1,), (H_kv,) or (B, H_kv). */
static int descale_arg(PyObject *m, PyObject *obj, const char *fn, const char *arg, int B, int hkv, cu_scale *s,
                       int64_t *sb, int64_t *sh) {
    memset(s, 0, sizeof *s);
    *sb = *sh = 0;
    if (obj == Py_None) return 0;
    if (scale_arg(m, obj, fn, arg, s) < 0) return -1;
    if (s->count == 1) return 0;
    if (s->t.ndim == 1 && s->count == hkv) {
        *sh = 1;
        return 0;
    }
    if (s->t.ndim == 2 && s->t.shape[0] == B && s->t.shape[1] == hkv) {
        *sb = hkv;
        *sh = 1;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: %s must have shape (), (%d,) or (%d, %d); got %d elements", fn, arg, hkv, B, hkv,
                 s->count);
    return -1;
}

static PyObject *py_attn(PyObject *m, PyObject *args) {
    static const char *fn = "flash_attn_varlen_func";
    PyObject *qo, *ko, *vo, *cuo, *sko, *bto, *outo, *lseo, *alo, *sao, *kdo, *vdo;
    long long max_q, max_k;
    float scale, softcap;
    int causal, wl, wr, validate;
    const char *dtype_name;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLLfpiifOOOOsp:flash_attn_varlen_func", &qo, &ko, &vo, &cuo, &sko, &bto,
                          &outo, &lseo, &max_q, &max_k, &scale, &causal, &wl, &wr, &softcap, &alo, &sao, &kdo, &vdo,
                          &dtype_name, &validate))
        return NULL;
    cu_tensor q = {0}, k = {0}, v = {0}, cu = {0}, sk = {0}, bt = {0}, out = {0}, lse = {0}, al = {0}, sa = {0};
    cu_scale kd = {0}, vd = {0};
    void *h_cu = NULL, *h_sk = NULL, *h_bt = NULL, *h_al = NULL, *h_sa = NULL, *ws = NULL;
    float *dev_desc = NULL;
    PyObject *ret = NULL;
    vt_error err;
    vt_error_clear(&err);
    int st;
    if (cu_tensor_from(qo, fn, "q", 3, &q) < 0 || cu_tensor_from(ko, fn, "k", 4, &k) < 0 ||
        cu_tensor_from(vo, fn, "v", 4, &v) < 0 || cu_tensor_from(cuo, fn, "cu_seqlens_q", 1, &cu) < 0 ||
        cu_tensor_from(sko, fn, "seqused_k", 1, &sk) < 0 || cu_tensor_from(bto, fn, "block_table", 2, &bt) < 0 ||
        cu_tensor_from(outo, fn, "out", 3, &out) < 0)
        goto done;
    if (lseo != Py_None && cu_tensor_from(lseo, fn, "lse", 2, &lse) < 0) goto done;
    if (same_device(&q, &k, fn, "k") || same_device(&q, &v, fn, "v") || same_device(&q, &cu, fn, "cu_seqlens_q") ||
        same_device(&q, &sk, fn, "seqused_k") || same_device(&q, &bt, fn, "block_table") ||
        same_device(&q, &out, fn, "out") || (lse.capsule && same_device(&q, &lse, fn, "lse")))
        goto done;
    const int H = (int)q.shape[1], D = (int)q.shape[2], Hkv = (int)k.shape[2];
    const int B = (int)sk.shape[0];
    if (q.elem != E_F32 && q.elem != E_F16 && q.elem != E_BF16) {
        cu_dtype_err(fn, "q", "float32, float16 or bfloat16", &q);
        goto done;
    }
    if (out.elem != q.elem) {
        cu_dtype_err(fn, "out", elem_name(q.elem), &out);
        goto done;
    }
    if (cu.elem != E_I32 || sk.elem != E_I32 || bt.elem != E_I32) {
        const cu_tensor *bad = cu.elem != E_I32 ? &cu : sk.elem != E_I32 ? &sk : &bt;
        cu_dtype_err(fn, cu.elem != E_I32 ? "cu_seqlens_q" : sk.elem != E_I32 ? "seqused_k" : "block_table", "int32",
                     bad);
        goto done;
    }
    if (lse.capsule && (lse.elem != E_F32 || lse.shape[0] != H || lse.shape[1] != q.shape[0])) {
        PyErr_Format(PyExc_ValueError, "%s: lse must be float32 of shape (%d, %lld)", fn, H, (long long)q.shape[0]);
        goto done;
    }
    for (int i = 0; i < 4; i++)
        if (v.shape[i] != k.shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: v must have k's shape; got a difference in dimension %d", fn, i);
            goto done;
        }
    if (k.shape[3] != D || out.shape[0] != q.shape[0] || out.shape[1] != H || out.shape[2] != D ||
        cu.shape[0] != B + 1 || bt.shape[0] != B) {
        PyErr_Format(PyExc_ValueError, "%s: q, k, out, cu_seqlens_q, seqused_k and block_table must have matching "
                     "shapes (head_size %d, batch %d)", fn, D, B);
        goto done;
    }
    int kv_dt;
    if (vt_dtype_from_name(dtype_name, "kv_cache_dtype", &kv_dt, &err) != VT_OK) {
        cu_raise(m, err.status, &err);
        goto done;
    }
    if (k.elem == E_E4M3 || k.elem == E_E5M2) {
        if (kv_dt != VT_DTYPE_AUTO && kv_dt != k.elem) {
            cu_dtype_err(fn, "k", elem_name(kv_dt), &k);
            goto done;
        }
        kv_dt = k.elem;
    } else if (k.elem == E_U8) {
        if (kv_dt != VT_DTYPE_FP8_E4M3 && kv_dt != VT_DTYPE_FP8_E5M2) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must name the fp8 format of a uint8 cache; got '%.32s'",
                         fn, dtype_name);
            goto done;
        }
    } else if (k.elem == E_F32 || k.elem == E_F16 || k.elem == E_BF16) {
        kv_dt = k.elem;
    } else {
        cu_dtype_err(fn, "k", "a KV-cache dtype", &k);
        goto done;
    }
    if (v.elem != k.elem) {
        cu_dtype_err(fn, "v", elem_name(k.elem), &v);
        goto done;
    }
    if (q.strides[2] != q.itemsize || k.strides[3] != k.itemsize || v.strides[3] != v.itemsize ||
        out.strides[2] != out.itemsize || bt.strides[1] != 4) {
        PyErr_Format(PyExc_ValueError, "%s: q, k, v, out and block_table must have a contiguous last dimension", fn);
        goto done;
    }
    if (opt_floats(m, alo, fn, "alibi_slopes", H, &al, &h_al) < 0 || opt_floats(m, sao, fn, "s_aux", H, &sa, &h_sa) < 0)
        goto done;
    vt_attn_params p;
    memset(&p, 0, sizeof p);
    if (descale_arg(m, kdo, fn, "k_descale", B, Hkv, &kd, &p.k_descale_stride_b, &p.k_descale_stride_h) < 0 ||
        descale_arg(m, vdo, fn, "v_descale", B, Hkv, &vd, &p.v_descale_stride_b, &p.v_descale_stride_h) < 0)
        goto done;
    /* Host copies of the index arrays (validate), or at least nothing to check. */
    if (validate && (cu_copy_host(m, &cu, fn, "cu_seqlens_q", &h_cu) < 0 ||
                     cu_copy_host(m, &sk, fn, "seqused_k", &h_sk) < 0))
        goto done;
    if (validate && bt.strides[0] % 4 == 0) {
        /* the table as the core reads it: rows of bt_stride elements */
        size_t n = (size_t)(B > 0 ? (B - 1) * (bt.strides[0] / 4) + bt.shape[1] : 0);
        h_bt = malloc(n ? n * 4 : 4);
        if (!h_bt) {
            PyErr_NoMemory();
            goto done;
        }
        if ((st = vt_cuda_to_host(h_bt, bt.data, n * 4, fn, &err)) != VT_OK) {
            cu_raise(m, st, &err);
            goto done;
        }
    }
    p.q = q.data;
    p.q_dtype = (vt_dtype)q.elem;
    p.total_q = q.shape[0];
    p.q_stride_tok = q.strides[0];
    p.q_stride_head = q.strides[1];
    p.k = k.data;
    p.v = v.data;
    p.kv_dtype = (vt_dtype)kv_dt;
    p.num_blocks = k.shape[0];
    p.block_size = k.shape[1];
    p.k_stride_block = k.strides[0];
    p.k_stride_tok = k.strides[1];
    p.k_stride_head = k.strides[2];
    p.v_stride_block = v.strides[0];
    p.v_stride_tok = v.strides[1];
    p.v_stride_head = v.strides[2];
    p.num_heads = H;
    p.num_kv_heads = Hkv;
    p.head_size = D;
    p.batch = B;
    p.max_blocks = bt.shape[1];
    p.bt_stride = bt.strides[0] / 4;
    p.softmax_scale = scale;
    p.causal = causal;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = softcap;
    p.out = out.data;
    p.out_stride_tok = out.strides[0];
    p.out_stride_head = out.strides[1];
    p.lse = lse.capsule ? (float *)lse.data : NULL;
    p.lse_stride_head = lse.capsule ? lse.strides[0] / 4 : 0;
    p.lse_stride_tok = lse.capsule ? lse.strides[1] / 4 : 0;
    if (validate) {
        vt_attn_params hp = p; /* host copies for the core's checks */
        hp.cu_seqlens_q = h_cu;
        hp.seqused_k = h_sk;
        hp.block_table = h_bt;
        hp.alibi_slopes = h_al;
        hp.s_aux = h_sa;
        hp.k_descale = kd.host;
        hp.v_descale = vd.host;
        size_t dummy;
        if ((st = vt_attn_scratch_size(&hp, 1, &dummy, &err)) != VT_OK) {
            cu_raise(m, st, &err);
            goto done;
        }
        for (int b = 0; b < B; b++) {
            const int32_t *c = h_cu, *s = h_sk;
            if (c[b + 1] - c[b] > max_q || s[b] > max_k) {
                PyErr_Format(PyExc_ValueError, "%s: max_seqlen_q and max_seqlen_k must be at least the real maxima; got "
                             "%lld and %lld, sequence %d has %d queries and %d keys", fn, max_q, max_k, b,
                             c[b + 1] - c[b], s[b]);
                goto done;
            }
        }
    }
    if (vt_cuda_set_device(q.device, fn, &err) != VT_OK) {
        cu_raise(m, VT_CUDA_ERR_RUNTIME, &err);
        goto done;
    }
    float hd[2] = {kd.host ? kd.host[0] : 1.0f, vd.host ? vd.host[0] : 1.0f};
    if ((kd.host && !kd.is_tensor) || (vd.host && !vd.is_tensor))
        if (upload_floats(m, hd, 2, &dev_desc, fn) < 0) goto done;
    p.cu_seqlens_q = (const int32_t *)cu.data;
    p.seqused_k = (const int32_t *)sk.data;
    p.block_table = (const int32_t *)bt.data;
    p.alibi_slopes = al.capsule ? (const float *)al.data : NULL;
    p.s_aux = sa.capsule ? (const float *)sa.data : NULL;
    p.k_descale = !kd.host ? NULL : kd.is_tensor ? (const float *)kd.t.data : dev_desc;
    p.v_descale = !vd.host ? NULL : vd.is_tensor ? (const float *)vd.t.data : dev_desc + 1;
    size_t ws_bytes = 0;
    if ((st = vt_cuda_attn_workspace(&p, max_q, max_k, &ws_bytes, NULL, &err)) != VT_OK ||
        (st = vt_cuda_malloc(&ws, ws_bytes, fn, &err)) != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    st = vt_cuda_attn(&p, max_q, max_k, ws, ws_bytes, NULL, &err);
    if (st == VT_OK && (ws || dev_desc)) st = vt_cuda_synchronize(fn, &err); /* before the frees */
    Py_END_ALLOW_THREADS
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    vt_cuda_free(ws, fn, NULL);
    vt_cuda_free(dev_desc, fn, NULL);
    free(h_cu);
    free(h_sk);
    free(h_bt);
    free(h_al);
    free(h_sa);
    scale_release(&kd);
    scale_release(&vd);
    cu_tensor *all[] = {&q, &k, &v, &cu, &sk, &bt, &out, &lse, &al, &sa};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) cu_release(all[i]);
    return ret;
}

static PyMethodDef cu_methods[] = {
    {"device_count", py_device_count, METH_NOARGS,
     "device_count($module, /)\n--\n\nNumber of CUDA devices; 0 when the runtime finds none (never raises)."},
    {"device_status", py_device_status, METH_NOARGS,
     "device_status($module, /)\n--\n\nThe CUDA runtime's answer to a device count, as text."},
    {"runtime_version", py_runtime_version, METH_NOARGS,
     "runtime_version($module, /)\n--\n\n(runtime, driver) versions in CUDA's encoding; 0 when unknown."},
    {"reshape_and_cache_flash", (PyCFunction)(void (*)(void))py_store, METH_VARARGS | METH_KEYWORDS,
     "reshape_and_cache_flash($module, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, "
     "v_scale, layout=None)\n--\n\nvLLM's store on CUDA tensors (see vtinfer.reshape_and_cache_flash)."},
    {"flash_attn_varlen_func", py_attn, METH_VARARGS,
     "flash_attn_varlen_func($module, q, k, v, cu_seqlens_q, seqused_k, block_table, out, lse, max_seqlen_q, "
     "max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, s_aux, k_descale, "
     "v_descale, kv_cache_dtype, validate, /)\n--\n\nPaged attention on CUDA tensors (see "
     "vtinfer.flash_attn_varlen_func; this is the positional form the Python layer calls)."},
    {NULL, NULL, 0, NULL},
};

static int cu_exec(PyObject *m) {
    cu_state *st = cu_get_state(m);
    PyObject *c = PyImport_ImportModule("vtinfer._C");
    if (!c) return -1;
    st->VtinferError = PyObject_GetAttrString(c, "VtinferError");
    Py_DECREF(c);
    if (!st->VtinferError) return -1;
    PyObject *bases = PyTuple_Pack(2, st->VtinferError, PyExc_RuntimeError);
    if (!bases) return -1;
    st->CudaError = PyErr_NewExceptionWithDoc("vtinfer.CudaError", "The CUDA runtime reported an error.", bases, NULL);
    Py_DECREF(bases);
    if (!st->CudaError || PyModule_AddObjectRef(m, "CudaError", st->CudaError) < 0) return -1;
    return PyModule_AddFunctions(m, cu_methods);
}

static int cu_traverse(PyObject *m, visitproc visit, void *arg) {
    cu_state *st = cu_get_state(m);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->VtinferError);
    return 0;
}

static int cu_clear(PyObject *m) {
    cu_state *st = cu_get_state(m);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->VtinferError);
    return 0;
}

static void cu_free(void *m) { cu_clear((PyObject *)m); }

static PyModuleDef_Slot cu_slots[] = {
    {Py_mod_exec, cu_exec},
    {0, NULL},
};

static PyModuleDef cu_module_def = {
    PyModuleDef_HEAD_INIT, "vtinfer._cuda", "vtinfer's CUDA arm (see csrc/cuda).", sizeof(cu_state), NULL, cu_slots,
    cu_traverse, cu_clear, cu_free,
};

PyMODINIT_FUNC PyInit__cuda(void);
PyMODINIT_FUNC PyInit__cuda(void) { return PyModuleDef_Init(&cu_module_def); }
