/* The cache ops' shared argument helpers (vt_cacheops.h). */
#include "vt_cacheops.h"

#include <math.h>
#include <string.h>

/* Up to 8 pinned tensors per call, released together. */
void vt_co_pins_release(vt_co_pins *p) {
    for (int i = 0; i < p->n; i++) vt_tensor_release(&p->t[i]);
    p->n = 0;
}

/* Pin obj (elem in mask, ndim dims or any when < 0). */
vt_tensor *vt_co_pin(vt_module_state *st, vt_co_pins *p, PyObject *obj, const char *fn, const char *arg, int flags,
                      unsigned mask, int ndim) {
    vt_tensor *t = &p->t[p->n];
    if (vt_tensor_from_object(st, obj, fn, arg, flags, t) < 0) return NULL;
    p->n++;
    if (vt_tensor_check(t, fn, arg, mask, ndim, VT_MEMORY_CPU) < 0) return NULL;
    return t;
}

/* An int32 index array of ndim dims with a contiguous last dimension (a
 * NumPy array without one is copied). */
vt_tensor *vt_co_pin_index(vt_module_state *st, vt_co_pins *p, PyObject *obj, const char *fn, const char *arg, int ndim) {
    vt_tensor *t = vt_co_pin(st, p, obj, fn, arg, 0, VT_ELEM_BIT(VT_ELEM_I32), ndim);
    if (!t) return NULL;
    if (t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 4 && vt_tensor_contiguous_input(st, t, fn, arg) < 0)
        return NULL;
    return t;
}

int vt_co_last_dim_ok(const vt_tensor *t, const char *fn, const char *arg) {
    if (t->ndim > 0 && t->shape[t->ndim - 1] > 1 && t->strides[t->ndim - 1] != (int64_t)t->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have a contiguous last dimension (stride %zu bytes); got %lld",
                     fn, arg, t->itemsize, (long long)t->strides[t->ndim - 1]);
        return -1;
    }
    return 0;
}

int vt_co_no_overlap(const vt_tensor *a, const char *an, const vt_tensor *b, const char *bn, const char *fn) {
    if (a && b && vt_tensor_share_elements(a, b)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must not share elements with %s", fn, an, bn);
        return -1;
    }
    return 0;
}

/* Bytes from t->data to the end of its last element; -1 with ValueError
 * when a stride is negative. */
int64_t vt_co_view_extent(const vt_tensor *t, const char *fn, const char *arg) {
    int64_t hi = (int64_t)t->itemsize;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        if (t->strides[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have non-negative strides; got %lld in dimension %d", fn, arg,
                         (long long)t->strides[i], i);
            return -1;
        }
        hi += (t->shape[i] - 1) * t->strides[i];
    }
    return hi;
}

int vt_co_parse_int(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t *out) {
    return vt_int_arg(obj, fn, arg, lo, INT64_MAX, out);
}

/* A positive finite scale: a number (a one-element array is turned into
 * a float by the Python wrapper). */
int vt_co_parse_scale(PyObject *obj, const char *fn, const char *arg, float *out) {
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj))) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    float f = (float)v;
    if (!(f > 0.0f) || isinf(f)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be finite and > 0 (as float32); got %R", fn, arg, obj);
        return -1;
    }
    *out = f;
    return 0;
}

/* kv_dtype / kv_cache_dtype: "auto" (VT_DTYPE_AUTO) or an fp8 format. */
int vt_co_parse_fp8_name(PyObject *obj, const char *fn, const char *arg, int *out) {
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a str; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (strcmp(s, "auto") == 0) {
        *out = VT_DTYPE_AUTO;
        return 0;
    }
    if (strcmp(s, "fp8") == 0 || strcmp(s, "fp8_e4m3") == 0) {
        *out = VT_DTYPE_FP8_E4M3;
        return 0;
    }
    if (strcmp(s, "fp8_e5m2") == 0) {
        *out = VT_DTYPE_FP8_E5M2;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: %s must be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'; got '%.64s'", fn, arg, s);
    return -1;
}

int vt_co_is_code(vt_elem e) { return e == VT_ELEM_U8 || e == VT_ELEM_E4M3 || e == VT_ELEM_E5M2; }

/* The fp8 format a code array holds under `fmt` (TypeError when an
 * ml_dtypes float8 array names the other one). */
int vt_co_code_fmt(const vt_tensor *t, int fmt, const char *fn, const char *arg, const char *flag) {
    const int implied = t->elem == VT_ELEM_E4M3 || t->elem == VT_ELEM_E5M2 ? (int)t->elem : -1; /* a float8 array's own */
    if (fmt == VT_DTYPE_AUTO) {
        PyErr_Format(PyExc_TypeError, "%s: %s must name the fp8 format ('fp8', 'fp8_e4m3' or 'fp8_e5m2') for %s of "
                     "dtype %s; got 'auto'", fn, flag, arg, t->dtype_name);
        return -1;
    }
    if (implied >= 0 && implied != fmt) {
        PyErr_Format(PyExc_TypeError, "%s: %s of dtype %s must be read with %s '%s'; got '%s'", fn, arg,
                     t->dtype_name, flag, vt_dtype_get(implied)->name, vt_dtype_get(fmt)->name);
        return -1;
    }
    return 0;
}

PyObject *vt_co_done(vt_module_state *st, vt_co_pins *p, vt_status s, const vt_error *err) {
    vt_co_pins_release(p);
    if (s != VT_OK) return vt_raise(st, err);
    Py_RETURN_NONE;
}
