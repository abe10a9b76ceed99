/* The dtype table: the single description of every storage dtype. */
#include <stdio.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/dtype.h"
#include "vtinfer/resolver.h"

/* A row's NULL-terminated name list, in the row itself. */
#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
/* Geometry shared by the rows that pack or rotate a head row (vt_dtype_check_head_size). */
#define INT4_GEOMETRY .head_multiple = 2, .head_max = 4096, .rht_block_max = 1024
#define SLOT_ROW .numpy_name = "uint8", .elem_bytes = 1, .max_finite = 255.0, .mantissa_bits = 8, .elem_bits = 8, \
    .code_dtype = -1, .scale_kind = VT_SCALE_SLOT, .page_layout = VT_PAGE_SLOTS, .read_family = VT_READ_SLOTS
#define TQ_ROW SLOT_ROW, .family = "turboquant", .slot = &vt_slot_turboquant, .boundary_layers = 2
#define TQ_GEOMETRY .head_multiple = 2, .head_max = VT_SLOT_MAX_D
/* The MSE presets: Lloyd-Max indices of the Hadamard-rotated unit key, the read renormalising the centroids. */
#define TQ_MSE_KEYS .norm_correction = 1, .key_basis = VT_KEY_BASIS_HADAMARD
#define OCTAVE_ROW SLOT_ROW, .family = "octave", .slot = &vt_slot_octave, .head_multiple = 64, \
    .head_max = VT_SLOT_MAX_D
#define NVFP4_ROW SLOT_ROW, .family = "nvfp4", .key_bits = 4, .value_bits = 4, .head_multiple = 64, \
    .head_max = VT_SLOT_MAX_D, .global_scale = 1

static const vt_dtype_info dtype_table[VT_DTYPE_COUNT] = {
    [VT_DTYPE_F32] = {.id = VT_DTYPE_F32, .name = "float32", .numpy_name = "float32", .flags = NAMES("float32", "float"),
                      .elem_bytes = 4, .max_finite = 3.4028234663852886e38, .exponent_bits = 8, .mantissa_bits = 23,
                      .elem_bits = 32, .code_dtype = VT_DTYPE_F32, .scale_kind = VT_SCALE_NONE,
                      .page_layout = VT_PAGE_DENSE, .head_multiple = 1, .read_family = VT_READ_ELEMENTS, .family = "plain",
                      .store = &vt_store_elements},
    [VT_DTYPE_F16] = {.id = VT_DTYPE_F16, .name = "float16", .numpy_name = "float16", .flags = NAMES("float16", "half"),
                      .elem_bytes = 2, .max_finite = 65504.0, .exponent_bits = 5, .mantissa_bits = 10,
                      .elem_bits = 16, .code_dtype = VT_DTYPE_F16, .scale_kind = VT_SCALE_NONE,
                      .page_layout = VT_PAGE_DENSE, .head_multiple = 1, .read_family = VT_READ_ELEMENTS, .family = "plain",
                      .store = &vt_store_elements},
    [VT_DTYPE_BF16] = {.id = VT_DTYPE_BF16, .name = "bfloat16", .numpy_name = "bfloat16", .flags = NAMES("bfloat16"),
                       .elem_bytes = 2, .max_finite = 3.3895313892515355e38, .exponent_bits = 8, .mantissa_bits = 7,
                       .elem_bits = 16, .code_dtype = VT_DTYPE_BF16, .scale_kind = VT_SCALE_NONE,
                       .page_layout = VT_PAGE_DENSE, .head_multiple = 1, .read_family = VT_READ_ELEMENTS, .pair_dot = 1,
                       .family = "plain", .store = &vt_store_elements},
    [VT_DTYPE_FP8_E4M3] = {.id = VT_DTYPE_FP8_E4M3, .name = "fp8_e4m3", .numpy_name = "float8_e4m3fn",
                           .flags = NAMES("fp8", "fp8_e4m3"), .aliases = NAMES("e4m3", "e4m3fn"), .elem_bytes = 1, .is_fp8 = 1, .max_finite = 448.0, .exponent_bits = 4,
                           .mantissa_bits = 3, .elem_bits = 8, .code_dtype = VT_DTYPE_FP8_E4M3,
                           .scale_kind = VT_SCALE_TENSOR, .page_layout = VT_PAGE_DENSE, .head_multiple = 1, .read_family = VT_READ_ELEMENTS,
                           .pair_dot = 1, .family = "fp8", .store = &vt_store_elements},
    [VT_DTYPE_FP8_E5M2] = {.id = VT_DTYPE_FP8_E5M2, .name = "fp8_e5m2", .numpy_name = "float8_e5m2",
                           .flags = NAMES("fp8_e5m2"), .aliases = NAMES("e5m2"), .elem_bytes = 1, .is_fp8 = 1, .max_finite = 57344.0,
                           .exponent_bits = 5, .mantissa_bits = 2, .elem_bits = 8, .code_dtype = VT_DTYPE_FP8_E5M2,
                           .scale_kind = VT_SCALE_TENSOR, .page_layout = VT_PAGE_DENSE, .head_multiple = 1, .read_family = VT_READ_ELEMENTS,
                           .pair_dot = 1, .family = "fp8", .store = &vt_store_elements},
    /* vLLM 0.33 _PER_TOKEN_HEAD_QUANT_PARAMS: int8 (127, -128); fp8 (finfo max, min) = (448, -448). */
    [VT_DTYPE_INT8_PTH] = {.id = VT_DTYPE_INT8_PTH, .name = "int8_per_token_head", .numpy_name = "int8",
                           .flags = NAMES("int8_per_token_head"), .elem_bytes = 1, .max_finite = 127.0, .mantissa_bits = 7,
                           .elem_bits = 8, .is_int = 1, .code_dtype = -1, .scale_kind = VT_SCALE_TOKEN_HEAD,
                           .quant_max = 127.0f, .quant_min = -128.0f, .page_layout = VT_PAGE_SCALE_PLANES,
                           .head_multiple = 1, .read_family = VT_READ_ELEMENTS, .pair_dot = 1, .family = "per_token_head",
                           .store = &vt_store_per_token_head},
    [VT_DTYPE_FP8_PTH] = {.id = VT_DTYPE_FP8_PTH, .name = "fp8_per_token_head", .numpy_name = "float8_e4m3fn",
                          .flags = NAMES("fp8_per_token_head"), .elem_bytes = 1, .max_finite = 448.0, .exponent_bits = 4,
                          .mantissa_bits = 3, .elem_bits = 8, .code_dtype = VT_DTYPE_FP8_E4M3,
                          .scale_kind = VT_SCALE_TOKEN_HEAD, .quant_max = 448.0f, .quant_min = -448.0f,
                          .page_layout = VT_PAGE_SCALE_PLANES, .head_multiple = 1, .read_family = VT_READ_ELEMENTS,
                          .pair_dot = 1, .family = "per_token_head", .store = &vt_store_per_token_head},
    /* vLLM 0.33 int4_per_token_head.py: asymmetric codes 0..15 (zero point in the scale's low bits), two per
     * uint8 byte, after a randomized Hadamard rotation over blocks of the head size's largest power-of-two
     * divisor (kv_store_int4.c; rows are rotated whole on the stack, hence head_max). */
    [VT_DTYPE_INT4_PTH] = {.id = VT_DTYPE_INT4_PTH, .name = "int4_per_token_head", .numpy_name = "uint8",
                           .flags = NAMES("int4_per_token_head"), .elem_bytes = 1, .max_finite = 15.0, .mantissa_bits = 4,
                           .elem_bits = 4, .code_dtype = -1, .scale_kind = VT_SCALE_TOKEN_HEAD, .quant_max = 15.0f,
                           .quant_min = 0.0f, .page_layout = VT_PAGE_SCALE_PLANES, INT4_GEOMETRY,
                           .read_family = VT_READ_INT4_ROTATED, .pair_dot = 1, .causal_only = 1,
                           .family = "int4_per_token_head", .store = &vt_store_int4},
    /* vLLM 0.33 turboquant/config.py TQ_PRESETS (key bits, value bits, norm correction): one uint8 slot per
     * (token, KV head); elem_bits 8 are the slot cache's bytes (kv_store_tq.c). The MSE key presets rotate the
     * whole head row by one Hadamard transform, so their head size is a power of two. */
    [VT_DTYPE_TQ_K8V4] = {.id = VT_DTYPE_TQ_K8V4, .name = "turboquant_k8v4", .flags = NAMES("turboquant_k8v4"), TQ_ROW,
                          .key_bits = 8, .value_bits = 4, TQ_GEOMETRY},
    [VT_DTYPE_TQ_4BIT_NC] = {.id = VT_DTYPE_TQ_4BIT_NC, .name = "turboquant_4bit_nc", .flags = NAMES("turboquant_4bit_nc"), TQ_ROW,
                             .key_bits = 4, .value_bits = 4, TQ_MSE_KEYS, TQ_GEOMETRY, .head_pow2 = 1},
    [VT_DTYPE_TQ_K3V4_NC] = {.id = VT_DTYPE_TQ_K3V4_NC, .name = "turboquant_k3v4_nc", .flags = NAMES("turboquant_k3v4_nc"), TQ_ROW,
                             .key_bits = 3, .value_bits = 4, TQ_MSE_KEYS, TQ_GEOMETRY, .head_pow2 = 1},
    [VT_DTYPE_TQ_3BIT_NC] = {.id = VT_DTYPE_TQ_3BIT_NC, .name = "turboquant_3bit_nc", .flags = NAMES("turboquant_3bit_nc"), TQ_ROW,
                             .key_bits = 3, .value_bits = 3, TQ_MSE_KEYS, TQ_GEOMETRY, .head_pow2 = 1},
    /* vLLM 0.33 ultraquant/format.py: FP4 E2M1 codes, two per byte, and one UE8M0 scale byte per group of 32,
     * keys rotated by one Hadamard transform of the whole row (kv_store_uq.c). */
    [VT_DTYPE_UQ_4BIT] = {.id = VT_DTYPE_UQ_4BIT, .name = "ultraquant_4bit", .flags = NAMES("ultraquant_4bit"), SLOT_ROW,
                          .key_bits = 4, .value_bits = 4, .head_multiple = 32, .head_max = VT_SLOT_MAX_D, .head_pow2 = 1,
                          .family = "ultraquant", .key_basis = VT_KEY_BASIS_HADAMARD, .boundary_layers = 2,
                          .query_dtype = VT_DTYPE_FP8_E4M3, .slot = &vt_slot_ultraquant},
    /* vLLM 0.33 rocm_octave.py (OctaveFormat, reference_quantize): sign flips and Walsh-Hadamard rotations, Lloyd-Max
     * int8 codebooks, fp16 scales; K per 64-dim block (4-bit on the rotary dims) or, compact, whole; the read gives
     * K and V in the model's basis (kv_store_octave.c). Every layer is quantized (no boundary layers). */
    [VT_DTYPE_OCT_K3V4] = {.id = VT_DTYPE_OCT_K3V4, .name = "octave_k3v4", .flags = NAMES("octave_k3v4"), OCTAVE_ROW,
                           .key_bits = 3, .value_bits = 4, .rope_block = 64},
    [VT_DTYPE_OCT_K3V3] = {.id = VT_DTYPE_OCT_K3V3, .name = "octave_k3v3", .flags = NAMES("octave_k3v3"), OCTAVE_ROW,
                           .key_bits = 3, .value_bits = 3, .rope_block = 64},
    [VT_DTYPE_OCT_K3V3_COMPACT] = {.id = VT_DTYPE_OCT_K3V3_COMPACT, .name = "octave_k3v3_compact",
                                   .flags = NAMES("octave_k3v3_compact"), OCTAVE_ROW, .key_bits = 3, .value_bits = 3,
                                   .head_pow2 = 1},
    /* vLLM 0.33 nvfp4 (its SM100 store kernel; csrc/core/nvfp4.c): a slot per (token, KV head) of E2M1 codes and
     * e4m3 scales per 16 elements, the layer's k_scale / v_scale the global scale; vLLM's page holds the same
     * bytes per (token, KV head), its V scales swizzled across 4 tokens, hence D a multiple of 64. */
    [VT_DTYPE_NVFP4] = {.id = VT_DTYPE_NVFP4, .name = "nvfp4", .flags = NAMES("nvfp4"), NVFP4_ROW,
                        .slot = &vt_slot_nvfp4},
    [VT_DTYPE_NVFP4_4OVER6] = {.id = VT_DTYPE_NVFP4_4OVER6, .name = "nvfp4_4over6", .flags = NAMES("nvfp4_4over6"),
                               NVFP4_ROW, .slot = &vt_slot_nvfp4_4over6},
};

static long long pow2_divisor(long long d) { return d > 0 ? d & -d : 0; }

vt_status vt_dtype_check_head_size(int dtype, long long head_size, const char *fn, const char *what,
                                   const char *dtype_arg, vt_error *err) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    if (!t || (head_size > 0 && head_size % t->head_multiple == 0 && (!t->head_max || head_size <= t->head_max) &&
               (!t->head_pow2 || pow2_divisor(head_size) == head_size) &&
               (!t->rht_block_max || pow2_divisor(head_size) <= t->rht_block_max)))
        return VT_OK;
    char rule[160];
    if (t->head_pow2 && t->head_multiple > 2)
        snprintf(rule, sizeof rule, "a power of two from %d to %lld (one Hadamard rotation of the whole row, "
                 "groups of %d)", t->head_multiple, (long long)t->head_max, t->head_multiple);
    else if (t->head_pow2)
        snprintf(rule, sizeof rule, "a power of two, at most %lld (one Hadamard rotation of the whole row)",
                 (long long)t->head_max);
    else if (t->rht_block_max)
        snprintf(rule, sizeof rule, "even and at most %lld, with a largest power-of-two divisor of at most %d "
                 "(two codes per byte; the rotation block)", (long long)t->head_max, t->rht_block_max);
    else if (t->head_max && t->head_multiple > 2)
        snprintf(rule, sizeof rule, "a multiple of %d, at most %lld", t->head_multiple, (long long)t->head_max);
    else if (t->head_max)
        snprintf(rule, sizeof rule, "even and at most %lld", (long long)t->head_max);
    else
        snprintf(rule, sizeof rule, "> 0");
    return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be %s for %s '%s'; got %lld", fn, what, rule,
                        dtype_arg ? dtype_arg : "kv_cache_dtype", t->name, (long long)head_size);
}

int vt_dtype_decoder(int dtype) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->code_dtype >= 0 ? t->code_dtype : dtype;
}

size_t vt_dtype_row_bytes(int dtype, size_t head_size) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->page_layout != VT_PAGE_SLOTS ? head_size * (size_t)t->elem_bits / 8 : 0;
}

int vt_dtype_needs_codebook(int dtype) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->slot ? t->slot->needs_codebook(t) : 0;
}

size_t vt_dtype_slot_bytes_rope(int dtype, size_t head_size, size_t rope_dim) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    if (!t || !t->slot) return 0;
    if (t->rope_block > 0 && (rope_dim > head_size || rope_dim % (size_t)t->rope_block != 0)) return 0;
    return t->slot->slot_bytes(t, head_size, rope_dim);
}

size_t vt_dtype_slot_bytes(int dtype, size_t head_size) { return vt_dtype_slot_bytes_rope(dtype, head_size, head_size); }

int64_t vt_dtype_rope_of_slot_width(int dtype, size_t head_size, size_t width) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    if (!t || !t->slot) return -1;
    if (t->rope_block <= 0) return vt_dtype_slot_bytes(dtype, head_size) == width ? 0 : -1;
    for (size_t r = 0; r <= head_size; r += (size_t)t->rope_block)
        if (vt_dtype_slot_bytes_rope(dtype, head_size, r) == width) return (int64_t)r;
    return -1;
}

const vt_dtype_info *vt_dtype_get(int dtype) {
    if (dtype < 0 || dtype >= VT_DTYPE_COUNT) return NULL;
    return &dtype_table[dtype];
}

int vt_dtype_from_alias(const char *name) {
    if (!name) return -1;
    for (int d = 0; d < VT_DTYPE_COUNT; d++)
        for (const char *const *a = dtype_table[d].aliases; a && *a; a++)
            if (strcmp(name, *a) == 0) return d;
    return -1;
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
    const char *unstored = vt_vllm_kv_cache_dtype_unstored(name);
    if (unstored)
        return vt_error_set(err, VT_ERR_VALUE, "%s must be one of %s; got '%s', which vtinfer does not store: %s",
                            argname, list, name, unstored);
    return vt_error_set(err, VT_ERR_VALUE, "%s must be one of %s; got '%.64s'", argname, list, name);
}

int vt_dtype_per_token_head(int dtype) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    return t && t->scale_kind == VT_SCALE_TOKEN_HEAD;
}
