/* What the cache-op binding files share (cacheops_args.c): pinning with
 * release-together, the scalar parsers, the checks every op repeats, and
 * each file's exec hook. _C only (NumPy front door). */
#ifndef VTINFER_BINDING_CACHEOPS_H
#define VTINFER_BINDING_CACHEOPS_H

#include "vt_binding.h"
#include "vtinfer/cache_ops.h"

#define VT_CO_ALL_ELEMS (VT_ELEMS_FLOAT | VT_ELEMS_CODES)

/* Up to 8 pinned tensors per call, released together. */
typedef struct vt_co_pins {
    vt_tensor t[8];
    int n;
} vt_co_pins;

void vt_co_pins_release(vt_co_pins *p);
/* Pin obj into p (elem in mask, ndim dims or any when < 0); NULL with an exception. */
vt_tensor *vt_co_pin(vt_module_state *st, vt_co_pins *p, PyObject *obj, const char *fn, const char *arg, int flags,
                     unsigned mask, int ndim);
/* An int32 index array of ndim dims with a contiguous last dimension (a
 * NumPy array without one is copied). */
vt_tensor *vt_co_pin_index(vt_module_state *st, vt_co_pins *p, PyObject *obj, const char *fn, const char *arg,
                           int ndim);
int vt_co_last_dim_ok(const vt_tensor *t, const char *fn, const char *arg);
/* a or b NULL: nothing to compare. */
int vt_co_no_overlap(const vt_tensor *a, const char *an, const vt_tensor *b, const char *bn, const char *fn);
/* Bytes from t->data to the end of its last element; -1 with ValueError when a stride is negative. */
int64_t vt_co_view_extent(const vt_tensor *t, const char *fn, const char *arg);
/* An int (or an index-like number) >= lo. */
int vt_co_parse_int(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t *out);
/* A positive finite float32 scale given as a Python number. */
int vt_co_parse_scale(PyObject *obj, const char *fn, const char *arg, float *out);
/* "auto" (VT_DTYPE_AUTO) or an fp8 format name. */
int vt_co_parse_fp8_name(PyObject *obj, const char *fn, const char *arg, int *out);
int vt_co_is_code(vt_elem e);
/* The fp8 format a code array holds under fmt (TypeError when a float8 array names the other one). */
int vt_co_code_fmt(const vt_tensor *t, int fmt, const char *fn, const char *arg, const char *flag);
/* Release p; raise for a failed status, else return None. */
PyObject *vt_co_done(vt_module_state *st, vt_co_pins *p, vt_status s, const vt_error *err);

/* The files' functions (cacheops_gather.c, cacheops_merge.c, cacheops_mla.c). */
int vt_cacheops_gather_exec(PyObject *m);
int vt_cacheops_merge_exec(PyObject *m);
int vt_cacheops_mla_exec(PyObject *m);

#endif /* VTINFER_BINDING_CACHEOPS_H */
