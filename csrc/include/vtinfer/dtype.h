/* vtinfer public C API: the one table that describes every storage dtype.
 *
 * Python derives KV_CACHE_DTYPES and every other dtype list from this table;
 * there is no second hand-kept list. Enum values are only ever appended. */
#ifndef VTINFER_DTYPE_H
#define VTINFER_DTYPE_H

#include <stddef.h>

#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vt_dtype {
    VT_DTYPE_F32 = 0,
    VT_DTYPE_F16 = 1,
    VT_DTYPE_BF16 = 2,
    VT_DTYPE_FP8_E4M3 = 3, /* float8 e4m3fn: no infinities, NaN 0x7F/0xFF, max 448 */
    VT_DTYPE_FP8_E5M2 = 4, /* float8 e5m2: IEEE-like, max finite 57344 */
    VT_DTYPE_COUNT = 5
} vt_dtype;

/* Value of a flag that names no dtype by itself ("auto": the model's dtype). */
#define VT_DTYPE_AUTO (-1)

typedef struct vt_dtype_info {
    vt_dtype id;
    const char *name;          /* canonical vtinfer name: "float32", "fp8_e4m3", ... */
    const char *numpy_name;    /* NumPy / ml_dtypes name: "float32", "bfloat16", "float8_e4m3fn" */
    const char *const *flags;  /* vLLM --kv-cache-dtype spellings naming this dtype, NULL-terminated */
    size_t elem_bytes;         /* bytes per element */
    int is_fp8;                /* 1 for the float8 formats */
    double max_finite;         /* largest finite value */
    int exponent_bits;         /* IEEE-style field widths */
    int mantissa_bits;
} vt_dtype_info;

/* The table entry of `dtype`, or NULL when `dtype` is out of range. */
VT_API const vt_dtype_info *vt_dtype_get(int dtype);

/* Look up a dtype by canonical name, NumPy name or vLLM flag spelling
 * (exact, case-sensitive, as vLLM compares). Writes the id to *out, or
 * VT_DTYPE_AUTO for "auto". Returns VT_ERR_VALUE with the accepted names
 * listed in `err` when nothing matches; `argname` names the argument in
 * that message (e.g. "kv_cache_dtype"). */
VT_API vt_status vt_dtype_from_name(const char *name, const char *argname, int *out, vt_error *err);

/* The kv-cache-dtype flag values in table order, "auto" first; index i in
 * [0, vt_kv_cache_flag_count()). Returns NULL past the end. */
VT_API size_t vt_kv_cache_flag_count(void);
VT_API const char *vt_kv_cache_flag(size_t i);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_DTYPE_H */
