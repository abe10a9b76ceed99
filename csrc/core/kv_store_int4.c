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
static uint32_t rht_sign_masks[VT_INT4_RHT_MAX];
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

/* The stored scale and the codes from the row's min and max (the step after them is the same on every ISA). */
#define INT4_QUANTIZE(NAME, SPEC, MINMAX, CODES)                                         \
    SPEC void NAME(const float *x, int64_t d, uint8_t *codes, float *scale_out) {         \
        float mn = INFINITY, mx = -INFINITY;                                             \
        MINMAX(x, d, &mn, &mx);                                                          \
        const float scale = fmaxf((mx - mn) / 15.0f, 1e-6f);                             \
        const float zp = code_of(-mn / scale);                                           \
        CODES(x, d, 1.0f / scale, zp, codes);                                            \
        uint32_t bits;                                                                   \
        memcpy(&bits, &scale, 4);                                                        \
        bits = (bits & ~0xFu) | ((uint32_t)zp & 0xFu);                                   \
        memcpy(scale_out, &bits, 4);                                                     \
    }

INT4_QUANTIZE(vt_int4_quantize_row, , minmax_scalar, codes_scalar)

#if VT_X86
/* AVX2 / AVX-512: the same operations per element; the last n % 8 (n % 16) elements take the twins. */
VT_TARGET_AVX2 static inline void minmax_avx2(const float *x, int64_t n, float *mn, float *mx) {
    __m256 lo = _mm256_set1_ps(INFINITY), hi = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(v, lo); /* a NaN lane gives the second operand */
        hi = _mm256_max_ps(v, hi);
    }
    _Alignas(32) float l[8], h[8];
    _mm256_store_ps(l, lo);
    _mm256_store_ps(h, hi);
    for (int k = 0; k < 8; k++) { /* the lanes' minima and maxima (no NaN among them) */
        *mn = l[k] < *mn ? l[k] : *mn;
        *mx = h[k] > *mx ? h[k] : *mx;
    }
    minmax_scalar(x + i, n - i, mn, mx);
}

VT_TARGET_AVX2 static inline void codes_avx2(const float *x, int64_t n, float inv, float zp, uint8_t *codes) {
    const __m256 vi = _mm256_set1_ps(inv), vz = _mm256_set1_ps(zp), half = _mm256_set1_ps(0.5f),
                 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(15.0f);
    const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, /* lanes' */
                                          0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1); /* bytes */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi), vz);
        const __m256 ge = _mm256_cmp_ps(t, zero, _CMP_GE_OQ);
        __m256 r = _mm256_blendv_ps(_mm256_sub_ps(t, half), _mm256_add_ps(t, half), ge);
        r = _mm256_min_ps(_mm256_max_ps(r, zero), top); /* NaN -> 0 (max_ps gives its second operand) */
        const __m256i c = _mm256_cvttps_epi32(r);
        const __m256i w = _mm256_shuffle_epi8(_mm256_or_si256(c, _mm256_srli_epi64(c, 28)), pick); /* c0 | c1 << 4 */
        const int32_t b4 = _mm_cvtsi128_si32(_mm_unpacklo_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
        memcpy(codes + i / 2, &b4, 4);
    }
    codes_scalar(x + i, n - i, inv, zp, codes + i / 2);
}

VT_TARGET_AVX512 static inline void minmax_avx512(const float *x, int64_t n, float *mn, float *mx) {
    __m512 lo = _mm512_set1_ps(INFINITY), hi = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        lo = _mm512_min_ps(v, lo); /* a NaN lane gives the second operand */
        hi = _mm512_max_ps(v, hi);
    }
    _Alignas(64) float l[16], h[16];
    _mm512_store_ps(l, lo);
    _mm512_store_ps(h, hi);
    for (int k = 0; k < 16; k++) { /* the lanes' minima and maxima (no NaN among them) */
        *mn = l[k] < *mn ? l[k] : *mn;
        *mx = h[k] > *mx ? h[k] : *mx;
    }
    minmax_scalar(x + i, n - i, mn, mx);
}

VT_TARGET_AVX512 static inline void codes_avx512(const float *x, int64_t n, float inv, float zp, uint8_t *codes) {
    const __m512 vi = _mm512_set1_ps(inv), vz = _mm512_set1_ps(zp), half = _mm512_set1_ps(0.5f),
                 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(15.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi), vz);
        const __mmask16 ge = _mm512_cmp_ps_mask(t, zero, _CMP_GE_OQ);
        __m512 r = _mm512_mask_add_ps(_mm512_sub_ps(t, half), ge, t, half);
        r = _mm512_min_ps(_mm512_max_ps(r, zero), top); /* NaN -> 0 (max_ps gives its second operand) */
        const __m512i c = _mm512_cvttps_epi32(r);
        _mm_storel_epi64((__m128i *)(void *)(codes + i / 2),
                         _mm512_cvtepi64_epi8(_mm512_or_si512(c, _mm512_srli_epi64(c, 28)))); /* c0 | c1 << 4 */
    }
    codes_scalar(x + i, n - i, inv, zp, codes + i / 2);
}

INT4_QUANTIZE(quantize_row_avx2, static VT_TARGET_AVX2, minmax_avx2, codes_avx2)
INT4_QUANTIZE(quantize_row_avx512, static VT_TARGET_AVX512, minmax_avx512, codes_avx512)
#endif

vt_int4_quantize_fn vt_int4_quantize_for(vt_isa isa) {
#if VT_X86
    if (isa == VT_ISA_AVX512) return quantize_row_avx512;
    if (isa == VT_ISA_AVX2) return quantize_row_avx2;
#endif
    (void)isa;
    return vt_int4_quantize_row;
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
