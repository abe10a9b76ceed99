/* vLLM 0.33's TurboQuant slot codec: the store and the dequantized read of one (token, KV head) slot
 * (vtinfer/turboquant.h; the rules with vLLM's sources: .agents/specs/kv-formats.md). The loops and checks
 * are kv_slots.c's. Scalar C11. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/turboquant.h"

#define TQ_MAX_D VT_SLOT_MAX_D /* the rotation's stack row */

static void put_f16(uint8_t *dst, float x) {
    uint16_t h = vt_f16_from_f32(x);
    dst[0] = (uint8_t)(h & 0xFF), dst[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *src) { return vt_f16_to_f32((uint16_t)(src[0] | (src[1] << 8))); }

/* Codes q[0..d) of `bits` (3 or 4) into dst: 4-bit two per byte (even element low); 3-bit per group
 * of 8 one 24-bit little-endian word (element i at bit 3i), d / 8 groups. */
static void pack(const uint8_t *q, int64_t d, int bits, uint8_t *dst) {
    if (bits == 4) {
        for (int64_t j = 0; j < d / 2; j++) dst[j] = (uint8_t)(q[2 * j] | (q[2 * j + 1] << 4));
        return;
    }
    for (int64_t g = 0; g < d / 8; g++) {
        uint32_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint32_t)q[8 * g + i] << (3 * i);
        for (int b = 0; b < 3; b++) dst[3 * g + b] = (uint8_t)(w >> (8 * b));
    }
}

/* Code i of a packed row: the 16 bits from byte bit / 8 (vLLM's read). */
static unsigned unpack_one(const uint8_t *src, int64_t nbytes, int64_t i, int bits) {
    int64_t bit = i * bits, byte = bit / 8;
    unsigned w = src[byte] | (byte + 1 < nbytes ? (unsigned)src[byte + 1] << 8 : 0u);
    return (w >> (bit % 8)) & ((1u << bits) - 1u);
}

/* out[j] = levels[code j] for the d codes of a packed row of nbytes, each as unpack_one reads it: the active ISA's
 * lookups for 4-bit rows of even d (a byte's two codes) and a 3-bit row's whole 24-bit groups, unpack_one for the
 * rest (a partial group, other widths). */
static void lookup_row(const uint8_t *src, int64_t nbytes, int64_t d, int bits, const float *levels, float *out) {
    const vt_codec_kernels *k = vt_kernels_active()->codec;
    const float one = 1.0f; /* the nibble lookup's scale: x * 1 is x */
    int64_t i = 0;
    if (bits == 4 && d % 2 == 0) {
        k->nibbles(src, (size_t)d, levels, &one, (size_t)d, out);
        return;
    }
    if (bits == 3 && d >= 8) k->packed3(src, (size_t)(i = d / 8 * 8), levels, out);
    for (; i < d; i++) out[i] = levels[unpack_one(src, nbytes, i, bits)];
}

/* Values: min / max, scale floored at 1e-8, codes by division (not a reciprocal), then fp16 scale, fp16 min. */
static void store_values(const float *v, int64_t d, int bits, uint8_t *dst, int64_t vdb) {
    uint8_t q[TQ_MAX_D];
    const int top = (1 << bits) - 1;
    float lo = v[0], hi = v[0];
    for (int64_t i = 1; i < d; i++) {
        if (v[i] < lo) lo = v[i];
        if (v[i] > hi) hi = v[i];
    }
    float scale = (hi - lo) / (float)top;
    if (!(scale > 1e-8f)) scale = 1e-8f;
    for (int64_t i = 0; i < d; i++) {
        float t = (v[i] - lo) / scale + 0.5f;
        q[i] = !isfinite(t) || t < 0.0f ? 0 : t >= (float)top ? (uint8_t)top : (uint8_t)(int32_t)t;
    }
    pack(q, d, bits, dst);
    put_f16(dst + vdb, scale);
    put_f16(dst + vdb + 2, lo);
}

void vt_fwht_f64(double *x, int64_t d) {
    for (int64_t h = 1; h < d; h *= 2)
        for (int64_t i = 0; i < d; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                double a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
}

/* MSE key: norm (float32 squares summed in double), unit row, rotation y = x_hat H / sqrt(D) (products
 * exact in double, rounded once to float32), index = count of midpoints <= y, packed, then fp16 norm. */
static void store_key_mse(const vt_tq_cache *c, const float *k, int bits, uint8_t *dst) {
    const int64_t d = c->head_size;
    double y[TQ_MAX_D], sum = 0.0;
    uint8_t q[TQ_MAX_D];
    for (int64_t i = 0; i < d; i++) {
        float sq = k[i] * k[i];
        sum += (double)sq;
    }
    const float norm = (float)sqrt(sum);
    const float den = norm + 1e-8f;
    for (int64_t i = 0; i < d; i++) y[i] = (double)(k[i] / den);
    vt_fwht_f64(y, d);
    const double h = (double)(1.0f / (float)sqrt((double)d));
    const int n_mid = (1 << bits) - 1;
    for (int64_t i = 0; i < d; i++) {
        float yi = (float)(y[i] * h);
        int idx = 0;
        if (yi == yi)
            while (idx < n_mid && yi >= c->midpoints[idx]) idx++;
        q[i] = (uint8_t)idx;
    }
    pack(q, d, bits, dst);
    put_f16(dst + (d * bits + 7) / 8, norm);
}

/* The key part's bytes: fp8 keys D, MSE keys the packed indices and an fp16 norm. */
static int64_t key_part_bytes(const vt_dtype_info *t, int64_t d) {
    return t->key_bits == 8 ? d : (d * t->key_bits + 7) / 8 + 2;
}

static void tq_store(const vt_tq_cache *c, const vt_dtype_info *t, const float *kr, const float *vr,
                     uint8_t *slot) {
    const int64_t d = c->head_size;
    if (t->key_bits == 8)
        for (int64_t i = 0; i < d; i++) slot[i] = vt_fp8_e4m3_from_f32(kr[i]); /* saturating, nearest even */
    else
        store_key_mse(c, kr, t->key_bits, slot);
    store_values(vr, d, t->value_bits, slot + key_part_bytes(t, d), (d * t->value_bits + 7) / 8);
}

static void tq_read(const vt_tq_cache *c, const vt_dtype_info *t, const uint8_t *slot, float *ko, float *vo) {
    const int64_t d = c->head_size;
    const int64_t mse = (d * t->key_bits + 7) / 8;
    const int64_t vdb = (d * t->value_bits + 7) / 8;
    if (t->key_bits == 8) { /* the active ISA's e4m3 row decode at scale 1: vt_fp8_e4m3_to_f32 of each code */
        vt_kernels_active()->codec->dequant[0][vt_float_index(VT_DTYPE_F32)](slot, ko, (size_t)d, 1.0f);
    } else {
        lookup_row(slot, mse, d, t->key_bits, c->centroids, ko);
        if (t->norm_correction) {
            float ss = 0.0f;
            for (int64_t j = 0; j < d; j++) ss += ko[j] * ko[j];
            const float r = 1.0f / sqrtf(ss + 1e-16f);
            for (int64_t j = 0; j < d; j++) ko[j] *= r;
        }
        const float nrm = get_f16(slot + mse);
        for (int64_t j = 0; j < d; j++) ko[j] = nrm * ko[j];
    }
    const uint8_t *vq = slot + key_part_bytes(t, d);
    const float scale = get_f16(vq + vdb), zero = get_f16(vq + vdb + 2);
    float levels[16]; /* code x scale + zero per level */
    for (int q = 0; q < 1 << t->value_bits; q++) levels[q] = (float)q * scale + zero;
    lookup_row(vq, vdb, d, t->value_bits, levels, vo);
}

/* vLLM 0.33 TurboQuantConfig.slot_size_aligned: the key part, then ceil(D * vb / 8) value code bytes and 4
 * bytes of fp16 scale and zero, rounded up to even. */
static size_t tq_slot_bytes(const vt_dtype_info *t, size_t d, size_t rope_dim) {
    (void)rope_dim;
    size_t slot = (size_t)key_part_bytes(t, (int64_t)d) + (d * (size_t)t->value_bits + 7) / 8 + 4;
    return slot + slot % 2;
}

/* Trapezoid rule over [a, b] in 200 intervals of N(0, var)'s density (moment 0) or x times it (moment 1). */
static double trapezoid(int moment, double a, double b, double var, double norm) {
    const double step = (b - a) / 200;
    double fa = norm * exp(-a * a / (2 * var)), fb = norm * exp(-b * b / (2 * var));
    if (moment) fa *= a, fb *= b;
    double total = 0.5 * (fa + fb);
    for (int i = 1; i < 200; i++) {
        const double x = a + i * step;
        const double f = norm * exp(-x * x / (2 * var));
        total += moment ? x * f : f;
    }
    return total * step;
}

vt_status vt_tq_codebook(int dtype, int64_t head_size, float *centroids, float *midpoints, vt_error *err) {
    const vt_dtype_info *t = vt_dtype_get(dtype);
    if (!t || !t->slot || !t->slot->needs_codebook(t))
        return vt_error_set(err, VT_ERR_VALUE, "turboquant_codebook: dtype must be an MSE preset (a slot format "
                            "whose keys index a codebook); got %s", t ? t->name : "an unknown dtype id");
    if (head_size <= 0)
        return vt_error_set(err, VT_ERR_VALUE, "turboquant_codebook: head_size must be > 0; got %lld",
                            (long long)head_size);
    if (t->key_bits < 1 || t->key_bits > 4) /* the solve's arrays hold 16 levels, as the paged cache's */
        return vt_error_set(err, VT_ERR_UNSUPPORTED, "turboquant_codebook: %s's %d-bit keys exceed the 16-level "
                            "codebook", t->name, t->key_bits);
    /* vLLM's solve: 2^bits equal cells over +-3.5 sigma; each round cuts at the neighbours' midpoints (outer
     * edges +-10.5 sigma) and moves each centroid to its cell's conditional mean; at most 200 rounds, stopping
     * without taking the round once no centroid moves by 1e-10. Python floats there, doubles here: the same
     * operations in the same order. */
    const int levels = 1 << t->key_bits;
    const double var = 1.0 / (double)head_size, sigma = sqrt(var), norm = 1.0 / sqrt(2 * 3.141592653589793 * var);
    const double lo = -3.5 * sigma, hi = 3.5 * sigma;
    double cent[16], moved[16], edges[17];
    for (int i = 0; i < levels; i++) cent[i] = lo + (hi - lo) * (i + 0.5) / levels;
    for (int round = 0; round < 200; round++) {
        edges[0] = lo * 3, edges[levels] = hi * 3;
        for (int i = 0; i + 1 < levels; i++) edges[i + 1] = (cent[i] + cent[i + 1]) / 2.0;
        double most = 0.0;
        for (int i = 0; i < levels; i++) {
            const double mass = trapezoid(0, edges[i], edges[i + 1], var, norm);
            moved[i] = mass > 1e-15 ? trapezoid(1, edges[i], edges[i + 1], var, norm) / mass : cent[i];
            const double d = fabs(moved[i] - cent[i]);
            if (d > most) most = d;
        }
        if (most < 1e-10) break;
        memcpy(cent, moved, sizeof cent);
    }
    for (int i = 0; i < levels; i++) centroids[i] = (float)cent[i];
    for (int i = 0; i + 1 < levels; i++) midpoints[i] = (centroids[i] + centroids[i + 1]) / 2.0f;
    return VT_OK;
}

/* The core's own codebooks, solved once per (dtype, head size) and kept for the process (the solve takes
 * milliseconds): a fixed table, so a pointer handed out stays valid. */
#define SHARED_CODEBOOKS 64
static struct {
    int dtype;
    int64_t head_size;
    float centroids[16];
} shared_books[SHARED_CODEBOOKS];
static int shared_count;
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

vt_status vt_tq_centroids_shared(int dtype, int64_t head_size, const float **centroids, vt_error *err) {
    vt_status s = VT_OK;
    float mids[15];
    pthread_mutex_lock(&shared_lock);
    int i = 0;
    while (i < shared_count && !(shared_books[i].dtype == dtype && shared_books[i].head_size == head_size)) i++;
    if (i == shared_count) {
        if (shared_count == SHARED_CODEBOOKS)
            s = vt_error_set(err, VT_ERR_UNSUPPORTED, "turboquant_codebook: the core keeps %d codebooks and all are "
                             "taken; pass the codebook (slot_centroids) for more (dtype, head size) pairs",
                             SHARED_CODEBOOKS);
        else if ((s = vt_tq_codebook(dtype, head_size, shared_books[i].centroids, mids, err)) == VT_OK) {
            shared_books[i].dtype = dtype, shared_books[i].head_size = head_size;
            shared_count++;
        }
    }
    if (s == VT_OK) *centroids = shared_books[i].centroids;
    pthread_mutex_unlock(&shared_lock);
    return s;
}

static int tq_needs_codebook(const vt_dtype_info *t) { return t->key_bits != 8; }

const vt_slot_codec vt_slot_turboquant = {
    .slot_bytes = tq_slot_bytes, .needs_codebook = tq_needs_codebook, .store = tq_store, .read = tq_read,
};
