/* The one way the binding includes Python and NumPy: sets the NumPy API
 * version and the unique-symbol macros. module.c defines VT_NUMPY_IMPORT
 * before including this header and owns the API table; every other file
 * only uses it. */
#ifndef VTINFER_BINDING_NUMPY_H
#define VTINFER_BINDING_NUMPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#define NPY_TARGET_VERSION NPY_2_0_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL vtinfer_ARRAY_API
#ifndef VT_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif /* VTINFER_BINDING_NUMPY_H */
