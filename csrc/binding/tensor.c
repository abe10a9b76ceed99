/* Argument conversion: NumPy arrays and DLPack producers to vt_tensor.
 *
 * Arrays are pinned, never copied: a NumPy array is referenced as is; a
 * DLPack capsule is consumed (renamed "used_...") and its deleter runs when
 * the owner object below is released. */
#include "vt_binding.h"
#include "vt_dlpack.h"

#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#endif

const char *vt_elem_name(vt_elem e) {
    switch (e) {
    case VT_ELEM_F32: return "float32";
    case VT_ELEM_F16: return "float16";
    case VT_ELEM_BF16: return "bfloat16";
    case VT_ELEM_E4M3: return "float8_e4m3fn";
    case VT_ELEM_E5M2: return "float8_e5m2";
    case VT_ELEM_U8: return "uint8";
    case VT_ELEM_I32: return "int32";
    case VT_ELEM_I64: return "int64";
    case VT_ELEM_F64: return "float64";
    default: return "other";
    }
}

static vt_elem elem_from_numpy(const vt_module_state *st, PyArray_Descr *d) {
    int n = d->type_num;
    if (n == NPY_FLOAT32) return VT_ELEM_F32;
    if (n == NPY_FLOAT16) return VT_ELEM_F16;
    if (n == NPY_UINT8) return VT_ELEM_U8;
    if (n == NPY_INT32) return VT_ELEM_I32;
    if (n == NPY_INT64) return VT_ELEM_I64;
    if (n == NPY_FLOAT64) return VT_ELEM_F64;
    if (n == st->typenum_bf16) return VT_ELEM_BF16;
    if (n == st->typenum_e4m3) return VT_ELEM_E4M3;
    if (n == st->typenum_e5m2) return VT_ELEM_E5M2;
    return VT_ELEM_OTHER;
}

static vt_elem elem_from_dlpack(vt_dl_dtype d) {
    if (d.lanes != 1) return VT_ELEM_OTHER;
    if (d.code == VT_DL_FLOAT && d.bits == 32) return VT_ELEM_F32;
    if (d.code == VT_DL_FLOAT && d.bits == 16) return VT_ELEM_F16;
    if (d.code == VT_DL_FLOAT && d.bits == 64) return VT_ELEM_F64;
    if (d.code == VT_DL_BFLOAT && d.bits == 16) return VT_ELEM_BF16;
    if (d.code == VT_DL_UINT && d.bits == 8) return VT_ELEM_U8;
    if (d.code == VT_DL_INT && d.bits == 32) return VT_ELEM_I32;
    if (d.code == VT_DL_INT && d.bits == 64) return VT_ELEM_I64;
    if (d.code == VT_DL_FLOAT8_E4M3FN && d.bits == 8) return VT_ELEM_E4M3;
    if (d.code == VT_DL_FLOAT8_E5M2 && d.bits == 8) return VT_ELEM_E5M2;
    return VT_ELEM_OTHER;
}

static int from_numpy(vt_module_state *st, PyArrayObject *a, const char *fn, const char *arg, vt_tensor *t) {
    int nd = PyArray_NDIM(a);
    if (nd > VT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have at most %d dimensions; got %d", fn, arg, VT_MAX_DIMS, nd);
        return -1;
    }
    PyArray_Descr *d = PyArray_DESCR(a);
    t->owner = Py_NewRef((PyObject *)a);
    t->data = PyArray_DATA(a);
    t->elem = elem_from_numpy(st, d);
    t->itemsize = (size_t)PyArray_ITEMSIZE(a);
    t->ndim = nd;
    for (int i = 0; i < nd; i++) {
        t->shape[i] = PyArray_DIM(a, i);
        t->strides[i] = PyArray_STRIDE(a, i);
    }
    t->readonly = !PyArray_ISWRITEABLE(a);
    t->device_type = VT_DL_CPU;
    t->device_id = 0;
    if (t->elem == VT_ELEM_OTHER) {
        PyObject *s = PyObject_Str((PyObject *)d);
        const char *c = s ? PyUnicode_AsUTF8(s) : NULL;
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", c ? c : "unknown");
        Py_XDECREF(s);
        PyErr_Clear();
    } else {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", vt_elem_name(t->elem));
    }
    return 0;
}

/* Owner of a consumed DLPack tensor: a capsule whose destructor runs the
 * producer's deleter. */
static void dl_owner_destroy(PyObject *cap) {
    void *p = PyCapsule_GetPointer(cap, "vtinfer.dlpack_owner");
    int versioned = (int)(intptr_t)PyCapsule_GetContext(cap);
    if (!p) {
        PyErr_Clear();
        return;
    }
    /* The deleter may run Python code (a ctypes or Python producer) while
     * an exception of ours is pending: keep it aside meanwhile. */
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

static int from_dlpack(PyObject *obj, const char *fn, const char *arg, vt_tensor *t) {
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) return -1;
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
    if (!cap) return -1;
    vt_dl_tensor *dl = NULL;
    void *managed = NULL;
    int versioned = 0, readonly = 0;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        vt_dl_managed_versioned *mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (mt->version.major != 1) {
            Py_DECREF(cap);
            PyErr_Format(PyExc_TypeError, "%s: %s must export DLPack 1.x; got version %u", fn, arg,
                         (unsigned)mt->version.major);
            return -1;
        }
        dl = &mt->dl_tensor;
        managed = mt;
        versioned = 1;
        readonly = (mt->flags & VT_DL_FLAG_READ_ONLY) != 0;
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) goto fail;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        vt_dl_managed *mt = PyCapsule_GetPointer(cap, "dltensor");
        dl = &mt->dl_tensor;
        managed = mt;
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) goto fail;
    } else {
        Py_DECREF(cap);
        PyErr_Format(PyExc_TypeError, "%s: %s.__dlpack__() must return a DLPack capsule", fn, arg);
        return -1;
    }
    /* From here the capsule is ours: its deleter must run exactly once. */
    PyObject *owner = PyCapsule_New(managed, "vtinfer.dlpack_owner", dl_owner_destroy);
    Py_DECREF(cap);
    if (!owner) {
        if (versioned) ((vt_dl_managed_versioned *)managed)->deleter(managed);
        else ((vt_dl_managed *)managed)->deleter(managed);
        return -1;
    }
    if (PyCapsule_SetContext(owner, (void *)(intptr_t)versioned) < 0) {
        Py_DECREF(owner);
        return -1;
    }
    t->owner = owner;
    if (dl->ndim < 0 || dl->ndim > VT_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have at most %d dimensions; got %d", fn, arg, VT_MAX_DIMS,
                     (int)dl->ndim);
        return -1;
    }
    t->elem = elem_from_dlpack(dl->dtype);
    t->itemsize = (size_t)((dl->dtype.bits * dl->dtype.lanes + 7) / 8);
    t->data = (char *)dl->data + dl->byte_offset;
    t->ndim = dl->ndim;
    int64_t stride = (int64_t)t->itemsize;
    for (int i = dl->ndim - 1; i >= 0; i--) {
        int64_t dim = dl->shape[i], st_i = stride;
        if (dim < 0 || (dl->strides && __builtin_mul_overflow(dl->strides[i], (int64_t)t->itemsize, &st_i)) ||
            __builtin_mul_overflow(stride, dim > 0 ? dim : 1, &stride)) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have a shape and strides whose byte sizes fit in 64 bits", fn,
                         arg);
            return -1;
        }
        t->shape[i] = dim;
        t->strides[i] = st_i;
    }
    t->readonly = readonly;
    t->device_type = dl->device.device_type;
    t->device_id = dl->device.device_id;
    if (t->elem == VT_ELEM_OTHER)
        snprintf(t->dtype_name, sizeof t->dtype_name, "DLPack(code=%u, bits=%u, lanes=%u)", dl->dtype.code,
                 dl->dtype.bits, dl->dtype.lanes);
    else
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", vt_elem_name(t->elem));
    return 0;
fail:
    Py_DECREF(cap);
    return -1;
}

int vt_tensor_from_object(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, int flags,
                          vt_tensor *t) {
    memset(t, 0, sizeof *t);
    int rc;
    if (PyArray_Check(obj)) {
        rc = from_numpy(st, (PyArrayObject *)obj, fn, arg, t);
    } else if (PyObject_HasAttrString(obj, "__dlpack__")) {
        rc = from_dlpack(obj, fn, arg, t);
    } else if (flags & VT_TENSOR_NO_CONVERT) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a NumPy array or support __dlpack__; got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    } else {
        PyObject *a = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
        if (!a) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: %s must be an array; got %s", fn, arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        rc = from_numpy(st, (PyArrayObject *)a, fn, arg, t);
        Py_DECREF(a);
    }
    if (rc < 0) {
        vt_tensor_release(t);
        return -1;
    }
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

int vt_tensor_is_contiguous(const vt_tensor *t) {
    int64_t expect = (int64_t)t->itemsize;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return 0;
        expect *= t->shape[i];
    }
    return 1;
}

int64_t vt_tensor_numel(const vt_tensor *t, const char *fn, const char *arg) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || vt_size_mul(n, (size_t)t->shape[i], &n) != 0 || n > (size_t)INT64_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have a size that fits in 64 bits", fn, arg);
            return -1;
        }
    }
    size_t bytes;
    if (vt_size_mul(n, t->itemsize ? t->itemsize : 1, &bytes) != 0 || bytes > (size_t)INT64_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have a byte size that fits in 64 bits", fn, arg);
        return -1;
    }
    return (int64_t)n;
}

static int default_threads(void) {
    const char *env = getenv("VTINFER_NUM_THREADS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && *end == '\0' && v >= 1) return v > VT_MAX_THREADS ? VT_MAX_THREADS : (int)v;
    }
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n > VT_MAX_THREADS ? VT_MAX_THREADS : n;
    }
#endif
    return 1;
}

int vt_num_threads_arg(PyObject *value, const char *fn) {
    if (value == NULL || value == Py_None) return default_threads();
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s: num_threads must be an int or None; got %s", fn, Py_TYPE(value)->tp_name);
        return -1;
    }
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 1) {
        PyErr_Format(PyExc_ValueError, "%s: num_threads must be >= 1; got %ld", fn, v);
        return -1;
    }
    return v > VT_MAX_THREADS ? VT_MAX_THREADS : (int)v;
}

/* Describe the allowed element set of a mask for messages. */
static void mask_names(unsigned mask, char *buf, size_t size) {
    static const vt_elem all[] = {VT_ELEM_F32, VT_ELEM_F16, VT_ELEM_BF16, VT_ELEM_E4M3, VT_ELEM_E5M2,
                                  VT_ELEM_U8,  VT_ELEM_I32, VT_ELEM_I64,  VT_ELEM_F64};
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

int vt_tensor_check(const vt_tensor *t, const char *fn, const char *arg, unsigned elem_mask, int ndim) {
    /* STYLE.md order: (Python type: done by the caller) rank, (shape: the
     * caller's), dtype, (contiguity: the caller's), device. */
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
    if (t->device_type != VT_DL_CPU && t->device_type != VT_DL_CUDA_HOST) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in CPU memory; got DLPack device type %d", fn, arg,
                     t->device_type);
        return -1;
    }
    return 0;
}

int vt_tensor_contiguous_input(vt_module_state *st, vt_tensor *t, const char *fn, const char *arg) {
    if (vt_tensor_is_contiguous(t)) return 0;
    if (!PyArray_Check(t->owner)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be C-contiguous when passed through DLPack", fn, arg);
        return -1;
    }
    PyArrayObject *c = PyArray_GETCONTIGUOUS((PyArrayObject *)t->owner);
    if (!c) return -1;
    vt_tensor_release(t);
    int rc = from_numpy(st, c, fn, arg, t);
    Py_DECREF(c);
    return rc;
}

int vt_tensor_overlap(const vt_tensor *a, const vt_tensor *b) {
    /* Byte extents [lo, hi) of each tensor; overlapping extents count. */
    const char *alo = a->data, *ahi = a->data, *blo = b->data, *bhi = b->data;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] == 0) return 0;
        int64_t span = (a->shape[i] - 1) * a->strides[i];
        if (span < 0) alo += span; else ahi += span;
    }
    for (int i = 0; i < b->ndim; i++) {
        if (b->shape[i] == 0) return 0;
        int64_t span = (b->shape[i] - 1) * b->strides[i];
        if (span < 0) blo += span; else bhi += span;
    }
    ahi += a->itemsize;
    bhi += b->itemsize;
    return alo < bhi && blo < ahi;
}
