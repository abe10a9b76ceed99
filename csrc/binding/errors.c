/* Status -> exception for vtinfer._C: the mapping itself is
 * vt_status_exception (vt_status_map.h), shared with vtinfer._cuda; and the
 * result of a call that made two arrays. */
#include "vt_binding.h"
#include "vt_status_map.h"

PyObject *vt_raise(vt_module_state *st, const vt_error *err) {
    PyObject *type = vt_status_exception(err->status, st ? st->VtinferError : NULL, st ? st->ConfigError : NULL);
    PyErr_SetString(type, err->message[0] ? err->message : vt_status_name(err->status));
    return NULL;
}

PyObject *vt_pair_result(vt_module_state *st, vt_status s, const vt_error *err, PyArrayObject *a, PyArrayObject *b) {
    PyObject *r = s == VT_OK ? PyTuple_Pack(2, (PyObject *)a, (PyObject *)b) : vt_raise(st, err);
    Py_DECREF(a);
    Py_DECREF(b);
    return r;
}
