/* vLLM 0.33's UltraQuant slot codec (ultraquant_4bit): the store and the dequantized read of one
 * (token, KV head) slot, following the Triton store vLLM runs (vllm/v1/attention/ops/ultraquant/
 * triton_store.py) and its format (format.py). The loops and checks are kv_slots.c's. Scalar C11.
 *
 * Slot of D + 2 * D / 32 bytes: [K codes D / 2 | K scales D / 32 | V codes D / 2 | V scales D / 32].
 * K is rotated first by the in-register Walsh-Hadamard the kernel runs: log2(D) butterfly stages, each
 * y[i] = (y[i] + y[i ^ b]) * c (bit b of i clear) or (y[i ^ b] - y[i]) * c (set), c = float32(1 / sqrt(2)),
 * in float32. V is not rotated. Per group of 32 (float32 throughout):
 *   a = max |x|; a == 0, a not finite, or a * 0.156 underflowing to 0 (float32 input only): scale byte 0, every
 *   code +0 (0b0000);
 *   else e = floor(log2(a * float32(0.156)) + 0.5), s = 2^e, byte e + 127 (0 outside [0, 255]);
 *   code of x: n = the number of the 14 FP4 midpoints m with x / s > m (sorted level n of
 *   -6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6), E2M1 bits 15 - n (n < 7) or n - 7;
 *   packed two per byte, element 2j in the low nibble.
 * Read: E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6, sign bit 3) times 2^(byte - 127), byte 0 reading 0; K stays in
 * the rotated basis (K_model = K_rot H, H the orthonormal Sylvester Hadamard, its own inverse). */
#include <math.h>
#include <stdint.h>

#include "vt_internal.h"
#include "vtinfer/turboquant.h"

#define UQ_GROUP 32

static const float uq_mid[14] = {-5.0f, -3.5f, -2.5f, -1.75f, -1.25f, -0.75f, -0.25f,
                                 0.25f,  0.75f, 1.25f, 1.75f,  2.5f,  3.5f,  5.0f};
static const float uq_value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static size_t uq_slot_bytes(const vt_dtype_info *t, size_t d, size_t rope_dim) {
    (void)rope_dim;
    (void)t;
    return d + 2 * (d / UQ_GROUP);
}

static int uq_needs_codebook(const vt_dtype_info *t) {
    (void)t;
    return 0;
}

/* The store kernel's rotation, in place (d a power of two). */
static void uq_rotate(float *y, int64_t d) {
    const float c = 0.70710678118654752f;
    for (int64_t b = 1; b < d; b *= 2)
        for (int64_t i = 0; i < d; i++) {
            if (i & b) continue;
            const float lo = y[i], hi = y[i | b];
            y[i] = (lo + hi) * c;
            y[i | b] = (lo - hi) * c;
        }
}

/* One row of d elements: codes into dst[0, d / 2), scale bytes into dst[d / 2, d / 2 + d / 32). */
static void uq_quantize_row(const float *x, int64_t d, uint8_t *dst) {
    uint8_t *scales = dst + d / 2;
    for (int64_t g = 0; g < d / UQ_GROUP; g++) {
        const float *xg = x + g * UQ_GROUP;
        uint8_t *cg = dst + g * (UQ_GROUP / 2);
        float a = 0.0f;
        int finite = 1;
        for (int i = 0; i < UQ_GROUP; i++) {
            const float m = fabsf(xg[i]);
            if (!(m <= 3.4028234663852886e38f)) finite = 0; /* inf or NaN */
            if (m > a) a = m;
        }
        const float sr = a * 0.156f;
        if (sr == 0.0f || !finite) { /* a zero group, or one whose scale underflows (float32 input only) */
            scales[g] = 0;
            for (int i = 0; i < UQ_GROUP / 2; i++) cg[i] = 0;
            continue;
        }
        const int e = (int)floorf(log2f(sr) + 0.5f);
        const float s = exp2f((float)e);
        scales[g] = (uint8_t)(e + 127 >= 0 && e + 127 <= 255 ? e + 127 : 0);
        for (int i = 0; i < UQ_GROUP; i += 2) {
            unsigned bits[2];
            for (int k = 0; k < 2; k++) {
                const float v = xg[i + k] / s;
                unsigned n = 0;
                for (int m = 0; m < 14; m++) n += v > uq_mid[m];
                bits[k] = n < 7 ? 15u - n : n - 7u;
            }
            cg[i / 2] = (uint8_t)(bits[0] | (bits[1] << 4));
        }
    }
}

static void uq_dequant_row(const uint8_t *src, int64_t d, float *out) {
    const uint8_t *bytes = src + d / 2;
    float s[VT_SLOT_MAX_D / UQ_GROUP];
    /* 2^(byte - 127) is the float32 whose exponent field is the byte (255: inf); byte 0 reads 0 */
    for (int64_t g = 0; g < d / UQ_GROUP; g++) s[g] = vt_bits_f32((uint32_t)bytes[g] << 23);
    vt_kernels_active()->codec->nibbles(src, (size_t)d, uq_value, s, UQ_GROUP, out);
}

static void uq_store(const vt_tq_cache *c, const vt_dtype_info *t, const float *k, const float *v, uint8_t *slot) {
    (void)t;
    const int64_t d = c->head_size;
    float kr[VT_SLOT_MAX_D];
    for (int64_t i = 0; i < d; i++) kr[i] = k[i];
    uq_rotate(kr, d);
    uq_quantize_row(kr, d, slot);
    uq_quantize_row(v, d, slot + d / 2 + d / UQ_GROUP);
}

static void uq_read(const vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *k, float *v) {
    (void)t;
    const int64_t d = c->head_size;
    uq_dequant_row(slot, d, k);
    uq_dequant_row(slot + d / 2 + d / UQ_GROUP, d, v);
}

const vt_slot_codec vt_slot_ultraquant = {
    .slot_bytes = uq_slot_bytes, .needs_codebook = uq_needs_codebook, .store = uq_store, .read = uq_read,
};
