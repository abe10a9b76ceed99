/* The binding's view of an array argument, free of Python and NumPy:
 *
 *   vt_tensor        data pointer, element type, shape, byte strides, device
 *   vt_dl_describe   a DLPack DLTensor -> vt_tensor, every field validated
 *                    before any pointer arithmetic (fuzzed: tests/fuzz)
 *   vt_tensor_share_elements   exact "do two strided views share an element"
 *
 * Both extensions (vtinfer._C, vtinfer._cuda) fill vt_tensor through the
 * DLPack importer (vt_import.h); vtinfer._C also from NumPy arrays
 * (tensor.c). Everything after the import is the same code. */
#ifndef VTINFER_BINDING_TENSOR_H
#define VTINFER_BINDING_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "vt_dlpack.h"
#include "vtinfer/dtype.h"

/* Element types the binding recognises: the storage dtypes of the dtype
 * table first (same values), then index and code types. */
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
    VT_ELEM_I8 = 20, /* int8 codes (int8_per_token_head caches) */
    VT_ELEM_OTHER = 31
} vt_elem;

#define VT_MAX_DIMS 8

/* A borrowed view of an array argument, pinned by `owner` (a PyObject*,
 * spelled without Python.h) until vt_tensor_release. Strides in bytes. */
typedef struct vt_tensor {
    struct _object *owner;
    void *data;
    vt_elem elem;
    size_t itemsize;
    int ndim;
    int64_t shape[VT_MAX_DIMS];
    int64_t strides[VT_MAX_DIMS];
    int readonly;
    int device_type; /* DLPack device codes: 1 CPU, 2 CUDA, 3 CUDA host */
    int device_id;
    char dtype_name[40]; /* for messages: "float32", "int64", ">f4", ... */
} vt_tensor;

/* Bit of an element type in the masks below. */
#define VT_ELEM_BIT(e) (1u << (unsigned)(e))
#define VT_ELEMS_FLOAT (VT_ELEM_BIT(VT_ELEM_F32) | VT_ELEM_BIT(VT_ELEM_F16) | VT_ELEM_BIT(VT_ELEM_BF16))
#define VT_ELEMS_CODES (VT_ELEM_BIT(VT_ELEM_U8) | VT_ELEM_BIT(VT_ELEM_E4M3) | VT_ELEM_BIT(VT_ELEM_E5M2))

/* Name of an element type: the dtype table's NumPy name for the storage
 * dtypes ("float32", "bfloat16", "float8_e4m3fn"), the index types' own
 * names otherwise ("uint8", "int32", "int64", "float64"). */
const char *vt_elem_name(vt_elem e);

/* Whether an array of element e can hold the codes of the per-token-head format `dtype`, from its table row:
 * packed codes (elem_bits < 8) as uint8 bytes, integer codes as int8, fp8 codes as uint8 or their float8 type.
 * `what` (cap bytes) receives the accepted elements in words, for a message ("uint8 (two 4-bit)", "int8",
 * "uint8 or float8_e4m3fn"). */
int vt_elem_holds_codes(int dtype, vt_elem e, char *what, size_t cap);

/* Elements of a cache array's last axis that hold one head row of head_size elements of `dtype` (packed codes:
 * the bytes, head_size * elem_bits / 8); head_size for VT_DTYPE_AUTO. */
int64_t vt_cache_row_elems(int dtype, int64_t head_size);
/* That row's length in words for a message: "D", or "D / 2" for two codes per byte; `d` has cap bytes. */
const char *vt_cache_row_words(int dtype, char *d, size_t cap);

/* Element type of a DLPack dtype (VT_ELEM_OTHER when unknown or lanes != 1). */
vt_elem vt_elem_from_dl(vt_dl_dtype d);

/* Describe a DLPack tensor as a vt_tensor (owner left NULL). Checks, in
 * this order and before any pointer arithmetic: ndim in [0, VT_MAX_DIMS],
 * shape present, lanes == 1, bits a non-zero multiple of 8, every size
 * >= 0, every byte stride and the byte extent within int64, byte_offset
 * and the extent within the address space, data non-NULL when the tensor
 * has an element. Returns 0, or -1 with `msg` holding the expectation
 * without the "fn: arg " prefix ("must have at most 8 dimensions; got 9").
 * Needs no interpreter: fuzzed by tests/fuzz/fuzz_dlpack.c. */
int vt_dl_describe(const vt_dl_tensor *dl, int readonly, vt_tensor *t, char *msg, size_t msg_size);

/* Lowest and one-past-highest byte touched, relative to t->data (0, 0 for
 * a tensor without elements). Sizes were checked at import: no overflow. */
void vt_tensor_extent(const vt_tensor *t, int64_t *lo, int64_t *hi);

/* Number of elements (import bounded the byte size: fits in int64). */
int64_t vt_tensor_count(const vt_tensor *t);

/* 1 when C-contiguous (strides of size-1 dims ignored). */
int vt_tensor_is_contiguous(const vt_tensor *t);
/* 1 when the last dimension is contiguous (or has at most one element, or
 * the tensor has none). */
int vt_tensor_last_dim_contiguous(const vt_tensor *t);

/* Could two elements of t share a byte? 0 when the non-trivial
 * dimensions, taken by increasing |stride|, nest (each stride at least the
 * span of the dimensions below it): then every element has bytes of its
 * own. 1 otherwise (a zero stride, blocks built with as_strided to alias,
 * or an interleaving this sufficient test cannot prove disjoint, which no
 * layout vLLM or vtinfer builds has). Destinations must answer 0. */
int vt_tensor_self_overlaps(const vt_tensor *t);

/* Do a and b share at least one byte of an element? Exact for any strides
 * (negative, zero, interleaved views of one allocation such as kv[:, 0]
 * and kv[:, 1]): the views are split until their byte extents are
 * disjoint or single elements are compared. The split is bounded by a
 * work budget; past it the answer is 1 ("cannot prove disjoint"), which
 * no layout vLLM or vtinfer builds reaches. Returns 0 or 1. */
int vt_tensor_share_elements(const vt_tensor *a, const vt_tensor *b);

#endif /* VTINFER_BINDING_TENSOR_H */
