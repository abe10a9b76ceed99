/* Shared declarations of the binding: module state, argument conversion,
 * the status -> exception mapping. Every binding file includes this. */
#ifndef VTINFER_BINDING_H
#define VTINFER_BINDING_H

#include "vt_import.h"
#include "vt_store_args.h"
#include "vt_numpy.h"
#include "vtinfer/vtinfer.h"

/* Heap types and objects that binding files create in the module's exec
 * slot live in state->slots[...]; each file adds its own index here. */
enum vt_state_slot {
    VT_SLOT_KVCACHE_TYPE = 0,
    VT_SLOT_RESOLUTION_TYPE = 1,
    VT_SLOT_COUNT = 8 /* room for more files' slots; the module clears all of them */
};

typedef struct vt_module_state {
    PyObject *VtinferError; /* base of vtinfer's own exceptions */
    PyObject *ConfigError;  /* malformed document (VtinferError, ValueError) */
    /* ml_dtypes dtypes: descriptors (owned) and their NumPy type numbers */
    PyArray_Descr *descr_bf16, *descr_e4m3, *descr_e5m2;
    int typenum_bf16, typenum_e4m3, typenum_e5m2;
    PyObject *slots[VT_SLOT_COUNT];
    /* attention's scratch kept between calls (attention_binding.c: taken and given back under the GIL, so a
     * call holds it alone), and its size; freed by the module's clear */
    void *attn_scratch;
    size_t attn_scratch_bytes;
} vt_module_state;

extern PyModuleDef vt_module_def;

/* State of the vtinfer._C module, from the module object or from a heap
 * type defined by it (PyType_GetModuleByDef). */
vt_module_state *vt_state(PyObject *module);
vt_module_state *vt_state_from_type(PyTypeObject *type);

/* Raise the Python exception for a failed core call; returns NULL. */
PyObject *vt_raise(vt_module_state *st, const vt_error *err);
/* (a, b) when s is VT_OK, else the core's error raised; takes both references either way. */
PyObject *vt_pair_result(vt_module_state *st, vt_status s, const vt_error *err, PyArrayObject *a, PyArrayObject *b);

/* Pin `obj` as a tensor. Accepts NumPy arrays (no copy; a masked array
 * is refused; non-native byte order: a destination (VT_TENSOR_WRITABLE)
 * is refused, an input converted to a native copy), objects with
 * __dlpack__ (vt_tensor_from_dlpack), and with no VT_TENSOR_NO_CONVERT
 * anything numpy.asarray takes. `fn` and `arg` name the function and argument in
 * error messages. Returns 0, or -1 with an exception set. */
int vt_tensor_from_object(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, int flags,
                          vt_tensor *t);
/* Inputs only: replace a non-contiguous NumPy array by a C-contiguous copy
 * (documented per function); a non-contiguous DLPack input is refused. */
int vt_tensor_contiguous_input(vt_module_state *st, vt_tensor *t, const char *fn, const char *arg);

/* A scale argument as a new float32 C-contiguous array of at most 2
 * dimensions (a number, a sequence, any real array; bool refused), or NULL
 * with TypeError naming fn and arg. */
PyArrayObject *vt_scale_array(PyObject *obj, const char *fn, const char *arg);

/* The store's inputs: a NumPy key/value without a contiguous last
 * dimension, or a non-contiguous slot_mapping, replaced by a contiguous
 * copy (DLPack: refused). */
int vt_copy_inputs_contiguous(vt_module_state *st, vt_store_call *c);

/* Number of elements; -1 (with ValueError set) when it overflows. */
int64_t vt_tensor_numel(const vt_tensor *t, const char *fn, const char *arg);
/* Default thread count: VTINFER_NUM_THREADS, else the CPU affinity count.
 * `value` None -> default; otherwise an int >= 1 (ValueError/TypeError
 * naming num_threads). Returns the count or -1 with an exception set. */
int vt_num_threads_arg(PyObject *value, const char *fn);

/* Per-file exec hooks called from module.c in order. Each returns 0 or -1
 * with an exception set. */
int vt_info_exec(PyObject *m, vt_module_state *st);
int vt_codec_exec(PyObject *m, vt_module_state *st);
int vt_attention_exec(PyObject *m, vt_module_state *st);
int vt_kvcache_exec(PyObject *m, vt_module_state *st);
int vt_store_exec(PyObject *m, vt_module_state *st);
int vt_resolver_exec(PyObject *m, vt_module_state *st);
int vt_cacheops_exec(PyObject *m, vt_module_state *st);
int vt_tq_exec(PyObject *m, vt_module_state *st);

#endif /* VTINFER_BINDING_H */
