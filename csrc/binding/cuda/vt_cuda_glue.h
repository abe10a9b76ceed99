/* What the files of vtinfer._cuda share: the CUDA front door for the
 * shared argument layers, host copies, the status -> exception mapping
 * with the arm's CudaError. */
#ifndef VTINFER_BINDING_CUDA_GLUE_H
#define VTINFER_BINDING_CUDA_GLUE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "vt_import.h"
#include "vtinfer/status.h"

/* Raise for a failed core or CUDA call (VT_CUDA_ERR_RUNTIME: CudaError);
 * returns NULL. m: the vtinfer._cuda module. */
PyObject *vt_cu_raise(PyObject *m, int status, const vt_error *err);
/* The front door (vt_pin_fn): DLPack only; the layers check the device. */
int vt_cu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t);
/* "<fn>: <arg> must be on cuda:<a's> like the first tensor" unless a and b share a device. */
int vt_cu_same_device(const vt_tensor *a, const vt_tensor *b, const char *fn, const char *arg);
/* A contiguous tensor's bytes copied to host memory (*out: malloc'd, the
 * caller frees). 0, or -1 with an exception set. */
int vt_cu_copy_host(PyObject *m, const vt_tensor *t, const char *fn, const char *arg, void **out);

/* The module's attention function (cuda_attention.c). */
int vt_cu_attention_exec(PyObject *m);

#endif /* VTINFER_BINDING_CUDA_GLUE_H */
