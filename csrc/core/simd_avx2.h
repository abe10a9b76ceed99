/* AVX2+FMA+F16C decode helpers shared by the codec row kernels
 * (codec_avx2.c), the attention tile (attn_avx2.c) and the int4 store
 * (kv_store_int4.c): one fp8 decode, one bf16 decode and one in-vector
 * Walsh-Hadamard butterfly for all. Include only from files compiled for x86;
 * every function carries the AVX2 target attribute. */
#ifndef VTINFER_SIMD_AVX2_H
#define VTINFER_SIMD_AVX2_H

#include "vt_internal.h"

#if VT_X86
#include <immintrin.h>

#define VT256 VT_TARGET_AVX2 static inline __attribute__((always_inline))

/* 16 fp8 codes (bytes of c) to float32, exactly, in order: *a elements
 * 0-7, *b 8-15. Through the fp8 -> fp16 bit map and F16C: an e5m2 code is
 * fp16's top byte (inf and NaN included; F16C quietens a signalling NaN
 * as the scalar decoder does); an e4m3fn magnitude shifted left by 7 is
 * the fp16 of 2^-8 times its value (subnormals included), so the result
 * is multiplied by 2^8 (exact); its NaN (magnitude 0x7F) maps to fp16's
 * quiet NaN. The sign is kept for every code, NaN included. */
VT256 void vt256_fp8x16_to_f32(int e4m3, __m128i c, __m256 *a, __m256 *b) {
    __m256i w = _mm256_cvtepu8_epi16(c);
    __m256 f = _mm256_set1_ps(1.0f);
    if (!e4m3) {
        w = _mm256_slli_epi16(w, 8);
    } else {
        __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
        __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
        __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7F));
        w = _mm256_or_si256(_mm256_blendv_epi8(_mm256_slli_epi16(mag, 7), _mm256_set1_epi16(0x7E00), nan), sign);
        f = _mm256_set1_ps(256.0f);
    }
    *a = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(w)), f);
    *b = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(w, 1)), f);
}

/* 16 bf16 values (16-bit lanes of x) to float32, exactly, split by parity:
 * *even gets elements 0, 2, .., 14 and *odd 1, 3, .., 15. No shuffle. */
VT256 void vt256_bf16_split(__m256i x, __m256 *even, __m256 *odd) {
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* float32 bits rounded to bfloat16, nearest even, in the high 16 bits of each lane (the low 16 bits are left
 * over). A NaN is not quietened: a caller whose NaN may carry payload bits only below bit 16 tests for it. */
VT256 __m256i vt256_bf16_rne(__m256i u) {
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
}

/* Load 8 bf16 values as float32, in order, exactly. */
VT256 __m256 vt256_ld_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* The Walsh-Hadamard butterfly stages of strides 1, 2 and 4, the ones inside 8 lanes, as the scalar twin computes
 * them (vt_fwht_scalar). One stage, given q, each lane's partner (lane i ^ h): the lanes whose bit h is clear take
 * self + partner (a + c), the others partner - self (a - c). */
#define VT256_FWHT_STAGE(v, q, set_lanes) _mm256_blend_ps(_mm256_add_ps(v, q), _mm256_sub_ps(q, v), set_lanes)

VT256 __m256 vt256_fwht8(__m256 v) {
    v = VT256_FWHT_STAGE(v, _mm256_permute_ps(v, 0xB1), 0xAA);
    v = VT256_FWHT_STAGE(v, _mm256_permute_ps(v, 0x4E), 0xCC);
    return VT256_FWHT_STAGE(v, _mm256_permute2f128_ps(v, v, 0x01), 0xF0);
}

#endif /* VT_X86 */
#endif /* VTINFER_SIMD_AVX2_H */
