/* The AVX-512 attention tile's chunk decoders, one per format: a chunk of CH = 32 elements (64 for fp8 by
 * byte lookups) of a K or V row becomes float32 vectors, exactly. Included by attn_avx512_tile.h after its
 * target (T), inline (AI), CH and VT_TILE_VBMI macros; each tile instance passes its format as a constant,
 * so the format branches fold away.
 *
 * bf16 splits a 32-bit lane into its even element (x << 16) and odd element (x & 0xffff0000), so a
 * 32-element chunk becomes two vectors (evens, odds); fp8 codes map through a 128-entry magnitude -> bf16
 * table (every e4m3fn / e5m2 value, subnormals, inf and NaN included, is a bf16 value) held in four
 * registers (vpermt2w), then take the bf16 path. With VBMI, fp8 decodes 64 codes at a time instead: the
 * same table as two 128-entry byte tables (low and high byte of each bf16 value) looked up by vpermi2b
 * (which reads the code's low 7 bits, its magnitude), the sign ORed into the high bytes, the bytes
 * interleaved into bf16 (unpack within 128-bit lanes) and split into float32: 9 vector ops per 64 codes
 * against 18. */
#ifndef VTINFER_ATTN_DEC_AVX512_H
#define VTINFER_ATTN_DEC_AVX512_H

/* fp8's decode tables: the 16-bit one (simd_avx512.h, shared with the codec) and, with VBMI, the
 * same values as byte tables: lo0 / lo1 the low bytes of entries 0-63 / 64-127, hi0 / hi1 the high. */
typedef struct fp8tab {
    vt512_fp8tab w;
    __m512i lo0, lo1, hi0, hi1;
} fp8tab;

/* 1 where dt's codes decode 64 at a time by byte lookups: the VBMI instance, which holds the fp8 tiles only. */
#define VB(dt) ((void)(dt), VT_TILE_VBMI)

/* Elements of a decode unit: the chunk (32) or, for byte lookups, 64. */
#define UNIT(dt) (VB(dt) ? 64 : CH)

T static AI fp8tab fp8_tables(vt_dtype dt) {
    fp8tab tb;
    tb.w = vt512_fp8_table(dt);
    tb.lo0 = tb.lo1 = tb.hi0 = tb.hi1 = _mm512_setzero_si512();
#if VT_TILE_VBMI
    if (VB(dt)) {
#define BYTES(a, b) _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)), _mm512_cvtepi16_epi8(b), 1)
        tb.lo0 = BYTES(tb.w.t0, tb.w.t1);
        tb.lo1 = BYTES(tb.w.t2, tb.w.t3);
        tb.hi0 = BYTES(_mm512_srli_epi16(tb.w.t0, 8), _mm512_srli_epi16(tb.w.t1, 8));
        tb.hi1 = BYTES(_mm512_srli_epi16(tb.w.t2, 8), _mm512_srli_epi16(tb.w.t3, 8));
#undef BYTES
    }
#endif
    return tb;
}

/* Position, within its decode unit (UNIT(dt) elements), that element e of the unit takes after
 * decoding: bf16 and fp8 split evens (lanes 0-15) from odds (16-31); float32 and float16 keep
 * their order; fp8 by byte lookups (dec64): code e sits in 128-bit lane k = e / 16 at byte
 * i = e % 16, its bf16 in the low (i < 8) or high unpack at 16-bit lane 8 k + i % 8, whose
 * parity picks the even or odd vector of that unpack's split. */
static inline int chunk_pos(vt_dtype dt, int e) {
    if (VB(dt)) {
        const int k = e >> 4, i = e & 15;
        return ((i >> 3) * 2 + (i & 1)) * 16 + ((8 * k + (i & 7)) >> 1);
    }
    if (dt == VT_DTYPE_F32 || dt == VT_DTYPE_F16) return e;
    return (e & 1) * 16 + (e >> 1);
}

/* Bytes of the c-th 64-code unit of a D-code row that hold codes. */
static inline __mmask64 unit_mask64(int D, int c) {
    int left = D - c * 64;
    return left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
}

#if VT_TILE_VBMI
/* Decode the 64 fp8 codes at src (bytes outside m read as code 0, i.e. +0) into four float32
 * vectors, exactly, in chunk_pos order: vpermi2b looks the low and the high byte of each code's
 * bf16 value up by its low 7 bits (the magnitude; bit 7 is not an index bit), the code's sign
 * goes to the high byte's bit 7, and the two byte vectors interleave into bf16. */
T static AI void dec64(const uint8_t *src, __mmask64 m, const fp8tab *tb, __m512 v[4]) {
    const __m512i c = _mm512_maskz_loadu_epi8(m, src);
    const __m512i lo = _mm512_permutex2var_epi8(tb->lo0, c, tb->lo1);
    __m512i hi = _mm512_permutex2var_epi8(tb->hi0, c, tb->hi1);
    hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (c & 0x80) */
    vt512_bf16_split(_mm512_unpacklo_epi8(lo, hi), &v[0], &v[1]);
    vt512_bf16_split(_mm512_unpackhi_epi8(lo, hi), &v[2], &v[3]);
}
#endif

/* Decode the 32-element chunk at src (elements past `m` read as 0) into
 * two float32 vectors, exactly, in chunk_pos order. */
T static AI void dec32(vt_dtype dt, const uint8_t *src, __mmask32 m, const fp8tab *tb, __m512 *a, __m512 *b) {
    __m512i x;
    if (dt == VT_DTYPE_F32) {
        *a = _mm512_maskz_loadu_ps((__mmask16)m, src);
        *b = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), src + 64);
        return;
    }
    if (dt == VT_DTYPE_F16) {
        x = _mm512_maskz_loadu_epi16(m, src);
        *a = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
        *b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
        return;
    }
    if (dt == VT_DTYPE_BF16) x = _mm512_maskz_loadu_epi16(m, src);
    else x = vt512_fp8_to_bf16(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, src)), &tb->w);
    vt512_bf16_split(x, a, b);
}

#endif /* VTINFER_ATTN_DEC_AVX512_H */
