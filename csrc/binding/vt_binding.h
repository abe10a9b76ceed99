/* Shared declarations of the binding: module state, argument conversion,
 * the status -> exception mapping. Every binding file includes this. */
#ifndef VTINFER_BINDING_H
#define VTINFER_BINDING_H

#include "vt_numpy.h"
#include "vtinfer/vtinfer.h"

/* Heap types and objects that binding files create in the module's exec
 * slot live in state->slots[...]; each file adds its own index here. */
enum vt_state_slot {
    VT_SLOT_KVCACHE_TYPE = 0,
    VT_SLOT_RESOLUTION_TYPE = 1,
    VT_SLOT_RESERVED_2 = 2,
    VT_SLOT_RESERVED_3 = 3,
    VT_SLOT_RESERVED_4 = 4,
    VT_SLOT_RESERVED_5 = 5,
    VT_SLOT_RESERVED_6 = 6,
    VT_SLOT_RESERVED_7 = 7,
    VT_SLOT_COUNT = 8
};

typedef struct vt_module_state {
    PyObject *VtinferError; /* base of vtinfer's own exceptions */
    PyObject *ConfigError;  /* malformed document (VtinferError, ValueError) */
    /* ml_dtypes dtypes: descriptors (owned) and their NumPy type numbers */
    PyArray_Descr *descr_bf16, *descr_e4m3, *descr_e5m2;
    int typenum_bf16, typenum_e4m3, typenum_e5m2;
    PyObject *slots[VT_SLOT_COUNT];
} vt_module_state;

extern PyModuleDef vt_module_def;

/* State of the vtinfer._C module, from the module object or from a heap
 * type defined by it (PyType_GetModuleByDef). */
vt_module_state *vt_state(PyObject *module);
vt_module_state *vt_state_from_type(PyTypeObject *type);

/* Raise the Python exception for a failed core call; returns NULL. */
PyObject *vt_raise(vt_module_state *st, const vt_error *err);

/* Element types the binding recognises in arrays: the storage dtypes of
 * the dtype table first (same values), then index and code types. */
typedef enum vt_elem {
    VT_ELEM_F32 = VT_DTYPE_F32,
    VT_ELEM_F16 = VT_DTYPE_F16,
    VT_ELEM_BF16 = VT_DTYPE_BF16,
    VT_ELEM_E4M3 = VT_DTYPE_FP8_E4M3,
    VT_ELEM_E5M2 = VT_DTYPE_FP8_E5M2,
    VT_ELEM_U8 = 16,
    VT_ELEM_I32 = 17,
    VT_ELEM_I64 = 18,
    VT_ELEM_F64 = 19,
    VT_ELEM_OTHER = 31
} vt_elem;

#define VT_MAX_DIMS 8

/* A borrowed view of an array argument (NumPy or DLPack), pinned by
 * `owner` until vt_tensor_release. Strides are in bytes. */
typedef struct vt_tensor {
    PyObject *owner;
    void *data;
    vt_elem elem;
    size_t itemsize;
    int ndim;
    int64_t shape[VT_MAX_DIMS];
    int64_t strides[VT_MAX_DIMS];
    int readonly;
    int device_type; /* 1 = CPU, 2 = CUDA (DLPack device codes) */
    int device_id;
    char dtype_name[40]; /* for error messages: "float32", "int64", ... */
} vt_tensor;

/* Flags for vt_tensor_from_object. */
#define VT_TENSOR_WRITABLE 1    /* refuse read-only arrays (outputs, caches) */
#define VT_TENSOR_NO_CONVERT 2  /* refuse objects that are not arrays or DLPack */

/* Pin `obj` as a tensor. Accepts NumPy arrays (no copy), objects with
 * __dlpack__ (no copy), and with no VT_TENSOR_NO_CONVERT anything
 * numpy.asarray takes. `fn` and `arg` name the function and argument in
 * error messages. Returns 0, or -1 with an exception set. */
int vt_tensor_from_object(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, int flags,
                          vt_tensor *t);
void vt_tensor_release(vt_tensor *t);

/* Bit of an element type in the masks below. */
#define VT_ELEM_BIT(e) (1u << (unsigned)(e))
#define VT_ELEMS_FLOAT (VT_ELEM_BIT(VT_ELEM_F32) | VT_ELEM_BIT(VT_ELEM_F16) | VT_ELEM_BIT(VT_ELEM_BF16))
#define VT_ELEMS_CODES (VT_ELEM_BIT(VT_ELEM_U8) | VT_ELEM_BIT(VT_ELEM_E4M3) | VT_ELEM_BIT(VT_ELEM_E5M2))

/* Check that t is in CPU memory, has an element type in `elem_mask` and
 * (ndim >= 0) that many dimensions, in the order STYLE.md gives. Returns 0,
 * or -1 with TypeError/ValueError naming fn and arg. */
int vt_tensor_check(const vt_tensor *t, const char *fn, const char *arg, unsigned elem_mask, int ndim);

/* Inputs only: replace a non-contiguous NumPy array by a C-contiguous copy
 * (documented per function); a non-contiguous DLPack input is refused. */
int vt_tensor_contiguous_input(vt_module_state *st, vt_tensor *t, const char *fn, const char *arg);

/* 1 when the byte extents of a and b overlap. */
int vt_tensor_overlap(const vt_tensor *a, const vt_tensor *b);

/* 1 when the tensor is C-contiguous (strides of size-1 dims ignored). */
int vt_tensor_is_contiguous(const vt_tensor *t);
/* Number of elements; -1 (with ValueError set) when it overflows. */
int64_t vt_tensor_numel(const vt_tensor *t, const char *fn, const char *arg);
/* Name of an element type ("float32", "bfloat16", "float8_e4m3fn", ...). */
const char *vt_elem_name(vt_elem e);

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
int vt_resolver_exec(PyObject *m, vt_module_state *st);

#endif /* VTINFER_BINDING_H */
