/* Status -> exception for vtinfer._C: the mapping itself is
 * vt_status_exception (vt_status_map.h), shared with vtinfer._cuda. */
#include "vt_binding.h"
#include "vt_status_map.h"

PyObject *vt_raise(vt_module_state *st, const vt_error *err) {
    PyObject *type = vt_status_exception(err->status, st ? st->VtinferError : NULL, st ? st->ConfigError : NULL);
    PyErr_SetString(type, err->message[0] ? err->message : vt_status_name(err->status));
    return NULL;
}
