/* The dtype table: the single description of every storage dtype. */
#include <string.h>

#include "vtinfer/dtype.h"

static const char *const flags_f32[] = {"float32", "float", NULL};
static const char *const flags_f16[] = {"float16", "half", NULL};
static const char *const flags_bf16[] = {"bfloat16", NULL};
static const char *const flags_e4m3[] = {"fp8", "fp8_e4m3", NULL};
static const char *const flags_e5m2[] = {"fp8_e5m2", NULL};
static const char *const flags_i8pth[] = {"int8_per_token_head", NULL};
static const char *const flags_f8pth[] = {"fp8_per_token_head", NULL};
static const char *const flags_i4pth[] = {"int4_per_token_head", NULL};
static const char *const flags_tq_k8v4[] = {"turboquant_k8v4", NULL};
static const char *const flags_tq_4nc[] = {"turboquant_4bit_nc", NULL};
static const char *const flags_tq_k3v4[] = {"turboquant_k3v4_nc", NULL};
static const char *const flags_tq_3nc[] = {"turboquant_3bit_nc", NULL};

static const vt_dtype_info dtype_table[VT_DTYPE_COUNT] = {
    {VT_DTYPE_F32, "float32", "float32", flags_f32, 4, 0, 3.4028234663852886e38, 8, 23, 32, 0, VT_DTYPE_F32,
     VT_SCALE_NONE, 0.0f, 0.0f, VT_PAGE_DENSE, 0, 0, 0},
    {VT_DTYPE_F16, "float16", "float16", flags_f16, 2, 0, 65504.0, 5, 10, 16, 0, VT_DTYPE_F16, VT_SCALE_NONE, 0.0f,
     0.0f, VT_PAGE_DENSE, 0, 0, 0},
    {VT_DTYPE_BF16, "bfloat16", "bfloat16", flags_bf16, 2, 0, 3.3895313892515355e38, 8, 7, 16, 0, VT_DTYPE_BF16,
     VT_SCALE_NONE, 0.0f, 0.0f, VT_PAGE_DENSE, 0, 0, 0},
    {VT_DTYPE_FP8_E4M3, "fp8_e4m3", "float8_e4m3fn", flags_e4m3, 1, 1, 448.0, 4, 3, 8, 0, VT_DTYPE_FP8_E4M3,
     VT_SCALE_TENSOR, 0.0f, 0.0f, VT_PAGE_DENSE, 0, 0, 0},
    {VT_DTYPE_FP8_E5M2, "fp8_e5m2", "float8_e5m2", flags_e5m2, 1, 1, 57344.0, 5, 2, 8, 0, VT_DTYPE_FP8_E5M2,
     VT_SCALE_TENSOR, 0.0f, 0.0f, VT_PAGE_DENSE, 0, 0, 0},
    /* vLLM 0.33 _PER_TOKEN_HEAD_QUANT_PARAMS: int8 (127, -128); fp8 (finfo max, min) = (448, -448). */
    {VT_DTYPE_INT8_PTH, "int8_per_token_head", "int8", flags_i8pth, 1, 0, 127.0, 0, 7, 8, 1, -1,
     VT_SCALE_TOKEN_HEAD, 127.0f, -128.0f, VT_PAGE_SCALE_PLANES, 0, 0, 0},
    {VT_DTYPE_FP8_PTH, "fp8_per_token_head", "float8_e4m3fn", flags_f8pth, 1, 0, 448.0, 4, 3, 8, 0,
     VT_DTYPE_FP8_E4M3, VT_SCALE_TOKEN_HEAD, 448.0f, -448.0f, VT_PAGE_SCALE_PLANES, 0, 0, 0},
    /* vLLM 0.33 int4_per_token_head.py: asymmetric codes 0..15 (zero point in the scale's low bits), two per
     * uint8 byte, after a randomized Hadamard rotation (kv_store_int4.c). */
    {VT_DTYPE_INT4_PTH, "int4_per_token_head", "uint8", flags_i4pth, 1, 0, 15.0, 0, 4, 4, 0, -1,
     VT_SCALE_TOKEN_HEAD, 15.0f, 0.0f, VT_PAGE_SCALE_PLANES, 0, 0, 0},
    /* vLLM 0.33 turboquant/config.py TQ_PRESETS (key bits, value bits, norm correction): one uint8 slot per
     * (token, KV head); elem_bits 8 are the slot cache's bytes (kv_store_tq.c). */
    {VT_DTYPE_TQ_K8V4, "turboquant_k8v4", "uint8", flags_tq_k8v4, 1, 0, 255.0, 0, 8, 8, 0, -1, VT_SCALE_SLOT, 0.0f,
     0.0f, VT_PAGE_SLOTS, 8, 4, 0},
    {VT_DTYPE_TQ_4BIT_NC, "turboquant_4bit_nc", "uint8", flags_tq_4nc, 1, 0, 255.0, 0, 8, 8, 0, -1, VT_SCALE_SLOT,
     0.0f, 0.0f, VT_PAGE_SLOTS, 4, 4, 1},
    {VT_DTYPE_TQ_K3V4_NC, "turboquant_k3v4_nc", "uint8", flags_tq_k3v4, 1, 0, 255.0, 0, 8, 8, 0, -1, VT_SCALE_SLOT,
     0.0f, 0.0f, VT_PAGE_SLOTS, 3, 4, 1},
    {VT_DTYPE_TQ_3BIT_NC, "turboquant_3bit_nc", "uint8", flags_tq_3nc, 1, 0, 255.0, 0, 8, 8, 0, -1, VT_SCALE_SLOT,
     0.0f, 0.0f, VT_PAGE_SLOTS, 3, 3, 1},
};

size_t vt_dtype_row_bytes(int dtype, size_t head_size) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->page_layout != VT_PAGE_SLOTS ? head_size * (size_t)t->elem_bits / 8 : 0;
}

/* vLLM 0.33 TurboQuantConfig.slot_size_aligned: key part D (fp8) or ceil(D * kb / 8) + 2 (indices, fp16 norm),
 * then ceil(D * vb / 8) value code bytes and 4 bytes of fp16 scale and zero, rounded up to even. */
size_t vt_dtype_slot_bytes(int dtype, size_t head_size) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    if (!t || t->page_layout != VT_PAGE_SLOTS) return 0;
    size_t kps = t->key_bits == 8 ? head_size : (head_size * (size_t)t->key_bits + 7) / 8 + 2;
    size_t slot = kps + (head_size * (size_t)t->value_bits + 7) / 8 + 4;
    return slot + slot % 2;
}


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
        /* A per-token-head or TurboQuant row's numpy_name names its element type only ("int8"), not the format. */
        if (strcmp(name, t->name) == 0 ||
            (t->scale_kind <= VT_SCALE_TENSOR && strcmp(name, t->numpy_name) == 0)) {
            *out = d;
            return VT_OK;
        }
        for (const char *const *f = t->flags; *f; f++)
            if (strcmp(name, *f) == 0) {
                *out = d;
                return VT_OK;
            }
    }
    char list[512];
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

int vt_dtype_per_token_head(int dtype) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->scale_kind == VT_SCALE_TOKEN_HEAD;
}
