/* The one mapping from core status codes to Python exceptions. */
#include "vt_binding.h"

PyObject *vt_raise(vt_module_state *st, const vt_error *err) {
    PyObject *type;
    switch (err->status) {
    case VT_ERR_VALUE:
    case VT_ERR_OVERFLOW: type = PyExc_ValueError; break;
    case VT_ERR_TYPE: type = PyExc_TypeError; break;
    case VT_ERR_INDEX: type = PyExc_IndexError; break;
    case VT_ERR_NOMEM: type = PyExc_MemoryError; break;
    case VT_ERR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    case VT_ERR_IO: type = PyExc_OSError; break;
    case VT_ERR_BUFFER: type = PyExc_BufferError; break;
    case VT_ERR_PARSE: type = st && st->ConfigError ? st->ConfigError : PyExc_ValueError; break;
    default: type = st && st->VtinferError ? st->VtinferError : PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, err->message[0] ? err->message : vt_status_name(err->status));
    return NULL;
}
