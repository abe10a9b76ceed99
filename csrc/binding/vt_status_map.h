/* The one mapping from core status codes to Python exception types, shared
 * by vtinfer._C (errors.c) and vtinfer._cuda (cuda/cuda_module.c). Needs
 * only Python.h. `own` is vtinfer.VtinferError (VT_ERR_INTERNAL and codes
 * this table does not know), `config` is vtinfer.ConfigError (VT_ERR_PARSE);
 * either may be NULL, then RuntimeError / ValueError stand in. */
#ifndef VTINFER_BINDING_STATUS_MAP_H
#define VTINFER_BINDING_STATUS_MAP_H

#include <Python.h>

#include "vtinfer/status.h"

static inline PyObject *vt_status_exception(int status, PyObject *own, PyObject *config) {
    switch (status) {
    case VT_ERR_VALUE:
    case VT_ERR_OVERFLOW: return PyExc_ValueError;
    case VT_ERR_TYPE: return PyExc_TypeError;
    case VT_ERR_INDEX: return PyExc_IndexError;
    case VT_ERR_NOMEM: return PyExc_MemoryError;
    case VT_ERR_UNSUPPORTED: return PyExc_NotImplementedError;
    case VT_ERR_IO: return PyExc_OSError;
    case VT_ERR_BUFFER: return PyExc_BufferError;
    case VT_ERR_PARSE: return config ? config : PyExc_ValueError;
    default: return own ? own : PyExc_RuntimeError;
    }
}

#endif /* VTINFER_BINDING_STATUS_MAP_H */
