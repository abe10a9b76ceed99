/* vLLM 0.33's int4_per_token_head row codec (int4_per_token_head.py), the
 * scalar reference; every rule with its vLLM line is in
 * .agents/specs/kv-formats.md. For one (token, KV head) row of D elements:
 *
 *   1. rotate: per block of b = D & -D elements, x <- H_b (s ⊙ x) with s the
 *      ±1 signs below and H_b the unnormalized Walsh-Hadamard butterfly
 *      (float32, stages h = 1, 2, 4, ...), then round to the source dtype
 *      and back (vLLM's `single_rht(key.float()).to(key.dtype)`);
 *   2. scale = max((max - min) / 15, 1e-6); zp = clamp(rhaz(-min / scale), 0, 15);
 *   3. code_i = clamp(rhaz(x_i * (1 / scale) + zp), 0, 15), where rhaz(t) =
 *      int32(t >= 0 ? t + 0.5 : t - 0.5) (float -> int32 truncation, saturating,
 *      NaN -> 0: NVIDIA's cvt.rzi.s32.f32);
 *   4. byte i = code_{2i} | code_{2i+1} << 4; the stored scale's float32 bits
 *      are (bits(scale) & ~0xF) | zp.
 * IEEE float32 one operation at a time (the build has no FP contraction).
 * min / max ignore NaN elements (fminf / fmaxf). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/kvcache.h"

#if VT_X86
#include <immintrin.h>

#include "simd_avx2.h"
#include "simd_avx512.h"
#endif

/* vLLM's RHT signs for round 0: 2 * bernoulli(0.5) - 1 from a CPU torch.Generator seeded 0x9E3779B9 (the
 * first b of them for block size b: the draws of a longer vector start with those of a shorter one).
 * Bit i (word i / 32, bit i % 32) set = sign -1. Generated with torch 2.13.0; tests/numerics/int4_twin.py
 * draws them from torch at test time and compares. */
static const uint32_t rht_sign_bits[VT_INT4_RHT_MAX / 32] = {
    0x9a8ca6f2u, 0x7f7fca4eu, 0x59bbc293u, 0x9480abc7u, 0xb55b747eu, 0x54503bbeu, 0xcdf467b7u, 0x05dfbc5fu,
    0xb291e3ccu, 0x57563834u, 0xe46ae225u, 0x67fc4ca6u, 0xcfc78691u, 0x32d9dff1u, 0x365fdb89u, 0x75625346u,
    0x668ae4e3u, 0xd9cf73a9u, 0xeb0082b6u, 0x0ca36fb4u, 0xe29e7333u, 0xa50d373fu, 0x0f3cfcebu, 0x1d541dfeu,
    0xb2e4cf05u, 0x1e32d587u, 0x237771acu, 0xc78728fdu, 0x4bee5a90u, 0x56a40da0u, 0xbb9454f0u, 0xf6680674u,
};

/* The sign table as one float32 sign-bit mask per element (0 or 0x80000000), built once. */
static _Alignas(64) uint32_t rht_sign_masks[VT_INT4_RHT_MAX];
static pthread_once_t rht_masks_once = PTHREAD_ONCE_INIT;

static void build_sign_masks(void) {
    for (int i = 0; i < VT_INT4_RHT_MAX; i++) rht_sign_masks[i] = (rht_sign_bits[i >> 5] >> (i & 31) & 1u) << 31;
}

/* x[i] = -x[i] where sign i is -1, as a flip of the sign bit (what negation is): an XOR per element, which the
 * compiler vectorizes. */
static void flip_signs(float *x, int64_t b) {
    pthread_once(&rht_masks_once, build_sign_masks);
    for (int64_t i = 0; i < b; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u ^= rht_sign_masks[i];
        memcpy(&x[i], &u, 4);
    }
}

int64_t vt_int4_rht_block(int64_t d) { return d & -d; }

/* The butterflies are the codec's unnormalized Walsh-Hadamard rows (fwht_raw: stages h = 1, 2, 4, .., the same
 * operations on every ISA). */
void vt_int4_rht(float *x, int64_t d, int inverse) {
    const int64_t b = vt_int4_rht_block(d);
    const vt_fwht_row_fn hadamard = vt_codec_active()->fwht_raw;
    for (int64_t o = 0; o < d; o += b) {
        if (!inverse) flip_signs(x + o, b);
        hadamard(x + o, (size_t)b, (size_t)b);
        if (inverse) flip_signs(x + o, b);
    }
}

void vt_int4_rht_back(float *x, int64_t d) {
    vt_int4_rht(x, d, 1);
    const float b = (float)vt_int4_rht_block(d); /* a power of two: x / b is exact where x * (1 / b) is */
    for (int64_t i = 0; i < d; i++) x[i] /= b;
}

/* int32(t) as NVIDIA's cvt.rzi.s32.f32: truncation, saturating, NaN -> 0; then clamp [0, 15]. Selects, not
 * branches (codes fall either side at random): NaN fails t > 0 and becomes 0; the clamp leaves [0, 15]. */
static float code_of(float t) {
    t = t >= 0.0f ? t + 0.5f : t - 0.5f;
    t = t > 0.0f ? t : 0.0f;
    t = t < 15.0f ? t : 15.0f;
    return (float)(int32_t)t;
}

/* min / max as the SIMD kernels' min_ps / max_ps: a NaN element compares false and is ignored (as fminf / fmaxf). */
static void minmax_scalar(const float *x, int64_t n, float *mn, float *mx) {
    for (int64_t i = 0; i < n; i++) {
        *mn = x[i] < *mn ? x[i] : *mn;
        *mx = x[i] > *mx ? x[i] : *mx;
    }
}

/* Code bytes of n (even) elements: code_of(x * inv + zp), two roundings each (no contraction). */
static void codes_scalar(const float *x, int64_t n, float inv, float zp, uint8_t *codes) {
    for (int64_t i = 0; i < n; i += 2) {
        const float lo = x[i] * inv + zp, hi = x[i + 1] * inv + zp;
        codes[i / 2] = (uint8_t)((unsigned)code_of(lo) | (unsigned)code_of(hi) << 4);
    }
}

/* The stored scale and the codes of x[d] from its min and max (the step after them is the same on every ISA). */
#define INT4_FROM_RANGE(CODES, x, d, mn, mx, codes, scale_out)                          \
    do {                                                                                 \
        const float r_ = ((mx) - (mn)) / 15.0f;                                          \
        const float scale_ = r_ > 1e-6f ? r_ : 1e-6f; /* fmaxf(r_, 1e-6f), NaN included */ \
        const float zp_ = code_of(-(mn) / scale_);                                       \
        CODES((x), (d), 1.0f / scale_, zp_, (codes));                                    \
        uint32_t bits_;                                                                  \
        memcpy(&bits_, &scale_, 4);                                                      \
        bits_ = (bits_ & ~0xFu) | ((uint32_t)zp_ & 0xFu);                                \
        memcpy((scale_out), &bits_, 4);                                                  \
    } while (0)

/* A rotated row x[d] -> its codes and stored scale. */
#define INT4_QUANTIZE(NAME, SPEC, MINMAX, CODES)                                         \
    SPEC void NAME(const float *x, int64_t d, uint8_t *codes, float *scale_out) {         \
        float mn = INFINITY, mx = -INFINITY;                                             \
        MINMAX(x, d, &mn, &mx);                                                          \
        INT4_FROM_RANGE(CODES, x, d, mn, mx, codes, scale_out);                          \
    }

INT4_QUANTIZE(quantize_row_scalar, static, minmax_scalar, codes_scalar)

#if VT_X86
/* AVX2 / AVX-512: the same operations per element; the last n % 8 (n % 16) elements take the twins. */
/* min / max of n values, W lanes at a time (the lanes keep no NaN: min_ps / max_ps give their second operand). */
#define INT4_MINMAX(NAME, TGT, VEC, W, SET1, LOADU, STORE, MIN, MAX)                                            \
    TGT static inline void NAME(const float *x, int64_t n, float *mn, float *mx) {                              \
        VEC lo = SET1(INFINITY), hi = SET1(-INFINITY);                                                          \
        int64_t i = 0;                                                                                          \
        for (; i + W <= n; i += W) {                                                                            \
            const VEC v = LOADU(x + i);                                                                         \
            lo = MIN(v, lo);                                                                                    \
            hi = MAX(v, hi);                                                                                    \
        }                                                                                                       \
        _Alignas(64) float l[W], h[W];                                                                          \
        STORE(l, lo);                                                                                           \
        STORE(h, hi);                                                                                           \
        for (int k = 0; k < W; k++) { /* the lanes' minima and maxima */                                        \
            *mn = l[k] < *mn ? l[k] : *mn;                                                                      \
            *mx = h[k] > *mx ? h[k] : *mx;                                                                      \
        }                                                                                                       \
        minmax_scalar(x + i, n - i, mn, mx);                                                                    \
    }
INT4_MINMAX(minmax_avx2, VT_TARGET_AVX2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_store_ps, _mm256_min_ps,
            _mm256_max_ps)
INT4_MINMAX(minmax_avx512, VT_TARGET_AVX512, __m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_store_ps,
            _mm512_min_ps, _mm512_max_ps)

VT_TARGET_AVX2 static inline void codes_avx2(const float *x, int64_t n, float inv, float zp, uint8_t *codes) {
    const __m256 vi = _mm256_set1_ps(inv), vz = _mm256_set1_ps(zp), half = _mm256_set1_ps(0.5f),
                 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(15.0f);
    const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, /* lanes' */
                                          0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1); /* bytes */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), vz);
        const __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, half), zero), top); /* see codes_avx512 */
        const __m256i c = _mm256_cvttps_epi32(r);
        const __m256i w = _mm256_shuffle_epi8(_mm256_or_si256(c, _mm256_srli_epi64(c, 28)), pick); /* c0 | c1 << 4 */
        const int32_t b4 = _mm_cvtsi128_si32(_mm_unpacklo_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
        memcpy(codes + i / 2, &b4, 4);
    }
    if (i < n) codes_scalar(x + i, n - i, inv, zp, codes + i / 2);
}

VT_TARGET_AVX512 static inline void codes_avx512(const float *x, int64_t n, float inv, float zp, uint8_t *codes) {
    const __m512 vi = _mm512_set1_ps(inv), vz = _mm512_set1_ps(zp), half = _mm512_set1_ps(0.5f),
                 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(15.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), vz);
        /* code_of's t - 0.5 for t < 0 is left out: t + 0.5 < 0.5 there too, so the clamp and the truncation give 0
         * either way. NaN -> 0 (max_ps gives its second operand). */
        const __m512 r = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(t, half), zero), top);
        const __m512i c = _mm512_cvttps_epi32(r);
        _mm_storel_epi64((__m128i *)(void *)(codes + i / 2),
                         _mm512_cvtepi64_epi8(_mm512_or_si512(c, _mm512_srli_epi64(c, 28)))); /* c0 | c1 << 4 */
    }
    if (i < n) codes_scalar(x + i, n - i, inv, zp, codes + i / 2);
}

INT4_QUANTIZE(quantize_row_avx2, static VT_TARGET_AVX2, minmax_avx2, codes_avx2)
INT4_QUANTIZE(quantize_row_avx512, static VT_TARGET_AVX512, minmax_avx512, codes_avx512)
#endif

/* One row step by step, each step the active codec's row kernel or the quantizer q: source -> float32, signs and
 * butterflies, the source dtype's rounding (vLLM's `.to(key.dtype)` after the float32 rotation), min / max, codes.
 * The scalar ISA's row, and the SIMD ISAs' for rotation blocks narrower than a vector. */
static void store_row_steps(const void *src, int src_dtype, int64_t d, uint8_t *codes, float *scale_out,
                            void (*q)(const float *, int64_t, uint8_t *, float *)) {
    const vt_codec_kernels *ck = vt_codec_active();
    _Alignas(64) float buf[VT_KV_INT4_MAX_D];
    _Alignas(64) uint16_t half[VT_KV_INT4_MAX_D];
    ck->convert[src_dtype][VT_DTYPE_F32](src, buf, (size_t)d);
    vt_int4_rht(buf, d, 0);
    if (src_dtype != VT_DTYPE_F32) {
        ck->convert[VT_DTYPE_F32][src_dtype](buf, half, (size_t)d);
        ck->convert[src_dtype][VT_DTYPE_F32](half, buf, (size_t)d);
    }
    q(buf, d, codes, scale_out);
}

static void store_row_scalar(const void *src, int src_dtype, int64_t d, uint8_t *codes, float *scale_out) {
    store_row_steps(src, src_dtype, d, codes, scale_out, quantize_row_scalar);
}

#if VT_X86
/* The SIMD rows hold a rotation block of up to 16 vectors in registers: each vector is loaded from the source,
 * converted, sign-flipped (an XOR with the mask table) and run through the in-vector butterflies, the wider stages
 * run between the registers, and each result is rounded to the source dtype, taken into the min / max and written
 * once to an L1 row buffer, which the codes then read. The operations are the steps' own, in their order: the bytes
 * are the scalar twin's. Wider blocks (b > 16 vectors) and blocks narrower than a vector take the steps. */

/* 16 source elements from element i as float32. */
VT_TARGET_AVX512 static inline __m512 ld16_f32(const void *src, int sd, int64_t i) {
    if (sd == VT_DTYPE_BF16) return vt512_ld_bf16((const uint16_t *)src + i, 0xFFFF);
    if (sd == VT_DTYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)src + i)));
    return _mm512_loadu_ps((const float *)src + i);
}

/* v rounded to the source dtype and back, nearest even. bfloat16 needs no NaN case: a NaN lane's low 16 bits are 0
 * (a bfloat16 NaN's payload, sign flips and sums propagate it, inf - inf makes the default NaN), so the rounding adds
 * at most 0x8000 below them and leaves the lane as it is. */
VT_TARGET_AVX512 static inline __m512 round_trip16(__m512 v, int sd) {
    if (sd == VT_DTYPE_BF16)
        return _mm512_castsi512_ps(
            _mm512_and_si512(vt512_bf16_rne(_mm512_castps_si512(v)), _mm512_set1_epi32((int)0xFFFF0000u)));
    if (sd == VT_DTYPE_F16) return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return v;
}

/* The first stages of vector i of a block at source element e: load, convert, flip signs, in-vector butterflies. */
VT_TARGET_AVX512 static inline __m512 first16(const void *src, int sd, int64_t e, int i) {
    const __m512i s = _mm512_load_si512((const void *)(rht_sign_masks + 16 * i));
    return vt512_fwht16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(ld16_f32(src, sd, e)), s)));
}

VT_TARGET_AVX2 static inline __m256 ld8_f32(const void *src, int sd, int64_t i) {
    if (sd == VT_DTYPE_BF16) return vt256_ld_bf16((const uint16_t *)src + i);
    if (sd == VT_DTYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)src + i)));
    return _mm256_loadu_ps((const float *)src + i);
}

VT_TARGET_AVX2 static inline __m256 round_trip8(__m256 v, int sd) { /* as round_trip16 */
    if (sd == VT_DTYPE_BF16)
        return _mm256_castsi256_ps(
            _mm256_and_si256(vt256_bf16_rne(_mm256_castps_si256(v)), _mm256_set1_epi32((int)0xFFFF0000u)));
    if (sd == VT_DTYPE_F16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return v;
}

VT_TARGET_AVX2 static inline __m256 first8(const void *src, int sd, int64_t e, int i) {
    const __m256 s = _mm256_castsi256_ps(_mm256_load_si256((const __m256i *)(const void *)(rht_sign_masks + 8 * i)));
    return vt256_fwht8(_mm256_xor_ps(ld8_f32(src, sd, e), s));
}

VT_TARGET_AVX2 static inline float hmin8(__m256 v) { /* no NaN lanes */
    __m128 l = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    l = _mm_min_ps(l, _mm_movehl_ps(l, l));
    return _mm_cvtss_f32(_mm_min_ss(l, _mm_movehdup_ps(l)));
}

VT_TARGET_AVX2 static inline float hmax8(__m256 v) {
    __m128 g = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    g = _mm_max_ps(g, _mm_movehl_ps(g, g));
    return _mm_cvtss_f32(_mm_max_ss(g, _mm_movehdup_ps(g)));
}

/* The rotation block of nv vectors of W lanes (nv a constant at every call) at source element o -> y, its range
 * into lo / hi. */
#define INT4_BLOCK(NAME, TGT, VEC, W, FIRST, ADD, SUB, ROUND, STORE, MIN, MAX)                                   \
    TGT static inline __attribute__((always_inline)) void NAME(const void *src, int sd, int64_t o, const int nv,  \
                                                               float *y, VEC *lo, VEC *hi) {                      \
        VEC v[16], mn[16], mx[16];                                                                                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < nv; i++) v[i] = FIRST(src, sd, o + W * i, i);               \
        _Pragma("GCC unroll 4") for (int h = 1; h < nv; h *= 2) /* the stages between registers */               \
            _Pragma("GCC unroll 16") for (int i = 0; i < nv; i++) if (!(i & h)) {                                \
                const VEC a = ADD(v[i], v[i + h]), c = SUB(v[i], v[i + h]);                                       \
                v[i] = a;                                                                                          \
                v[i + h] = c;                                                                                      \
            }                                                                                                      \
        _Pragma("GCC unroll 16") for (int i = 0; i < nv; i++) {                                                   \
            v[i] = ROUND(v[i], sd);                                                                                \
            STORE(y + W * i, v[i]);                                                                                \
            mn[i] = MIN(v[i], *lo); /* a NaN lane gives the second operand */                                      \
            mx[i] = MAX(v[i], *hi);                                                                                \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int h = 1; h < nv; h *= 2) /* a tree, not a chain (no NaN lanes are left) */ \
            _Pragma("GCC unroll 16") for (int i = 0; i + h < nv; i += 2 * h) {                                    \
                mn[i] = MIN(mn[i], mn[i + h]);                                                                     \
                mx[i] = MAX(mx[i], mx[i + h]);                                                                     \
            }                                                                                                      \
        *lo = mn[0];                                                                                               \
        *hi = mx[0];                                                                                               \
    }

#define ROW_BLOCKS(BLOCK, NV) \
    for (int64_t o = 0; o < d; o += b) BLOCK(src, sd, o, NV, buf + o, &lo, &hi)

/* The row of a source dtype sd (a constant at every call: the conversions fold away): blocks of 1 to 16 vectors
 * in registers, others by the steps. */
#define INT4_ROW(NAME, TGT, VEC, W, BLOCK, SET1, HMIN, HMAX, QUANTIZE, CODES)                                      \
    TGT static inline __attribute__((always_inline)) void NAME(const void *src, const int sd, int64_t d,          \
                                                               uint8_t *codes, float *scale_out) {                \
        _Alignas(64) float buf[VT_KV_INT4_MAX_D];                                                                  \
        VEC lo = SET1(INFINITY), hi = SET1(-INFINITY);                                                             \
        const int64_t b = vt_int4_rht_block(d);                                                                    \
        switch (b) {                                                                                               \
        case W: ROW_BLOCKS(BLOCK, 1); break;                                                                       \
        case 2 * W: ROW_BLOCKS(BLOCK, 2); break;                                                                   \
        case 4 * W: ROW_BLOCKS(BLOCK, 4); break;                                                                   \
        case 8 * W: ROW_BLOCKS(BLOCK, 8); break;                                                                   \
        case 16 * W: ROW_BLOCKS(BLOCK, 16); break;                                                                 \
        default: store_row_steps(src, sd, d, codes, scale_out, QUANTIZE); return;                                  \
        }                                                                                                          \
        const float mn = HMIN(lo), mx = HMAX(hi);                                                                  \
        INT4_FROM_RANGE(CODES, buf, d, mn, mx, codes, scale_out);                                                  \
    }

INT4_BLOCK(block_avx512, VT_TARGET_AVX512, __m512, 16, first16, _mm512_add_ps, _mm512_sub_ps, round_trip16,
           _mm512_store_ps, _mm512_min_ps, _mm512_max_ps)
INT4_BLOCK(block_avx2, VT_TARGET_AVX2, __m256, 8, first8, _mm256_add_ps, _mm256_sub_ps, round_trip8, _mm256_store_ps,
           _mm256_min_ps, _mm256_max_ps)
INT4_ROW(row_avx512, VT_TARGET_AVX512, __m512, 16, block_avx512, _mm512_set1_ps, _mm512_reduce_min_ps,
         _mm512_reduce_max_ps, quantize_row_avx512, codes_avx512)
INT4_ROW(row_avx2, VT_TARGET_AVX2, __m256, 8, block_avx2, _mm256_set1_ps, hmin8, hmax8, quantize_row_avx2, codes_avx2)

/* One row function per (ISA, source dtype). */
#define ROW_INSTANCE(NAME, TGT, ROW, SD) \
    TGT static void NAME(const void *src, int sd, int64_t d, uint8_t *codes, float *scale_out) { \
        (void)sd;                                                                              \
        ROW(src, SD, d, codes, scale_out);                                                     \
    }
ROW_INSTANCE(row_avx512_f32, VT_TARGET_AVX512, row_avx512, VT_DTYPE_F32)
ROW_INSTANCE(row_avx512_f16, VT_TARGET_AVX512, row_avx512, VT_DTYPE_F16)
ROW_INSTANCE(row_avx512_bf16, VT_TARGET_AVX512, row_avx512, VT_DTYPE_BF16)
ROW_INSTANCE(row_avx2_f32, VT_TARGET_AVX2, row_avx2, VT_DTYPE_F32)
ROW_INSTANCE(row_avx2_f16, VT_TARGET_AVX2, row_avx2, VT_DTYPE_F16)
ROW_INSTANCE(row_avx2_bf16, VT_TARGET_AVX2, row_avx2, VT_DTYPE_BF16)
#undef ROW_INSTANCE
#undef ROW_BLOCKS
#endif

vt_int4_store_row_fn vt_int4_store_row_for(vt_isa isa, int src_dtype) {
    pthread_once(&rht_masks_once, build_sign_masks); /* the SIMD rows read the mask table without asking */
#if VT_X86
    static const vt_int4_store_row_fn rows[2][3] = {
        {[VT_DTYPE_F32] = row_avx2_f32, [VT_DTYPE_F16] = row_avx2_f16, [VT_DTYPE_BF16] = row_avx2_bf16},
        {[VT_DTYPE_F32] = row_avx512_f32, [VT_DTYPE_F16] = row_avx512_f16, [VT_DTYPE_BF16] = row_avx512_bf16},
    };
    if ((isa == VT_ISA_AVX2 || isa == VT_ISA_AVX512) && src_dtype >= 0 && src_dtype < 3)
        return rows[isa == VT_ISA_AVX512][src_dtype];
#endif
    (void)isa;
    (void)src_dtype;
    return store_row_scalar;
}

void vt_int4_dequant_row(const uint8_t *codes, float stored_scale, float *dst, int64_t d) {
    uint32_t bits;
    memcpy(&bits, &stored_scale, 4);
    const float zp = (float)(bits & 0xFu);
    bits &= ~0xFu;
    float s;
    memcpy(&s, &bits, 4);
    for (int64_t i = 0; i < d; i += 2) {
        dst[i] = ((float)(codes[i / 2] & 0xFu) - zp) * s;
        dst[i + 1] = ((float)(codes[i / 2] >> 4) - zp) * s;
    }
}
