/* The AVX-512 attention tile's decoder table: one row per format an instance file reads, each row the
 * format's unit decoder and what the tile needs to know of its codes. A decode unit of 32 elements (64 for
 * fp8 by byte lookups) of a K or V row becomes 2 (4) float32 vectors, exactly. Included by
 * attn_avx512_tile.h after its target (T), inline (AI), CH and VT_TILE_VBMI macros; each tile instance takes
 * its row as a compile-time constant, so the row's fields fold into the instance (no call, no branch on the
 * format).
 *
 * bf16 splits a 32-bit lane into its even element (x << 16) and odd element (x & 0xffff0000), so a
 * 32-element chunk becomes two vectors (evens, odds); fp8 codes map through a 128-entry magnitude -> bf16
 * table (every e4m3fn / e5m2 value, subnormals, inf and NaN included, is a bf16 value) held in four
 * registers (vpermt2w), then take the bf16 path. With VBMI, fp8 decodes 64 codes at a time instead: the
 * same table as two 128-entry byte tables (low and high byte of each bf16 value) looked up by vpermi2b
 * (which reads the code's low 7 bits, its magnitude), the sign ORed into the high bytes, the bytes
 * interleaved into bf16 (unpack within 128-bit lanes) and split into float32: 9 vector ops per 64 codes
 * against 18.
 *
 * A new format read by this tile: its unit function, its row, and its line in VT_AVX512_DECODERS. */
#ifndef VTINFER_ATTN_DEC_AVX512_H
#define VTINFER_ATTN_DEC_AVX512_H

/* fp8's decode tables: the 16-bit one (simd_avx512.h, shared with the codec) and, with VBMI, the
 * same values as byte tables: lo0 / lo1 the low bytes of entries 0-63 / 64-127, hi0 / hi1 the high. */
typedef struct fp8tab {
    vt512_fp8tab w;
    __m512i lo0, lo1, hi0, hi1;
} fp8tab;

/* A decoder row (below): unit decodes unit c of a D-element row at `row` (elements past D read as 0) into
 * elems / 16 float32 vectors, in the order pos gives. */
typedef struct dec512 {
    void (*unit)(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]);
    int (*pos)(int e); /* the position, within its unit, that element e of the unit takes after decoding */
    int elems;         /* elements per decode unit: 32, or 64 (fp8 by byte lookups) */
    int bits;          /* bits per element */
    vt_dtype fp8;      /* the fp8 format whose decode table the unit reads; else float32 (no table) */
    int lookups;       /* the fp8 table also as byte tables (VBMI) */
    /* the decode outruns memory: a K row is prefetched beside each key's logit and the V rows before the
     * softmax, not both at the head's start (measured: speed.md, Results) */
    int prefetch_per_key;
} dec512;

T static AI fp8tab fp8_tables(const dec512 *dc) {
    fp8tab tb;
    tb.w = vt512_fp8_table(dc->fp8);
    tb.lo0 = tb.lo1 = tb.hi0 = tb.hi1 = _mm512_setzero_si512();
#if VT_TILE_VBMI
    if (dc->lookups) {
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

/* float32 and float16 keep their order; bf16 and fp8 (through bf16) split evens (lanes 0-15) from odds
 * (16-31). */
static inline int pos_natural(int e) { return e; }
static inline int pos_pairs(int e) { return (e & 1) * 16 + (e >> 1); }

/* fp8 by byte lookups (dec64): code e sits in 128-bit lane k = e / 16 at byte i = e % 16, its bf16 in the
 * low (i < 8) or high unpack at 16-bit lane 8 k + i % 8, whose parity picks the even or odd vector of that
 * unpack's split. */
static inline int pos_lookups(int e) {
    const int k = e >> 4, i = e & 15;
    return ((i >> 3) * 2 + (i & 1)) * 16 + ((8 * k + (i & 7)) >> 1);
}

/* Bytes of the c-th 64-code unit of a D-code row that hold codes. */
static inline __mmask64 unit_mask64(int D, int c) {
    int left = D - c * 64;
    return left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
}

T static AI void dec_f32(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]) {
    (void)tb;
    const __mmask32 m = vt512_chunk_mask(D, c);
    const uint8_t *src = row + (size_t)c * CH * 4;
    v[0] = _mm512_maskz_loadu_ps((__mmask16)m, src);
    v[1] = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), src + 64);
}

T static AI void dec_f16(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]) {
    (void)tb;
    const __m512i x = _mm512_maskz_loadu_epi16(vt512_chunk_mask(D, c), row + (size_t)c * CH * 2);
    v[0] = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    v[1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
}

T static AI void dec_bf16(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]) {
    (void)tb;
    vt512_bf16_split(_mm512_maskz_loadu_epi16(vt512_chunk_mask(D, c), row + (size_t)c * CH * 2), &v[0], &v[1]);
}

/* fp8 codes through the 16-bit table into bf16 */
T static AI void dec_fp8(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]) {
    const __m256i x = _mm256_maskz_loadu_epi8(vt512_chunk_mask(D, c), row + (size_t)c * CH);
    vt512_bf16_split(vt512_fp8_to_bf16(_mm512_cvtepu8_epi16(x), &tb->w), &v[0], &v[1]);
}

#if VT_TILE_VBMI
/* Decode the 64 fp8 codes of unit c (bytes past D read as code 0, i.e. +0) into four float32 vectors,
 * exactly, in pos_lookups order: vpermi2b looks the low and the high byte of each code's bf16 value up by
 * its low 7 bits (the magnitude; bit 7 is not an index bit), the code's sign goes to the high byte's bit 7,
 * and the two byte vectors interleave into bf16. */
T static AI void dec64(const uint8_t *row, int c, int D, const fp8tab *tb, __m512 v[4]) {
    const __m512i x = _mm512_maskz_loadu_epi8(unit_mask64(D, c), row + (size_t)c * 64);
    const __m512i lo = _mm512_permutex2var_epi8(tb->lo0, x, tb->lo1);
    __m512i hi = _mm512_permutex2var_epi8(tb->hi0, x, tb->hi1);
    hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (x & 0x80) */
    vt512_bf16_split(_mm512_unpacklo_epi8(lo, hi), &v[0], &v[1]);
    vt512_bf16_split(_mm512_unpackhi_epi8(lo, hi), &v[2], &v[3]);
}

static const dec512 DEC_E4M3_LOOKUP = {.unit = dec64, .pos = pos_lookups, .elems = 64, .bits = 8,
                                       .fp8 = VT_DTYPE_FP8_E4M3, .lookups = 1, .prefetch_per_key = 1};
static const dec512 DEC_E5M2_LOOKUP = {.unit = dec64, .pos = pos_lookups, .elems = 64, .bits = 8,
                                       .fp8 = VT_DTYPE_FP8_E5M2, .lookups = 1, .prefetch_per_key = 1};

/* The formats an instance file reads: X(format, its decoder row, per-token-head scales). The tile makes one
 * instance per line and the file's entries of the (ISA x format) kernel table from them. With VBMI: the
 * fp8-decoded formats. */
#define VT_AVX512_DECODERS(X)                                                                                  \
    X(FP8_E4M3, DEC_E4M3_LOOKUP, 0)                                                                            \
    X(FP8_E5M2, DEC_E5M2_LOOKUP, 0)                                                                            \
    X(FP8_PTH, DEC_E4M3_LOOKUP, 1)
#else
static const dec512 DEC_F32 = {.unit = dec_f32, .pos = pos_natural, .elems = CH, .bits = 32, .prefetch_per_key = 1};
static const dec512 DEC_F16 = {.unit = dec_f16, .pos = pos_natural, .elems = CH, .bits = 16, .prefetch_per_key = 1};
static const dec512 DEC_BF16 = {.unit = dec_bf16, .pos = pos_pairs, .elems = CH, .bits = 16, .prefetch_per_key = 1};
static const dec512 DEC_E4M3 = {.unit = dec_fp8, .pos = pos_pairs, .elems = CH, .bits = 8, .fp8 = VT_DTYPE_FP8_E4M3};
static const dec512 DEC_E5M2 = {.unit = dec_fp8, .pos = pos_pairs, .elems = CH, .bits = 8, .fp8 = VT_DTYPE_FP8_E5M2};

/* Without VBMI: the float and per-tensor fp8 formats (cpu.c gives the per-token-head ones the AVX2
 * instances). */
#define VT_AVX512_DECODERS(X)                                                                                  \
    X(F32, DEC_F32, 0)                                                                                         \
    X(F16, DEC_F16, 0)                                                                                         \
    X(BF16, DEC_BF16, 0)                                                                                       \
    X(FP8_E4M3, DEC_E4M3, 0)                                                                                   \
    X(FP8_E5M2, DEC_E5M2, 0)
#endif

#endif /* VTINFER_ATTN_DEC_AVX512_H */
