/* Scalar codecs: the reference twins of every SIMD codec kernel.
 *
 * Encoding is done on the float32 bit pattern with integer arithmetic, so
 * the result does not depend on the floating-point environment (rounding
 * mode, FTZ/DAZ). See vtinfer/codec.h for the semantics. */
#include <math.h>
#include <pthread.h>

#include "vt_internal.h"

/* Geometry of a small float format, for the shared encoder below. */
typedef struct fp_format {
    int mbits;          /* stored mantissa bits */
    int emin;           /* exponent of the smallest normal number */
    uint32_t max_bits;  /* float32 bits of the largest finite value */
    uint32_t max_code;  /* its code, sign excluded */
} fp_format;

static const fp_format FMT_E4M3 = {3, -6, 0x43E00000u, 0x7Eu};   /* 448 */
static const fp_format FMT_E5M2 = {2, -14, 0x47600000u, 0x7Bu};  /* 57344 */

/* Round the magnitude bits `a` (finite, < max) of a float32 to the format:
 * nearest, ties to even, subnormals on the format's fixed grid. Returns the
 * code without the sign. Shared by the fp8 encoders. */
static uint32_t encode_magnitude(uint32_t a, const fp_format *f) {
    int e = (int)(a >> 23) - 127;
    if (e >= f->emin) {
        int drop = 23 - f->mbits;
        uint32_t r = (a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop;
        uint32_t code = r - ((uint32_t)(127 - (1 - f->emin)) << f->mbits);
        return code > f->max_code ? f->max_code : code;
    }
    if ((a >> 23) == 0) return 0; /* float32 zero or subnormal: below half the grid step */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    int shift = 23 + f->emin - f->mbits - e;
    if (shift > 24) return 0;
    return (m + ((1u << (shift - 1)) - 1u) + ((m >> shift) & 1u)) >> shift;
}

static uint8_t encode_fp8(float x, const fp_format *f) {
    uint32_t u = vt_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7F; /* NaN: canonical, sign dropped (as CUDA does) */
    if (a >= f->max_bits) return (uint8_t)(sign | f->max_code);
    return (uint8_t)(sign | encode_magnitude(a, f));
}

uint8_t vt_fp8_e4m3_from_f32(float x) { return encode_fp8(x, &FMT_E4M3); }
uint8_t vt_fp8_e5m2_from_f32(float x) { return encode_fp8(x, &FMT_E5M2); }

float vt_f32_round_e4m3fn(float x) {
    /* up to 464 (the midpoint of 448 and the NaN code's 480, a tie to the even 448) the saturating encoder
     * rounds as the cast does; past it the cast rounds to the NaN code */
    if ((vt_f32_bits(x) & 0x7FFFFFFFu) > 0x43E80000u) return vt_bits_f32(0x7FC00000u);
    return vt_fp8_e4m3_to_f32(vt_fp8_e4m3_from_f32(x));
}

float vt_fp8_e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    if (e == 15 && m == 7) return vt_bits_f32(sign | 0x7FC00000u);
    if (e == 0) return vt_bits_f32(sign | vt_f32_bits((float)m * 0x1p-9f));
    return vt_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

float vt_fp8_e5m2_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t e = (c >> 2) & 0x1Fu, m = c & 3u;
    if (e == 31) return vt_bits_f32(sign | 0x7F800000u | (m ? 0x400000u | (m << 21) : 0u));
    if (e == 0) return vt_bits_f32(sign | vt_f32_bits((float)m * 0x1p-16f));
    return vt_bits_f32(sign | ((e + 112u) << 23) | (m << 21));
}

uint16_t vt_bf16_from_f32(float x) {
    uint32_t u = vt_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float vt_bf16_to_f32(uint16_t h) { return vt_bits_f32((uint32_t)h << 16); }

uint16_t vt_f16_from_f32(float x) {
    static const fp_format FMT_F16 = {10, -14, 0x477FE000u, 0x7BFFu}; /* 65504 */
    uint32_t u = vt_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    if (a >= FMT_F16.max_bits) return (uint16_t)(sign | FMT_F16.max_code);
    return (uint16_t)(sign | encode_magnitude(a, &FMT_F16));
}

float vt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31) return vt_bits_f32(sign | 0x7F800000u | (m ? 0x400000u | (m << 13) : 0u)); /* NaN quietened */
    if (e == 0) return vt_bits_f32(sign | vt_f32_bits((float)m * 0x1p-24f));
    return vt_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- decode tables ---- */

static float table_e4m3[256], table_e5m2[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (int c = 0; c < 256; c++) {
        table_e4m3[c] = vt_fp8_e4m3_to_f32((uint8_t)c);
        table_e5m2[c] = vt_fp8_e5m2_to_f32((uint8_t)c);
    }
}

const float *vt_fp8_decode_table(vt_dtype fmt) {
    pthread_once(&tables_once, build_tables);
    if (fmt == VT_DTYPE_FP8_E4M3) return table_e4m3;
    if (fmt == VT_DTYPE_FP8_E5M2) return table_e5m2;
    return NULL;
}

/* ---- scalar row kernels ---- */

static inline float load_f32(const void *p, size_t i) { return ((const float *)p)[i]; }
static inline float load_f16(const void *p, size_t i) { return vt_f16_to_f32(((const uint16_t *)p)[i]); }
static inline float load_bf16(const void *p, size_t i) { return vt_bf16_to_f32(((const uint16_t *)p)[i]); }

#define QUANT_ROW(NAME, LOAD, ENC)                                               \
    static void NAME(const void *src, uint8_t *dst, size_t n, float scale) {     \
        for (size_t i = 0; i < n; i++) dst[i] = ENC(LOAD(src, i) / scale);       \
    }
/* One fp8 format's quantizers from each float input. */
#define QUANT_ROWS(FMT, ENC)                           \
    QUANT_ROW(quant_f32_##FMT, load_f32, ENC)          \
    QUANT_ROW(quant_f16_##FMT, load_f16, ENC)          \
    QUANT_ROW(quant_bf16_##FMT, load_bf16, ENC)
QUANT_ROWS(e4m3, vt_fp8_e4m3_from_f32)
QUANT_ROWS(e5m2, vt_fp8_e5m2_from_f32)

static inline void store_f32(void *p, size_t i, float v) { ((float *)p)[i] = v; }
static inline void store_f16(void *p, size_t i, float v) { ((uint16_t *)p)[i] = vt_f16_from_f32(v); }
static inline void store_bf16(void *p, size_t i, float v) { ((uint16_t *)p)[i] = vt_bf16_from_f32(v); }

#define DEQUANT_ROW(NAME, TABLE, STORE)                                           \
    static void NAME(const uint8_t *src, void *dst, size_t n, float scale) {      \
        const float *t = vt_fp8_decode_table(TABLE);                              \
        for (size_t i = 0; i < n; i++) STORE(dst, i, t[src[i]] * scale);          \
    }
/* One fp8 format's dequantizers to each float output. */
#define DEQUANT_ROWS(FMT, TABLE)                          \
    DEQUANT_ROW(dequant_##FMT##_f32, TABLE, store_f32)    \
    DEQUANT_ROW(dequant_##FMT##_f16, TABLE, store_f16)    \
    DEQUANT_ROW(dequant_##FMT##_bf16, TABLE, store_bf16)
DEQUANT_ROWS(e4m3, VT_DTYPE_FP8_E4M3)
DEQUANT_ROWS(e5m2, VT_DTYPE_FP8_E5M2)

#define CONVERT_ROW(NAME, LOAD, STORE)                                \
    static void NAME(const void *src, void *dst, size_t n) {         \
        for (size_t i = 0; i < n; i++) STORE(dst, i, LOAD(src, i));  \
    }
CONVERT_ROW(convert_f32_f16, load_f32, store_f16)
CONVERT_ROW(convert_f32_bf16, load_f32, store_bf16)
CONVERT_ROW(convert_f16_f32, load_f16, store_f32)
CONVERT_ROW(convert_f16_bf16, load_f16, store_bf16)
CONVERT_ROW(convert_bf16_f32, load_bf16, store_f32)
CONVERT_ROW(convert_bf16_f16, load_bf16, store_f16)

void vt_copy_4(const void *src, void *dst, size_t n) { memcpy(dst, src, n * 4); }
void vt_copy_2(const void *src, void *dst, size_t n) { memcpy(dst, src, n * 2); }

/* vt_fwht_row_fn (codec.h): the twin of the SIMD rotations. Each stage's butterflies are independent, so stages
 * 1 and 2 run together on each group of four and the wider stages as contiguous runs the compiler vectorizes: the same operations on the same values as stage by stage. */
static void fwht_scalar(float *x, size_t d, size_t b, int normalize) {
    const float norm = (float)(1.0 / sqrt((double)b));
    for (size_t o = 0; o < d; o += b) {
        float *y = x + o;
        size_t h = 1;
        if (b >= 4) {
            for (size_t i = 0; i < b; i += 4) {
                const float s0 = y[i] + y[i + 1], d0 = y[i] - y[i + 1];
                const float s1 = y[i + 2] + y[i + 3], d1 = y[i + 2] - y[i + 3];
                y[i] = s0 + s1, y[i + 1] = d0 + d1, y[i + 2] = s0 - s1, y[i + 3] = d0 - d1;
            }
            h = 4;
        }
        for (; h < b; h *= 2)
            for (size_t i = 0; i < b; i += 2 * h) {
                float *lo = y + i, *hi = y + i + h;
                for (size_t j = 0; j < h; j++) {
                    const float a = lo[j], c = hi[j];
                    lo[j] = a + c;
                    hi[j] = a - c;
                }
            }
        if (normalize)
            for (size_t i = 0; i < b; i++) y[i] *= norm;
    }
}

void vt_fwht_scalar(float *x, size_t d, size_t b) { fwht_scalar(x, d, b, 1); }
void vt_fwht_raw_scalar(float *x, size_t d, size_t b) { fwht_scalar(x, d, b, 0); }

/* vt_levels4_row_fn / vt_levels3_row_fn / vt_packed3_row_fn / vt_nibbles_row_fn (codec.h): the twins of the SIMD lookups, plain scalar loops under GCC
 * (no-tree-vectorize): its -O3 vectorization of the lookups into SSE2 lane extracts and inserts measured 1.3x
 * slower than the scalar loop. */
#if defined(__GNUC__) && !defined(__clang__)
#define SCALAR_LOOPS __attribute__((optimize("no-tree-vectorize")))
#else
#define SCALAR_LOOPS
#endif

SCALAR_LOOPS void vt_levels4_scalar(const uint8_t *src, size_t n, const float *levels, float *out) {
    for (size_t w = 0; w < n / 8; w++)
        for (int j = 0; j < 4; j++) {
            const unsigned b = src[4 * w + j];
            out[8 * w + j] = levels[b & 15u];
            out[8 * w + 4 + j] = levels[b >> 4];
        }
}

SCALAR_LOOPS void vt_levels3_scalar(const uint8_t *lo, const uint8_t *hi, size_t n, const float *levels, float *out) {
    for (size_t w = 0; w < n / 32; w++)
        for (int j = 0; j < 4; j++) {
            const unsigned b = lo[8 * w + j] | (unsigned)lo[8 * w + 4 + j] << 8, h = hi[4 * w + j];
            for (int i = 0; i < 8; i++) out[32 * w + 4 * i + j] = levels[(b >> (2 * i) & 3u) | (h >> i & 1u) << 2];
        }
}

SCALAR_LOOPS void vt_packed3_scalar(const uint8_t *src, size_t n, const float *levels, float *out) {
    for (size_t g = 0; g < n / 8; g++) {
        const uint32_t w = src[3 * g] | (uint32_t)src[3 * g + 1] << 8 | (uint32_t)src[3 * g + 2] << 16;
        for (int e = 0; e < 8; e++) out[8 * g + e] = levels[w >> (3 * e) & 7u];
    }
}

SCALAR_LOOPS void vt_nibbles_scalar(const uint8_t *src, size_t n, const float *levels, const float *scales,
                                    size_t group, float *out) {
    for (size_t i = 0; i < n; i++) out[i] = levels[src[i / 2] >> (4 * (i & 1)) & 15u] * scales[i / group];
}

const vt_codec_kernels vt_codec_scalar = {
    .quant = {[VT_DTYPE_F32] = {quant_f32_e4m3, quant_f32_e5m2},
              [VT_DTYPE_F16] = {quant_f16_e4m3, quant_f16_e5m2},
              [VT_DTYPE_BF16] = {quant_bf16_e4m3, quant_bf16_e5m2}},
    .dequant = {{[VT_DTYPE_F32] = dequant_e4m3_f32, [VT_DTYPE_F16] = dequant_e4m3_f16,
                 [VT_DTYPE_BF16] = dequant_e4m3_bf16},
                {[VT_DTYPE_F32] = dequant_e5m2_f32, [VT_DTYPE_F16] = dequant_e5m2_f16,
                 [VT_DTYPE_BF16] = dequant_e5m2_bf16}},
    .convert = {[VT_DTYPE_F32] = {[VT_DTYPE_F32] = vt_copy_4, [VT_DTYPE_F16] = convert_f32_f16,
                                  [VT_DTYPE_BF16] = convert_f32_bf16},
                [VT_DTYPE_F16] = {[VT_DTYPE_F32] = convert_f16_f32, [VT_DTYPE_F16] = vt_copy_2,
                                  [VT_DTYPE_BF16] = convert_f16_bf16},
                [VT_DTYPE_BF16] = {[VT_DTYPE_F32] = convert_bf16_f32, [VT_DTYPE_F16] = convert_bf16_f16,
                                   [VT_DTYPE_BF16] = vt_copy_2}},
    .fwht = vt_fwht_scalar,
    .levels4 = vt_levels4_scalar,
    .levels3 = vt_levels3_scalar,
    .nibbles = vt_nibbles_scalar,
    .packed3 = vt_packed3_scalar,
    .fwht_raw = vt_fwht_raw_scalar,
};
