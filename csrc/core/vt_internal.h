/* Internal declarations shared by csrc/core files; not part of the public
 * API and never installed. */
#ifndef VTINFER_CORE_INTERNAL_H
#define VTINFER_CORE_INTERNAL_H

#include <string.h>

#include "vtinfer/codec.h"
#include "vtinfer/runtime.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define VT_X86 1
#define VT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VT_TARGET_AVX512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
/* AVX-512 plus AVX512-VBMI's byte permutes (vpermi2b): the fp8 attention tile's decode only. */
#define VT_TARGET_AVX512VBMI \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))
/* AVX-512 plus the AVX512-BF16 pair dot product (vdpbf16ps): the grouped-row attention tile only. */
#define VT_TARGET_AVX512BF16 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#else
#define VT_X86 0
#endif

/* ---- dispatch: one immutable kernel table per ISA ----
 * Each ISA's codec row kernels are a const table defined beside them
 * (codec_scalar.c, codec_avx2.c, codec_avx512.c; the AVX variants exist
 * only on x86 and reuse the scalar copies). cpu.c pairs each with that
 * ISA's attention tile in one vt_kernels table and publishes the chosen
 * table with one atomic pointer store; a kernel call loads the pointer
 * once and runs on that table to its end. */
extern const vt_codec_kernels vt_codec_scalar;
#if VT_X86
extern const vt_codec_kernels vt_codec_avx2;
extern const vt_codec_kernels vt_codec_avx512;
#endif
/* The initializer of a SIMD ISA's codec table (codec_avx2.c, codec_avx512.c): each file defines the row kernels
 * under these names (q_<src>_<fp8>, d_<fp8>_<dst>, c_<src>_<dst>); the copies (same dtype) are the scalar twins'
 * memcpy. */
#define VT_CODEC_TABLE_INIT                                                                                          \
    {                                                                                                                \
        .quant = {[VT_DTYPE_F32] = {q_f32_e4m3, q_f32_e5m2},                                                         \
                  [VT_DTYPE_F16] = {q_f16_e4m3, q_f16_e5m2},                                                         \
                  [VT_DTYPE_BF16] = {q_bf16_e4m3, q_bf16_e5m2}},                                                     \
        .dequant = {{[VT_DTYPE_F32] = d_e4m3_f32, [VT_DTYPE_F16] = d_e4m3_f16, [VT_DTYPE_BF16] = d_e4m3_bf16},       \
                    {[VT_DTYPE_F32] = d_e5m2_f32, [VT_DTYPE_F16] = d_e5m2_f16, [VT_DTYPE_BF16] = d_e5m2_bf16}},      \
        .convert = {                                                                                                 \
            [VT_DTYPE_F32] = {[VT_DTYPE_F32] = vt_copy_4, [VT_DTYPE_F16] = c_f32_f16, [VT_DTYPE_BF16] = c_f32_bf16}, \
            [VT_DTYPE_F16] = {[VT_DTYPE_F32] = c_f16_f32, [VT_DTYPE_F16] = vt_copy_2, [VT_DTYPE_BF16] = c_f16_bf16}, \
            [VT_DTYPE_BF16] = {[VT_DTYPE_F32] = c_bf16_f32, [VT_DTYPE_F16] = c_bf16_f16, [VT_DTYPE_BF16] = vt_copy_2}, \
        },                                                                                                           \
        .fwht = fwht_rows, .levels4 = levels4_rows, .levels3 = levels3_rows, .nibbles = nibbles_rows,                \
        .packed3 = packed3_rows, .fwht_raw = fwht_raw_rows,                                                          \
    }
void vt_fwht_scalar(float *x, size_t n, size_t block);     /* vt_fwht_row_fn's scalar twin */
void vt_fwht_raw_scalar(float *x, size_t n, size_t block); /* fwht_raw's: the same butterflies, not normalized */
/* A SIMD ISA's Walsh-Hadamard rows (fwht_rows, fwht_raw_rows for VT_CODEC_TABLE_INIT) from its W-lane vector type
 * and ops, IN_VECTOR the butterfly stages inside one vector: as vt_fwht_scalar (or its raw twin), bit for bit:
 * blocks of W or more run the strides below W inside each vector and the wider ones between vectors; smaller blocks
 * take the twin. */
#define VT_FWHT_ROWS(TGT, VEC, W, IN_VECTOR, LOADU, STOREU, ADD, SUB, MUL, SET1)                                     \
    TGT static inline void fwht_body(float *x, size_t n, size_t b, int normalize) {                                  \
        if (b < W || b % W || n % b) {                                                                               \
            if (normalize) vt_fwht_scalar(x, n, b);                                                                  \
            else vt_fwht_raw_scalar(x, n, b);                                                                        \
            return;                                                                                                  \
        }                                                                                                            \
        const VEC norm = SET1((float)(1.0 / sqrt((double)b)));                                                       \
        for (size_t o = 0; o < n; o += b) {                                                                          \
            float *y = x + o;                                                                                        \
            for (size_t i = 0; i < b; i += W) STOREU(y + i, IN_VECTOR(LOADU(y + i)));                                \
            for (size_t h = W; h < b; h *= 2)                                                                        \
                for (size_t i = 0; i < b; i += 2 * h)                                                                \
                    for (size_t j = i; j < i + h; j += W) {                                                          \
                        const VEC lo = LOADU(y + j), hi = LOADU(y + j + h);                                          \
                        STOREU(y + j, ADD(lo, hi));                                                                  \
                        STOREU(y + j + h, SUB(lo, hi));                                                              \
                    }                                                                                                \
            if (normalize)                                                                                           \
                for (size_t i = 0; i < b; i += W) STOREU(y + i, MUL(LOADU(y + i), norm));                           \
        }                                                                                                            \
    }                                                                                                                \
    TGT static void fwht_rows(float *x, size_t n, size_t b) { fwht_body(x, n, b, 1); }                               \
    TGT static void fwht_raw_rows(float *x, size_t n, size_t b) { fwht_body(x, n, b, 0); }
/* vt_levels4_row_fn's, vt_levels3_row_fn's and vt_packed3_row_fn's scalar twins */
void vt_levels4_scalar(const uint8_t *src, size_t n, const float *levels, float *out);
void vt_levels3_scalar(const uint8_t *lo, const uint8_t *hi, size_t n, const float *levels, float *out);
void vt_packed3_scalar(const uint8_t *src, size_t n, const float *levels, float *out);
void vt_nibbles_scalar(const uint8_t *src, size_t n, const float *levels, const float *scales, size_t group,
                       float *out); /* vt_nibbles_row_fn's scalar twin */
void vt_copy_4(const void *src, void *dst, size_t n); /* memcpy of n 4-byte / 2-byte elements */
void vt_copy_2(const void *src, void *dst, size_t n);

struct vt_attn_params;
struct vt_attn_item;
/* An attention tile kernel; see attn_internal.h for its contract. */
typedef void (*vt_attn_tile_fn)(const struct vt_attn_params *p, const struct vt_attn_item *it, float *work, float *m,
                                float *l, float *acc);

/* One ISA's kernels: its codec row kernels and, per storage format, the attention tile that reads it
 * (filled once from the ISA's tile per read family and each dtype row's read_family; NULL: not read). */
typedef struct vt_kernels {
    vt_isa isa;
    const vt_codec_kernels *codec;
    vt_attn_tile_fn attn_tile[VT_DTYPE_COUNT];
} vt_kernels;

/* The table of the active ISA (initialising the runtime with the best ISA
 * on first use). Never NULL; tables are never modified or freed. */
const vt_kernels *vt_kernels_active(void);
/* isa's table on this CPU with its AVX512-BF16 bit taken as avx512bf16 (1 or 0) whatever the CPU has, the
 * other feature rows as the CPU has them (so a test checks both); NULL for an isa this build has no table for. */
const vt_kernels *vt_kernels_table(vt_isa isa, int avx512bf16);

/* A slot format (page_layout VT_PAGE_SLOTS): what its row's `slot` points to. kv_slots.c runs the checks and the
 * loops over tokens and heads; the format's file (kv_store_tq.c, kv_store_uq.c, kv_store_octave.c, nvfp4.c) supplies
 * these. k and v are one head's float32 rows of c->head_size elements. slot_bytes is called with a rope_dim the
 * row's rope_block admits (vt_dtype_slot_bytes_rope checks it first); rows without one ignore it. */
struct vt_tq_cache;
typedef struct vt_slot_codec {
    size_t (*slot_bytes)(const vt_dtype_info *t, size_t head_size, size_t rope_dim);
    /* 1 when the store and read need the caller's codebook (c->centroids, c->midpoints) */
    int (*needs_codebook)(const vt_dtype_info *t);
    void (*store)(const struct vt_tq_cache *c, const vt_dtype_info *t, const float *k, const float *v,
                  uint8_t *slot);
    void (*read)(const struct vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k, float *v);
    /* Optional (NULL: attention reads with read): attention's read, K and V left in bases of the codec's own
     * (orthogonal rotations of the model's), with the two maps that make it equal read's attention: attn_query
     * puts a query row (d float32, in place) in attn_read's K basis (q . k = q' . k'), attn_output puts a sum of
     * weights x attn_read's V rows back in the model's basis. */
    void (*attn_read)(const struct vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k, float *v);
    void (*attn_query)(const vt_dtype_info *t, float *q, int64_t d);
    void (*attn_output)(const vt_dtype_info *t, float *o, int64_t d);
} vt_slot_codec;
extern const vt_slot_codec vt_slot_turboquant, vt_slot_ultraquant, vt_slot_octave, vt_slot_nvfp4, vt_slot_nvfp4_4over6;
/* vt_tq_store / vt_tq_gather with the caller's name (fn) heading each message: the functional forms say
 * turboquant_store / turboquant_gather, the paged cache PagedKVCache.store / PagedKVCache.gather. */
vt_status vt_tq_store_named(const char *fn, const struct vt_tq_cache *c, int src_dtype, const void *key,
                            int64_t key_stride_token, int64_t key_stride_head, const void *value,
                            int64_t value_stride_token, int64_t value_stride_head, const int64_t *slot_mapping,
                            int64_t num_tokens, vt_error *err);
vt_status vt_tq_gather_named(const char *fn, const struct vt_tq_cache *c, const int64_t *slots, int64_t n,
                             float *k_out, float *v_out, int num_threads, vt_error *err);
/* *centroids: an MSE preset's codebook for head_size (vt_tq_codebook), solved on first use and kept by the core
 * for the process (thread-safe). */
vt_status vt_tq_centroids_shared(int dtype, int64_t head_size, const float **centroids, vt_error *err);
/* The largest head size a slot format takes (rows rotated on the stack). */
#define VT_SLOT_MAX_D 4096
/* In place: x <- x H (Sylvester's unnormalised +-1 Hadamard of order d, a power of two), in double: the
 * butterflies (a + b, a - b) over strides 1, 2, 4, ... (the MSE store's rotation and the read's query's). */
void vt_fwht_f64(double *x, int64_t d);
/* x rounded to float8 e4m3fn and back, nearest even, NaN past its range (|x| > 464, inf, NaN): the cast torch
 * and ml_dtypes make (not the saturating store of vt_fp8_e4m3_from_f32). */
float vt_f32_round_e4m3fn(float x);

/* A row's store kernel (vt_dtype_info.store): vt_kv_store_check asks `check` (the format's own checks) after the
 * common ones, and vt_kv_store runs `run` once every check passed and there are tokens. */
struct vt_kv_store_params;
typedef struct vt_store_kernel {
    vt_status (*check)(const struct vt_kv_store_params *p, const char *fn, vt_error *err);
    void (*run)(const struct vt_kv_store_params *p, int num_threads);
} vt_store_kernel;
/* kv_store.c: the element formats (plain, per-tensor fp8); kv_store_pth.c: int8 / fp8 per-token-head and
 * int4_per_token_head (its row writer rotates first). */
extern const vt_store_kernel vt_store_elements, vt_store_per_token_head, vt_store_int4;
/* codes * scale in float32 (the read of a per-token-head row; int8 or the e4m3 table; int4: (code - zp) *
 * scale with zp from the stored scale's low bits, n elements from n / 2 bytes). */
void vt_pth_dequant_row(int dtype, const uint8_t *codes, float *dst, int64_t n, float scale);

/* int4_per_token_head (kv_store_int4.c). Largest rotation block (the sign table's length). */
#define VT_INT4_RHT_MAX 1024
/* Largest int4 head size (rows are rotated whole on the stack). */
#define VT_KV_INT4_MAX_D 4096
/* Rotation block of a head size d: its largest power-of-two divisor. */
int64_t vt_int4_rht_block(int64_t d);
/* In place on x[d]: vLLM's single_rht (inverse = 0: H (s ⊙ x) per block) or its inverse without the
 * 1 / b (inverse = 1: s ⊙ (H x)). Needs vt_int4_rht_block(d) <= VT_INT4_RHT_MAX. */
void vt_int4_rht(float *x, int64_t d, int inverse);
/* x[d] from the rotated space back to the model's basis, normalized: s ⊙ (H x) / b per block of
 * b = vt_int4_rht_block(d) (H H = b I). The attention tiles' outputs and the cache's gather end with it. */
void vt_int4_rht_back(float *x, int64_t d);
/* One (token, KV head) row of d source elements (src_dtype float32, float16 or bfloat16; d even, d <=
 * VT_KV_INT4_MAX_D) -> rotated, rounded to the source dtype, quantized: d / 2 packed code bytes and the stored scale
 * (zero point in its low bits). The row an ISA runs for a source dtype; every one gives the scalar twin's bytes. */
typedef void (*vt_int4_store_row_fn)(const void *src, int src_dtype, int64_t d, uint8_t *codes, float *scale_out);
vt_int4_store_row_fn vt_int4_store_row_for(vt_isa isa, int src_dtype);
/* d / 2 packed bytes and a stored scale -> (code - zp) * scale, d float32 values (rotated space). */
void vt_int4_dequant_row(const uint8_t *codes, float stored_scale, float *dst, int64_t d);

/* Index of a float dtype in the [3] dimensions of vt_codec_kernels, or -1. */
static inline int vt_float_index(int dtype) {
    return (dtype == VT_DTYPE_F32 || dtype == VT_DTYPE_F16 || dtype == VT_DTYPE_BF16) ? dtype : -1;
}

/* Index of an fp8 dtype in the [2] dimensions of vt_codec_kernels, or -1. */
static inline int vt_fp8_index(int dtype) {
    return dtype == VT_DTYPE_FP8_E4M3 ? 0 : (dtype == VT_DTYPE_FP8_E5M2 ? 1 : -1);
}

static inline uint32_t vt_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float vt_bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Threads for a call: num_threads (at least 1), but no more than the work gives each thread min_per_thread units
 * of, nor than max_threads (> 0; e.g. the blocks a store splits by, or VT_MAX_THREADS). */
static inline int vt_useful_threads(int num_threads, int64_t work, int64_t min_per_thread, int64_t max_threads) {
    int64_t nth = num_threads < 1 ? 1 : num_threads;
    const int64_t useful = work / min_per_thread;
    if (nth > useful) nth = useful < 1 ? 1 : useful;
    if (nth > max_threads) nth = max_threads;
    return (int)nth;
}

/* 1 when x is finite and > 0 (the rule for every scale). */
static inline int vt_scale_ok(float x) {
    return x > 0.0f && x <= 3.4028234663852886e38f;
}

#endif /* VTINFER_CORE_INTERNAL_H */
