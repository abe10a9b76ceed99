/* KV cache and store tests in plain C (no Python).
 *
 *  1. vt_kv_store under every ISA the CPU has (scalar twin, AVX2, AVX-512)
 *     against a reference written here: a loop of the scalar codecs
 *     (vt_fp8_*_from_f32(x / scale), vt_bf16/f16_from_f32) scattered by
 *     slot, for the flash layout and vLLM's x-split layout (chunk 8 and 1);
 *  2. refusals write nothing: a bad slot after good ones, a bad scale;
 *  3. geometry: zero sizes, 64-bit overflow, page bytes linear in element size;
 *  4. the cache: store/gather round trip, set_scales refusal leaves scales. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vtinfer/kvcache.h"
#include "vtinfer/turboquant.h"
#include "vtinfer/vtinfer.h"

#include "check.h"

enum { T = 37, H = 3, D = 64, BS = 5, NB = 11 };

static uint32_t rng_state = 12345u;
static float frand(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((float)(rng_state >> 8) / 16777216.0f - 0.5f) * 40.0f;
}

/* Reference encode of one element of the cache dtype from float32. */
static void ref_put(vt_dtype cd, float x, float scale, unsigned char *dst) {
    if (cd == VT_DTYPE_FP8_E4M3) *dst = vt_fp8_e4m3_from_f32(x / scale);
    else if (cd == VT_DTYPE_FP8_E5M2) *dst = vt_fp8_e5m2_from_f32(x / scale);
    else if (cd == VT_DTYPE_BF16) { uint16_t h = vt_bf16_from_f32(x); memcpy(dst, &h, 2); }
    else if (cd == VT_DTYPE_F16) { uint16_t h = vt_f16_from_f32(x); memcpy(dst, &h, 2); }
    else memcpy(dst, &x, 4);
}

/* layout 0: NHD flash; 1: HND flash; 2: x-split key (chunk x) / value (chunk 1). */
static void dst_for(int layout, int which, size_t es, int64_t x, unsigned char *base, vt_kv_dst *d) {
    const int64_t e = (int64_t)es;
    d->base = base;
    if (layout == 0) *d = (vt_kv_dst){base, BS * H * D * e, H * D * e, D * e, 0, D};
    else if (layout == 1) *d = (vt_kv_dst){base, BS * H * D * e, D * e, BS * D * e, 0, D};
    else if (which == 0) /* [NB, H, D/x, BS, x] */
        *d = (vt_kv_dst){base, H * D * BS * e, x * e, D * BS * e, BS * x * e, x};
    else /* [NB, H, D, BS] */
        *d = (vt_kv_dst){base, H * D * BS * e, e, D * BS * e, BS * e, 1};
}

static size_t offset_of(const vt_kv_dst *d, int64_t slot, int64_t h, int64_t dd, size_t es) {
    int64_t b = slot / BS, o = slot % BS;
    return (size_t)(b * d->stride_block + o * d->stride_slot + h * d->stride_head + (dd / d->chunk) * d->stride_chunk +
                    (dd % d->chunk) * (int64_t)es);
}

static void test_store_against_reference(void) {
    static float key[T][H][D], value[T][H][D];
    int64_t slots[T];
    for (int t = 0; t < T; t++) {
        slots[t] = (t * 7 + 3) % (NB * BS);
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) key[t][h][d] = frand(), value[t][h][d] = frand();
    }
    slots[5] = -1;
    slots[9] = slots[2]; /* duplicate: the later token (9) wins */
    const float ks[H] = {0.37f, 1.5f, 3.0f}, vs[H] = {2.5f, 0.11f, 0.75f};
    const vt_dtype cds[] = {VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_BF16, VT_DTYPE_F16, VT_DTYPE_F32};
    const size_t bytes = (size_t)NB * BS * H * D * 4;
    unsigned char *kc = malloc(bytes), *vc = malloc(bytes), *rk = malloc(bytes), *rv = malloc(bytes);
    for (int isa = VT_ISA_SCALAR; isa <= (int)vt_isa_best(); isa++) {
        CHECK(vt_isa_set((vt_isa)isa, NULL) == VT_OK, "isa %d", isa);
        for (size_t ci = 0; ci < sizeof cds / sizeof cds[0]; ci++) {
            const vt_dtype cd = cds[ci];
            const size_t es = vt_dtype_get(cd)->elem_bytes;
            for (int layout = 0; layout < 3; layout++) {
                const int64_t x = (int64_t)(16 / es) > D ? D : (int64_t)(16 / es);
                vt_kv_store_params p;
                memset(&p, 0, sizeof p);
                memset(kc, 0, bytes), memset(vc, 0, bytes), memset(rk, 0, bytes), memset(rv, 0, bytes);
                dst_for(layout, 0, es, x, kc, &p.key_cache);
                dst_for(layout, 1, es, x, vc, &p.value_cache);
                p.key = key, p.value = value;
                p.key_stride_token = H * D * 4, p.key_stride_head = D * 4;
                p.value_stride_token = H * D * 4, p.value_stride_head = D * 4;
                p.slot_mapping = slots, p.num_tokens = T, p.num_kv_heads = H, p.head_size = D;
                p.block_size = BS, p.num_blocks = NB, p.src_dtype = VT_DTYPE_F32, p.cache_dtype = cd;
                p.k_scale = ks, p.v_scale = vs, p.scale_per_head = 1;
                vt_error err;
                vt_status st = vt_kv_store(&p, 3, &err);
                CHECK(st == VT_OK, "store: %s", err.message);
                vt_kv_dst rkd, rvd;
                dst_for(layout, 0, es, x, rk, &rkd);
                dst_for(layout, 1, es, x, rv, &rvd);
                for (int t = 0; t < T; t++) {
                    if (slots[t] < 0) continue;
                    for (int h = 0; h < H; h++)
                        for (int d = 0; d < D; d++) {
                            ref_put(cd, key[t][h][d], ks[h], rk + offset_of(&rkd, slots[t], h, d, es));
                            ref_put(cd, value[t][h][d], vs[h], rv + offset_of(&rvd, slots[t], h, d, es));
                        }
                }
                CHECK(memcmp(kc, rk, bytes) == 0, "K isa %d dtype %d layout %d", isa, (int)cd, layout);
                CHECK(memcmp(vc, rv, bytes) == 0, "V isa %d dtype %d layout %d", isa, (int)cd, layout);

                /* A refused call writes nothing: bad last slot, then bad scale. */
                memcpy(rk, kc, bytes);
                for (int t = 0; t < T; t++) key[t][0][0] += 1.0f;
                int64_t saved = slots[T - 1];
                slots[T - 1] = NB * BS;
                st = vt_kv_store(&p, 2, &err);
                CHECK(st == VT_ERR_INDEX && strstr(err.message, "slot_mapping[36]"), "bad slot: %d %s", st,
                      err.message);
                slots[T - 1] = saved;
                if (vt_dtype_get(cd)->is_fp8) {
                    float bad[H] = {1.0f, NAN, 1.0f};
                    p.v_scale = bad;
                    st = vt_kv_store(&p, 2, &err);
                    CHECK(st == VT_ERR_VALUE && strstr(err.message, "v_scale"), "bad scale: %s", err.message);
                    p.v_scale = vs;
                }
                CHECK(memcmp(kc, rk, bytes) == 0, "refused call wrote (dtype %d layout %d)", (int)cd, layout);
                for (int t = 0; t < T; t++) key[t][0][0] -= 1.0f;
            }
        }
    }
    vt_isa_set(vt_isa_best(), NULL);
    free(kc), free(vc), free(rk), free(rv);
}

static void test_geometry(void) {
    vt_error err;
    size_t kv, region, page, total, page8;
    vt_kv_cache_config g = {4, 10, 16, 8, 128, VT_DTYPE_BF16, VT_KV_LAYOUT_NHD, 0};
    CHECK(vt_kv_cache_sizes(&g, "t", &kv, &region, &page, &total, &err) == VT_OK, "%s", err.message);
    CHECK(page == 2u * 4 * 16 * 8 * 128 * 2, "page %zu", page);
    g.dtype = VT_DTYPE_FP8_E4M3;
    CHECK(vt_kv_cache_sizes(&g, "t", NULL, NULL, &page8, NULL, &err) == VT_OK, "fp8");
    CHECK(page8 * 2 == page, "fp8 page must be half: %zu vs %zu", page8, page);
    g.num_blocks = 0;
    CHECK(vt_kv_cache_sizes(&g, "t", NULL, NULL, NULL, NULL, &err) == VT_ERR_VALUE && strstr(err.message, "num_blocks"),
          "zero: %s", err.message);
    vt_kv_cache_config big = {1 << 20, 1 << 20, 1 << 20, 1 << 20, 16, VT_DTYPE_F32, VT_KV_LAYOUT_NHD, 0};
    CHECK(vt_kv_cache_sizes(&big, "t", NULL, NULL, NULL, NULL, &err) == VT_ERR_OVERFLOW, "overflow");
    vt_kv_cache_config huge = {INT64_MAX, INT64_MAX, 1, 1, 1, VT_DTYPE_F32, VT_KV_LAYOUT_NHD, 0};
    CHECK(vt_kv_cache_sizes(&huge, "t", NULL, NULL, NULL, NULL, &err) == VT_ERR_OVERFLOW, "overflow 2");
    /* int4_per_token_head: vLLM's page, bs * H * 2 * (D / 2 + 4) bytes per layer; odd D refused */
    vt_kv_cache_config i4 = {3, 5, 16, 2, 80, VT_DTYPE_INT4_PTH, VT_KV_LAYOUT_HND, 0};
    CHECK(vt_kv_cache_sizes(&i4, "t", &kv, NULL, &page, NULL, &err) == VT_OK, "int4: %s", err.message);
    CHECK(page == 3u * 16 * 2 * 2 * (80 / 2 + 4) && kv == 5u * 16 * 2 * 40, "int4 page %zu kv %zu", page, kv);
    i4.head_size = 81;
    CHECK(vt_kv_cache_sizes(&i4, "t", NULL, NULL, NULL, NULL, &err) == VT_ERR_VALUE && strstr(err.message, "head_size"),
          "int4 odd: %s", err.message);
    vt_kv_cache_free(NULL);
}

static void test_cache_round_trip(void) {
    vt_kv_cache_config g = {2, 4, 4, 2, 16, VT_DTYPE_FP8_E4M3, VT_KV_LAYOUT_HND, 0};
    vt_kv_cache *c = NULL;
    vt_error err;
    CHECK(vt_kv_cache_create(&g, &c, &err) == VT_OK, "%s", err.message);
    if (!c) return;
    CHECK(((uintptr_t)vt_kv_cache_layer_data(c, 0, 0) % 64) == 0, "alignment");
    /* the accessors (vt_kv_cache is opaque): sizes worked out by hand for L=2, blocks=4, bs=4, H=2, D=16, fp8 */
    const vt_kv_cache_config *gc = vt_kv_cache_get_config(c);
    CHECK(gc->num_layers == 2 && gc->num_blocks == 4 && gc->block_size == 4 && gc->num_kv_heads == 2 &&
              gc->head_size == 16 && gc->dtype == VT_DTYPE_FP8_E4M3 && gc->layout == VT_KV_LAYOUT_HND,
          "config");
    CHECK(vt_kv_cache_elem_bytes(c) == 1 && vt_kv_cache_kv_bytes(c) == 512 && vt_kv_cache_region_bytes(c) == 512,
          "element / region bytes");
    CHECK(vt_kv_cache_page_bytes(c) == 2 * 2 * 4 * 2 * 16 && vt_kv_cache_nbytes(c) == 2 * 2 * 512, "page / total bytes");
    CHECK((char *)vt_kv_cache_layer_data(c, 1, 1) - (char *)vt_kv_cache_layer_data(c, 0, 0) == 3 * 512, "layer spacing");
    CHECK(!vt_kv_cache_is_released(c), "not released");
    float k[2] = {0.5f, 4.0f}, v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    CHECK(vt_kv_cache_set_scales(c, VT_KV_SCALE_LAYER, k, VT_KV_SCALE_HEAD, v, &err) == VT_OK, "%s", err.message);
    float bad[1] = {-1.0f};
    CHECK(vt_kv_cache_set_scales(c, VT_KV_SCALE_TENSOR, bad, VT_KV_SCALE_TENSOR, NULL, &err) == VT_ERR_VALUE,
          "negative");
    vt_kv_scale_mode kmode;
    CHECK(vt_kv_cache_scales(c, 0, &kmode)[2] == 4.0f && kmode == VT_KV_SCALE_LAYER, "scales kept after refusal");
    float y[2 * 2 * 16], yv[2 * 2 * 16];
    float src[2 * 2 * 16];
    for (int i = 0; i < 64; i++) src[i] = (float)(i % 13) - 6.0f;
    int64_t slots[2] = {3, 14};
    CHECK(vt_kv_cache_store(c, 1, src, 2 * 16 * 4, 16 * 4, src, 2 * 16 * 4, 16 * 4, VT_DTYPE_F32, slots, 2, 1, &err) ==
              VT_OK, "%s", err.message);
    CHECK(vt_kv_cache_gather(c, 1, slots, 2, y, yv, &err) == VT_OK, "%s", err.message);
    for (int i = 0; i < 64; i++) {
        int h = (i / 16) % 2;
        float want_k = vt_fp8_e4m3_to_f32(vt_fp8_e4m3_from_f32(src[i] / 4.0f)) * 4.0f;
        float want_v = vt_fp8_e4m3_to_f32(vt_fp8_e4m3_from_f32(src[i] / v[2 + h])) * v[2 + h];
        CHECK(y[i] == want_k && yv[i] == want_v, "gather %d: %g %g vs %g %g", i, y[i], yv[i], want_k, want_v);
    }
    CHECK(vt_kv_cache_store(c, 2, src, 0, 0, src, 0, 0, VT_DTYPE_F32, slots, 2, 1, &err) == VT_ERR_INDEX, "layer");
    vt_kv_cache_release(c);
    CHECK(vt_kv_cache_is_released(c), "released flag");
    CHECK(vt_kv_cache_gather(c, 1, slots, 2, y, yv, &err) == VT_ERR_VALUE, "released");
    vt_kv_cache_free(c);
}

/* 5. TurboQuant (vt_tq_store / vt_tq_gather): hand-computed k8v4 slot bytes, values read back, and
 *    refusals that write nothing (a bad slot after good ones, no codebook, D not a power of two). */
static void test_turboquant(void) {
    enum { TD = 16, TS = 16 + 8 + 4, TB = 4 };
    CHECK(vt_dtype_slot_bytes(VT_DTYPE_TQ_K8V4, TD) == TS, "k8v4 slot bytes");
    CHECK(vt_dtype_slot_bytes(VT_DTYPE_TQ_3BIT_NC, 128) == 102 && vt_dtype_slot_bytes(VT_DTYPE_F32, 128) == 0,
          "3bit_nc slot bytes / a plain dtype has none");
    uint8_t cache[TB * TS], before[TB * TS];
    memset(cache, 0x5A, sizeof cache);
    float k[2 * TD], v[2 * TD];
    for (int i = 0; i < 2 * TD; i++) k[i] = 0.0f, v[i] = (float)(i % TD) * 2.0f - 4.0f; /* min -4, scale 2 */
    k[0] = 1000.0f, k[1] = -1000.0f, k[2] = 17.0f;
    vt_tq_cache c = {VT_DTYPE_TQ_K8V4, 1, TB, 1, TD, cache, TB * TS, TS, TS, NULL, NULL, 0, 1.0f, 1.0f};
    int64_t slots[2] = {2, -1};
    vt_error err;
    CHECK(vt_tq_store(&c, VT_DTYPE_F32, k, TD * 4, TD * 4, v, TD * 4, TD * 4, slots, 2, &err) == VT_OK, "store: %s",
          err.message);
    const uint8_t *s = cache + 2 * TS;
    CHECK(s[0] == 0x7E && s[1] == 0xFE && s[2] == 0x58 && s[3] == 0, "e4m3 keys: saturation, tie to even");
    CHECK(s[16] == 0x10 && s[23] == 0xFE, "value nibbles: element 2j low");
    CHECK(s[24] == 0x00 && s[25] == 0x40 && s[26] == 0x00 && s[27] == 0xC4, "fp16 scale 2 and zero -4");
    for (int i = 0; i < TB * TS; i++)
        if (i < 2 * TS || i >= 3 * TS) CHECK(cache[i] == 0x5A, "byte %d outside the stored slot written", i);
    float ko[TD], vo[TD];
    int64_t one = 2;
    CHECK(vt_tq_gather(&c, &one, 1, ko, vo, 1, &err) == VT_OK && ko[0] == 448.0f && ko[2] == 16.0f && vo[0] == -4.0f &&
              vo[TD - 1] == 26.0f, "gather");
    memcpy(before, cache, sizeof cache);
    int64_t bad[2] = {0, TB};
    CHECK(vt_tq_store(&c, VT_DTYPE_F32, k, TD * 4, TD * 4, v, TD * 4, TD * 4, bad, 2, &err) == VT_ERR_INDEX &&
              strstr(err.message, "slot_mapping[1]") != NULL, "bad slot refused");
    vt_tq_cache m = c;
    m.dtype = VT_DTYPE_TQ_4BIT_NC;
    CHECK(vt_tq_store(&m, VT_DTYPE_F32, k, TD * 4, TD * 4, v, TD * 4, TD * 4, slots, 2, &err) == VT_ERR_VALUE &&
              strstr(err.message, "codebook") != NULL, "MSE preset without a codebook refused");
    m.head_size = 12;
    CHECK(vt_tq_store(&m, VT_DTYPE_F32, k, TD * 4, TD * 4, v, TD * 4, TD * 4, slots, 2, &err) == VT_ERR_VALUE &&
              strstr(err.message, "power of two") != NULL, "D 12 refused for an MSE preset");
    m = c;
    m.dtype = VT_DTYPE_INT8_PTH;
    CHECK(vt_tq_store(&m, VT_DTYPE_F32, k, TD * 4, TD * 4, v, TD * 4, TD * 4, slots, 2, &err) == VT_ERR_VALUE,
          "a non-TurboQuant dtype refused");
    CHECK(memcmp(before, cache, sizeof cache) == 0, "a refused store wrote");
}

/* 6. Octave (octave_k3v4 through the slot loops): slot bytes per rotary dims, a one-hot K row whose rotation is a
 *    constant block (hand-computed codes, fp16 scale 381/256 and read-back 16383/2048), a zero V row, untouched pad
 *    bytes, and rope_dim refusals that write nothing. */
static void test_octave(void) {
    enum { OD = 128, OS = 32 + 24 + 64 + 6 + 2, OB = 2 };
    CHECK(vt_dtype_slot_bytes_rope(VT_DTYPE_OCT_K3V4, OD, 64) == OS && vt_dtype_slot_bytes(VT_DTYPE_OCT_K3V4, OD) == 136 &&
              vt_dtype_slot_bytes_rope(VT_DTYPE_OCT_K3V4, OD, 32) == 0 &&
              vt_dtype_slot_bytes(VT_DTYPE_OCT_K3V3_COMPACT, OD) == 100,
          "octave slot bytes");
    uint8_t cache[OB * OS], before[OB * OS];
    memset(cache, 0x5A, sizeof cache);
    float k[OD] = {0}, v[OD] = {0};
    k[0] = 8.0f; /* sign -1 at dim 0: the rotated block 0 is 64 x -1, block 1 zero */
    vt_tq_cache c = {VT_DTYPE_OCT_K3V4, 1, OB, 1, OD, cache, OB * OS, OS, OS, NULL, NULL, 64, 1.0f, 1.0f};
    int64_t slot = 1;
    vt_error err;
    CHECK(vt_tq_store(&c, VT_DTYPE_F32, k, OD * 4, OD * 4, v, OD * 4, OD * 4, &slot, 1, &err) == VT_OK, "store: %s",
          err.message);
    const uint8_t *s = cache + OS;
    int ok = 1;
    for (int i = 0; i < 32; i++) ok &= s[i] == 0x44;        /* y = -46: 4-bit code 4 (LUT -43) */
    for (int i = 32; i < 48; i++) ok &= s[i] == 0xFF;       /* zero block: 3-bit code 3, low plane */
    for (int i = 48; i < 56; i++) ok &= s[i] == 0x00;       /* high plane */
    for (int i = 56; i < 120; i++) ok &= s[i] == 0x77;      /* zero V: 4-bit code 7 */
    CHECK(ok, "octave codes");
    CHECK(s[120] == 0xF4 && s[121] == 0x3D && s[122] == 0 && s[123] == 0 && s[124] == 0 && s[125] == 0,
          "fp16 scales: K block 0 381/256, block 1 and V zero");
    for (int i = 0; i < OS; i++) CHECK(cache[i] == 0x5A, "slot 0 byte %d written", i);
    CHECK(s[126] == 0x5A && s[127] == 0x5A, "pad bytes written");
    float ko[OD], vo[OD];
    CHECK(vt_tq_gather(&c, &slot, 1, ko, vo, 1, &err) == VT_OK, "gather: %s", err.message);
    ok = ko[0] == 16383.0f / 2048.0f;
    for (int i = 1; i < OD; i++) ok &= ko[i] == 0.0f && vo[i] == 0.0f;
    CHECK(ok && vo[0] == 0.0f, "octave read: k[0] %g", ko[0]);
    memcpy(before, cache, sizeof cache);
    static const int64_t bad_rope[] = {32, -64, 192};
    for (int i = 0; i < 3; i++) {
        vt_tq_cache m = c;
        m.rope_dim = bad_rope[i];
        CHECK(vt_tq_store(&m, VT_DTYPE_F32, k, OD * 4, OD * 4, v, OD * 4, OD * 4, &slot, 1, &err) == VT_ERR_VALUE &&
                  strstr(err.message, "rope_dim must be a multiple of 64") != NULL,
              "rope_dim %lld refused", (long long)bad_rope[i]);
    }
    vt_tq_cache m = c;
    m.head_size = 96;
    CHECK(vt_tq_store(&m, VT_DTYPE_F32, k, OD * 4, OD * 4, v, OD * 4, OD * 4, &slot, 1, &err) == VT_ERR_VALUE &&
              strstr(err.message, "a multiple of 64") != NULL,
          "head size 96 refused");
    CHECK(memcmp(before, cache, sizeof cache) == 0, "a refused octave store wrote");

    /* the paged cache holds the same slots: one region per layer (K and V the same storage), the same bytes */
    vt_kv_cache_config g = {2, OB, 1, 1, OD, VT_DTYPE_OCT_K3V4, VT_KV_LAYOUT_NHD, 64};
    vt_kv_cache *pc = NULL;
    CHECK(vt_kv_cache_create(&g, &pc, &err) == VT_OK, "octave cache: %s", err.message);
    CHECK(vt_kv_cache_row_bytes(pc) == OS && vt_kv_cache_page_bytes(pc) == 2 * OS &&
              vt_kv_cache_layer_data(pc, 1, 0) == vt_kv_cache_layer_data(pc, 1, 1) &&
              vt_kv_cache_layer_data(pc, 1, 0) != vt_kv_cache_layer_data(pc, 0, 0),
          "octave cache geometry");
    CHECK(vt_kv_cache_store(pc, 1, k, OD * 4, OD * 4, v, OD * 4, OD * 4, VT_DTYPE_F32, &slot, 1, 1, &err) == VT_OK &&
              memcmp((const uint8_t *)vt_kv_cache_layer_data(pc, 1, 0) + OS, s, 126) == 0,
          "the cache's store writes the slot loops' bytes: %s", err.message);
    float gk[OD], gv[OD];
    CHECK(vt_kv_cache_gather(pc, 1, &slot, 1, gk, gv, &err) == VT_OK && gk[0] == 16383.0f / 2048.0f && gk[1] == 0.0f &&
              gv[0] == 0.0f,
          "the cache's gather reads the slot: %s", err.message);
    vt_kv_cache_free(pc);
    g.rope_dim = 32;
    CHECK(vt_kv_cache_create(&g, &pc, &err) == VT_ERR_VALUE && strstr(err.message, "rope_dim") != NULL && !pc,
          "rope_dim 32 refused by the cache");
    g.rope_dim = 0;
    g.dtype = VT_DTYPE_TQ_4BIT_NC;
    CHECK(vt_kv_cache_create(&g, &pc, &err) == VT_OK, "tq cache: %s", err.message);
    /* an MSE preset: the cache holds its codebook (vt_tq_codebook at its head size) and stores the slot loops'
     * bytes with it; its gather reads them back with the centroids */
    CHECK(vt_kv_cache_store(pc, 0, k, OD * 4, OD * 4, v, OD * 4, OD * 4, VT_DTYPE_F32, &slot, 1, 1, &err) == VT_OK,
          "the cache stores an MSE preset with its own codebook: %s", err.message);
    float cen[16], mid[15];
    CHECK(vt_tq_codebook(VT_DTYPE_TQ_4BIT_NC, OD, cen, mid, &err) == VT_OK && cen[0] < cen[1] &&
              mid[0] == (cen[0] + cen[1]) / 2.0f && cen[0] == -cen[15],
          "codebook: %s", err.message);
    const size_t ts = vt_kv_cache_row_bytes(pc);
    uint8_t want[512] = {0};
    vt_tq_cache tc = {.dtype = VT_DTYPE_TQ_4BIT_NC, .num_blocks = 1, .block_size = 1, .num_kv_heads = 1,
                      .head_size = OD, .data = want, .stride_block = (int64_t)ts, .stride_pos = (int64_t)ts,
                      .stride_head = (int64_t)ts, .centroids = cen, .midpoints = mid};
    const int64_t zero = 0;
    CHECK(ts <= sizeof want &&
              vt_tq_store(&tc, VT_DTYPE_F32, k, OD * 4, OD * 4, v, OD * 4, OD * 4, &zero, 1, &err) == VT_OK &&
              memcmp((const uint8_t *)vt_kv_cache_layer_data(pc, 0, 0) + ts, want, ts) == 0,
          "the cache's MSE slot equals the slot loops' with vt_tq_codebook: %s", err.message);
    float tk[OD], tv[OD], wk[OD], wv[OD];
    CHECK(vt_kv_cache_gather(pc, 0, &slot, 1, tk, tv, &err) == VT_OK &&
              vt_tq_gather(&tc, &zero, 1, wk, wv, 1, &err) == VT_OK && memcmp(tk, wk, sizeof tk) == 0 &&
              memcmp(tv, wv, sizeof tv) == 0 && tk[0] != 0.0f,
          "the cache's MSE gather reads with its centroids: %s", err.message);
    CHECK(vt_tq_codebook(VT_DTYPE_TQ_K8V4, OD, cen, mid, &err) == VT_ERR_VALUE &&
              strstr(err.message, "MSE preset") != NULL && vt_tq_codebook(VT_DTYPE_TQ_4BIT_NC, 0, cen, mid, &err) ==
              VT_ERR_VALUE,
          "codebook refusals");
    vt_kv_cache_free(pc);
}

int main(void) {
    if (vt_runtime_init(NULL, NULL) != VT_OK) return 2;
    test_store_against_reference();
    test_geometry();
    test_cache_round_trip();
    test_turboquant();
    test_octave();
    char ok[64];
    snprintf(ok, sizeof ok, "OK (isa up to %s)", vt_isa_name(vt_isa_best()));
    return finish("test_kvcache", ok);
}
