/* AVX-512 (F+BW+VL+DQ) codec row kernels, compiled with per-function target
 * attributes so the library still loads on CPUs without AVX-512. Each one
 * is bit-identical to its scalar twin in codec_scalar.c; tests/c sweeps all
 * 2^32 float32 inputs and all codes to prove it. */
#include "vt_internal.h"

#if VT_X86
#include <immintrin.h>

#define T VT_TARGET_AVX512

/* ---- 16-lane loads to float32 and stores from float32, tails masked ---- */

T static inline __m512 ld_f32(const void *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
T static inline __m512 ld_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
T static inline __m512 ld_bf16(const void *p, __mmask16 m) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* float32 -> bfloat16 bits in 32-bit lanes, nearest even, NaN quietened. */
T static inline __m256i bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
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

/* ---- fp8 encode of 16 float32 lanes (see encode_fp8 in codec_scalar.c) ---- */

T static inline __m128i enc_fp8(__m512 v, int mbits, int emin, uint32_t max_bits, uint32_t max_code) {
    const int drop = 23 - mbits;
    __m512i u = _mm512_castps_si512(v);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)drop), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32((1 << (drop - 1)) - 1)), lsb);
    __m512i code_n = _mm512_sub_epi32(_mm512_srli_epi32(r, (unsigned)drop),
                                      _mm512_set1_epi32((127 - (1 - emin)) << mbits));
    code_n = _mm512_min_epi32(code_n, _mm512_set1_epi32((int)max_code));
    /* Below the smallest normal the grid is fixed: scale by 2^(mbits-emin)
     * (exact) and round to the nearest integer, ties to even. */
    float k = (float)(1u << (mbits - emin));
    __m512i code_s = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(k)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __mmask16 normal = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((127 + emin) << 23));
    __m512i code = _mm512_mask_mov_epi32(code_s, normal, code_n);
    __mmask16 sat = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((int)max_bits));
    code = _mm512_mask_mov_epi32(code, sat, _mm512_set1_epi32((int)max_code));
    code = _mm512_or_si512(code, sign);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    code = _mm512_mask_mov_epi32(code, nan, _mm512_set1_epi32(0x7F));
    return _mm512_cvtepi32_epi8(code);
}

T static inline __m128i enc_e4m3(__m512 v) { return enc_fp8(v, 3, -6, 0x43E00000u, 0x7Eu); }
T static inline __m128i enc_e5m2(__m512 v) { return enc_fp8(v, 2, -14, 0x47600000u, 0x7Bu); }

/* ---- fp8 decode of 16 codes to float32 (exact) ---- */

T static inline __m512 dec_e4m3(__m128i bytes) {
    __m512i c = _mm512_cvtepu8_epi32(bytes);
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(7))), _mm512_set1_ps(0x1p-9f));
    __mmask16 is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(8));
    __m512i bits = _mm512_mask_mov_epi32(normal, is_sub, _mm512_castps_si512(sub));
    __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F));
    bits = _mm512_mask_mov_epi32(bits, nan, _mm512_set1_epi32(0x7FC00000));
    bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24));
    return _mm512_castsi512_ps(bits);
}

T static inline __m512 dec_e5m2(__m128i bytes) {
    __m512i c = _mm512_cvtepu8_epi32(bytes);
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7F));
    __m512i m = _mm512_and_si512(c, _mm512_set1_epi32(3));
    __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 21), _mm512_set1_epi32(112 << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(m), _mm512_set1_ps(0x1p-16f));
    __mmask16 is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(4));
    __m512i bits = _mm512_mask_mov_epi32(normal, is_sub, _mm512_castps_si512(sub));
    __mmask16 special = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7C));
    __m512i inf_nan = _mm512_or_si512(_mm512_set1_epi32(0x7F800000), _mm512_slli_epi32(m, 21));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7C));
    inf_nan = _mm512_mask_or_epi32(inf_nan, nan, inf_nan, _mm512_set1_epi32(0x400000));
    bits = _mm512_mask_mov_epi32(bits, special, inf_nan);
    bits = _mm512_or_si512(bits, _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24));
    return _mm512_castsi512_ps(bits);
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
 * subnormal range. Vectors with such a lane are divided for real. */
typedef struct div_plan {
    __m512 scale, inv;
    int pow2;
    int fast;             /* 1/scale is a normal float32 with a normal reciprocal error */
    int drop;             /* mantissa bits dropped to reach the fp8 grid */
    uint32_t min_normal;  /* float32 bits of the smallest normal fp8 value */
    uint32_t safe_tiny;   /* below this magnitude every path gives code 0 */
} div_plan;

T static inline div_plan plan_division(float scale, int mbits, int emin) {
    div_plan p;
    uint32_t b = vt_f32_bits(scale);
    uint32_t e = (b >> 23) & 0xFFu;
    p.scale = _mm512_set1_ps(scale);
    p.inv = _mm512_set1_ps(1.0f / scale);
    p.pow2 = (b & 0x7FFFFFu) == 0 && e >= 1 && e <= 253;
    p.fast = e >= 2 && e <= 252;
    p.drop = 23 - mbits;
    p.min_normal = (uint32_t)(127 + emin) << 23;
    p.safe_tiny = (uint32_t)(127 + emin - mbits - 3) << 23;
    return p;
}

T static inline __m512 divide(__m512 x, const div_plan *p) {
    if (!p->fast && !p->pow2) return _mm512_div_ps(x, p->scale);
    __m512 q = _mm512_mul_ps(x, p->inv);
    if (p->pow2) return q;
    __m512i a = _mm512_and_si512(_mm512_castps_si512(q), _mm512_set1_epi32(0x7FFFFFFF));
    __m512i low = _mm512_and_si512(a, _mm512_set1_epi32((1 << p->drop) - 1));
    __m512i dist = _mm512_abs_epi32(_mm512_sub_epi32(low, _mm512_set1_epi32(1 << (p->drop - 1))));
    __mmask16 near_mid = _mm512_cmple_epu32_mask(dist, _mm512_set1_epi32(8));
    __mmask16 normal = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((int)p->min_normal));
    __mmask16 finite = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __mmask16 sub = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32((int)p->safe_tiny)) & ~normal;
    if (((near_mid & normal & finite) | sub) == 0) return q;
    return _mm512_div_ps(x, p->scale);
}

#define QUANT(NAME, LD, ES, ENC, MBITS, EMIN)                                              \
    T static void NAME(const void *src, uint8_t *dst, size_t n, float scale) {             \
        const div_plan p = plan_division(scale, MBITS, EMIN);                              \
        for (size_t i = 0; i < n; i += 16) {                                               \
            __mmask16 m = tail_mask(n - i);                                                \
            __m128i c = ENC(divide(LD((const char *)src + i * (ES), m), &p));              \
            _mm_mask_storeu_epi8(dst + i, m, c);                                           \
        }                                                                                  \
    }
QUANT(q_f32_e4m3, ld_f32, 4, enc_e4m3, 3, -6)
QUANT(q_f16_e4m3, ld_f16, 2, enc_e4m3, 3, -6)
QUANT(q_bf16_e4m3, ld_bf16, 2, enc_e4m3, 3, -6)
QUANT(q_f32_e5m2, ld_f32, 4, enc_e5m2, 2, -14)
QUANT(q_f16_e5m2, ld_f16, 2, enc_e5m2, 2, -14)
QUANT(q_bf16_e5m2, ld_bf16, 2, enc_e5m2, 2, -14)

#define DEQUANT(NAME, DEC, ST, ES)                                                     \
    T static void NAME(const uint8_t *src, void *dst, size_t n, float scale) {         \
        const __m512 s = _mm512_set1_ps(scale);                                        \
        for (size_t i = 0; i < n; i += 16) {                                           \
            __mmask16 m = tail_mask(n - i);                                            \
            __m512 v = _mm512_mul_ps(DEC(_mm_maskz_loadu_epi8(m, src + i)), s);       \
            ST((char *)dst + i * (ES), v, m);                                          \
        }                                                                              \
    }
DEQUANT(d_e4m3_f32, dec_e4m3, st_f32, 4)
DEQUANT(d_e4m3_f16, dec_e4m3, st_f16, 2)
DEQUANT(d_e4m3_bf16, dec_e4m3, st_bf16, 2)
DEQUANT(d_e5m2_f32, dec_e5m2, st_f32, 4)
DEQUANT(d_e5m2_f16, dec_e5m2, st_f16, 2)
DEQUANT(d_e5m2_bf16, dec_e5m2, st_bf16, 2)

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

void vt_codec_fill_avx512(vt_codec_kernels *k) {
    k->quant[VT_DTYPE_F32][0] = q_f32_e4m3;
    k->quant[VT_DTYPE_F16][0] = q_f16_e4m3;
    k->quant[VT_DTYPE_BF16][0] = q_bf16_e4m3;
    k->quant[VT_DTYPE_F32][1] = q_f32_e5m2;
    k->quant[VT_DTYPE_F16][1] = q_f16_e5m2;
    k->quant[VT_DTYPE_BF16][1] = q_bf16_e5m2;
    k->dequant[0][VT_DTYPE_F32] = d_e4m3_f32;
    k->dequant[0][VT_DTYPE_F16] = d_e4m3_f16;
    k->dequant[0][VT_DTYPE_BF16] = d_e4m3_bf16;
    k->dequant[1][VT_DTYPE_F32] = d_e5m2_f32;
    k->dequant[1][VT_DTYPE_F16] = d_e5m2_f16;
    k->dequant[1][VT_DTYPE_BF16] = d_e5m2_bf16;
    k->convert[VT_DTYPE_F32][VT_DTYPE_F16] = c_f32_f16;
    k->convert[VT_DTYPE_F32][VT_DTYPE_BF16] = c_f32_bf16;
    k->convert[VT_DTYPE_F16][VT_DTYPE_F32] = c_f16_f32;
    k->convert[VT_DTYPE_F16][VT_DTYPE_BF16] = c_f16_bf16;
    k->convert[VT_DTYPE_BF16][VT_DTYPE_F32] = c_bf16_f32;
    k->convert[VT_DTYPE_BF16][VT_DTYPE_F16] = c_bf16_f16;
}

#endif /* VT_X86 */
