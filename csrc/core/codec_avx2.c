/* AVX2+FMA+F16C codec row kernels (8 lanes), per-function target
 * attributes; tails (< 8 elements) go to the scalar codecs, so every
 * element is bit-identical to the scalar twin in codec_scalar.c. */
#include <math.h>
#include <string.h>

#include "simd_avx2.h"

#if VT_X86

#define T VT_TARGET_AVX2

T static inline __m256 ld_f32(const void *p) { return _mm256_loadu_ps(p); }
T static inline __m256 ld_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128(p)); }
#define ld_bf16 vt256_ld_bf16

/* Low 16 bits of each 32-bit lane, in order, as 8 x uint16. */
T static inline __m128i pack_u16(__m256i x) {
    __m256i p = _mm256_packus_epi32(x, x);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

T static inline void st_f32(void *p, __m256 v) { _mm256_storeu_ps(p, v); }
T static inline void st_f16(void *p, __m256 v) {
    _mm_storeu_si128(p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
T static inline void st_bf16(void *p, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i r = _mm256_srli_epi32(vt256_bf16_rne(u), 16);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    _mm_storeu_si128(p, pack_u16(_mm256_blendv_epi8(r, q, nan)));
}

/* See encode_fp8 in codec_scalar.c. Magnitudes are < 2^31, so signed
 * compares order them correctly. Normal codes round the float32 bits; min()
 * saturates them (inf too). Subnormal codes: adding M = 2^23 quanta of the
 * subnormal grid makes float32's own round-to-nearest-even leave the code in
 * M's low mantissa bits (|v| < 2^emin < M, so the sum stays in M's binade). */
T static inline __m256i enc_fp8(__m256 v, int mbits, int emin, int max_code) {
    const int drop = 23 - mbits;
    const int m_bits = (127 + 23 + emin - mbits) << 23; /* M = 2^(23 + emin - mbits) */
    __m256i u = _mm256_castps_si256(v);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, drop), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (drop - 1)) - 1)), lsb);
    __m256i code_n =
        _mm256_sub_epi32(_mm256_srli_epi32(r, drop), _mm256_set1_epi32((127 - (1 - emin)) << mbits));
    code_n = _mm256_min_epi32(code_n, _mm256_set1_epi32(max_code));
    __m256 t = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(_mm256_set1_epi32(m_bits)));
    __m256i code_s = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(m_bits));
    __m256i normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(((127 + emin) << 23) - 1));
    __m256i code = _mm256_or_si256(_mm256_blendv_epi8(code_s, code_n, normal), sign);
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), nan);
}

/* Store byte 0 of each of the 8 lanes. */
T static inline void st_codes(uint8_t *dst, __m256i code) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_shuffle_epi8(code, pick);
    __m256i both = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(both));
}

/* Store the codes (0..255 in each 32-bit lane) of four vectors, 32 bytes in order. */
T static inline void st_codes32(uint8_t *dst, __m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)dst, p);
}

T static inline __m256i enc_e4m3(__m256 v) { return enc_fp8(v, 3, -6, 0x7E); }
T static inline __m256i enc_e5m2(__m256 v) { return enc_fp8(v, 2, -14, 0x7B); }

/* The scalar twins (vt_codec_scalar) handle the last n % 8 elements (n % 16 for fp8 decode). */

/* x / scale as a true float32 division at the cost of a multiply; see
 * divide() in codec_avx512.c for why this is exact. */
enum { DIV_POW2, DIV_CHECKED, DIV_ALWAYS };

typedef struct div_plan {
    __m256 scale, inv;
    int pow2, fast, drop;
    int min_normal, safe_tiny;
} div_plan;

T static inline div_plan plan_division(float scale, int mbits, int emin) {
    div_plan p;
    uint32_t b = vt_f32_bits(scale), e = (b >> 23) & 0xFFu;
    p.scale = _mm256_set1_ps(scale);
    p.inv = _mm256_set1_ps(1.0f / scale);
    p.pow2 = (b & 0x7FFFFFu) == 0 && e >= 1 && e <= 253;
    p.fast = e >= 2 && e <= 252;
    p.drop = 23 - mbits;
    p.min_normal = (127 + emin) << 23;
    p.safe_tiny = (127 + emin - mbits - 3) << 23;
    return p;
}

/* 1 when some lane of q = x * RN(1/s) may encode differently from RN(x/s): near a midpoint of the fp8 grid
 * (normal, finite), or in the subnormal range above what always encodes as zero. */
T static inline int division_needed(__m256 q, const div_plan *p) {
    __m256i a = _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7FFFFFFF));
    __m256i low = _mm256_and_si256(a, _mm256_set1_epi32((1 << p->drop) - 1));
    __m256i dist = _mm256_abs_epi32(_mm256_sub_epi32(low, _mm256_set1_epi32(1 << (p->drop - 1))));
    __m256i near_mid = _mm256_cmpgt_epi32(_mm256_set1_epi32(9), dist);
    __m256i normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(p->min_normal - 1));
    __m256i finite = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7F800000), a);
    __m256i tiny_ok = _mm256_cmpgt_epi32(_mm256_set1_epi32(p->safe_tiny), a);
    __m256i danger = _mm256_or_si256(_mm256_and_si256(_mm256_and_si256(near_mid, normal), finite),
                                     _mm256_andnot_si256(_mm256_or_si256(normal, tiny_ok), _mm256_set1_epi32(-1)));
    return !_mm256_testz_si256(danger, danger);
}

/* x / scale for one plan's mode (a constant in each loop below, so its tests fold away). */
T static inline __m256 divide(__m256 x, const div_plan *p, int mode) {
    if (mode == DIV_ALWAYS) return _mm256_div_ps(x, p->scale);
    __m256 q = _mm256_mul_ps(x, p->inv);
    if (mode == DIV_POW2 || !division_needed(q, p)) return q;
    return _mm256_div_ps(x, p->scale);
}

/* 32 codes per step, then 8, then the scalar twin for the last n % 8. */
#define QUANT_LOOP(LD, ES, ENC, MODE)                                                               \
    for (; i + 32 <= n; i += 32) {                                                                  \
        const char *x = (const char *)src + i * (ES);                                               \
        st_codes32(dst + i, ENC(divide(LD(x), &p, MODE)), ENC(divide(LD(x + 8 * (ES)), &p, MODE)),  \
                   ENC(divide(LD(x + 16 * (ES)), &p, MODE)), ENC(divide(LD(x + 24 * (ES)), &p, MODE))); \
    }                                                                                               \
    for (; i + 8 <= n; i += 8) st_codes(dst + i, ENC(divide(LD((const char *)src + i * (ES)), &p, MODE)));

#define QUANT(NAME, LD, ES, ENC, S, F, MBITS, EMIN)                                      \
    T static void NAME(const void *src, uint8_t *dst, size_t n, float scale) {           \
        const div_plan p = plan_division(scale, MBITS, EMIN);                            \
        size_t i = 0;                                                                    \
        if (p.pow2) {                                                                    \
            QUANT_LOOP(LD, ES, ENC, DIV_POW2)                                            \
        } else if (p.fast) {                                                             \
            QUANT_LOOP(LD, ES, ENC, DIV_CHECKED)                                         \
        } else {                                                                         \
            QUANT_LOOP(LD, ES, ENC, DIV_ALWAYS)                                          \
        }                                                                                \
        if (i < n) vt_codec_scalar.quant[S][F]((const char *)src + i * (ES), dst + i, n - i, scale); \
    }
QUANT(q_f32_e4m3, ld_f32, 4, enc_e4m3, VT_DTYPE_F32, 0, 3, -6)
QUANT(q_f16_e4m3, ld_f16, 2, enc_e4m3, VT_DTYPE_F16, 0, 3, -6)
QUANT(q_bf16_e4m3, ld_bf16, 2, enc_e4m3, VT_DTYPE_BF16, 0, 3, -6)
QUANT(q_f32_e5m2, ld_f32, 4, enc_e5m2, VT_DTYPE_F32, 1, 2, -14)
QUANT(q_f16_e5m2, ld_f16, 2, enc_e5m2, VT_DTYPE_F16, 1, 2, -14)
QUANT(q_bf16_e5m2, ld_bf16, 2, enc_e5m2, VT_DTYPE_BF16, 1, 2, -14)

/* fp8 decode: the F16C map shared with the attention tile (simd_avx2.h). */
#define DEQUANT(NAME, E4M3, ST, ES, F, D)                                         \
    T static void NAME(const uint8_t *src, void *dst, size_t n, float scale) {    \
        const __m256 s = _mm256_set1_ps(scale);                                   \
        size_t i = 0;                                                             \
        for (; i + 16 <= n; i += 16) {                                            \
            __m256 a, b;                                                          \
            vt256_fp8x16_to_f32(E4M3, _mm_loadu_si128((const __m128i *)(src + i)), &a, &b); \
            ST((char *)dst + i * (ES), _mm256_mul_ps(a, s));                      \
            ST((char *)dst + (i + 8) * (ES), _mm256_mul_ps(b, s));                \
        }                                                                         \
        if (i < n) vt_codec_scalar.dequant[F][D](src + i, (char *)dst + i * (ES), n - i, scale); \
    }
DEQUANT(d_e4m3_f32, 1, st_f32, 4, 0, VT_DTYPE_F32)
DEQUANT(d_e4m3_f16, 1, st_f16, 2, 0, VT_DTYPE_F16)
DEQUANT(d_e4m3_bf16, 1, st_bf16, 2, 0, VT_DTYPE_BF16)
DEQUANT(d_e5m2_f32, 0, st_f32, 4, 1, VT_DTYPE_F32)
DEQUANT(d_e5m2_f16, 0, st_f16, 2, 1, VT_DTYPE_F16)
DEQUANT(d_e5m2_bf16, 0, st_bf16, 2, 1, VT_DTYPE_BF16)

#define CONVERT(NAME, LD, LES, ST, SES, S, D)                                             \
    T static void NAME(const void *src, void *dst, size_t n) {                            \
        size_t i = 0;                                                                     \
        for (; i + 8 <= n; i += 8) ST((char *)dst + i * (SES), LD((const char *)src + i * (LES))); \
        if (i < n) vt_codec_scalar.convert[S][D]((const char *)src + i * (LES), (char *)dst + i * (SES), n - i); \
    }
CONVERT(c_f32_f16, ld_f32, 4, st_f16, 2, VT_DTYPE_F32, VT_DTYPE_F16)
CONVERT(c_f32_bf16, ld_f32, 4, st_bf16, 2, VT_DTYPE_F32, VT_DTYPE_BF16)
CONVERT(c_f16_f32, ld_f16, 2, st_f32, 4, VT_DTYPE_F16, VT_DTYPE_F32)
CONVERT(c_f16_bf16, ld_f16, 2, st_bf16, 2, VT_DTYPE_F16, VT_DTYPE_BF16)
CONVERT(c_bf16_f32, ld_bf16, 2, st_f32, 4, VT_DTYPE_BF16, VT_DTYPE_F32)
CONVERT(c_bf16_f16, ld_bf16, 2, st_f16, 2, VT_DTYPE_BF16, VT_DTYPE_F16)

/* ---- the Walsh-Hadamard rotation (vt_fwht_row_fn), 8 lanes ---- */

VT_FWHT_ROWS(T, __m256, 8, vt256_fwht8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, _mm256_sub_ps,
             _mm256_mul_ps, _mm256_set1_ps)

/* ---- level lookups of packed codes (vt_levels4_row_fn, vt_levels3_row_fn, vt_packed3_row_fn), 8 lanes ---- */

/* 8 codes from 4 bytes: each byte widened to a lane twice (codes j and j + 4), shifted, masked; the 16 levels are
 * two 8-entry permutes, blended on the code's bit 3. */
T static void levels4_rows(const uint8_t *src, size_t n, const float *levels, float *out) {
    const __m256 L0 = _mm256_loadu_ps(levels), L1 = _mm256_loadu_ps(levels + 8);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
    const __m256i sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i m15 = _mm256_set1_epi32(15);
    for (size_t w = 0; w < n / 8; w++) {
        uint32_t b;
        memcpy(&b, src + 4 * w, 4);
        const __m256i z = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128((int)b));
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(z, idx), sh), m15);
        const __m256 top = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
        _mm256_storeu_ps(out + 8 * w, _mm256_blendv_ps(_mm256_permutevar8x32_ps(L0, c),
                                                       _mm256_permutevar8x32_ps(L1, c), top));
    }
}

/* 32 codes from 8 low-plane and 4 high-plane bytes: lane j of a 128-bit word gathers lo[j], lo[4 + j], hi[j]
 * (bits 0-7, 8-15, 16-23), broadcast to both 128-bit lanes; each 8-lane group takes codes i = 2g, 2g + 1. */
T static void levels3_rows(const uint8_t *lo, const uint8_t *hi, size_t n, const float *levels, float *out) {
    const __m256 L = _mm256_loadu_ps(levels);
    const __m128i gather = _mm_setr_epi8(0, 4, 8, -1, 1, 5, 9, -1, 2, 6, 10, -1, 3, 7, 11, -1);
    const __m256i sl = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), sh = _mm256_setr_epi32(14, 14, 14, 14, 15, 15, 15, 15);
    const __m256i m3 = _mm256_set1_epi32(3), m4 = _mm256_set1_epi32(4);
    for (size_t w = 0; w < n / 32; w++) {
        uint32_t h;
        memcpy(&h, hi + 4 * w, 4);
        const __m128i bytes = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(lo + 8 * w)), (int)h, 2);
        const __m256i W = _mm256_broadcastsi128_si256(_mm_shuffle_epi8(bytes, gather));
        for (int g = 0; g < 4; g++) {
            const __m256i c =
                _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(W, _mm256_add_epi32(sl, _mm256_set1_epi32(4 * g))), m3),
                                _mm256_and_si256(_mm256_srlv_epi32(W, _mm256_add_epi32(sh, _mm256_set1_epi32(2 * g))), m4));
            _mm256_storeu_ps(out + 32 * w + 8 * g, _mm256_permutevar8x32_ps(L, c));
        }
    }
}

/* 8 codes from each 3-byte group: its 24 bits in every lane, lane e shifted right by 3e and masked, then one
 * 8-entry permute; every group but the last is read as 4 bytes (the fourth, the next group's, is shifted out). */
T static void packed3_rows(const uint8_t *src, size_t n, const float *levels, float *out) {
    const __m256 L = _mm256_loadu_ps(levels);
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21), m7 = _mm256_set1_epi32(7);
    const size_t groups = n / 8;
    for (size_t g = 0; g < groups; g++) {
        uint32_t w;
        if (g + 1 < groups)
            memcpy(&w, src + 3 * g, 4);
        else
            w = src[3 * g] | (uint32_t)src[3 * g + 1] << 8 | (uint32_t)src[3 * g + 2] << 16;
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), sh), m7);
        _mm256_storeu_ps(out + 8 * g, _mm256_permutevar8x32_ps(L, c));
    }
}

/* 8 codes from 4 bytes (each byte widened to two lanes, the high nibble shifted down), looked up in the 16 levels
 * times the group's scale (two 8-entry permutes, blended on bit 3; one product per level: the twin's rounding). */
T static void nibbles_rows(const uint8_t *src, size_t n, const float *levels, const float *scales, size_t group,
                           float *out) {
    if (group % 8 || n % 8) {
        vt_nibbles_scalar(src, n, levels, scales, group, out);
        return;
    }
    const __m256i idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i sh = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    const __m256i m15 = _mm256_set1_epi32(15);
    for (size_t g = 0; g < n; g += group) {
        const __m256 s = _mm256_set1_ps(scales[g / group]);
        const __m256 L0 = _mm256_mul_ps(_mm256_loadu_ps(levels), s), L1 = _mm256_mul_ps(_mm256_loadu_ps(levels + 8), s);
        for (size_t i = g, e = g + group < n ? g + group : n; i < e; i += 8) {
            uint32_t b;
            memcpy(&b, src + i / 2, 4);
            const __m256i z = _mm256_cvtepu8_epi32(_mm_cvtsi32_si128((int)b));
            const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(z, idx), sh), m15);
            const __m256 top = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
            _mm256_storeu_ps(out + i, _mm256_blendv_ps(_mm256_permutevar8x32_ps(L0, c), _mm256_permutevar8x32_ps(L1, c), top));
        }
    }
}

const vt_codec_kernels vt_codec_avx2 = VT_CODEC_TABLE_INIT;

#endif /* VT_X86 */
