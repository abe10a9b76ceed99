/* The DLPack importer both extensions share (vt_import.h): a producer's
 * capsule is consumed (renamed "used_...") and its deleter runs when the
 * owner capsule made here is released; the fields are validated by
 * vt_dl_describe before anything is computed from them. */
#include "vt_import.h"

#include <stdio.h>
#include <string.h>

/* Owner of a consumed DLPack tensor: a capsule whose destructor runs the
 * producer's deleter (context 1: versioned struct). */
static void dl_owner_destroy(PyObject *cap) {
    void *p = PyCapsule_GetPointer(cap, "vtinfer.dlpack_owner");
    int versioned = (int)(intptr_t)PyCapsule_GetContext(cap);
    if (!p) {
        PyErr_Clear();
        return;
    }
    /* The deleter may run Python code (a ctypes producer) while an
     * exception of ours is pending: keep it aside meanwhile. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (versioned) {
        vt_dl_managed_versioned *mt = p;
        if (mt->deleter) mt->deleter(mt);
    } else {
        vt_dl_managed *mt = p;
        if (mt->deleter) mt->deleter(mt);
    }
    PyErr_Restore(type, value, tb);
}

/* "<fn>: <arg> must be exportable through DLPack; got <type>: <message>". */
static void export_failed(const char *fn, const char *arg) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
    if (!text) PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: %s must be exportable through DLPack; got %s: %s", fn, arg,
                 type ? ((PyTypeObject *)type)->tp_name : "an error", text ? text : "?");
    Py_XDECREF(s);
    if (value) { /* chain the producer's exception as the cause */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyException_SetCause(v2, Py_NewRef(value));
        PyErr_Restore(t2, v2, tb2);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* 1 when obj.<method>() exists and returns True (torch's is_neg/is_conj:
 * a lazy view whose exported bytes do not hold its values). */
static int lazy_bit(PyObject *obj, const char *method) {
    PyObject *f = PyObject_GetAttrString(obj, method);
    if (!f) {
        PyErr_Clear();
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    int v = r ? PyObject_IsTrue(r) : 0;
    Py_XDECREF(r);
    if (v < 0 || !r) PyErr_Clear();
    return v > 0;
}

/* Call obj.__dlpack__, asking for a versioned capsule first. A torch
 * tensor that requires grad: detached when read, refused when written. */
static PyObject *call_dlpack(PyObject *obj, const char *fn, const char *arg, int flags) {
    if (lazy_bit(obj, "is_neg") || lazy_bit(obj, "is_conj")) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold its own values (call .resolve_neg() / .resolve_conj() "
                     "first); got a lazy %s view", fn, arg, lazy_bit(obj, "is_neg") ? "negative" : "conjugate");
        return NULL;
    }
    PyObject *src = Py_NewRef(obj);
    PyObject *rg = PyObject_GetAttrString(obj, "requires_grad");
    if (!rg) PyErr_Clear();
    int wants_grad = rg ? PyObject_IsTrue(rg) : 0;
    Py_XDECREF(rg);
    if (wants_grad < 0) PyErr_Clear();
    if (wants_grad > 0) {
        if (flags & VT_TENSOR_WRITABLE) {
            Py_DECREF(src);
            PyErr_Format(PyExc_ValueError, "%s: %s must not require grad (vtinfer writes it outside autograd); got "
                         "a tensor with requires_grad=True", fn, arg);
            return NULL;
        }
        Py_SETREF(src, PyObject_CallMethod(obj, "detach", NULL));
        if (!src) {
            export_failed(fn, arg);
            return NULL;
        }
    }
    PyObject *method = PyObject_GetAttrString(src, "__dlpack__");
    Py_DECREF(src);
    if (!method) {
        export_failed(fn, arg);
        return NULL;
    }
    PyObject *kwargs = Py_BuildValue("{s:(ii)}", "max_version", 1, 0);
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = (kwargs && empty) ? PyObject_Call(method, empty, kwargs) : NULL;
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) { /* producer predates max_version */
        PyErr_Clear();
        cap = PyObject_CallNoArgs(method);
    }
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    Py_DECREF(method);
    if (!cap) export_failed(fn, arg);
    return cap;
}

/* Take ownership of the capsule's tensor: *owner runs the deleter. */
static int consume(PyObject *cap, const char *fn, const char *arg, PyObject **owner, const vt_dl_tensor **dl,
                   int *readonly) {
    void *managed;
    int versioned = 0;
    *readonly = 0;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        vt_dl_managed_versioned *mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (mt->version.major != 1) {
            PyErr_Format(PyExc_TypeError, "%s: %s must export DLPack 1.x; got version %u", fn, arg,
                         (unsigned)mt->version.major);
            return -1;
        }
        *dl = &mt->dl_tensor;
        managed = mt;
        versioned = 1;
        *readonly = (mt->flags & VT_DL_FLAG_READ_ONLY) != 0;
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) return -1;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        vt_dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
        *dl = &mt->dl_tensor;
        managed = mt;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: %s.__dlpack__() must return a DLPack capsule; got %s", fn, arg,
                     Py_TYPE(cap)->tp_name);
        return -1;
    }
    /* From here the tensor is ours: its deleter must run exactly once. */
    *owner = PyCapsule_New(managed, "vtinfer.dlpack_owner", dl_owner_destroy);
    if (*owner && PyCapsule_SetContext(*owner, (void *)(intptr_t)versioned) == 0) return 0;
    if (*owner) Py_CLEAR(*owner); /* context 0 would run the wrong deleter: run it here */
    if (versioned) ((vt_dl_managed_versioned *)managed)->deleter(managed);
    else ((vt_dl_managed *)managed)->deleter(managed);
    return -1;
}

int vt_tensor_from_dlpack(PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    memset(t, 0, sizeof *t);
    PyObject *cap = call_dlpack(obj, fn, arg, flags), *owner = NULL;
    if (!cap) return -1;
    const vt_dl_tensor *dl = NULL;
    int readonly = 0;
    int rc = consume(cap, fn, arg, &owner, &dl, &readonly);
    Py_DECREF(cap);
    if (rc < 0) return -1;
    char msg[200];
    if (vt_dl_describe(dl, readonly, t, msg, sizeof msg) < 0) {
        Py_DECREF(owner);
        memset(t, 0, sizeof *t);
        PyErr_Format(PyExc_ValueError, "%s: %s %s", fn, arg, msg);
        return -1;
    }
    t->owner = owner;
    if ((flags & VT_TENSOR_WRITABLE) && t->readonly) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be writable; got a read-only array", fn, arg);
        vt_tensor_release(t);
        return -1;
    }
    return 0;
}

void vt_tensor_release(vt_tensor *t) {
    Py_CLEAR(t->owner);
    t->data = NULL;
}

/* The allowed element set of a mask, for messages: "float32, float16 or bfloat16". */
static void mask_names(unsigned mask, char *buf, size_t size) {
    static const vt_elem all[] = {VT_ELEM_F32, VT_ELEM_F16, VT_ELEM_BF16, VT_ELEM_E4M3, VT_ELEM_E5M2,
                                  VT_ELEM_U8,  VT_ELEM_I32, VT_ELEM_I64,  VT_ELEM_F64, VT_ELEM_I8};
    size_t used = 0;
    int count = 0, total = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) total += (mask & VT_ELEM_BIT(all[i])) != 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!(mask & VT_ELEM_BIT(all[i]))) continue;
        count++;
        const char *sep = count == 1 ? "" : (count == total ? (total == 2 ? " or " : ", or ") : ", ");
        int w = snprintf(buf + used, size - used, "%s%s", sep, vt_elem_name(all[i]));
        if (w < 0 || (size_t)w >= size - used) break;
        used += (size_t)w;
    }
}

int vt_tensor_check(const vt_tensor *t, const char *fn, const char *arg, unsigned elem_mask, int ndim, vt_memory mem) {
    if (ndim >= 0 && t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have %d dimensions; got %d", fn, arg, ndim, t->ndim);
        return -1;
    }
    if (!(elem_mask & VT_ELEM_BIT(t->elem))) {
        char names[160];
        mask_names(elem_mask, names, sizeof names);
        PyErr_Format(PyExc_TypeError, "%s: %s must have dtype %s; got %s", fn, arg, names, t->dtype_name);
        return -1;
    }
    /* Kernels step by whole elements (an LSE's stride / 4, an index row's
     * / 4): a NumPy view (as_strided, a packed structured field) whose
     * stride is not a multiple of the element size is refused, never
     * rounded to a neighbouring element. */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1 && t->itemsize > 1 && t->strides[i] % (int64_t)t->itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have strides that are multiples of its element size (%zu "
                         "bytes); got %lld bytes in dimension %d", fn, arg, t->itemsize, (long long)t->strides[i], i);
            return -1;
        }
    if (mem == VT_MEMORY_CPU && t->device_type != VT_DL_CPU && t->device_type != VT_DL_CUDA_HOST) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in CPU memory; got DLPack device type %d", fn, arg,
                     t->device_type);
        return -1;
    }
    if (mem == VT_MEMORY_CUDA && t->device_type != VT_DL_CUDA) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be on a CUDA device; got DLPack device type %d", fn, arg,
                     t->device_type);
        return -1;
    }
    return 0;
}

/* "[a, b, ...]" of n values into buf (at least 32 bytes). */
static void format_dims(const int64_t *v, int n, char *buf, size_t size) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && k < size - 24; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)v[i]);
    snprintf(buf + k, size - k, "]");
}

int vt_shape_error(const char *fn, const char *arg, const char *want, const vt_tensor *t) {
    char got[200];
    format_dims(t->shape, t->ndim, got, sizeof got);
    PyErr_Format(PyExc_ValueError, "%s: %s must have shape %s; got %s", fn, arg, want, got);
    return -1;
}

int vt_refuse_shared(const char *fn, const vt_tensor *input, const char *in_name, const vt_tensor *dst,
                     const char *dst_name) {
    if (!vt_tensor_share_elements(input, dst)) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s must not share memory with %s; got views sharing elements", fn, in_name,
                 dst_name);
    return -1;
}

int vt_refuse_self_alias(const char *fn, const vt_tensor *dst, const char *name) {
    if (!vt_tensor_self_overlaps(dst)) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s must not alias itself (its strides make two elements share memory)", fn,
                 name);
    return -1;
}

int vt_refuse_noncontiguous(void *ctx, vt_tensor *t, const char *fn, const char *arg) {
    (void)ctx;
    if (vt_tensor_is_contiguous(t)) return 0;
    char got[200];
    format_dims(t->strides, t->ndim, got, sizeof got);
    PyErr_Format(PyExc_ValueError, "%s: %s must be C-contiguous when passed through DLPack; got byte strides %s", fn,
                 arg, got);
    return -1;
}
