/* The per-token-head store (vLLM 0.33's int8_per_token_head and
 * fp8_per_token_head): for every (token, KV head) one float32 scale
 *   scale = max(absmax(row) / QUANT_MAX, 1e-6)
 * is written to the scale cache, and each element becomes
 *   q = x * (1 / scale)                     (a multiply by the reciprocal)
 *   int8: q = q >= 0 ? q + 0.5 : q - 0.5    (round half away from zero ...)
 *         code = trunc(clamp(q, -128, 127)) (... completed by the truncating store)
 *   fp8:  code = e4m3(clamp(q, -448, 448))  (round to nearest even, vtinfer's codec)
 * with IEEE float32 arithmetic, one operation at a time. QUANT_MAX/MIN come
 * from the dtype table. absmax ignores NaN elements and clamp maps NaN to
 * QUANT_MIN (maxnum/minnum, as Triton lowers tl.max and tl.clamp); see
 * .agents/specs/kv-formats.md for the rules with their vLLM file and line.
 *
 * Row kernels: a scalar twin (always), AVX2 and AVX-512 variants, chosen at
 * run time by the active ISA; each is tested byte for byte against an
 * independent NumPy twin (tests/numerics/test_kv_formats.py). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/kvcache.h"

#if VT_X86
#include <immintrin.h>
#endif

#define PTH_SCALE_FLOOR 1e-6f
/* Elements converted to float32 at once; longer rows take two passes. */
#define PTH_PIECE 512
#define PTH_PARALLEL_MIN_ELEMS ((int64_t)1 << 15)

/* Quantize n float32 values with reciprocal r into int8 codes (scalar twin). */
static void quant_int8_scalar(const float *x, uint8_t *dst, int64_t n, float r, float qmax, float qmin) {
    for (int64_t i = 0; i < n; i++) {
        float q = x[i] * r;
        q = q >= 0.0f ? q + 0.5f : q - 0.5f;
        q = fminf(fmaxf(q, qmin), qmax); /* NaN -> qmin (fmaxf returns the number) */
        dst[i] = (uint8_t)(int8_t)(int32_t)q;
    }
}

/* Scale and clamp n values into out (fp8 path, scalar twin). */
static void scale_clamp_scalar(const float *x, float *out, int64_t n, float r, float qmax, float qmin) {
    for (int64_t i = 0; i < n; i++) out[i] = fminf(fmaxf(x[i] * r, qmin), qmax);
}

/* Largest |x| over n values, NaN ignored, 0 for an empty or all-NaN row. */
static float absmax_scalar(const float *x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

#if VT_X86
/* AVX2: 8 lanes, the same operations in the same order as the twins; a row's last n % 8 elements take the twin. */
VT_TARGET_AVX2 static inline float absmax_avx2(const float *x, int64_t n, float m0) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_set1_ps(m0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m); /* NaN: keeps m */
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return absmax_scalar(x + i, n - i, _mm_cvtss_f32(h));
}

VT_TARGET_AVX2 static inline void quant_int8_avx2(const float *x, uint8_t *dst, int64_t n, float r, float qmax, float qmin) {
    const __m256 vr = _mm256_set1_ps(r), half = _mm256_set1_ps(0.5f), lo = _mm256_set1_ps(qmin),
                 hi = _mm256_set1_ps(qmax), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 q = _mm256_mul_ps(_mm256_loadu_ps(x + i), vr);
        __m256 ge = _mm256_cmp_ps(q, zero, _CMP_GE_OQ); /* false for NaN */
        __m256 t = _mm256_blendv_ps(_mm256_sub_ps(q, half), _mm256_add_ps(q, half), ge);
        t = _mm256_min_ps(_mm256_max_ps(t, lo), hi); /* max_ps gives its second operand for a NaN */
        __m256i c = _mm256_cvttps_epi32(t);          /* in [qmin, qmax]: the packs below never saturate */
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(void *)(dst + i), _mm_packs_epi16(w, w));
    }
    quant_int8_scalar(x + i, dst + i, n - i, r, qmax, qmin);
}

VT_TARGET_AVX2 static inline void scale_clamp_avx2(const float *x, float *out, int64_t n, float r, float qmax, float qmin) {
    const __m256 vr = _mm256_set1_ps(r), lo = _mm256_set1_ps(qmin), hi = _mm256_set1_ps(qmax);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vr), lo), hi));
    scale_clamp_scalar(x + i, out + i, n - i, r, qmax, qmin);
}

VT_TARGET_AVX512 static inline float absmax_avx512(const float *x, int64_t n, float m0) {
    __m512 m = _mm512_set1_ps(m0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m); /* NaN lane: keeps m */
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i)), m);
    }
    return _mm512_reduce_max_ps(m);
}

VT_TARGET_AVX512 static inline void quant_int8_avx512(const float *x, uint8_t *dst, int64_t n, float r, float qmax,
                                               float qmin) {
    const __m512 vr = _mm512_set1_ps(r), half = _mm512_set1_ps(0.5f), lo = _mm512_set1_ps(qmin),
                 hi = _mm512_set1_ps(qmax), zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 q = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vr);
        __mmask16 ge = _mm512_cmp_ps_mask(q, zero, _CMP_GE_OQ); /* false for NaN */
        __m512 t = _mm512_mask_add_ps(_mm512_sub_ps(q, half), ge, q, half);
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi); /* max_ps gives its second operand for a NaN */
        _mm_mask_storeu_epi8(dst + i, k, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(t)));
    }
}

VT_TARGET_AVX512 static inline void scale_clamp_avx512(const float *x, float *out, int64_t n, float r, float qmax,
                                                       float qmin) {
    const __m512 vr = _mm512_set1_ps(r), lo = _mm512_set1_ps(qmin), hi = _mm512_set1_ps(qmax);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 q = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vr);
        _mm512_mask_storeu_ps(out + i, k, _mm512_min_ps(_mm512_max_ps(q, lo), hi));
    }
}
#endif

typedef struct pth_job {
    const vt_kv_store_params *p;
    const vt_dtype_info *fmt;
    vt_convert_row_fn to_f32;  /* src dtype -> float32 */
    vt_quant_row_fn fp8_codes; /* float32 -> e4m3 codes (scale 1): fp8_per_token_head */
    vt_int4_store_row_fn int4_row; /* the active ISA's (int4_per_token_head) */
    size_t src_es;
    /* One (token, head) row: its scale to scale_dst, its codes to dst (the store kernel's row writer). */
    void (*row)(const struct pth_job *j, const char *src, uint8_t *dst, char *scale_dst);
} pth_job;

/* int4_per_token_head: rotate, round to the source dtype, quantize (kv_store_int4.c). D <= VT_KV_INT4_MAX_D. */
static void store_row_int4(const pth_job *j, const char *src, uint8_t *dst, char *scale_dst) {
    float scale;
    j->int4_row(src, j->p->src_dtype, j->p->head_size, dst, &scale);
    memcpy(scale_dst, &scale, sizeof scale);
}

/* The fp8 codes of clamp(x * r) in two steps: the clamp into a buffer, then the codec's encode at scale 1. */
#define FP8_CODES_BY_CODEC(NAME, TGT, CLAMP)                                                                       \
    TGT static inline void NAME(const pth_job *j, const float *x, uint8_t *dst, int64_t n, float r) {              \
        _Alignas(64) float tmp[PTH_PIECE];                                                                         \
        CLAMP(x, tmp, n, r, j->fmt->quant_max, j->fmt->quant_min);                                                 \
        j->fp8_codes(tmp, dst, (size_t)n, 1.0f);                                                                   \
    }

/* int8 / fp8 per-token-head: absmax scale, then the codes. One row function per ISA, each with its ISA's kernels
 * inlined (a (token, head) row is short: calls and set-ups per step cost as much as the steps). */
#define STORE_ROW_SCALED(NAME, TGT, ABSMAX, QUANT_INT8, FP8_CODES)                                                 \
    TGT static void NAME(const pth_job *j, const char *src, uint8_t *dst, char *scale_dst) {                       \
        const int64_t D = j->p->head_size;                                                                         \
        _Alignas(64) float buf[PTH_PIECE];                                                                         \
        float m = 0.0f;                                                                                            \
        for (int64_t d0 = 0; d0 < D; d0 += PTH_PIECE) {                                                            \
            int64_t n = D - d0 < PTH_PIECE ? D - d0 : PTH_PIECE;                                                   \
            j->to_f32(src + d0 * (int64_t)j->src_es, buf, (size_t)n);                                              \
            m = ABSMAX(buf, n, m);                                                                                 \
        }                                                                                                          \
        float scale = m / j->fmt->quant_max;                                                                       \
        if (!(scale > PTH_SCALE_FLOOR)) scale = PTH_SCALE_FLOOR;                                                   \
        const float r = 1.0f / scale;                                                                              \
        memcpy(scale_dst, &scale, sizeof scale);                                                                   \
        for (int64_t d0 = 0; d0 < D; d0 += PTH_PIECE) {                                                            \
            int64_t n = D - d0 < PTH_PIECE ? D - d0 : PTH_PIECE;                                                   \
            if (D > PTH_PIECE) j->to_f32(src + d0 * (int64_t)j->src_es, buf, (size_t)n);                           \
            if (j->fmt->is_int) QUANT_INT8(buf, dst + d0, n, r, j->fmt->quant_max, j->fmt->quant_min);             \
            else FP8_CODES(j, buf, dst + d0, n, r);                                                                \
        }                                                                                                          \
    }

#define VT_TARGET_NONE
FP8_CODES_BY_CODEC(fp8_codes_scalar, VT_TARGET_NONE, scale_clamp_scalar)
STORE_ROW_SCALED(store_row_scaled_scalar, VT_TARGET_NONE, absmax_scalar, quant_int8_scalar, fp8_codes_scalar)
#if VT_X86
FP8_CODES_BY_CODEC(fp8_codes_avx2, VT_TARGET_AVX2, scale_clamp_avx2)
STORE_ROW_SCALED(store_row_scaled_avx2, VT_TARGET_AVX2, absmax_avx2, quant_int8_avx2, fp8_codes_avx2)
FP8_CODES_BY_CODEC(fp8_codes_avx512, VT_TARGET_AVX512, scale_clamp_avx512)
STORE_ROW_SCALED(store_row_scaled_avx512, VT_TARGET_AVX512, absmax_avx512, quant_int8_avx512, fp8_codes_avx512)
#endif

/* The active ISA's row function. */
static void (*scaled_row(void))(const pth_job *, const char *, uint8_t *, char *) {
#if VT_X86
    if (vt_isa_active() == VT_ISA_AVX512) return store_row_scaled_avx512;
    if (vt_isa_active() == VT_ISA_AVX2) return store_row_scaled_avx2;
#endif
    return store_row_scaled_scalar;
}

static void pth_task(void *ctx, int ith, int nth) {
    const pth_job *j = ctx;
    const vt_kv_store_params *p = j->p;
    const int64_t bs = p->block_size, H = p->num_kv_heads;
    for (int64_t t = 0; t < p->num_tokens; t++) {
        const int64_t s = p->slot_mapping[t];
        if (s < 0) continue;
        const int64_t b = s / bs, o = s % bs;
        if (nth > 1 && (int)(b % nth) != ith) continue; /* one thread per block: the last token wins */
        const vt_kv_dst *kc = &p->key_cache, *vc = &p->value_cache, *ks = &p->k_scale_cache, *vs = &p->v_scale_cache;
        for (int64_t h = 0; h < H; h++) {
            j->row(j, (const char *)p->key + t * p->key_stride_token + h * p->key_stride_head,
                      (uint8_t *)kc->base + b * kc->stride_block + o * kc->stride_slot + h * kc->stride_head,
                      (char *)ks->base + b * ks->stride_block + o * ks->stride_slot + h * ks->stride_head);
            j->row(j, (const char *)p->value + t * p->value_stride_token + h * p->value_stride_head,
                      (uint8_t *)vc->base + b * vc->stride_block + o * vc->stride_slot + h * vc->stride_head,
                      (char *)vs->base + b * vs->stride_block + o * vs->stride_slot + h * vs->stride_head);
        }
    }
}

/* Checks the per-token-head parts vt_kv_store_check does not: scale caches given, code rows contiguous. */
static vt_status pth_check(const vt_kv_store_params *p, const char *fn, vt_error *err) {
    if (p->key_cache.chunk != p->head_size || p->value_cache.chunk != p->head_size)
        return vt_error_set(err, VT_ERR_VALUE,
                            "%s: key_cache must be a flash layout (contiguous head rows) for %s; got chunk %lld", fn,
                            vt_dtype_get(p->cache_dtype)->name, (long long)p->key_cache.chunk);
    if (p->num_tokens > 0 && (!p->k_scale_cache.base || !p->v_scale_cache.base))
        return vt_error_set(err, VT_ERR_VALUE, "%s: k_scale_cache and v_scale_cache must be given for %s; got NULL",
                            fn, vt_dtype_get(p->cache_dtype)->name);
    return vt_dtype_check_head_size(p->cache_dtype, p->head_size, fn, "head_size", NULL, err);
}

/* The store after every check passed, each row written by `row`. */
static void pth_run(const vt_kv_store_params *p, int num_threads,
                    void (*row)(const pth_job *, const char *, uint8_t *, char *)) {
    const vt_codec_kernels *ck = vt_codec_active();
    pth_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.fmt = vt_dtype_get(p->cache_dtype);
    j.to_f32 = ck->convert[p->src_dtype][VT_DTYPE_F32];
    if (!j.fmt->is_int && j.fmt->code_dtype >= 0) j.fp8_codes = ck->quant[VT_DTYPE_F32][vt_fp8_index(j.fmt->code_dtype)];
    j.src_es = vt_dtype_get(p->src_dtype)->elem_bytes;
    j.int4_row = vt_int4_store_row_for(vt_isa_active(), p->src_dtype);
    j.row = row;
    int64_t rows = p->num_tokens * p->num_kv_heads;
    int64_t work = rows > INT64_MAX / p->head_size ? INT64_MAX : rows * p->head_size;
    vt_parallel_for(pth_task, &j, vt_useful_threads(num_threads, work, PTH_PARALLEL_MIN_ELEMS, p->num_blocks));
}

static void scaled_run(const vt_kv_store_params *p, int num_threads) { pth_run(p, num_threads, scaled_row()); }
static void int4_run(const vt_kv_store_params *p, int num_threads) { pth_run(p, num_threads, store_row_int4); }

const vt_store_kernel vt_store_per_token_head = {.check = pth_check, .run = scaled_run};
const vt_store_kernel vt_store_int4 = {.check = pth_check, .run = int4_run};

void vt_pth_dequant_row(int dtype, const uint8_t *codes, float *dst, int64_t n, float scale) {
    const vt_dtype_info *fmt = vt_dtype_get(dtype);
    if (fmt->read_family == VT_READ_INT4_ROTATED) {
        vt_int4_dequant_row(codes, scale, dst, n);
    } else if (fmt->is_int) {
        for (int64_t i = 0; i < n; i++) dst[i] = (float)(int8_t)codes[i] * scale;
    } else {
        const float *t = vt_fp8_decode_table((vt_dtype)fmt->code_dtype);
        for (int64_t i = 0; i < n; i++) dst[i] = t[codes[i]] * scale;
    }
}
