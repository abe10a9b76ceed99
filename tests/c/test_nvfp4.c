/* Plain-C tests of csrc/core/nvfp4.c: the NVFP4 group codec and vLLM's NVFP4 pages. The group rule is
 * checked on E2M1 ties (a group whose block scale is exactly 1) and against a brute-force encoder written
 * here (the nearest of the 16 E2M1 values to x * m, ties to the even code, the sign of x * m kept); the
 * pages against offsets written from the page description in vtinfer/codec.h (HND and NHD, the V scales'
 * swizzle); every refusal must leave the pages as they were. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vtinfer/codec.h"
#include "vtinfer/runtime.h"
#include "vtinfer/turboquant.h"

static const float MAG[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* The nearest E2M1 code to v (|v| saturating at 6), ties to the even magnitude index. */
static unsigned brute_code(float v) {
    const float a = fabsf(v) > 6.0f ? 6.0f : fabsf(v);
    unsigned best = 0;
    for (unsigned i = 1; i < 8; i++) {
        const float di = fabsf(a - MAG[i]), db = fabsf(a - MAG[best]);
        if (di < db || (di == db && (i % 2) == 0)) best = i;
    }
    return best | (signbit(v) ? 8u : 0u);
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float uniform_pm(float r) { /* xorshift64*, [-r, r) */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return r * (2.0f * (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f - 1.0f);
}

static void test_group_rule(void) {
    const float ties[16] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                            -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, -0.1f};
    const unsigned want[16] = {7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 8};
    uint8_t codes[8], sf;
    vt_nvfp4_quantize_group(ties, 1.0f, 0, codes, &sf);
    CHECK(sf == 0x38, "ties: scale byte 0x%02x, want 0x38 (1.0)", sf);
    for (int i = 0; i < 16; i++) {
        const unsigned got = (codes[i / 2] >> (4 * (i % 2))) & 0xFu;
        CHECK(got == want[i], "ties: element %d code %u, want %u", i, got, want[i]);
    }
    /* random groups: every code is the brute-force nearest of x * m, m = 1 / (sf * scale) */
    for (int trial = 0; trial < 2000; trial++) {
        float x[16];
        const float r = ldexpf(1.0f, trial % 40 - 20);
        for (int i = 0; i < 16; i++) x[i] = uniform_pm(r);
        const float scale = trial % 3 ? 0.037f : 1.0f;
        vt_nvfp4_quantize_group(x, scale, trial % 2, codes, &sf);
        const float s = vt_fp8_e4m3_to_f32(sf);
        const float m = s != 0.0f ? 1.0f / (s * (1.0f / (1.0f / scale))) : 0.0f;
        for (int i = 0; i < 16; i++) {
            const unsigned got = (codes[i / 2] >> (4 * (i % 2))) & 0xFu;
            CHECK(got == brute_code(x[i] * m), "trial %d element %d: code %u, brute force %u", trial, i, got,
                  brute_code(x[i] * m));
        }
    }
}

enum { NB = 3, BS = 8, H = 2, D = 64, FULL = D / 2 + D / 16, SIDE = H * BS * FULL, PAGE = 2 * SIDE };

static void test_pages(int hnd) {
    uint8_t *cache = calloc(NB * PAGE, 1);
    float key[5][H][D], value[5][H][D];
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) key[t][h][d] = uniform_pm(3.0f), value[t][h][d] = uniform_pm(0.5f);
    const int64_t slots[5] = {0, 13, -1, 22, 7};
    vt_nvfp4_pages p = {.k = cache, .v = cache + SIDE, .page_stride = PAGE, .num_blocks = NB, .block_size = BS,
                        .num_kv_heads = H, .head_size = D, .hnd = hnd};
    vt_error err;
    CHECK(vt_nvfp4_store(&p, VT_DTYPE_F32, key, (int64_t)sizeof key[0], (int64_t)sizeof key[0][0], value,
                         (int64_t)sizeof value[0], (int64_t)sizeof value[0][0], slots, 5, 0.5f, 2.0f, 0, 2, &err) == VT_OK,
          "store: %s", err.message);
    const int S = D / 16, g4 = S / 4;
    for (int t = 0; t < 5; t++) {
        if (slots[t] < 0) continue;
        const int b = (int)(slots[t] / BS), pos = (int)(slots[t] % BS);
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < H; h++) {
                uint8_t codes[D / 2], sf[D / 16];
                vt_nvfp4_quantize_group(kv ? value[t][h] : key[t][h], kv ? 2.0f : 0.5f, 0, codes, sf);
                for (int g = 1; g < S; g++)
                    vt_nvfp4_quantize_group((kv ? value[t][h] : key[t][h]) + 16 * g, kv ? 2.0f : 0.5f, 0,
                                            codes + 8 * g, sf + g);
                const uint8_t *side = cache + b * PAGE + kv * SIDE;
                const int row = hnd ? h * BS + pos : pos * H + h;
                CHECK(!memcmp(side + row * (D / 2), codes, D / 2), "hnd %d token %d kv %d head %d: codes differ",
                      hnd, t, kv, h);
                for (int s = 0; s < S; s++) {
                    const int tt = kv ? (pos / 4) * 4 + s / g4 : pos, ss = kv ? (s % g4) * 4 + pos % 4 : s;
                    const int off = H * BS * (D / 2) + (hnd ? (h * BS + tt) * S : (tt * H + h) * S) + ss;
                    CHECK(side[off] == sf[s], "hnd %d token %d kv %d head %d scale %d: byte 0x%02x, want 0x%02x",
                          hnd, t, kv, h, s, side[off], sf[s]);
                }
            }
    }
    /* the read gives E2M1 * sf * scale of what was stored */
    const int64_t blocks[2] = {2, 0};
    float *k = malloc(sizeof(float) * 2 * BS * H * D), *v = malloc(sizeof(float) * 2 * BS * H * D);
    CHECK(vt_nvfp4_read_pages(&p, blocks, 2, 0.5f, 2.0f, k, v, 2, &err) == VT_OK, "read: %s", err.message);
    float deq[D];
    uint8_t codes[D / 2], sf[D / 16];
    for (int g = 0; g < S; g++) vt_nvfp4_quantize_group(key[3][1] + 16 * g, 0.5f, 0, codes + 8 * g, sf + g);
    CHECK(vt_nvfp4_dequantize(codes, sf, D, 0.5f, deq, &err) == VT_OK, "dequantize");
    /* token 3 sits in block 2 (blocks[0]), position 6 */
    CHECK(!memcmp(k + ((0 * BS + 6) * H + 1) * D, deq, sizeof deq), "hnd %d: read of block 2 / pos 6 / head 1", hnd);
    /* refusals write nothing */
    uint8_t *before = malloc(NB * PAGE);
    memcpy(before, cache, NB * PAGE);
    const int64_t bad_slots[2] = {1, NB * BS};
    CHECK(vt_nvfp4_store(&p, VT_DTYPE_F32, key, (int64_t)sizeof key[0], (int64_t)sizeof key[0][0], value,
                         (int64_t)sizeof value[0], (int64_t)sizeof value[0][0], bad_slots, 2, 0.5f, 2.0f, 0, 2,
                         &err) == VT_ERR_INDEX, "a slot past the cache is refused");
    CHECK(vt_nvfp4_store(&p, VT_DTYPE_F32, key, (int64_t)sizeof key[0], (int64_t)sizeof key[0][0], value,
                         (int64_t)sizeof value[0], (int64_t)sizeof value[0][0], slots, 5, 0.0f, 2.0f, 0, 1,
                         &err) == VT_ERR_VALUE, "k_scale 0 is refused");
    vt_nvfp4_pages odd = p;
    odd.block_size = 6;
    CHECK(vt_nvfp4_store(&odd, VT_DTYPE_F32, key, (int64_t)sizeof key[0], (int64_t)sizeof key[0][0], value,
                         (int64_t)sizeof value[0], (int64_t)sizeof value[0][0], slots, 5, 0.5f, 2.0f, 0, 1,
                         &err) == VT_ERR_VALUE, "block size 6 is refused");
    odd = p;
    odd.head_size = 32;
    CHECK(vt_nvfp4_read_pages(&odd, blocks, 2, 1.0f, 1.0f, k, v, 1, &err) == VT_ERR_VALUE, "head size 32 refused");
    const int64_t bad_blocks[1] = {NB};
    CHECK(vt_nvfp4_read_pages(&p, bad_blocks, 1, 1.0f, 1.0f, k, v, 1, &err) == VT_ERR_INDEX, "block past the cache");
    CHECK(!memcmp(before, cache, NB * PAGE), "hnd %d: a refused call wrote the pages", hnd);
    free(before);
    free(k);
    free(v);
    free(cache);
}

/* The nvfp4 row as a slot format on a caller's slot cache (vt_tq_store / vt_tq_gather): each half of the slot is
 * the group codec at that half's global scale; a global scale that is not finite and > 0 is refused, nothing
 * written. */
static void test_slots(void) {
    enum { SD = 64, SNB = 2, SBS = 4, SH = 1, SLOT = SD + SD / 8 };
    static uint8_t slots_cache[SNB * SBS * SH * SLOT];
    float key[SD], value[SD], kout[SD], vout[SD], want[SD];
    for (int i = 0; i < SD; i++) key[i] = uniform_pm(3.0f), value[i] = uniform_pm(0.1f);
    vt_tq_cache c = {.dtype = VT_DTYPE_NVFP4, .num_blocks = SNB, .block_size = SBS, .num_kv_heads = SH,
                     .head_size = SD, .data = slots_cache, .stride_block = SBS * SH * SLOT, .stride_pos = SH * SLOT,
                     .stride_head = SLOT, .k_scale = 0.25f, .v_scale = 0.0f};
    const int64_t slot[1] = {5};
    vt_error err;
    CHECK(vt_tq_store(&c, VT_DTYPE_F32, key, SD * 4, SD * 4, value, SD * 4, SD * 4, slot, 1, &err) == VT_ERR_VALUE,
          "v_scale 0 is refused");
    for (size_t i = 0; i < sizeof slots_cache; i++) CHECK(slots_cache[i] == 0, "a refused store wrote byte %zu", i);
    c.v_scale = 4.0f;
    CHECK(vt_tq_store(&c, VT_DTYPE_F32, key, SD * 4, SD * 4, value, SD * 4, SD * 4, slot, 1, &err) == VT_OK, "store");
    CHECK(vt_tq_gather(&c, slot, 1, kout, vout, 1, &err) == VT_OK, "gather");
    uint8_t codes[SD / 2], sf[SD / 16];
    const uint8_t *s = slots_cache + 5 * SLOT;
    for (int half = 0; half < 2; half++) {
        const float *x = half ? value : key, sc = half ? 4.0f : 0.25f;
        for (int g = 0; g < SD / 16; g++) vt_nvfp4_quantize_group(x + 16 * g, sc, 0, codes + 8 * g, sf + g);
        const uint8_t *h = s + half * (SD / 2 + SD / 16);
        CHECK(!memcmp(h, codes, sizeof codes) && !memcmp(h + SD / 2, sf, sizeof sf), "slot half %d bytes", half);
        CHECK(vt_nvfp4_dequantize(codes, sf, SD, sc, want, &err) == VT_OK, "dequantize");
        CHECK(!memcmp(half ? vout : kout, want, sizeof want), "slot half %d read", half);
    }
}

int main(void) {
    vt_error err;
    if (vt_runtime_init(NULL, &err) != VT_OK) return 1;
    test_group_rule();
    test_pages(1);
    test_pages(0);
    test_slots();
    return finish("test_nvfp4", "group rule, pages (HND, NHD), slots, refusals ok");
}
