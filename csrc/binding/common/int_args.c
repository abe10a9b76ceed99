/* The one integer converter of both extensions (vt_import.h: vt_int_arg). */
#include "vt_import.h"

#include <stdint.h>

/* The bound the value passed: "in [lo, hi]" when both ends are real limits,
 * else the end it crossed (an unbounded end is the 64-bit limit). */
static int out_of_range(PyObject *value, const char *fn, const char *arg, int64_t lo, int64_t hi, int too_big) {
    if (lo != INT64_MIN && hi != INT64_MAX)
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%lld, %lld]; got %S", fn, arg, (long long)lo,
                     (long long)hi, value);
    else if (too_big)
        PyErr_Format(PyExc_ValueError, "%s: %s must be <= %lld; got %S", fn, arg, (long long)hi, value);
    else
        PyErr_Format(PyExc_ValueError, "%s: %s must be >= %lld; got %S", fn, arg, (long long)lo, value);
    return -1;
}

int vt_int_arg(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t hi, int64_t *out) {
    if (PyBool_Check(obj) || PyFloat_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *idx = PyNumber_Index(obj);
    if (!idx) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(idx);
        return -1;
    }
    if (overflow || v < lo || v > hi) {
        out_of_range(idx, fn, arg, lo, hi, overflow > 0 || (!overflow && v > hi));
        Py_DECREF(idx);
        return -1;
    }
    Py_DECREF(idx);
    *out = (int64_t)v;
    return 0;
}
