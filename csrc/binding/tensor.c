/* vtinfer._C's front door for array arguments: NumPy arrays (pinned, not
 * copied, unless an input needs a native-byte-order or contiguous copy),
 * DLPack producers (the shared importer, common/tensor_dlpack.c) and,
 * where allowed, anything numpy.asarray takes; plus num_threads. */
#include "vt_binding.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sched.h>
#endif

static vt_elem elem_from_numpy(const vt_module_state *st, PyArray_Descr *d) {
    int n = d->type_num;
    if (n == NPY_FLOAT32) return VT_ELEM_F32;
    if (n == NPY_FLOAT16) return VT_ELEM_F16;
    if (n == NPY_UINT8) return VT_ELEM_U8;
    if (n == NPY_INT8) return VT_ELEM_I8;
    if (n == NPY_INT32) return VT_ELEM_I32;
    if (n == NPY_INT64) return VT_ELEM_I64;
    if (n == NPY_FLOAT64) return VT_ELEM_F64;
    if (n == st->typenum_bf16) return VT_ELEM_BF16;
    if (n == st->typenum_e4m3) return VT_ELEM_E4M3;
    if (n == st->typenum_e5m2) return VT_ELEM_E5M2;
    return VT_ELEM_OTHER;
}

/* 1 for a numpy.ma.MaskedArray (its mask would be ignored); numpy.ma is
 * looked up only when it was imported: otherwise no such array exists. */
static int is_masked(PyObject *obj) {
    if (PyArray_CheckExact(obj)) return 0;
    PyObject *name = PyUnicode_FromString("numpy.ma");
    PyObject *ma = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    if (!ma) {
        PyErr_Clear();
        return 0;
    }
    PyObject *cls = PyObject_GetAttrString(ma, "MaskedArray");
    Py_DECREF(ma);
    int r = cls ? PyObject_IsInstance(obj, cls) : 0;
    Py_XDECREF(cls);
    if (r < 0) PyErr_Clear();
    return r > 0;
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
    if (t->elem == VT_ELEM_OTHER || PyArray_ISBYTESWAPPED(a)) {
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

/* A NumPy array argument: refused when masked, or non-native as a
 * destination; a non-native input is converted to a native copy. */
static int numpy_arg(vt_module_state *st, PyArrayObject *a, const char *fn, const char *arg, int flags,
                     vt_tensor *t) {
    if (is_masked((PyObject *)a)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a plain ndarray (its mask would be ignored); got %s", fn, arg,
                     Py_TYPE(a)->tp_name);
        return -1;
    }
    if (!PyArray_ISBYTESWAPPED(a)) return from_numpy(st, a, fn, arg, t);
    if (flags & VT_TENSOR_WRITABLE) {
        PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR(a));
        PyErr_Format(PyExc_TypeError, "%s: %s must be in native byte order (vtinfer writes it); got dtype %S", fn, arg,
                     s ? s : Py_None);
        Py_XDECREF(s);
        return -1;
    }
    PyArray_Descr *native = PyArray_DescrNewByteorder(PyArray_DESCR(a), NPY_NATIVE);
    if (!native) return -1;
    PyArrayObject *c = (PyArrayObject *)PyArray_FromArray(a, native, NPY_ARRAY_CARRAY); /* steals native */
    if (!c) return -1;
    int rc = from_numpy(st, c, fn, arg, t);
    Py_DECREF(c);
    return rc;
}

int vt_tensor_from_object(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, int flags,
                          vt_tensor *t) {
    memset(t, 0, sizeof *t);
    int rc;
    if (PyArray_Check(obj)) {
        rc = numpy_arg(st, (PyArrayObject *)obj, fn, arg, flags, t);
    } else if (PyObject_HasAttrString(obj, "__dlpack__")) {
        return vt_tensor_from_dlpack(obj, fn, arg, flags, t);
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
        rc = numpy_arg(st, (PyArrayObject *)a, fn, arg, flags, t);
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

/* Parse a scale argument into float32 values: a number, or an array of
 * n_options[i] elements with the given rank. Returns a new float32
 * C-contiguous array or NULL with an exception set. */
PyArrayObject *vt_scale_array(PyObject *obj, const char *fn, const char *arg) {
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number or an array of them; got bool", fn, arg);
        return NULL;
    }
    PyObject *a = PyArray_FromAny(obj, PyArray_DescrFromType(NPY_FLOAT32), 0, 2,
                                  NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST, NULL);
    if (!a) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number or an array of at most 2 dimensions; got %s", fn,
                     arg, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (PyArrayObject *)a;
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
    PyObject *idx = PyBool_Check(value) || PyFloat_Check(value) || !PyIndex_Check(value) ? NULL : PyNumber_Index(value);
    if (!idx) { /* an int or any __index__ (NumPy integers); never bool or float */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: num_threads must be an int or None; got %s", fn, Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow > 0 || v > INT_MAX) { /* beyond C's int: refused by name, not a bare OverflowError */
        PyErr_Format(PyExc_ValueError, "%s: num_threads must be <= %d; got %S", fn, INT_MAX, value);
        return -1;
    }
    if (overflow < 0 || v < 1) {
        PyErr_Format(PyExc_ValueError, "%s: num_threads must be >= 1; got %S", fn, value);
        return -1;
    }
    return v > VT_MAX_THREADS ? VT_MAX_THREADS : (int)v;
}

int vt_tensor_contiguous_input(vt_module_state *st, vt_tensor *t, const char *fn, const char *arg) {
    if (vt_tensor_is_contiguous(t)) return 0;
    if (!PyArray_Check(t->owner)) return vt_refuse_noncontiguous(NULL, t, fn, arg);
    PyArrayObject *c = PyArray_GETCONTIGUOUS((PyArrayObject *)t->owner);
    if (!c) return -1;
    vt_tensor_release(t);
    int rc = from_numpy(st, c, fn, arg, t);
    Py_DECREF(c);
    return rc;
}


int vt_copy_inputs_contiguous(vt_module_state *st, vt_store_call *c) {
    if ((!vt_tensor_last_dim_contiguous(&c->key) && vt_tensor_contiguous_input(st, &c->key, c->fn, "key") < 0) ||
        (!vt_tensor_last_dim_contiguous(&c->value) && vt_tensor_contiguous_input(st, &c->value, c->fn, "value") < 0) ||
        vt_tensor_contiguous_input(st, &c->slots, c->fn, "slot_mapping") < 0)
        return -1;
    return vt_store_check_inputs_contiguous(c);
}
