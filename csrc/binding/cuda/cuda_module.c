/* vtinfer._cuda: the CUDA arm's Python glue (a separate extension, built
 * where a GPU is present and nvcc is found, or with VTINFER_CUDA=1; links the CUDA runtime).
 *
 *   _cuda.device_count() -> int          0 on a machine without a device (never raises)
 *   _cuda.device_status() -> str         the runtime's answer, e.g. "cudaErrorNoDevice: ..."
 *   _cuda.runtime_version() -> int
 *   _cuda.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
 *                                 kv_cache_dtype, k_scale, v_scale, *, layout=None,
 *                                 num_threads=None) -> None   (_C's signature; num_threads unused)
 *   _cuda.flash_attn_varlen_func(q, k, v, *, ...)   _C's signature plus validate=True
 *                                (cuda_attention.c) -> out | (out, lse)
 *   _cuda.CudaError                      (VtinferError, RuntimeError): the CUDA runtime failed
 *
 * Arrays are DLPack CUDA tensors (torch CUDA tensors), all on one device;
 * scales may also be Python floats. Tensors come in through the importer
 * vtinfer._C uses (common/tensor_dlpack.c); the store's arguments go
 * through the same argument layers as the CPU's (common/store_args.c,
 * common/attn_args.c), with the CUDA device check; the index and scale
 * values are judged on
 * host copies by the core's own checks (vt_kv_store_check,
 * vt_attn_scratch_size): the same exceptions and messages as the CPU
 * path. No NumPy, no torch. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vt_cuda.h"
#include "vt_cuda_glue.h"
#include "vt_signature.h"
#include "vt_status_map.h"
#include "vt_store_args.h"
#include "vtinfer/vtinfer.h"

typedef struct cu_state {
    PyObject *CudaError;
    PyObject *VtinferError;
} cu_state;

static cu_state *cu_get_state(PyObject *m) { return (cu_state *)PyModule_GetState(m); }

PyObject *vt_cu_raise(PyObject *m, int status, const vt_error *err) {
    PyObject *type = status == VT_CUDA_ERR_RUNTIME ? cu_get_state(m)->CudaError
                                                   : vt_status_exception(status, cu_get_state(m)->VtinferError, NULL);
    PyErr_SetString(type, err->message[0] ? err->message : "vtinfer._cuda: unknown error");
    return NULL;
}

/* ---- CUDA tensors: the shared importer with the CUDA device check ---- */

/* The arm's front door for the shared argument layer: DLPack only. */
int vt_cu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    (void)ctx;
    memset(t, 0, sizeof *t);
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a CUDA tensor (an object with __dlpack__); got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return vt_tensor_from_dlpack(obj, fn, arg, flags, t);
}

/* Pin obj as a CUDA tensor of `ndim` dimensions (any dtype: the caller checks). */
static int cu_tensor_from(PyObject *obj, const char *fn, const char *arg, int ndim, vt_tensor *t) {
    const unsigned any = 0xffffffffu;
    if (vt_cu_pin(NULL, obj, fn, arg, 0, t) < 0) return -1;
    if (vt_tensor_check(t, fn, arg, any, ndim, VT_MEMORY_CUDA) < 0) {
        vt_tensor_release(t);
        return -1;
    }
    return 0;
}

static int cu_dtype_err(const char *fn, const char *arg, const char *want, const vt_tensor *t) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be %s; got %s", fn, arg, want, t->dtype_name);
    return -1;
}

/* A small index/scale array (1-D or 2-D, contiguous) copied to host memory (malloc'd). */
int vt_cu_copy_host(PyObject *m, const vt_tensor *t, const char *fn, const char *arg, void **out) {
    if (!vt_tensor_is_contiguous(t)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be contiguous", fn, arg);
        return -1;
    }
    size_t n = (size_t)vt_tensor_count(t) * t->itemsize;
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
        vt_cu_raise(m, st, &err);
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
    vt_tensor t;
    int is_tensor;
    int count;
    float *host;
    float value;
} cu_scale;

static void scale_release(cu_scale *s) {
    if (s->is_tensor) vt_tensor_release(&s->t);
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
    if (s->t.elem != VT_ELEM_F32) {
        cu_dtype_err(fn, arg, "float32", &s->t);
        goto fail;
    }
    s->count = (int)vt_tensor_count(&s->t);
    void *h = NULL;
    if (vt_cu_copy_host(m, &s->t, fn, arg, &h) < 0) goto fail;
    s->host = h;
    return 0;
fail:
    scale_release(s);
    return -1;
}

int vt_cu_same_device(const vt_tensor *a, const vt_tensor *b, const char *fn, const char *arg) {
    if (a->device_id == b->device_id) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s must be on cuda:%d like the first tensor; got cuda:%d", fn, arg, a->device_id,
                 b->device_id);
    return -1;
}

/* A store scale: a Python number or a CUDA float32 tensor, as host values. */
static int store_scale(PyObject *m, PyObject *obj, const char *fn, const char *arg, cu_scale *s) {
    if (scale_arg(m, obj, fn, arg, s) < 0) return -1;
    if (s->is_tensor && s->t.ndim > 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have 1 or num_kv_heads elements in at most 1 dimension; got %d "
                     "dimensions", fn, arg, s->t.ndim);
        return -1;
    }
    return 0;
}

/* Host copy of slot_mapping; the core's checks on host values; then the
 * arm's duplicate policy. *cleared: tokens whose slot a later one names. */
static int store_host_checks(PyObject *m, vt_store_call *c, int64_t **slots, int64_t *cleared) {
    void *hs = NULL;
    if (vt_cu_copy_host(m, &c->slots, c->fn, "slot_mapping", &hs) < 0) return -1;
    *slots = hs;
    vt_kv_store_params hp = c->p;
    hp.slot_mapping = *slots;
    vt_error err;
    vt_error_clear(&err);
    int st = vt_kv_store_check(&hp, &err); /* host copies: the CPU's checks and messages */
    if (st != VT_OK) {
        vt_cu_raise(m, st, &err);
        return -1;
    }
    if ((*cleared = vt_cuda_clear_repeated_slots(*slots, hp.num_tokens)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Device copies of the (host) scales and, when duplicates were cleared,
 * of the slots; the launch; the frees. */
static int store_launch(PyObject *m, vt_store_call *c, const int64_t *slots, int64_t cleared) {
    const char *fn = c->fn;
    vt_kv_store_params p = c->p;
    float *dev_scales = NULL;
    int64_t *dev_slots = NULL;
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_set_device(c->key.device_id, fn, &err);
    if (st != VT_OK) st = VT_CUDA_ERR_RUNTIME;
    const size_t nsc = p.scale_per_head ? (size_t)p.num_kv_heads : 1;
    if (st == VT_OK && c->scales) {
        st = vt_cuda_malloc((void **)&dev_scales, 2 * nsc * sizeof(float), fn, &err);
        if (st == VT_OK) st = vt_cuda_to_device(dev_scales, c->scales, 2 * nsc * sizeof(float), fn, &err);
        p.k_scale = dev_scales;
        p.v_scale = dev_scales + nsc;
    }
    if (st == VT_OK && cleared > 0) {
        st = vt_cuda_malloc((void **)&dev_slots, (size_t)p.num_tokens * 8, fn, &err);
        if (st == VT_OK) st = vt_cuda_to_device(dev_slots, slots, (size_t)p.num_tokens * 8, fn, &err);
        p.slot_mapping = dev_slots;
    }
    if (st == VT_OK) {
        Py_BEGIN_ALLOW_THREADS
        st = vt_cuda_kv_store(&p, NULL, &err);
        if (st == VT_OK && (dev_scales || dev_slots)) st = vt_cuda_synchronize(fn, &err); /* before the frees */
        Py_END_ALLOW_THREADS
    }
    vt_cuda_free(dev_scales, fn, NULL);
    vt_cuda_free(dev_slots, fn, NULL);
    if (st != VT_OK) {
        vt_cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

static PyObject *py_store(PyObject *m, PyObject *args, PyObject *kw) {
    vt_store_pyargs a;
    vt_store_call c;
    memset(&c, 0, sizeof c);
    c.fn = "reshape_and_cache_flash";
    c.mem = VT_MEMORY_CUDA;
    if (vt_store_pyargs_parse(args, kw, 0, &a) < 0 ||
        vt_parse_dtype_name(a.kv_cache_dtype, c.fn, "kv_cache_dtype", &c.kv_flag) < 0 ||
        vt_parse_layout(a.layout, c.fn, &c.hnd) < 0)
        return NULL;
    cu_scale ks = {0}, vs = {0};
    int64_t *slots = NULL, cleared = 0;
    PyObject *ret = NULL;
    if (vt_store_pin_inputs(&c, vt_cu_pin, NULL, a.key, a.value, a.slot_mapping, -1, -1) < 0 ||
        vt_store_pin_caches(&c, vt_cu_pin, NULL, a.key_cache, a.value_cache) < 0 ||
        vt_store_pin_scale_caches(&c, vt_cu_pin, NULL, a.k_scale_cache, a.v_scale_cache) < 0 ||
        vt_cu_same_device(&c.key, &c.value, c.fn, "value") || vt_cu_same_device(&c.key, &c.key_cache, c.fn, "key_cache") ||
        vt_cu_same_device(&c.key, &c.value_cache, c.fn, "value_cache") ||
        vt_cu_same_device(&c.key, &c.slots, c.fn, "slot_mapping") || vt_store_check(&c) < 0)
        goto done;
    if (vt_dtype_per_token_head(c.p.cache_dtype)) { /* the CUDA store has no per-token-head kernel yet */
        PyErr_Format(PyExc_NotImplementedError, "%s: kv_cache_dtype '%s' is not built for CUDA tensors", c.fn,
                     vt_dtype_get(c.p.cache_dtype)->name);
        goto done;
    }
    if (vt_dtype_get(c.p.cache_dtype)->is_fp8 &&
        (store_scale(m, a.k_scale, c.fn, "k_scale", &ks) < 0 || store_scale(m, a.v_scale, c.fn, "v_scale", &vs) < 0 ||
         vt_store_set_scales(&c, ks.host, ks.count, vs.host, vs.count) < 0))
        goto done;
    if (store_host_checks(m, &c, &slots, &cleared) < 0 || store_launch(m, &c, slots, cleared) < 0) goto done;
    ret = Py_NewRef(Py_None);
done:
    free(slots);
    scale_release(&ks);
    scale_release(&vs);
    vt_store_release(&c);
    return ret;
}

static char store_doc[512];

static PyMethodDef cu_methods[] = {
    {"device_count", py_device_count, METH_NOARGS,
     "device_count($module, /)\n--\n\nNumber of CUDA devices; 0 when the runtime finds none (never raises)."},
    {"device_status", py_device_status, METH_NOARGS,
     "device_status($module, /)\n--\n\nThe CUDA runtime's answer to a device count, as text."},
    {"runtime_version", py_runtime_version, METH_NOARGS,
     "runtime_version($module, /)\n--\n\n(runtime, driver) versions in CUDA's encoding; 0 when unknown."},
    {"reshape_and_cache_flash", (PyCFunction)(void (*)(void))py_store, METH_VARARGS | METH_KEYWORDS,
     store_doc},
    {NULL, NULL, 0, NULL},
};

static int cu_exec(PyObject *m) {
    cu_state *st = cu_get_state(m);
    vt_signature_doc(vt_store_flash_signature(), "vLLM's store on CUDA tensors (see vtinfer.reshape_and_cache_flash).",
                     store_doc, sizeof store_doc);
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
    if (PyModule_AddFunctions(m, cu_methods) < 0) return -1;
    return vt_cu_attention_exec(m);
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
