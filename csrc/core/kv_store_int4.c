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
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/kvcache.h"

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

static void flip_signs(float *x, int64_t b) {
    for (int64_t i = 0; i < b; i++)
        if (rht_sign_bits[i >> 5] >> (i & 31) & 1u) x[i] = -x[i];
}

static void hadamard(float *x, int64_t b) {
    for (int64_t h = 1; h < b; h <<= 1)
        for (int64_t k = 0; k < b; k += 2 * h)
            for (int64_t i = k; i < k + h; i++) {
                const float a = x[i], c = x[i + h];
                x[i] = a + c;
                x[i + h] = a - c;
            }
}

int64_t vt_int4_rht_block(int64_t d) { return d & -d; }

void vt_int4_rht(float *x, int64_t d, int inverse) {
    const int64_t b = vt_int4_rht_block(d);
    for (int64_t o = 0; o < d; o += b) {
        if (!inverse) flip_signs(x + o, b);
        hadamard(x + o, b);
        if (inverse) flip_signs(x + o, b);
    }
}

/* int32(t) as NVIDIA's cvt.rzi.s32.f32: truncation, saturating, NaN -> 0; then clamp [0, 15]. */
static float code_of(float t) {
    t = t >= 0.0f ? t + 0.5f : t - 0.5f;
    if (!(t == t)) return 0.0f;
    if (t >= 15.0f) return 15.0f;
    if (t <= 0.0f) return 0.0f;
    return (float)(int32_t)t;
}

void vt_int4_quantize_row(const float *x, int64_t d, uint8_t *codes, float *scale_out) {
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < d; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    const float scale = fmaxf((mx - mn) / 15.0f, 1e-6f);
    const float zp = code_of(-mn / scale);
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < d; i += 2) {
        const float lo = x[i] * inv + zp, hi = x[i + 1] * inv + zp; /* two roundings each: no contraction */
        codes[i / 2] = (uint8_t)((unsigned)code_of(lo) | (unsigned)code_of(hi) << 4);
    }
    uint32_t bits;
    memcpy(&bits, &scale, 4);
    bits = (bits & ~0xFu) | ((uint32_t)zp & 0xFu);
    memcpy(scale_out, &bits, 4);
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
