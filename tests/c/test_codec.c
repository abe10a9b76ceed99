/* Codec tests in plain C (no Python).
 *
 *   test_codec            quick: a strided sample of float32 inputs
 *   test_codec --full     every one of the 2^32 float32 bit patterns
 *
 * Three kinds of check:
 *  1. the scalar twins against independently written references (fp8: a
 *     nearest-value search over the code table with ties to the even code;
 *     float16: the compiler's _Float16 conversion; bfloat16: nearest of the
 *     two neighbouring bf16 values computed in double);
 *  2. every SIMD variant the CPU has against the scalar twin, bit for bit;
 *  3. decode of all 256 codes against values computed from the format
 *     definition, and the bulk API's argument checks. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vtinfer/vtinfer.h"

#include "check.h"

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---- independent references ---- */

typedef struct ref_fmt { int ebits, mbits; int max_code; double vals[128]; } ref_fmt;
static ref_fmt REF_E4M3 = {4, 3, 0x7E, {0}}, REF_E5M2 = {5, 2, 0x7B, {0}};

/* Value of a non-negative code from the format's definition. */
static double ref_value(const ref_fmt *f, int code) {
    int bias = (1 << (f->ebits - 1)) - 1;
    int e = code >> f->mbits, m = code & ((1 << f->mbits) - 1);
    if (e == 0) return ldexp((double)m, 1 - bias - f->mbits);
    return ldexp(1.0 + (double)m / (1 << f->mbits), e - bias);
}

static void ref_init(ref_fmt *f) {
    for (int c = 0; c <= f->max_code; c++) f->vals[c] = ref_value(f, c);
}

static uint8_t ref_encode(const ref_fmt *f, float x) {
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return 0x7F;
    double v = fabs((double)x);
    if (v >= f->vals[f->max_code]) return sign | (uint8_t)f->max_code;
    int lo = 0, hi = f->max_code; /* vals[lo] <= v < vals[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (f->vals[mid] <= v) lo = mid; else hi = mid;
    }
    double dlo = v - f->vals[lo], dhi = f->vals[hi] - v;
    int code = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
    return sign | (uint8_t)code;
}

static uint16_t ref_f16(float x) {
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static uint16_t ref_bf16(float x) {
    uint32_t u = f32_bits(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
    uint16_t t = (uint16_t)(u >> 16);
    if ((u & 0xFFFF) == 0) return t;
    double v = (double)x, a = (double)bits_f32((uint32_t)t << 16), b = (double)bits_f32((uint32_t)(t + 1) << 16);
    /* b may be inf when a is the largest finite bf16: compare with the midpoint instead. */
    double mid = a + (b - a) / 2;
    if (isinf(b)) mid = (double)bits_f32((uint32_t)t << 16) + ldexp(1.0, ((u >> 23) & 0xFF) - 127 - 8) * (signbit(x) ? -1 : 1);
    int up = signbit(x) ? (v < mid) : (v > mid);
    if (v == mid) up = t & 1;
    return up ? (uint16_t)(t + 1) : t;
}

/* ---- the sweep ---- */

#define BLOCK 65536u
/* scales[0] must be 1.0: the reference check runs at that scale. */
typedef struct sweep_arg { uint64_t begin, end, step; int with_ref; const float *scales; int nscales; } sweep_arg;

static int isa_count;
static vt_codec_kernels isa_kernels[3];

static void *sweep(void *p) {
    const sweep_arg *a = p;
    float *x = malloc(BLOCK * sizeof(float));
    uint8_t *c0 = malloc(BLOCK), *c1 = malloc(BLOCK);
    uint16_t *h0 = malloc(BLOCK * 2), *h1 = malloc(BLOCK * 2);
    for (uint64_t base = a->begin; base < a->end; base += (uint64_t)BLOCK * a->step) {
        size_t n = 0;
        for (uint64_t i = base; i < a->end && n < BLOCK; i += a->step) x[n++] = bits_f32((uint32_t)i);
        for (int f = 0; f < 2; f++) {
            const ref_fmt *rf = f ? &REF_E5M2 : &REF_E4M3;
            for (int si = 0; si < a->nscales; si++) {
                float scale = a->scales[si];
                isa_kernels[0].quant[VT_DTYPE_F32][f](x, c0, n, scale);
                for (size_t i = 0; i < n; i++) {
                    float v = x[i] / scale;
                    uint8_t s = f ? vt_fp8_e5m2_from_f32(v) : vt_fp8_e4m3_from_f32(v);
                    CHECK(c0[i] == s, "row kernel vs scalar fmt %d x=0x%08x", f, f32_bits(x[i]));
                    if (a->with_ref && si == 0) {
                        uint8_t r = ref_encode(rf, x[i]);
                        CHECK(s == r, "scalar vs reference fmt %d x=0x%08x (%.9g): got 0x%02x want 0x%02x", f,
                              f32_bits(x[i]), (double)x[i], s, r);
                    }
                }
                for (int k = 1; k < isa_count; k++) {
                    isa_kernels[k].quant[VT_DTYPE_F32][f](x, c1, n, scale);
                    for (size_t i = 0; i < n; i++)
                        CHECK(c1[i] == c0[i], "isa %d vs scalar fmt %d scale %a x=0x%08x: 0x%02x vs 0x%02x", k, f,
                              (double)scale, f32_bits(x[i]), c1[i], c0[i]);
                }
            }
        }
        for (int d = VT_DTYPE_F16; d <= VT_DTYPE_BF16; d++) {
            isa_kernels[0].convert[VT_DTYPE_F32][d](x, h0, n);
            for (size_t i = 0; i < n; i++) {
                uint16_t s = d == VT_DTYPE_F16 ? vt_f16_from_f32(x[i]) : vt_bf16_from_f32(x[i]);
                CHECK(h0[i] == s, "convert row vs scalar dtype %d x=0x%08x", d, f32_bits(x[i]));
                if (a->with_ref) {
                    uint16_t r = d == VT_DTYPE_F16 ? ref_f16(x[i]) : ref_bf16(x[i]);
                    if (d == VT_DTYPE_F16 && isnan(x[i])) r = s; /* NaN payloads: checked below */
                    CHECK(s == r, "scalar vs reference dtype %d x=0x%08x: 0x%04x want 0x%04x", d, f32_bits(x[i]),
                          s, r);
                }
            }
            for (int k = 1; k < isa_count; k++) {
                isa_kernels[k].convert[VT_DTYPE_F32][d](x, h1, n);
                for (size_t i = 0; i < n; i++)
                    CHECK(h1[i] == h0[i], "isa %d vs scalar dtype %d x=0x%08x: 0x%04x vs 0x%04x", k, d,
                          f32_bits(x[i]), h1[i], h0[i]);
            }
        }
    }
    free(x), free(c0), free(c1), free(h0), free(h1);
    return NULL;
}

/* Non-unit scales exercise the SIMD division shortcut (multiply by the
 * reciprocal, divide for real near fp8 rounding boundaries): a power of
 * two, ordinary values, and scales whose reciprocal is not a normal
 * float32 (always divided). */
static const float SCALES_FULL[] = {1.0f, 0.37f};
static const float SCALES_QUICK[] = {1.0f, 0.37f, 3.1f, 0x1p-7f, 448.0f / 3.0f, 1e-30f, 3e38f, 1.7e-38f, 0x1.fffffep-1f};

static void run_sweep(int full) {
    uint64_t step = full ? 1 : 4099; /* a prime stride touches every exponent and mantissa pattern */
    enum { NT = 2 };
    pthread_t t[NT];
    sweep_arg args[NT];
    uint64_t total = (uint64_t)1 << 32, per = total / NT;
    for (int i = 0; i < NT; i++) {
        args[i].begin = per * (uint64_t)i;
        args[i].begin += (step - args[i].begin % step) % step;
        args[i].end = i == NT - 1 ? total : per * (uint64_t)(i + 1);
        args[i].step = step;
        args[i].with_ref = 1;
        args[i].scales = full ? SCALES_FULL : SCALES_QUICK;
        args[i].nscales = full ? (int)(sizeof SCALES_FULL / sizeof(float)) : (int)(sizeof SCALES_QUICK / sizeof(float));
        pthread_create(&t[i], NULL, sweep, &args[i]);
    }
    for (int i = 0; i < NT; i++) pthread_join(t[i], NULL);
}

/* Targeted values whose answers are known by hand. */
static void test_known_values(void) {
    const float cases[] = {0.0f, -0.0f, 1.0f, 448.0f, 449.0f, 1e9f, INFINITY, -INFINITY, NAN, -NAN, 0x1p-9f,
                           0x1p-10f, 0x1.8p-10f, -0x1p-20f, 57344.0f, 464.0f, 17.0f, 18.0f, 61440.0f, 0x1p-17f};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(vt_fp8_e4m3_from_f32(cases[i]) == ref_encode(&REF_E4M3, cases[i]), "ref/e4m3 case %zu", i);
        CHECK(vt_fp8_e5m2_from_f32(cases[i]) == ref_encode(&REF_E5M2, cases[i]), "ref/e5m2 case %zu", i);
    }
    CHECK(vt_fp8_e4m3_from_f32(0.0f) == 0x00, "+0");
    CHECK(vt_fp8_e4m3_from_f32(-0.0f) == 0x80, "-0 keeps its sign");
    CHECK(vt_fp8_e4m3_from_f32(1.0f) == 0x38, "1.0");
    CHECK(vt_fp8_e4m3_from_f32(448.0f) == 0x7E, "max");
    CHECK(vt_fp8_e4m3_from_f32(1e9f) == 0x7E, "saturate");
    CHECK(vt_fp8_e4m3_from_f32(-INFINITY) == 0xFE, "-inf saturates");
    CHECK(vt_fp8_e4m3_from_f32(NAN) == 0x7F, "NaN");
    CHECK(vt_fp8_e4m3_from_f32(0x1p-9f) == 0x01, "smallest subnormal");
    CHECK(vt_fp8_e4m3_from_f32(0x1p-10f) == 0x00, "half the smallest subnormal ties to 0");
    CHECK(vt_fp8_e4m3_from_f32(0x1.8p-9f) == 0x02, "1.5 steps ties to even (2)");
    CHECK(vt_fp8_e4m3_from_f32(17.0f) == 0x58, "17 ties to 16 (even)");
    CHECK(vt_fp8_e4m3_from_f32(19.0f) == 0x5A, "19 ties to 20 (even)");
    CHECK(vt_fp8_e5m2_from_f32(57344.0f) == 0x7B, "e5m2 max");
    CHECK(vt_fp8_e5m2_from_f32(INFINITY) == 0x7B, "e5m2 inf saturates");
    CHECK(vt_fp8_e5m2_from_f32(0x1p-16f) == 0x01, "e5m2 smallest subnormal");
}

static void test_decode(void) {
    for (int c = 0; c < 256; c++) {
        int s = c >> 7, mag = c & 0x7F;
        float e4 = vt_fp8_e4m3_to_f32((uint8_t)c), e5 = vt_fp8_e5m2_to_f32((uint8_t)c);
        if (mag == 0x7F) CHECK(isnan(e4), "e4m3 0x%02x is NaN", c);
        else CHECK((double)e4 == (s ? -1 : 1) * ref_value(&REF_E4M3, mag), "e4m3 decode 0x%02x", c);
        if (mag > 0x7C) CHECK(isnan(e5), "e5m2 0x%02x is NaN", c);
        else if (mag == 0x7C) CHECK(isinf(e5) && (signbit(e5) != 0) == s, "e5m2 0x%02x is inf", c);
        else CHECK((double)e5 == (s ? -1 : 1) * ref_value(&REF_E5M2, mag), "e5m2 decode 0x%02x", c);
        CHECK((signbit(e4) != 0) == s || isnan(e4), "e4m3 sign 0x%02x", c);
        /* round trip: every finite code encodes back to itself */
        if (mag != 0x7F) CHECK(vt_fp8_e4m3_from_f32(e4) == c, "e4m3 round trip 0x%02x", c);
        if (mag < 0x7C) CHECK(vt_fp8_e5m2_from_f32(e5) == c, "e5m2 round trip 0x%02x", c);
    }
    /* decode * scale through every ISA and output dtype, bit for bit */
    uint8_t codes[256 + 13];
    for (int i = 0; i < 256 + 13; i++) codes[i] = (uint8_t)(i * 7 + 3);
    const float scales[] = {1.0f, 0.0078125f, 3.3f, 1e-30f, 7e30f};
    for (int f = 0; f < 2; f++)
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
            for (int d = 0; d < 3; d++) {
                uint32_t ref[269], out[269];
                memset(ref, 0, sizeof ref);
                isa_kernels[0].dequant[f][d](codes, ref, 269, scales[si]);
                for (int k = 1; k < isa_count; k++) {
                    memset(out, 0, sizeof out);
                    isa_kernels[k].dequant[f][d](codes, out, 269, scales[si]);
                    CHECK(memcmp(ref, out, sizeof ref) == 0, "dequant isa %d fmt %d dtype %d scale %g", k, f, d,
                          (double)scales[si]);
                }
            }
}

/* Every float16 and bfloat16 bit pattern as a quantize source, several
 * scales, every ISA against scalar; and f16/bf16 <-> f32 conversions. */
static void test_half_sources(void) {
    uint16_t *h = malloc(65536 * 2);
    uint8_t *c0 = malloc(65536), *c1 = malloc(65536);
    float *f0 = malloc(65536 * 4), *f1 = malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    const float scales[] = {1.0f, 0.5f, 3.0f, 0.1f, 0.37f, 1e-30f, 3e38f, 1.7e-38f, 1e-45f};
    const size_t nscales = sizeof scales / sizeof scales[0];
    for (int src = VT_DTYPE_F16; src <= VT_DTYPE_BF16; src++) {
        isa_kernels[0].convert[src][VT_DTYPE_F32](h, f0, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            float want = src == VT_DTYPE_F16 ? vt_f16_to_f32(h[i]) : vt_bf16_to_f32(h[i]);
            CHECK(f32_bits(f0[i]) == f32_bits(want), "widen dtype %d 0x%04x", src, i);
            if (src == VT_DTYPE_F16) {
                _Float16 hf;
                memcpy(&hf, &h[i], 2);
                if (!isnan((float)hf)) CHECK(f32_bits((float)hf) == f32_bits(want), "f16 widen ref 0x%04x", i);
            }
        }
        for (int k = 1; k < isa_count; k++) {
            isa_kernels[k].convert[src][VT_DTYPE_F32](h, f1, 65536);
            CHECK(memcmp(f0, f1, 65536 * 4) == 0, "widen isa %d dtype %d", k, src);
        }
        for (int f = 0; f < 2; f++)
            for (size_t si = 0; si < nscales; si++) {
                isa_kernels[0].quant[src][f](h, c0, 65536, scales[si]);
                for (uint32_t i = 0; i < 65536; i++) {
                    float v = f0[i] / scales[si];
                    uint8_t want = f ? vt_fp8_e5m2_from_f32(v) : vt_fp8_e4m3_from_f32(v);
                    CHECK(c0[i] == want, "quant src %d fmt %d 0x%04x", src, f, i);
                }
                for (int k = 1; k < isa_count; k++) {
                    isa_kernels[k].quant[src][f](h, c1, 65536, scales[si]);
                    CHECK(memcmp(c0, c1, 65536) == 0, "quant isa %d src %d fmt %d scale %g", k, src, f,
                          (double)scales[si]);
                }
            }
    }
    free(h), free(c0), free(c1), free(f0), free(f1);
}

/* Division, not multiplication by the reciprocal: search scales s and
 * e4m3 midpoints m for x = fl(m * s) where fl(x / s) is exactly the
 * midpoint but fl(x * fl(1 / s)) is not, so the two give different codes;
 * the bulk API must give the division's code. */
static void test_scale_is_division(void) {
    int found = 0;
    for (uint32_t k = 0; k < 100000 && found < 3; k++) {
        float s = bits_f32(0x3E99999Au + k * 13u); /* around 0.3 */
        for (int lo = 8; lo < 0x7E && found < 3; lo++) {
            float m = (float)((ref_value(&REF_E4M3, lo) + ref_value(&REF_E4M3, lo + 1)) / 2);
            float x = m * s;
            uint8_t div = ref_encode(&REF_E4M3, x / s), mul = ref_encode(&REF_E4M3, x * (1.0f / s));
            if (div == mul) continue;
            found++;
            /* 67 copies: the SIMD main loops and their tails both see x */
            uint8_t got[67];
            float xs[67];
            for (int i = 0; i < 67; i++) xs[i] = x;
            vt_error err;
            CHECK(vt_fp8_quantize(xs, VT_DTYPE_F32, got, 67, s, VT_DTYPE_FP8_E4M3, 1, &err) == VT_OK, "quantize");
            for (int i = 0; i < 67; i++)
                CHECK(got[i] == div, "x/scale must be a true division: x=%a s=%a got[%d] 0x%02x want 0x%02x (mul 0x%02x)",
                      (double)x, (double)s, i, got[i], div, mul);
        }
    }
    CHECK(found == 3, "cases where x/s and x*(1/s) give different codes exist (found %d)", found);
}

/* Inputs whose quotient lands within 24 ulps of every fp8 midpoint (where
 * the SIMD multiply-by-reciprocal shortcut must fall back to a division),
 * for several non-power-of-two scales: every ISA against the scalar twin. */
static void test_division_boundaries(void) {
    const float scales[] = {0.37f, 3.1f, 0.3f, 1.0f / 3.0f, 448.0f / 3.0f, 7.0f, 0.1f, 1e-3f, 1e3f};
    enum { OFFS = 24, MAXN = 2 * 128 * (2 * OFFS + 1) };
    static float x[MAXN];
    static uint8_t c0[MAXN], c1[MAXN];
    for (int f = 0; f < 2; f++) {
        const ref_fmt *rf = f ? &REF_E5M2 : &REF_E4M3;
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            float s = scales[si];
            size_t n = 0;
            for (int lo = 0; lo < rf->max_code; lo++) {
                float m = (float)((rf->vals[lo] + rf->vals[lo + 1]) / 2);
                float xm = m * s;
                for (int k = -OFFS; k <= OFFS; k++) {
                    uint32_t b = f32_bits(xm);
                    x[n++] = bits_f32((uint32_t)((int64_t)b + k));
                    x[n++] = -bits_f32((uint32_t)((int64_t)b + k));
                }
            }
            size_t len = n - 5; /* not a multiple of 16: tails too */
            isa_kernels[0].quant[VT_DTYPE_F32][f](x, c0, len, s);
            for (int k = 1; k < isa_count; k++) {
                isa_kernels[k].quant[VT_DTYPE_F32][f](x, c1, len, s);
                for (size_t i = 0; i < len; i++)
                    CHECK(c1[i] == c0[i], "midpoint neighbourhood: isa %d fmt %d scale %a x=%a: 0x%02x vs 0x%02x", k, f,
                          (double)s, (double)x[i], c1[i], c0[i]);
            }
        }
    }
}

/* Long rows stream their output past the caches after peeling to an
 * aligned address: every misalignment of dst, every ISA vs scalar. */
static void test_stream_alignment(void) {
    enum { N = 70001 };
    float *x = malloc((N + 16) * sizeof(float)), *f0 = malloc((N + 32) * sizeof(float)),
          *f1 = malloc((N + 32) * sizeof(float));
    uint8_t *c0 = malloc(N + 64), *c1 = malloc(N + 64);
    for (int i = 0; i < N + 16; i++) x[i] = sinf((float)i * 0.37f) * 600.0f;
    for (int k = 0; k < isa_count; k++)
        for (int off = 0; off < 16; off++)
            for (int f = 0; f < 2; f++) {
                const float scales[] = {0.5f, 0.37f};
                for (int si = 0; si < 2; si++) {
                    isa_kernels[0].quant[VT_DTYPE_F32][f](x + 1, c0 + off, N, scales[si]);
                    isa_kernels[k].quant[VT_DTYPE_F32][f](x + 1, c1 + off, N, scales[si]);
                    CHECK(memcmp(c0 + off, c1 + off, N) == 0, "stream quant isa %d fmt %d off %d", k, f, off);
                }
                isa_kernels[0].dequant[f][VT_DTYPE_F32](c0 + 5, f0 + off, N, 0.37f);
                isa_kernels[k].dequant[f][VT_DTYPE_F32](c0 + 5, f1 + off, N, 0.37f);
                CHECK(memcmp(f0 + off, f1 + off, N * sizeof(float)) == 0, "stream dequant isa %d fmt %d off %d", k, f,
                      off);
            }
    free(x), free(f0), free(f1), free(c0), free(c1);
}

/* The Walsh-Hadamard rotation (vt_fwht_row_fn: fwht and fwht_raw) of every ISA against the scalar twin, bit for bit (a NaN only as a
 * NaN: which operand's payload an add passes on is the compiler's choice, even in the twin), over blocks of 2 to 512 (the SIMD kernels take blocks of 16 or more, the twin the rest)
 * and rows of several blocks; and the twin against the butterflies written out stage by stage in double from
 * float32 operations (each add / sub rounded to float32). */
static void test_fwht(void) {
    enum { N = 1024 };
    static float x0[N], x1[N], ref[N];
    uint32_t seed = 12345u;
    for (int raw = 0; raw < 2; raw++) /* fwht, then fwht_raw (the same butterflies, not normalized) */
    for (size_t b = 2; b <= 512; b *= 2)
        for (size_t n = b; n <= N; n *= 4) {
            for (size_t i = 0; i < n; i++) {
                seed = seed * 1664525u + 1013904223u;
                uint32_t r = seed >> 8;
                x0[i] = (float)((double)(r % 20001) / 1000.0 - 10.0);
                if (r % 97 == 0) x0[i] = bits_f32(0x7FC00000u | (r & 0xFFFu) | (r & 1u) << 31); /* NaNs, payloads */
                if (r % 89 == 0) x0[i] = r & 2u ? INFINITY : -INFINITY;
                if (r % 83 == 0) x0[i] = bits_f32(r & 0x807FFFFFu); /* subnormals */
            }
            memcpy(ref, x0, n * sizeof(float));
            for (size_t o = 0; o < n; o += b) /* stage by stage */
                for (size_t h = 1; h < b; h *= 2)
                    for (size_t i = o; i < o + b; i++)
                        if (!(i & h)) {
                            const float a = ref[i], c = ref[i + h];
                            ref[i] = a + c, ref[i + h] = a - c;
                        }
            const float norm = (float)(1.0 / sqrt((double)b));
            if (!raw)
                for (size_t i = 0; i < n; i++) ref[i] *= norm;
            memcpy(x1, x0, n * sizeof(float));
            (raw ? isa_kernels[0].fwht_raw : isa_kernels[0].fwht)(x1, n, b);
            int same = 1;
            for (size_t i = 0; i < n; i++) same &= f32_bits(x1[i]) == f32_bits(ref[i]) || (x1[i] != x1[i] && ref[i] != ref[i]);
            CHECK(same, "fwht%s twin vs stage by stage: block %zu, n %zu", raw ? "_raw" : "", b, n);
            for (int k = 1; k < isa_count; k++) {
                memcpy(ref, x1, n * sizeof(float));
                memcpy(x1, x0, n * sizeof(float));
                (raw ? isa_kernels[k].fwht_raw : isa_kernels[k].fwht)(x1, n, b);
                size_t bad = n;
                for (size_t i = 0; i < n && bad == n; i++)
                    if (f32_bits(x1[i]) != f32_bits(ref[i]) && !(x1[i] != x1[i] && ref[i] != ref[i])) bad = i;
                CHECK(bad == n, "fwht%s ISA %d vs twin: block %zu, n %zu: element %zu is %08x, the twin's %08x",
                      raw ? "_raw" : "", k, b, n, bad, bad < n ? f32_bits(x1[bad]) : 0u, bad < n ? f32_bits(ref[bad]) : 0u);
                memcpy(x1, ref, n * sizeof(float));
            }
        }
}

/* The level lookups (vt_levels4_row_fn, vt_levels3_row_fn) of every ISA and the twin against the codes read out
 * of the packed bytes one by one, as codec.h states the layouts: random bytes, levels with distinct bit patterns
 * (NaN payloads among them: a lookup copies bits), rows of 8 to 512 codes (4-bit: every multiple of 8, so the
 * 16-lane kernel's half-vector tail too). */
static void test_levels(void) {
    enum { N = 512 };
    static uint8_t src[N], hi[N / 8];
    static float ref[N], got[N];
    float levels[16];
    uint32_t seed = 777u;
    for (int i = 0; i < 16; i++) levels[i] = bits_f32(i % 5 == 4 ? 0x7FC00000u | (uint32_t)i : 0x3F800000u + (uint32_t)i * 4099u);
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) src[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
        for (int i = 0; i < N / 8; i++) hi[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
        for (size_t n = 8; n <= N; n += 8) {
            for (size_t d = 0; d < n; d++) { /* 4-bit: word d / 8, byte d % 4, nibble (d % 8) / 4 */
                const unsigned b = src[4 * (d / 8) + d % 4];
                ref[d] = levels[d % 8 < 4 ? b & 15u : b >> 4];
            }
            for (int k = 0; k < isa_count; k++) {
                memset(got, 0xEE, sizeof got);
                isa_kernels[k].levels4(src, n, levels, got);
                CHECK(memcmp(got, ref, n * 4) == 0 && f32_bits(got[n % N]) == (n < N ? 0xEEEEEEEEu : f32_bits(got[0])),
                      "levels4 ISA %d: n %zu", k, n);
            }
            if (n % 32) continue;
            for (size_t d = 0; d < n; d++) { /* 3-bit: d = 32w + 4i + j */
                const size_t w = d / 32, i = d % 32 / 4, j = d % 4;
                const unsigned low = src[8 * w + 4 * (i / 4) + j] >> (2 * (i % 4)) & 3u, top = hi[4 * w + j] >> i & 1u;
                ref[d] = levels[low | top << 2];
            }
            for (int k = 0; k < isa_count; k++) {
                memset(got, 0xEE, sizeof got);
                isa_kernels[k].levels3(src, hi, n, levels, got);
                CHECK(memcmp(got, ref, n * 4) == 0 && f32_bits(got[n % N]) == (n < N ? 0xEEEEEEEEu : f32_bits(got[0])),
                      "levels3 ISA %d: n %zu", k, n);
            }
        }
    }
}

/* The 3-bit lookup (vt_packed3_row_fn) of every ISA and the twin against each code read as its own 3 bits of the
 * row (bit 3i of the byte string, least significant first), rows of 8 to 400 codes, each in a buffer of exactly
 * 3n / 8 bytes (an ASan build reports a read past the row) and an output with a guard after it. */
static void test_packed3(void) {
    enum { N = 400 };
    static float ref[N + 1], got[N + 1];
    float levels[8];
    uint32_t seed = 31337u;
    for (int i = 0; i < 8; i++) levels[i] = bits_f32(i == 5 ? 0x7FC00005u : 0xBF000000u + (uint32_t)i * 65537u);
    for (size_t n = 8; n <= N; n += 8) {
        const size_t nbytes = 3 * n / 8;
        uint8_t *src = malloc(nbytes);
        CHECK(src != NULL, "malloc");
        if (!src) return;
        for (size_t i = 0; i < nbytes; i++) src[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
        for (size_t d = 0; d < n; d++) {
            unsigned code = 0;
            for (int b = 0; b < 3; b++) code |= (unsigned)(src[(3 * d + b) / 8] >> ((3 * d + b) % 8) & 1u) << b;
            ref[d] = levels[code];
        }
        for (int k = 0; k < isa_count; k++) {
            memset(got, 0xEE, sizeof got);
            isa_kernels[k].packed3(src, n, levels, got);
            CHECK(memcmp(got, ref, n * 4) == 0 && f32_bits(got[n]) == 0xEEEEEEEEu, "packed3 ISA %d: n %zu", k, n);
        }
        free(src);
    }
}

/* The nibble lookup (vt_nibbles_row_fn) of every ISA against the codes read one by one (code 2j the low nibble of
 * byte j), each times its group's scale: groups of 8 to 64 and whole rows, scales with zero, a power of two, an
 * infinity and a NaN among them; a NaN compares only as a NaN (which operand's payload a product passes on is
 * the compiler's choice). */
static void test_nibbles(void) {
    enum { N = 512 };
    static uint8_t src[N / 2];
    static float ref[N], got[N], scales[N];
    float levels[16];
    uint32_t seed = 4242u;
    for (int i = 0; i < 16; i++) levels[i] = (float)(i * i) * 0.37f - 20.0f;
    levels[5] = -0.0f;
    for (int i = 0; i < N; i++) scales[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / 65536.0f - 128.0f;
    scales[1] = 0.0f, scales[2] = 0.125f, scales[3] = INFINITY, scales[4] = NAN;
    for (int i = 0; i < N / 2; i++) src[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
    static const size_t groups[] = {8, 16, 24, 32, 64, 0};
    for (size_t n = 2; n <= N; n += n < 64 ? 2 : 48) {
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            const size_t group = groups[gi] ? groups[gi] : n;
            for (size_t i = 0; i < n; i++) ref[i] = levels[i % 2 ? src[i / 2] >> 4 : src[i / 2] & 15u] * scales[i / group];
            for (int k = 0; k < isa_count; k++) {
                memset(got, 0xEE, sizeof got);
                isa_kernels[k].nibbles(src, n, levels, scales, group, got);
                size_t bad = n;
                for (size_t i = 0; i < n && bad == n; i++)
                    if (f32_bits(got[i]) != f32_bits(ref[i]) && !(got[i] != got[i] && ref[i] != ref[i])) bad = i;
                CHECK(bad == n && (n == N || f32_bits(got[n]) == 0xEEEEEEEEu), "nibbles ISA %d: n %zu, group %zu, element %zu",
                      k, n, group, bad);
            }
        }
    }
}

static void test_bulk_api(void) {
    vt_error err;
    float x[1000];
    uint8_t c[1000], sentinel[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)(i - 500) * 0.37f;
    memset(c, 0xAB, sizeof c);
    memcpy(sentinel, c, sizeof c);
    CHECK(vt_fp8_quantize(x, VT_DTYPE_F32, c, 1000, 0.0f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_VALUE, "zero scale");
    CHECK(strstr(err.message, "scale") != NULL, "message names scale: %s", err.message);
    CHECK(vt_fp8_quantize(x, VT_DTYPE_F32, c, 1000, -1.0f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_VALUE, "neg scale");
    CHECK(vt_fp8_quantize(x, VT_DTYPE_F32, c, 1000, NAN, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_VALUE, "nan scale");
    CHECK(vt_fp8_quantize(x, VT_DTYPE_F32, c, 1000, INFINITY, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_VALUE, "inf scale");
    CHECK(vt_fp8_quantize(x, VT_DTYPE_F32, c, 1000, 1.0f, VT_DTYPE_F16, 1, &err) == VT_ERR_VALUE, "bad fmt");
    CHECK(vt_fp8_quantize(x, VT_DTYPE_FP8_E4M3, c, 1000, 1.0f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_TYPE, "bad src");
    CHECK(vt_fp8_quantize(NULL, VT_DTYPE_F32, c, 1000, 1.0f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_ERR_VALUE, "NULL");
    CHECK(memcmp(c, sentinel, sizeof c) == 0, "nothing written on error");
    CHECK(vt_fp8_quantize(NULL, VT_DTYPE_F32, NULL, 0, 1.0f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_OK, "empty ok");
    /* threads: same bytes whatever the thread count */
    enum { N = 1 << 20 };
    float *big = malloc(N * 4);
    uint8_t *a = malloc(N), *b = malloc(N);
    for (int i = 0; i < N; i++) big[i] = sinf((float)i) * 500.0f;
    CHECK(vt_fp8_quantize(big, VT_DTYPE_F32, a, N, 0.7f, VT_DTYPE_FP8_E4M3, 1, &err) == VT_OK, "1 thread");
    CHECK(vt_fp8_quantize(big, VT_DTYPE_F32, b, N, 0.7f, VT_DTYPE_FP8_E4M3, 3, &err) == VT_OK, "3 threads");
    CHECK(memcmp(a, b, N) == 0, "thread count does not change bytes");
    for (int i = 0; i < N; i += 9973) CHECK(a[i] == vt_fp8_e4m3_from_f32(big[i] / 0.7f), "bulk = scalar at %d", i);
    free(big), free(a), free(b);
}

static void test_table(void) {
    const vt_dtype_info *t = vt_dtype_get(VT_DTYPE_FP8_E4M3);
    CHECK(t && t->elem_bytes == 1 && t->is_fp8 && t->max_finite == 448.0, "e4m3 row");
    CHECK(vt_dtype_get(VT_DTYPE_BF16)->elem_bytes * 1 == 2 * vt_dtype_get(VT_DTYPE_FP8_E5M2)->elem_bytes, "half");
    CHECK(vt_dtype_get(-1) == NULL && vt_dtype_get(VT_DTYPE_COUNT) == NULL, "out of range");
    int d = 99;
    vt_error err;
    CHECK(vt_dtype_from_name("fp8", "kv_cache_dtype", &d, &err) == VT_OK && d == VT_DTYPE_FP8_E4M3, "fp8 alias");
    CHECK(vt_dtype_from_name("half", "kv_cache_dtype", &d, &err) == VT_OK && d == VT_DTYPE_F16, "half alias");
    CHECK(vt_dtype_from_name("auto", "kv_cache_dtype", &d, &err) == VT_OK && d == VT_DTYPE_AUTO, "auto");
    CHECK(vt_dtype_from_name("fp9", "kv_cache_dtype", &d, &err) == VT_ERR_VALUE, "unknown");
    CHECK(strstr(err.message, "kv_cache_dtype") && strstr(err.message, "fp8_e5m2"), "lists names: %s", err.message);
    CHECK(strcmp(vt_kv_cache_flag(0), "auto") == 0 && vt_kv_cache_flag(vt_kv_cache_flag_count()) == NULL, "flags");
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    ref_init(&REF_E4M3);
    ref_init(&REF_E5M2);
    vt_error err;
    if (vt_runtime_init(NULL, &err) != VT_OK) {
        fprintf(stderr, "init: %s\n", err.message);
        return 1;
    }
    vt_isa best = vt_isa_best();
    for (int k = 0; k <= (int)best; k++) {
        CHECK(vt_isa_set((vt_isa)k, &err) == VT_OK, "set isa %d", k);
        isa_kernels[isa_count++] = *vt_codec_active();
    }
    if ((int)best < VT_ISA_AVX512) CHECK(vt_isa_set(VT_ISA_AVX512, &err) == VT_ERR_UNSUPPORTED, "refuse isa");
    vt_isa_set(best, &err);
    printf("test_codec: ISAs tested: %d (best %s), sweep: %s\n", isa_count, vt_isa_name(best),
           full ? "all 2^32 float32 inputs" : "strided sample (1/4099)");
    test_table();
    test_known_values();
    test_decode();
    test_half_sources();
    test_scale_is_division();
    test_division_boundaries();
    test_stream_alignment();
    test_bulk_api();
    test_fwht();
    test_levels();
    test_packed3();
    test_nibbles();
    run_sweep(full);
    printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
    return failures ? 1 : 0;
}
