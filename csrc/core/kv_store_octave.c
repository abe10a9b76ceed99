/* vLLM 0.33's Octave slot codec (octave_k3v4, octave_k3v3, octave_k3v3_compact): the store and the read of one
 * (token, KV head) slot, following the PyTorch reference of the pinned wheel (vllm/v1/attention/ops/
 * rocm_octave.py: OctaveFormat, reference_quantize, reference_dequantize). The loops and checks are kv_slots.c's.
 * Scalar C11, float32 throughout.
 *
 * Slot: [K rope codes r / 2 | K nope codes (D - r) * 3 / 8 | V codes D * vb / 8 | fp16 scales | pad], padded to
 * 8 bytes (compact: no rope part, padded to 4); r the rotary dims (c->rope_dim, a multiple of 64), vb 4 (k3v4)
 * or 3. Scales: one per 64-dim K block (compact: one for K), then one for V.
 * Rotation of a row x: x * s (s the sign pattern below), then per block of b dims the Walsh-Hadamard butterflies
 * (a, b) -> (a + b, a - b) for h = 1, 2, .. b / 2, then * float32(1 / sqrt(b)). K: b = 64 (compact: D); V: b = D
 * when D is a power of two, else 64. The read undoes it: butterflies, * float32(1 / sqrt(b)), then * s.
 * Quantizing n rotated values x with the bits-bit codebook L (int8 values) and multiplier M (59 / 46):
 *   ss = sum x^2; rms = max(sqrt(ss / n), 1e-12); y = x / rms * M; code = the number of midpoints m of L with
 *   !(m >= y) (torch.bucketize: a NaN y takes the last code); dot = sum x * L[code];
 *   scale = (dot > 0 ? ss / max(dot, 1e-30) : 0) * 64, stored as fp16 (nearest even).
 *   The sums run in element order (the reference's torch reductions order them as the build vectorizes).
 * Read: L[code] * (float(scale16) / 64).
 * Packing: 4-bit, per 8 dims a little-endian word whose byte j holds dim j (low nibble) and dim j + 4 (high);
 * 3-bit, a 2-bit plane (per 16 dims a word, byte j bits 2i..2i+1 = dim 4i + j's low two bits) then a 1-bit plane
 * (per 32 dims a word, byte j bit i = dim 4i + j's high bit). Bytes the rules do not write (the pad) are left
 * as they were. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/turboquant.h"

#define OCT_BLOCK 64
#define OCT_ROPE_BITS 4
#define OCT_NOPE_BITS 3

/* vLLM's Octave signs (_signs_cpu): torch.randint(0, 2, (n,)) * -2 + 1 from a CPU torch.Generator seeded 0x5E17,
 * the first d of them for head size d (the draws of a longer vector start with those of a shorter one). Bit i
 * (word i / 32, bit i % 32) set = sign -1, as vLLM's sign_bits. Generated with torch 2.13.0;
 * tests/numerics/test_kv_formats_octave.py draws them from torch at test time and compares. */
static const uint32_t oct_sign_bits[VT_SLOT_MAX_D / 32] = {
    0x82c270ebu, 0x9e0d4635u, 0x41d23db1u, 0x68c675e6u, 0xf687e132u, 0xb5cabdc3u, 0x1e0ac1a1u, 0x74afc721u,
    0x53685d96u, 0x027ddb37u, 0xe256f797u, 0x05cb43d3u, 0x81a5b38cu, 0xeb391759u, 0xb4510dbfu, 0x20784184u,
    0x9dee13f1u, 0x86e164adu, 0xa8c67792u, 0x5131349cu, 0x0910255du, 0x78efda24u, 0xe9aa8b83u, 0xc536f0ebu,
    0xe8b1a302u, 0x2a1454e3u, 0xd3d7e6cfu, 0x3dcaa5a2u, 0xd27753c8u, 0xe896d57du, 0xf6ec09d3u, 0xbbbd9ddbu,
    0xbf4be67eu, 0xc791b80fu, 0xbd856aacu, 0x2d5db7f7u, 0x2c91e1d6u, 0x3fb5f166u, 0x0ae8013eu, 0xf18e3a84u,
    0xee320320u, 0x9f88b113u, 0x6a748059u, 0x8cdb4451u, 0xcba8a308u, 0x97374a82u, 0xf5a7b903u, 0x3ec613bau,
    0x4eff8bbau, 0x1576f093u, 0x726e54c6u, 0x32d69925u, 0x922c30c7u, 0x6ff89b24u, 0x02a34651u, 0x6ee9ca64u,
    0xc660ba23u, 0xefbab40au, 0x47b921b5u, 0x8430b303u, 0x6fb92048u, 0xd5bba472u, 0x6c75605bu, 0xaa4b56c5u,
    0x8d0f99d2u, 0xc5c23546u, 0xd3df0fdfu, 0xff8f8d78u, 0xf1da3f46u, 0x9a06d569u, 0x53320261u, 0x74a142e4u,
    0xfcff7eb0u, 0x4cfcd82du, 0x2fea43bfu, 0x33652d4fu, 0x363ad8fdu, 0x64549c1bu, 0x00c3de63u, 0x16faf664u,
    0xbfd6b99eu, 0x345a5260u, 0x9767c13fu, 0x6a662717u, 0xfe5d6ebfu, 0x8823c289u, 0x64d58088u, 0x02f6ba85u,
    0x4bdf5035u, 0xebdca31fu, 0x91f9af48u, 0x8e93f68fu, 0x1577d2f0u, 0x47da3060u, 0xa29a6e7bu, 0x9e8030c0u,
    0x766471e7u, 0x204a51f5u, 0x8847fd57u, 0x28ed4decu, 0xa66a7b83u, 0x26ec4dd5u, 0x980bda1eu, 0x399635e5u,
    0x3be335c4u, 0x83178223u, 0x53767cd7u, 0xa4c14f07u, 0x51396546u, 0x31df4ac3u, 0xd8c83314u, 0x310aba1cu,
    0x72845a65u, 0x7786cd15u, 0x4483a4a9u, 0x4de8e9d7u, 0x6ee5d397u, 0xb60c3239u, 0xe6728c3bu, 0x259c5874u,
    0xf81cd1a8u, 0x2adb785cu, 0x840f567eu, 0xfc3a3d91u, 0x770923ceu, 0xae5b12e9u, 0x386130e9u, 0xaac73337u,
};

/* Lloyd-Max codebooks for N(0, 1) as int8 (rocm_octave.py LUT, LUT_MULT). */
static const float oct_lut3[8] = {-127.0f, -79.0f, -45.0f, -14.0f, 14.0f, 45.0f, 79.0f, 127.0f};
static const float oct_lut4[16] = {-126.0f, -95.0f, -74.0f, -58.0f, -43.0f, -30.0f, -18.0f, -6.0f,
                                   6.0f,    18.0f,  30.0f,  43.0f,  58.0f,  74.0f,  95.0f,  126.0f};

static const float *oct_lut(int bits) { return bits == 4 ? oct_lut4 : oct_lut3; }
static float oct_mult(int bits) { return bits == 4 ? 46.0f : 59.0f; }

typedef struct oct_geometry {
    int64_t d, rope, kwide; /* head size, rotary dims, K dims with 4-bit codes (0 for compact) */
    int64_t off_nope, off_v, off_scales, num_k_scales, vbits, kblock, vblock, slot;
    int compact;
} oct_geometry;

static int64_t is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

static oct_geometry oct_layout(const vt_dtype_info *t, int64_t d, int64_t rope) {
    oct_geometry g;
    g.compact = t->rope_block == 0;
    g.d = d;
    g.rope = rope;
    g.kwide = g.compact ? 0 : rope;
    g.vbits = t->value_bits;
    g.off_nope = g.kwide * OCT_ROPE_BITS / 8;
    g.off_v = g.off_nope + (d - g.kwide) * OCT_NOPE_BITS / 8;
    g.off_scales = g.off_v + d * g.vbits / 8;
    g.num_k_scales = g.compact ? 1 : d / OCT_BLOCK;
    g.kblock = g.compact ? d : OCT_BLOCK;
    g.vblock = is_pow2(d) ? d : OCT_BLOCK;
    const int64_t raw = g.off_scales + 2 * (g.num_k_scales + 1), align = g.compact ? 4 : 8;
    g.slot = (raw + align - 1) / align * align;
    return g;
}

static size_t oct_slot_bytes(const vt_dtype_info *t, size_t d, size_t rope_dim) {
    return (size_t)oct_layout(t, (int64_t)d, (int64_t)rope_dim).slot;
}

static int oct_needs_codebook(const vt_dtype_info *t) {
    (void)t;
    return 0;
}

static int oct_negative(int64_t i) { return (int)(oct_sign_bits[i >> 5] >> (i & 31) & 1u); }

/* The sign pattern as float sign bits (bit 31 set where it is -1), expanded once from oct_sign_bits. */
static uint32_t oct_sign_mask[VT_SLOT_MAX_D];
static pthread_once_t oct_sign_once = PTHREAD_ONCE_INIT;

static void oct_expand_signs(void) {
    for (int64_t i = 0; i < VT_SLOT_MAX_D; i++) oct_sign_mask[i] = (uint32_t)oct_negative(i) << 31;
}

/* x[i] with its sign flipped where the sign pattern is -1 (a bit flip: a NaN keeps its payload). */
static void oct_flip_signs(float *x, int64_t d) {
    pthread_once(&oct_sign_once, oct_expand_signs);
    for (int64_t i = 0; i < d; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u ^= oct_sign_mask[i];
        memcpy(x + i, &u, 4);
    }
}

static void oct_rotate(const float *x, float *out, int64_t d, int64_t b) {
    for (int64_t i = 0; i < d; i++) out[i] = x[i];
    oct_flip_signs(out, d);
    vt_kernels_active()->codec->fwht(out, (size_t)d, (size_t)b);
}

static void oct_unrotate(float *x, int64_t d, int64_t b) {
    vt_kernels_active()->codec->fwht(x, (size_t)d, (size_t)b);
    oct_flip_signs(x, d);
}

/* n rotated values -> n codes of the given bits and the scale (before its fp16 rounding). */
static float oct_quantize(const float *x, int64_t n, int bits, uint8_t *codes) {
    const float *lut = oct_lut(bits);
    const int levels = 1 << bits;
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float rms = sqrtf(ss / (float)n);
    if (rms < 1e-12f) rms = 1e-12f; /* clamp_min keeps a NaN */
    const float mult = oct_mult(bits);
    float dot = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float y = x[i] / rms * mult;
        int code = 0;
        for (int m = 0; m + 1 < levels; m++) code += !((lut[m] + lut[m + 1]) / 2.0f >= y);
        codes[i] = (uint8_t)code;
        dot += x[i] * lut[code];
    }
    return (dot > 0.0f ? ss / (dot < 1e-30f ? 1e-30f : dot) : 0.0f) * 64.0f;
}

static void oct_pack(const uint8_t *c, int64_t n, int bits, uint8_t *dst) {
    if (bits == 4) {
        for (int64_t w = 0; w < n / 8; w++)
            for (int j = 0; j < 4; j++) dst[4 * w + j] = (uint8_t)(c[8 * w + j] | c[8 * w + 4 + j] << 4);
        return;
    }
    uint8_t *hi = dst + n / 4;
    for (int64_t w = 0; w < n / 16; w++)
        for (int j = 0; j < 4; j++) {
            unsigned b = 0;
            for (int i = 0; i < 4; i++) b |= (unsigned)(c[16 * w + 4 * i + j] & 3u) << (2 * i);
            dst[4 * w + j] = (uint8_t)b;
        }
    for (int64_t w = 0; w < n / 32; w++)
        for (int j = 0; j < 4; j++) {
            unsigned b = 0;
            for (int i = 0; i < 8; i++) b |= (unsigned)(c[32 * w + 4 * i + j] >> 2) << i;
            hi[4 * w + j] = (uint8_t)b;
        }
}

static void put_f16(uint8_t *p, float x) {
    const uint16_t h = vt_f16_from_f32(x);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

static float get_scale(const uint8_t *p) { return vt_f16_to_f32((uint16_t)(p[0] | p[1] << 8)) / 64.0f; }

static void oct_store(const vt_tq_cache *c, const vt_dtype_info *t, const float *k, const float *v, uint8_t *slot) {
    const oct_geometry g = oct_layout(t, c->head_size, c->rope_dim);
    float x[VT_SLOT_MAX_D];
    uint8_t codes[VT_SLOT_MAX_D];
    uint8_t *scales = slot + g.off_scales;
    oct_rotate(k, x, g.d, g.kblock);
    if (g.compact) {
        put_f16(scales, oct_quantize(x, g.d, OCT_NOPE_BITS, codes));
    } else {
        for (int64_t b = 0; b < g.d / OCT_BLOCK; b++) {
            const int bits = b * OCT_BLOCK < g.kwide ? OCT_ROPE_BITS : OCT_NOPE_BITS;
            put_f16(scales + 2 * b, oct_quantize(x + b * OCT_BLOCK, OCT_BLOCK, bits, codes + b * OCT_BLOCK));
        }
        oct_pack(codes, g.kwide, OCT_ROPE_BITS, slot);
    }
    oct_pack(codes + g.kwide, g.d - g.kwide, OCT_NOPE_BITS, slot + g.off_nope);
    oct_rotate(v, x, g.d, g.vblock);
    put_f16(scales + 2 * g.num_k_scales, oct_quantize(x, g.d, (int)g.vbits, codes));
    oct_pack(codes, g.d, (int)g.vbits, slot + g.off_v);
}

/* Levels times a scale, once per level (the same single rounding as per element). */
static void oct_levels(int bits, float s, float *l) {
    const float *lut = oct_lut(bits);
    for (int c = 0; c < 1 << bits; c++) l[c] = lut[c] * s;
}

/* n values of `bits`-bit codes of a section (its planes start at src, section_n dims long), from its dim e on. */
static void oct_decode(const uint8_t *src, int64_t section_n, int64_t e, int64_t n, int bits, float s, float *out) {
    const vt_codec_kernels *ck = vt_kernels_active()->codec;
    float l[16];
    oct_levels(bits, s, l);
    if (bits == 4)
        ck->levels4(src + e / 2, (size_t)n, l, out);
    else
        ck->levels3(src + e / 4, src + section_n / 4 + e / 8, (size_t)n, l, out);
}

/* K and V of a slot in their rotated bases (codes x scales, no rotation undone). */
static void oct_read_rotated(const vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k,
                             float *v) {
    const oct_geometry g = oct_layout(t, c->head_size, c->rope_dim);
    const uint8_t *scales = slot + g.off_scales;
    for (int64_t o = 0; o < g.d; o += g.kblock) {
        const float ks = get_scale(scales + 2 * (o / g.kblock));
        if (o < g.kwide)
            oct_decode(slot, g.kwide, o, g.kblock, OCT_ROPE_BITS, ks, k + o);
        else
            oct_decode(slot + g.off_nope, g.d - g.kwide, o - g.kwide, g.kblock, OCT_NOPE_BITS, ks, k + o);
    }
    oct_decode(slot + g.off_v, g.d, 0, g.d, (int)g.vbits, get_scale(scales + 2 * g.num_k_scales), v);
}

static void oct_read(const vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k, float *v) {
    const oct_geometry g = oct_layout(t, c->head_size, c->rope_dim);
    oct_read_rotated(c, t, slot, k, v);
    oct_unrotate(k, g.d, g.kblock);
    oct_unrotate(v, g.d, g.vblock);
}

/* Attention's maps, in double, rounded once: the K rotation is R = H S (S the signs, H the blocks'
 * Walsh-Hadamard / sqrt(b), symmetric), orthogonal, so q . (R^T k') = (R q) . k'; the V rotation's inverse is
 * R^T = S H, applied to a sum of rotated V rows. */
static void oct_rotate_f64(float *x, int64_t d, int64_t b, int signs_first) {
    double y[VT_SLOT_MAX_D];
    for (int64_t i = 0; i < d; i++) y[i] = (double)x[i];
    if (signs_first)
        for (int64_t i = 0; i < d; i++) y[i] = oct_negative(i) ? -y[i] : y[i];
    const double n = sqrt((double)b);
    for (int64_t o = 0; o < d; o += b) vt_fwht_f64(y + o, b);
    for (int64_t i = 0; i < d; i++) y[i] /= n;
    if (!signs_first)
        for (int64_t i = 0; i < d; i++) y[i] = oct_negative(i) ? -y[i] : y[i];
    for (int64_t i = 0; i < d; i++) x[i] = (float)y[i];
}

static void oct_attn_query(const vt_dtype_info *t, float *q, int64_t d) {
    oct_rotate_f64(q, d, oct_layout(t, d, 0).kblock, 1);
}

static void oct_attn_output(const vt_dtype_info *t, float *o, int64_t d) {
    oct_rotate_f64(o, d, oct_layout(t, d, 0).vblock, 0);
}

const vt_slot_codec vt_slot_octave = {
    .slot_bytes = oct_slot_bytes, .needs_codebook = oct_needs_codebook, .store = oct_store, .read = oct_read,
    .attn_read = oct_read_rotated, .attn_query = oct_attn_query, .attn_output = oct_attn_output,
};
