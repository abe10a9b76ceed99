/* The AVX2 attention tile's chunk decoders, one per format: a chunk of CH = 16 elements of a K or V row
 * becomes two float32 vectors, exactly. Included by attn_avx2.c after its target (T), inline (AI) and CH
 * macros; each tile instance passes its format as a constant, so the format branches fold away.
 *
 * bf16 splits a 32-bit lane into its even element (x << 16) and odd element (x & 0xffff0000), so q rows and
 * accumulators are kept in that even / odd order (chunk_pos); fp8 goes through the fp8 -> fp16 bit map (e5m2
 * is fp16's top byte; e4m3's magnitude shifted by 7 is fp16 at 2^-8 of the value, NaN mapped to fp16 NaN)
 * and F16C; the 2^8 (dec_unit) goes once on each logit and on the accumulators at the end (exact: a power of
 * two; a product below float32's normal range is the only place it can differ). int4_per_token_head: a
 * chunk is 8 bytes of codes whose low nibbles (the even elements) and high nibbles (the odd ones) become
 * float32 minus the key's zero point, in bf16's even / odd order. AVX2 has no byte-masked loads: a row's
 * last partial chunk is copied to a zero-padded buffer first. */
#ifndef VTINFER_ATTN_DEC_AVX2_H
#define VTINFER_ATTN_DEC_AVX2_H

/* The e4m3 decoder for chunks known to hold no NaN code (e4m3_rows_finite): dec16 without its NaN test. A
 * decoder, never a format: the tile passes it where it decodes, its own dt everywhere else. */
#define E4M3_FINITE ((vt_dtype)VT_DTYPE_COUNT)

static inline int chunk_pos(const vt_dtype dt, int e) {
    if (dt == VT_DTYPE_BF16 || dt == VT_DTYPE_INT4_PTH) return (e & 1) * 8 + (e >> 1);
    return e;
}

/* Decode the full 16-element chunk at src into two float32 vectors, in
 * chunk_pos order, exactly. */
T static AI void dec16(const vt_dtype dt, const uint8_t *src, __m256 *a, __m256 *b) {
    if (dt == VT_DTYPE_F32) {
        *a = _mm256_loadu_ps((const float *)src);
        *b = _mm256_loadu_ps((const float *)src + 8);
    } else if (dt == VT_DTYPE_F16) {
        *a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
        *b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16)));
    } else if (dt == VT_DTYPE_BF16) {
        vt256_bf16_split(_mm256_loadu_si256((const __m256i *)src), a, b);
    } else if (dt == VT_DTYPE_INT8_PTH) { /* int8 codes, sign-extended, natural order */
        __m128i x = _mm_loadu_si128((const __m128i *)src);
        *a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
        *b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
    } else if (dt == VT_DTYPE_FP8_E5M2) { /* e5m2 is fp16's top byte */
        const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src)), 8);
        *a = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
        *b = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
    } else { /* e4m3 at 2^-8 of its value (dec_unit): sign to bit 15, magnitude to bits 7..13; NaN to NaN.
              * Sign-extended, the code shifted by 7 has its sign in bits 14 and 15: bit 14 is cleared. */
        const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
        __m256i w = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16((short)0xBFFF));
        if (dt != E4M3_FINITE)
            w = _mm256_or_si256(w, _mm256_cmpeq_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F)));
        *a = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
        *b = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
    }
}

/* 1 when none of the n K rows k[j] and V rows v[j] (D e4m3 codes each) holds a NaN code (magnitude 0x7F):
 * their chunks may then go through E4M3_FINITE. The largest magnitude byte of the rows, in two vector ops per
 * 32 codes; the test it saves costs three per 16. */
T static AI int e4m3_rows_finite(const uint8_t *const *k, const uint8_t *const *v, int n, int D) {
    const __m256i mag = _mm256_set1_epi8(0x7F);
    __m256i mx = _mm256_setzero_si256();
    int tail = 0;
    for (int j = 0; j < 2 * n; j++) {
        const uint8_t *row = j < n ? k[j] : v[j - n];
        int d = 0;
        for (; d + 32 <= D; d += 32)
            mx = _mm256_max_epu8(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(row + d)), mag));
        for (; d < D; d++) tail |= (row[d] & 0x7F) == 0x7F;
    }
    return !tail && _mm256_movemask_epi8(_mm256_cmpeq_epi8(mx, mag)) == 0;
}

/* What a decoded element of dt is worth, in decoded units: e4m3 decodes to 2^-8 of its value (the
 * fp16 bit map), undone once on each logit and on the accumulators, exactly (powers of two). */
static inline float dec_unit(const vt_dtype dt) { return dt == VT_DTYPE_FP8_E4M3 ? 256.0f : 1.0f; }

/* 16 int4 codes (8 bytes: element 2i in byte i's low nibble, 2i + 1 in its high one) minus the
 * zero point zp, as evens (a) and odds (b). */
T static AI void dec16_i4(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)src));
    *a = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xF))), zp);
    *b = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4)), zp);
}

/* Chunk c of a row, known to be whole. */
T static AI void dec_whole(const vt_dtype dt, const uint8_t *row, int c, int esz, float zp, __m256 *a, __m256 *b) {
    if (dt == VT_DTYPE_INT4_PTH) dec16_i4(row + (size_t)c * CH / 2, _mm256_set1_ps(zp), a, b);
    else dec16(dt, row + (size_t)c * CH * esz, a, b);
}

/* Chunk c of a row: in place when whole, else through a zero-padded copy (int4: its codes minus
 * the zero point zp; lanes past the row then hold -zp, where q is 0). */
T static AI void dec_chunk(const vt_dtype dt, const uint8_t *row, int c, int D, int esz, float zp, __m256 *a, __m256 *b) {
    if (dt == VT_DTYPE_INT4_PTH) {
        if ((c + 1) * CH <= D) {
            dec16_i4(row + (size_t)c * CH / 2, _mm256_set1_ps(zp), a, b);
        } else {
            uint8_t pad[CH / 2] = {0};
            memcpy(pad, row + (size_t)c * CH / 2, (size_t)(D - c * CH) / 2);
            dec16_i4(pad, _mm256_set1_ps(zp), a, b);
        }
        return;
    }
    if ((c + 1) * CH <= D) {
        dec16(dt, row + (size_t)c * CH * esz, a, b);
    } else {
        uint8_t pad[CH * 4] = {0};
        memcpy(pad, row + (size_t)c * CH * esz, (size_t)(D - c * CH) * esz);
        dec16(dt, pad, a, b);
    }
}

/* Rows [0, nk) of src decoded in chunk_pos order into buf, Dp floats each (a last partial chunk as dec_chunk
 * pads it). */
T static AI void dec_rows(const vt_dtype dt, const uint8_t *const *src, const float *zp, int nk, int NC, int D, int Dp,
                          int esz, float *buf) {
    for (int jj = 0; jj < nk; jj++)
        for (int c = 0; c < NC; c++) {
            __m256 a, b;
            if (c + 1 < NC) dec_whole(dt, src[jj], c, esz, zp[jj], &a, &b);
            else dec_chunk(dt, src[jj], c, D, esz, zp[jj], &a, &b);
            _mm256_storeu_ps(buf + (size_t)jj * Dp + c * CH, a);
            _mm256_storeu_ps(buf + (size_t)jj * Dp + c * CH + 8, b);
        }
}

#endif /* VTINFER_ATTN_DEC_AVX2_H */
