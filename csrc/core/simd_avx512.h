/* AVX-512 (F+BW+VL+DQ) decode helpers shared by the codec row kernels
 * (codec_avx512.c), the attention tile (attn_avx512.c) and the int4 store
 * (kv_store_int4.c): one fp8 decode, one bf16 decode and one in-vector
 * Walsh-Hadamard butterfly for all. Include only from files compiled for x86;
 * every function carries the AVX-512 target attribute. */
#ifndef VTINFER_SIMD_AVX512_H
#define VTINFER_SIMD_AVX512_H

#include "vt_internal.h"

#if VT_X86
#include <immintrin.h>

#define VT512 VT_TARGET_AVX512 static inline __attribute__((always_inline))

/* The exact bf16 value of every fp8 magnitude 0..127 (every e4m3fn / e5m2
 * value, subnormals, inf and NaN included, is a bf16 value), held in four
 * registers of 32 16-bit lanes: magnitudes 0-31, 32-63, 64-95, 96-127. */
typedef struct vt512_fp8tab {
    __m512i t0, t1, t2, t3;
} vt512_fp8tab;

/* The table of fmt (an fp8 dtype); all zero for any other dtype. */
VT512 vt512_fp8tab vt512_fp8_table(vt_dtype fmt) {
    vt512_fp8tab tb;
    const float *t = vt_fp8_decode_table(fmt);
    if (!t) {
        tb.t0 = tb.t1 = tb.t2 = tb.t3 = _mm512_setzero_si512();
        return tb;
    }
    __m512i h[8];
    for (int i = 0; i < 8; i++) h[i] = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(t + 16 * i)), 16);
    tb.t0 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h[0])), _mm512_cvtepi32_epi16(h[1]), 1);
    tb.t1 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h[2])), _mm512_cvtepi32_epi16(h[3]), 1);
    tb.t2 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h[4])), _mm512_cvtepi32_epi16(h[5]), 1);
    tb.t3 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h[6])), _mm512_cvtepi32_epi16(h[7]), 1);
    return tb;
}

/* 32 fp8 codes, one per 16-bit lane of w (0..255), to their bf16 bits in
 * the same lanes, exactly: the 7-bit magnitude looks its value up
 * (vpermt2w over 64 entries, bit 6 picks the half), the sign bit is ORed
 * back (bit 7 of the code -> bit 15). */
VT512 __m512i vt512_fp8_to_bf16(__m512i w, const vt512_fp8tab *tb) {
    __m512i lo = _mm512_permutex2var_epi16(tb->t0, w, tb->t1); /* index bits 0-5 */
    __m512i hi = _mm512_permutex2var_epi16(tb->t2, w, tb->t3);
    __m512i x = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), lo, hi);
    /* x | (w << 8 & 0x8000): ternary logic A | (B & C) */
    return _mm512_ternarylogic_epi32(x, _mm512_slli_epi16(w, 8), _mm512_set1_epi16((short)0x8000), 0xF8);
}

/* 32 bf16 values (16-bit lanes of x) to float32, exactly, split by parity:
 * *even gets elements 0, 2, .., 30 and *odd elements 1, 3, .., 31 (a
 * 32-bit lane's low half is its even element). No shuffle. */
VT512 void vt512_bf16_split(__m512i x, __m512 *even, __m512 *odd) {
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* float32 bits rounded to bfloat16, nearest even, in the high 16 bits of each lane (as vt256_bf16_rne). */
VT512 __m512i vt512_bf16_rne(__m512i u) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
}

/* 16 bf16 values (16-bit lanes of x) to float32 in order, exactly. */
VT512 __m512 vt512_bf16x16_to_f32(__m256i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

/* Load 16 bf16 values (lanes outside m read as 0) as float32, in order. */
VT512 __m512 vt512_ld_bf16(const void *p, __mmask16 m) { return vt512_bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, p)); }

/* 16 fp8 codes (bytes of c) to float32 in order, exactly. */
VT512 __m512 vt512_fp8x16_to_f32(__m128i c, const vt512_fp8tab *tb) {
    __m512i w = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(c)); /* upper lanes unused */
    return vt512_bf16x16_to_f32(_mm512_castsi512_si256(vt512_fp8_to_bf16(w, tb)));
}

/* The Walsh-Hadamard butterfly stages of strides 1, 2, 4 and 8, the ones inside 16 lanes, as the scalar twin
 * computes them (vt_fwht_scalar: stages h = 1, 2, .., operand order included). One stage, given q, each lane's
 * partner (lane i ^ h): the lanes whose bit h is clear (m's zeros) take self + partner (a + c), the others
 * partner - self (a - c). */
VT512 __m512 vt512_fwht_stage(__m512 v, __m512 q, __mmask16 m) { return _mm512_mask_sub_ps(_mm512_add_ps(v, q), m, q, v); }

/* Partners: strides 1 and 2 within 128-bit lanes, 4 and 8 by swapping 128-bit lanes. */
VT512 __m512 vt512_fwht16(__m512 v) {
    v = vt512_fwht_stage(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);
    v = vt512_fwht_stage(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);
    v = vt512_fwht_stage(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);
    return vt512_fwht_stage(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);
}

#endif /* VT_X86 */
#endif /* VTINFER_SIMD_AVX512_H */
