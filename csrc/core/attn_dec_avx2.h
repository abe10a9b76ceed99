/* The AVX2 attention tile's decoder table: one row per format it reads, each row the format's chunk
 * decoder and what the tile needs to know of its codes. A chunk of CH = 16 elements of a K or V row
 * becomes two float32 vectors, exactly. Included by attn_avx2.c after its target (T), inline (AI) and CH
 * macros; each tile instance takes its row as a compile-time constant, so the row's fields fold into the
 * instance (no call, no branch on the format).
 *
 * bf16 splits a 32-bit lane into its even element (x << 16) and odd element (x & 0xffff0000), so q rows and
 * accumulators are kept in that even / odd order (`pairs`, chunk_pos); fp8 goes through the fp8 -> fp16 bit
 * map (e5m2 is fp16's top byte; e4m3's magnitude shifted by 7 is fp16 at 2^-8 of the value, NaN mapped to
 * fp16 NaN) and F16C; the 2^8 (`unit`) goes once on each logit and on the accumulators at the end (exact: a
 * power of two; a product below float32's normal range is the only place it can differ). int4_per_token_head:
 * a chunk is 8 bytes of codes whose low nibbles (the even elements) and high nibbles (the odd ones) become
 * float32 minus the key's zero point, in bf16's even / odd order. AVX2 has no byte-masked loads: a row's last
 * partial chunk is copied to a zero-padded buffer first.
 *
 * A new format read by this tile: its chunk function, its row, and its line in VT_AVX2_DECODERS. */
#ifndef VTINFER_ATTN_DEC_AVX2_H
#define VTINFER_ATTN_DEC_AVX2_H

/* A whole chunk at src as two float32 vectors in chunk_pos order; zp: the key's zero point, where the
 * row's codes have one (zero_point), else unused. */
typedef void (*dec256_chunk_fn)(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b);

typedef struct dec256 {
    dec256_chunk_fn chunk;
    /* The row for blocks whose K and V rows hold no NaN code (rows_finite says so), where that decodes in
     * fewer operations; NULL: none. */
    const struct dec256 *finite;
    int (*rows_finite)(const uint8_t *const *k, const uint8_t *const *v, int n, int D);
    int bits;       /* bits per element: a chunk is CH * bits / 8 bytes */
    int pairs;      /* 1: a chunk decodes to its even elements, then its odd ones */
    float unit;     /* a decoded 1 is worth 1 / unit (e4m3: 2^-8), undone on the logits and the accumulators */
    int zero_point; /* codes minus a per-key zero point, which the key's stored scale carries (int4) */
    int rotated;    /* keys in a rotated space: q rotated once, accumulators rotated back (int4) */
} dec256;

static inline int chunk_pos(const dec256 *dc, int e) { return dc->pairs ? (e & 1) * 8 + (e >> 1) : e; }

T static AI void dec_f32(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    *a = _mm256_loadu_ps((const float *)src);
    *b = _mm256_loadu_ps((const float *)src + 8);
}

T static AI void dec_f16(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    *a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
    *b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16)));
}

T static AI void dec_bf16(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    vt256_bf16_split(_mm256_loadu_si256((const __m256i *)src), a, b);
}

/* int8 codes, sign-extended, natural order */
T static AI void dec_int8(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    const __m128i x = _mm_loadu_si128((const __m128i *)src);
    *a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
    *b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
}

/* e5m2 is fp16's top byte */
T static AI void dec_e5m2(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)src)), 8);
    *a = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
    *b = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

/* e4m3 at 2^-8 of its value: sign to bit 15, magnitude to bits 7..13 (sign-extended, the code shifted by 7
 * has its sign in bits 14 and 15: bit 14 is cleared); with nan, code magnitude 0x7F to fp16 NaN. */
T static AI void e4m3_chunk(const uint8_t *src, const int nan, __m256 *a, __m256 *b) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    __m256i w = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16((short)0xBFFF));
    if (nan)
        w = _mm256_or_si256(w, _mm256_cmpeq_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F)));
    *a = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
    *b = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

T static AI void dec_e4m3(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    e4m3_chunk(src, 1, a, b);
}

T static AI void dec_e4m3_finite(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    (void)zp;
    e4m3_chunk(src, 0, a, b);
}

/* 1 when none of the n K rows k[j] and V rows v[j] (D e4m3 codes each) holds a NaN code (magnitude 0x7F):
 * their chunks may then go through dec_e4m3_finite. The largest magnitude byte of the rows, in two vector ops
 * per 32 codes; the test it saves costs three per 16. */
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

/* 16 int4 codes (8 bytes: element 2i in byte i's low nibble, 2i + 1 in its high one) minus the
 * zero point zp, as evens (a) and odds (b). */
T static AI void dec_int4(const uint8_t *src, __m256 zp, __m256 *a, __m256 *b) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)src));
    *a = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xF))), zp);
    *b = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 4)), zp);
}

static const dec256 DEC_F32 = {.chunk = dec_f32, .bits = 32, .unit = 1.0f};
static const dec256 DEC_F16 = {.chunk = dec_f16, .bits = 16, .unit = 1.0f};
static const dec256 DEC_BF16 = {.chunk = dec_bf16, .bits = 16, .pairs = 1, .unit = 1.0f};
static const dec256 DEC_INT8 = {.chunk = dec_int8, .bits = 8, .unit = 1.0f};
static const dec256 DEC_E5M2 = {.chunk = dec_e5m2, .bits = 8, .unit = 1.0f};
static const dec256 DEC_E4M3_FINITE = {.chunk = dec_e4m3_finite, .bits = 8, .unit = 256.0f};
static const dec256 DEC_E4M3 = {.chunk = dec_e4m3, .finite = &DEC_E4M3_FINITE, .rows_finite = e4m3_rows_finite,
                                .bits = 8, .unit = 256.0f};
static const dec256 DEC_INT4 = {.chunk = dec_int4, .bits = 4, .pairs = 1, .unit = 1.0f, .zero_point = 1,
                                .rotated = 1};

/* The formats this tile reads: X(format, its decoder row, per-token-head scales). attn_avx2.c makes one tile
 * instance per line and this ISA's entries of the (ISA x format) kernel table from them. */
#define VT_AVX2_DECODERS(X)                                                                                     \
    X(F32, DEC_F32, 0)                                                                                          \
    X(F16, DEC_F16, 0)                                                                                          \
    X(BF16, DEC_BF16, 0)                                                                                        \
    X(FP8_E4M3, DEC_E4M3, 0)                                                                                    \
    X(FP8_E5M2, DEC_E5M2, 0)                                                                                    \
    X(INT8_PTH, DEC_INT8, 1)                                                                                    \
    X(FP8_PTH, DEC_E4M3, 1)                                                                                     \
    X(INT4_PTH, DEC_INT4, 1)

/* Chunk c of a row, known to be whole. */
T static AI void dec_whole(const dec256 *dc, const uint8_t *row, int c, float zp, __m256 *a, __m256 *b) {
    dc->chunk(row + (size_t)c * CH * dc->bits / 8, _mm256_set1_ps(zp), a, b);
}

/* Chunk c of a D-element row: in place when whole, else through a zero-padded copy (codes with a zero
 * point: lanes past the row then hold -zp, where q is 0). */
T static AI void dec_chunk(const dec256 *dc, const uint8_t *row, int c, int D, float zp, __m256 *a, __m256 *b) {
    if ((c + 1) * CH <= D) {
        dec_whole(dc, row, c, zp, a, b);
    } else {
        uint8_t pad[CH * 4] = {0};
        memcpy(pad, row + (size_t)c * CH * dc->bits / 8, (size_t)(D - c * CH) * dc->bits / 8);
        dc->chunk(pad, _mm256_set1_ps(zp), a, b);
    }
}

/* Rows [0, nk) of src decoded in chunk_pos order into buf, Dp floats each (a last partial chunk as dec_chunk
 * pads it). */
T static AI void dec_rows(const dec256 *dc, const uint8_t *const *src, const float *zp, int nk, int NC, int D, int Dp,
                          float *buf) {
    for (int jj = 0; jj < nk; jj++)
        for (int c = 0; c < NC; c++) {
            __m256 a, b;
            if (c + 1 < NC) dec_whole(dc, src[jj], c, zp[jj], &a, &b);
            else dec_chunk(dc, src[jj], c, D, zp[jj], &a, &b);
            _mm256_storeu_ps(buf + (size_t)jj * Dp + c * CH, a);
            _mm256_storeu_ps(buf + (size_t)jj * Dp + c * CH + 8, b);
        }
}

#endif /* VTINFER_ATTN_DEC_AVX2_H */
