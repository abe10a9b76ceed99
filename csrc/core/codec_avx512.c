/* AVX-512 (F+BW+VL+DQ) codec row kernels, compiled with per-function target
 * attributes so the library still loads on CPUs without AVX-512. Each one
 * is bit-identical to its scalar twin in codec_scalar.c; tests/c sweeps all
 * 2^32 float32 inputs and all codes to prove it. */
#include <math.h>
#include <string.h>

#include "simd_avx512.h"

#if VT_X86

#define T VT_TARGET_AVX512

/* ---- 16-lane loads to float32 and stores from float32, tails masked ---- */

T static inline __m512 ld_f32(const void *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
T static inline __m512 ld_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
#define ld_bf16 vt512_ld_bf16

/* float32 -> bfloat16 bits in 32-bit lanes, nearest even, NaN quietened. */
T static inline __m256i bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i r = _mm512_srli_epi32(vt512_bf16_rne(u), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, q));
}

T static inline void st_f32(void *p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
T static inline void st_bf16(void *p, __m512 v, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, bf16_bits(v)); }
T static inline void st_f16(void *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* ---- fp8 encode of 16 float32 lanes (see encode_fp8 in codec_scalar.c) ----
 * The constants live in a struct built once per row so that the loop keeps
 * them in registers. Saturation needs no compare: the normal-path code of
 * any magnitude >= max finite (infinity included) exceeds max_code and the
 * min() clamps it; only NaN needs its own lane mask. */
typedef struct enc_consts {
    __m512i abs_mask, one, half_m1, bias, max_code, min_normal, nan_bits, sign_bit, canon_nan;
    __m512 sub_scale; /* 2^(mbits - emin): the subnormal grid step's inverse */
    int drop;
} enc_consts;

T static inline enc_consts make_enc(int mbits, int emin, uint32_t max_code) {
    enc_consts c;
    c.drop = 23 - mbits;
    c.abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    c.one = _mm512_set1_epi32(1);
    c.half_m1 = _mm512_set1_epi32((1 << (c.drop - 1)) - 1);
    c.bias = _mm512_set1_epi32((127 - (1 - emin)) << mbits);
    c.max_code = _mm512_set1_epi32((int)max_code);
    c.min_normal = _mm512_set1_epi32((127 + emin) << 23);
    c.nan_bits = _mm512_set1_epi32(0x7F800000);
    c.sign_bit = _mm512_set1_epi32(0x80);
    c.canon_nan = _mm512_set1_epi32(0x7F);
    c.sub_scale = _mm512_set1_ps((float)(1u << (mbits - emin)));
    return c;
}

T static inline __m128i enc_fp8(__m512 v, const enc_consts *c) {
    __m512i u = _mm512_castps_si512(v);
    __m512i a = _mm512_and_si512(u, c->abs_mask);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)c->drop), c->one);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, c->half_m1), lsb);
    __m512i code_n = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(r, (unsigned)c->drop), c->bias), c->max_code);
    /* Below the smallest normal the grid is fixed: scale by 2^(mbits-emin)
     * (exact) and round to the nearest integer, ties to even. */
    __m512i code_s = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), c->sub_scale),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __mmask16 normal = _mm512_cmpge_epu32_mask(a, c->min_normal);
    __m512i code = _mm512_mask_mov_epi32(code_s, normal, code_n);
    /* code | (u >> 24 & 0x80): ternary logic A | (B & C) */
    code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24), c->sign_bit, 0xF8);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, c->nan_bits);
    return _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(code, nan, c->canon_nan));
}

static inline __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* x / scale, exactly as a true float32 division, at the cost of a multiply.
 *
 * For a power-of-two scale, x * (1/scale) is the same correctly rounded
 * value as x / scale (1/scale is exact). Otherwise q = x * RN(1/scale) is
 * within 3 ulps of RN(x / scale); the fp8 code can only differ when q lies
 * within a few ulps of a point where the code changes: a midpoint of the
 * fp8 grid (its dropped mantissa bits near one half), or anywhere in the
 * subnormal range. Vectors with such a lane are divided for real. Scales
 * whose reciprocal is not a normal float32 are always divided. */
typedef enum div_mode { DIV_POW2, DIV_CHECKED, DIV_ALWAYS } div_mode;

static inline div_mode division_mode(float scale) {
    uint32_t b = vt_f32_bits(scale), e = (b >> 23) & 0xFFu;
    if ((b & 0x7FFFFFu) == 0 && e >= 1 && e <= 253) return DIV_POW2;
    return (e >= 2 && e <= 252) ? DIV_CHECKED : DIV_ALWAYS;
}

typedef struct div_consts {
    __m512 scale, inv;
    __m512i low_mask, half, near, safe_tiny;
} div_consts;

T static inline div_consts make_div(float scale, const enc_consts *c, int mbits, int emin) {
    div_consts d;
    d.scale = _mm512_set1_ps(scale);
    d.inv = _mm512_set1_ps(1.0f / scale);
    d.low_mask = _mm512_set1_epi32((1 << c->drop) - 1);
    d.half = _mm512_set1_epi32(1 << (c->drop - 1));
    d.near = _mm512_set1_epi32(8);
    d.safe_tiny = _mm512_set1_epi32((127 + emin - mbits - 3) << 23);
    return d;
}

/* 1 when some lane of q = x * RN(1/s) may encode differently from RN(x/s). */
T static inline int division_needed(__m512 q, const enc_consts *c, const div_consts *d) {
    __m512i a = _mm512_and_si512(_mm512_castps_si512(q), c->abs_mask);
    __m512i dist = _mm512_abs_epi32(_mm512_sub_epi32(_mm512_and_si512(a, d->low_mask), d->half));
    __mmask16 normal = _mm512_cmpge_epu32_mask(a, c->min_normal);
    __mmask16 near_mid = _mm512_mask_cmple_epu32_mask(normal, dist, d->near);
    __mmask16 sub = _mm512_mask_cmpge_epu32_mask(_knot_mask16(normal), a, d->safe_tiny);
    /* NaN lanes may count as near: dividing them gives the same NaN code; the masks stay in k registers */
    return !_kortestz_mask16_u8(near_mid, sub);
}

/* Rows this long or longer stream their codes past the caches (no
 * read-for-ownership of the destination) and prefetch their source a few
 * KiB ahead (measured: ~25% less time at DRAM scale than the hardware
 * prefetchers alone): bulk conversions, not the short head rows of the KV
 * store, which are read back soon. */
#define STREAM_MIN_ELEMS ((size_t)1 << 16)
#define PREFETCH_BYTES 2048

T static inline void put16(uint8_t *dst, __m128i codes, int stream) {
    if (stream) _mm_stream_si128((__m128i *)dst, codes);
    else _mm_storeu_si128((__m128i *)dst, codes);
}

/* One body for every source dtype and format; LD is a 16-lane loader. */
#define QUANT(NAME, LD, ES, MBITS, EMIN, MAXC)                                                      \
    T static void NAME(const void *src, uint8_t *dst, size_t n, float scale) {                      \
        const enc_consts c = make_enc(MBITS, EMIN, MAXC);                                           \
        const div_consts d = make_div(scale, &c, MBITS, EMIN);                                      \
        const div_mode mode = division_mode(scale);                                                 \
        const char *s = (const char *)src;                                                          \
        const int stream = n >= STREAM_MIN_ELEMS;                                                   \
        size_t i = 0;                                                                               \
        if (stream && ((uintptr_t)dst & 15u) != 0) { /* peel up to 15 codes: aligned streams */     \
            size_t head = 16u - ((uintptr_t)dst & 15u);                                             \
            __mmask16 m = tail_mask(head);                                                          \
            _mm_mask_storeu_epi8(dst, m, enc_fp8(_mm512_div_ps(LD(s, m), d.scale), &c));            \
            i = head;                                                                               \
        }                                                                                           \
        if (mode == DIV_POW2) {                                                                     \
            for (; i + 16 <= n; i += 16) {                                                          \
                if (stream) _mm_prefetch(s + i * (ES) + PREFETCH_BYTES, _MM_HINT_T0);               \
                put16(dst + i, enc_fp8(_mm512_mul_ps(LD(s + i * (ES), 0xFFFF), d.inv), &c), stream); \
            }                                                                                       \
        } else if (mode == DIV_CHECKED) {                                                           \
            for (; i + 16 <= n; i += 16) {                                                          \
                if (stream) _mm_prefetch(s + i * (ES) + PREFETCH_BYTES, _MM_HINT_T0);               \
                __m512 x = LD(s + i * (ES), 0xFFFF);                                                \
                __m512 q = _mm512_mul_ps(x, d.inv);                                                 \
                if (division_needed(q, &c, &d)) q = _mm512_div_ps(x, d.scale);                      \
                put16(dst + i, enc_fp8(q, &c), stream);                                             \
            }                                                                                       \
        } else {                                                                                    \
            for (; i + 16 <= n; i += 16)                                                            \
                put16(dst + i, enc_fp8(_mm512_div_ps(LD(s + i * (ES), 0xFFFF), d.scale), &c), stream); \
        }                                                                                           \
        if (stream) _mm_sfence();                                                                   \
        if (i < n) {                                                                                \
            __mmask16 m = tail_mask(n - i);                                                         \
            __m512 v = _mm512_div_ps(LD(s + i * (ES), m), d.scale);                                 \
            _mm_mask_storeu_epi8(dst + i, m, enc_fp8(v, &c));                                       \
        }                                                                                           \
    }

QUANT(q_f32_e4m3, ld_f32, 4, 3, -6, 0x7Eu)
QUANT(q_f16_e4m3, ld_f16, 2, 3, -6, 0x7Eu)
QUANT(q_bf16_e4m3, ld_bf16, 2, 3, -6, 0x7Eu)
QUANT(q_f32_e5m2, ld_f32, 4, 2, -14, 0x7Bu)
QUANT(q_f16_e5m2, ld_f16, 2, 2, -14, 0x7Bu)
QUANT(q_bf16_e5m2, ld_bf16, 2, 2, -14, 0x7Bu)

/* fp8 decode: the table lookup shared with the attention tile (simd_avx512.h). */
#define DEC(bytes) vt512_fp8x16_to_f32(bytes, &tb)
#define DEQUANT(NAME, FMT, ST, ES)                                                     \
    T static void NAME(const uint8_t *src, void *dst, size_t n, float scale) {         \
        const __m512 s = _mm512_set1_ps(scale);                                        \
        const vt512_fp8tab tb = vt512_fp8_table(FMT);                                  \
        size_t i = 0;                                                                  \
        if ((ES) == 4 && n >= STREAM_MIN_ELEMS && ((uintptr_t)dst & 3u) == 0) {        \
            if (((uintptr_t)dst & 63u) != 0) { /* peel to a 64-byte boundary */        \
                size_t head = (64u - ((uintptr_t)dst & 63u)) / 4u;                     \
                __mmask16 m = tail_mask(head);                                         \
                ST(dst, _mm512_mul_ps(DEC(_mm_maskz_loadu_epi8(m, src)), s), m);       \
                i = head;                                                              \
            }                                                                          \
            for (; i + 16 <= n; i += 16) {                                             \
                _mm_prefetch((const char *)src + i + PREFETCH_BYTES / 2, _MM_HINT_T0); \
                _mm512_stream_ps((float *)dst + i,                                     \
                                 _mm512_mul_ps(DEC(_mm_loadu_si128((const __m128i *)(src + i))), s)); \
            }                                                                          \
            _mm_sfence();                                                              \
        }                                                                              \
        for (; i < n; i += 16) {                                                       \
            __mmask16 m = tail_mask(n - i);                                            \
            __m512 v = _mm512_mul_ps(DEC(_mm_maskz_loadu_epi8(m, src + i)), s);       \
            ST((char *)dst + i * (ES), v, m);                                          \
        }                                                                              \
    }
DEQUANT(d_e4m3_f32, VT_DTYPE_FP8_E4M3, st_f32, 4)
DEQUANT(d_e4m3_f16, VT_DTYPE_FP8_E4M3, st_f16, 2)
DEQUANT(d_e4m3_bf16, VT_DTYPE_FP8_E4M3, st_bf16, 2)
DEQUANT(d_e5m2_f32, VT_DTYPE_FP8_E5M2, st_f32, 4)
DEQUANT(d_e5m2_f16, VT_DTYPE_FP8_E5M2, st_f16, 2)
DEQUANT(d_e5m2_bf16, VT_DTYPE_FP8_E5M2, st_bf16, 2)

#define CONVERT(NAME, LD, LES, ST, SES)                                        \
    T static void NAME(const void *src, void *dst, size_t n) {                 \
        for (size_t i = 0; i < n; i += 16) {                                   \
            __mmask16 m = tail_mask(n - i);                                    \
            ST((char *)dst + i * (SES), LD((const char *)src + i * (LES), m), m); \
        }                                                                      \
    }
CONVERT(c_f32_f16, ld_f32, 4, st_f16, 2)
CONVERT(c_f32_bf16, ld_f32, 4, st_bf16, 2)
CONVERT(c_f16_f32, ld_f16, 2, st_f32, 4)
CONVERT(c_f16_bf16, ld_f16, 2, st_bf16, 2)
CONVERT(c_bf16_f32, ld_bf16, 2, st_f32, 4)
CONVERT(c_bf16_f16, ld_bf16, 2, st_f16, 2)

#undef DEC

/* ---- the Walsh-Hadamard rotation (vt_fwht_row_fn), 16 lanes ---- */

VT_FWHT_ROWS(T, __m512, 16, vt512_fwht16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, _mm512_sub_ps,
             _mm512_mul_ps, _mm512_set1_ps)

/* ---- level lookups of packed codes (vt_levels4_row_fn, vt_levels3_row_fn, vt_packed3_row_fn), 16 lanes ---- */

/* 16 codes from 8 bytes: each byte widened to a lane twice (codes j and j + 4 of a word), shifted, masked, then
 * looked up by a 16-entry permute. */
T static void levels4_rows(const uint8_t *src, size_t n, const float *levels, float *out) {
    const __m512 L = _mm512_loadu_ps(levels);
    const __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7);
    const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i m15 = _mm512_set1_epi32(15);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i z = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + i / 2)));
        const __m512i c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, z), sh), m15);
        _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(c, L));
    }
    if (i < n) vt_levels4_scalar(src + i / 2, n - i, levels, out + i);
}

/* 32 codes from 8 low-plane and 4 high-plane bytes: lane j of a 128-bit word gathers lo[j], lo[4 + j], hi[j]
 * (bits 0-7, 8-15, 16-23), broadcast to the four 128-bit lanes; lane 4i + j shifts out code i's bits. */
T static void levels3_rows(const uint8_t *lo, const uint8_t *hi, size_t n, const float *levels, float *out) {
    const __m512 L = _mm512_zextps256_ps512(_mm256_loadu_ps(levels));
    const __m128i gather = _mm_setr_epi8(0, 4, 8, -1, 1, 5, 9, -1, 2, 6, 10, -1, 3, 7, 11, -1);
    const __m512i sl0 = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i sl1 = _mm512_add_epi32(sl0, _mm512_set1_epi32(8));
    const __m512i sh0 = _mm512_setr_epi32(14, 14, 14, 14, 15, 15, 15, 15, 16, 16, 16, 16, 17, 17, 17, 17);
    const __m512i sh1 = _mm512_add_epi32(sh0, _mm512_set1_epi32(4));
    const __m512i m3 = _mm512_set1_epi32(3), m4 = _mm512_set1_epi32(4);
    for (size_t w = 0; w < n / 32; w++) {
        uint32_t h;
        memcpy(&h, hi + 4 * w, 4);
        const __m128i bytes = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(lo + 8 * w)), (int)h, 2);
        const __m512i W = _mm512_broadcast_i32x4(_mm_shuffle_epi8(bytes, gather));
        const __m512i c0 = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(W, sl0), m3),
                                           _mm512_and_si512(_mm512_srlv_epi32(W, sh0), m4));
        const __m512i c1 = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(W, sl1), m3),
                                           _mm512_and_si512(_mm512_srlv_epi32(W, sh1), m4));
        _mm512_storeu_ps(out + 32 * w, _mm512_permutexvar_ps(c0, L));
        _mm512_storeu_ps(out + 32 * w + 16, _mm512_permutexvar_ps(c1, L));
    }
}

/* 16 codes from two 3-byte groups read as 8 bytes: the first group's 24 bits in lanes 0-7, the second's in lanes
 * 8-15, lane e of each shifted right by 3e and masked, then one permute; the last two groups (the 8-byte read would
 * pass the row) take the twin. */
T static void packed3_rows(const uint8_t *src, size_t n, const float *levels, float *out) {
    const __m512 L = _mm512_zextps256_ps512(_mm256_loadu_ps(levels));
    const __m512i sh = _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
    const __m512i m7 = _mm512_set1_epi32(7);
    const size_t groups = n / 8;
    size_t g = 0;
    for (; g + 3 <= groups; g += 2) {
        uint64_t w;
        memcpy(&w, src + 3 * g, 8);
        const __m512i W = _mm512_inserti64x4(_mm512_set1_epi32((int)(uint32_t)w), _mm256_set1_epi32((int)(uint32_t)(w >> 24)), 1);
        _mm512_storeu_ps(out + 8 * g, _mm512_permutexvar_ps(_mm512_and_si512(_mm512_srlv_epi32(W, sh), m7), L));
    }
    if (g < groups) vt_packed3_scalar(src + 3 * g, 8 * (groups - g), levels, out + 8 * g);
}

/* 16 codes from 8 bytes (each byte widened to two lanes, the high nibble shifted down), looked up in the 16
 * levels times the group's scale (one product per level: the twin's single rounding). */
T static void nibbles_rows(const uint8_t *src, size_t n, const float *levels, const float *scales, size_t group,
                           float *out) {
    if (group % 16 || n % 16) {
        vt_nibbles_scalar(src, n, levels, scales, group, out);
        return;
    }
    const __m512 L = _mm512_loadu_ps(levels);
    const __m512i idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i m15 = _mm512_set1_epi32(15);
    for (size_t g = 0; g < n; g += group) {
        const __m512 Ls = _mm512_mul_ps(L, _mm512_set1_ps(scales[g / group]));
        for (size_t i = g, e = g + group < n ? g + group : n; i < e; i += 16) {
            const __m512i z = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + i / 2)));
            const __m512i c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, z), sh), m15);
            _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(c, Ls));
        }
    }
}

const vt_codec_kernels vt_codec_avx512 = VT_CODEC_TABLE_INIT;

#endif /* VT_X86 */
