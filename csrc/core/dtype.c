/* The dtype table: the single description of every storage dtype. */
#include <string.h>

#include "vtinfer/dtype.h"

static const char *const flags_f32[] = {"float32", "float", NULL};
static const char *const flags_f16[] = {"float16", "half", NULL};
static const char *const flags_bf16[] = {"bfloat16", NULL};
static const char *const flags_e4m3[] = {"fp8", "fp8_e4m3", NULL};
static const char *const flags_e5m2[] = {"fp8_e5m2", NULL};

static const vt_dtype_info dtype_table[VT_DTYPE_COUNT] = {
    {VT_DTYPE_F32, "float32", "float32", flags_f32, 4, 0, 3.4028234663852886e38, 8, 23},
    {VT_DTYPE_F16, "float16", "float16", flags_f16, 2, 0, 65504.0, 5, 10},
    {VT_DTYPE_BF16, "bfloat16", "bfloat16", flags_bf16, 2, 0, 3.3895313892515355e38, 8, 7},
    {VT_DTYPE_FP8_E4M3, "fp8_e4m3", "float8_e4m3fn", flags_e4m3, 1, 1, 448.0, 4, 3},
    {VT_DTYPE_FP8_E5M2, "fp8_e5m2", "float8_e5m2", flags_e5m2, 1, 1, 57344.0, 5, 2},
};

const vt_dtype_info *vt_dtype_get(int dtype) {
    if (dtype < 0 || dtype >= VT_DTYPE_COUNT) return NULL;
    return &dtype_table[dtype];
}

size_t vt_kv_cache_flag_count(void) {
    size_t n = 1; /* "auto" */
    for (int d = 0; d < VT_DTYPE_COUNT; d++)
        for (const char *const *f = dtype_table[d].flags; *f; f++) n++;
    return n;
}

const char *vt_kv_cache_flag(size_t i) {
    if (i == 0) return "auto";
    i--;
    for (int d = 0; d < VT_DTYPE_COUNT; d++)
        for (const char *const *f = dtype_table[d].flags; *f; f++) {
            if (i == 0) return *f;
            i--;
        }
    return NULL;
}

vt_status vt_dtype_from_name(const char *name, const char *argname, int *out, vt_error *err) {
    if (!argname) argname = "dtype";
    if (!name) return vt_error_set(err, VT_ERR_VALUE, "vt_dtype_from_name: %s must be a string; got NULL", argname);
    if (strcmp(name, "auto") == 0) {
        *out = VT_DTYPE_AUTO;
        return VT_OK;
    }
    for (int d = 0; d < VT_DTYPE_COUNT; d++) {
        const vt_dtype_info *t = &dtype_table[d];
        if (strcmp(name, t->name) == 0 || strcmp(name, t->numpy_name) == 0) {
            *out = d;
            return VT_OK;
        }
        for (const char *const *f = t->flags; *f; f++)
            if (strcmp(name, *f) == 0) {
                *out = d;
                return VT_OK;
            }
    }
    char list[256];
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < vt_kv_cache_flag_count() && used + 24 < sizeof list; i++) {
        const char *f = vt_kv_cache_flag(i);
        size_t len = strlen(f);
        if (used) list[used++] = ',', list[used++] = ' ';
        memcpy(list + used, f, len);
        used += len;
        list[used] = '\0';
    }
    return vt_error_set(err, VT_ERR_VALUE, "%s must be one of %s; got '%.64s'", argname, list, name);
}
