/* Plain-C tests of csrc/core/cache_mla.c: vt_concat_and_cache_mla (auto, fp8 e4m3,
 * fp8_ds_mla's 656-byte entry) and vt_mask_empty_context_lse, on every ISA this CPU
 * has. The fp8 codes are checked against a brute-force encoder written here (every
 * e4m3 code decoded by vt_fp8_e4m3_to_f32, the nearest to x / s, ties to the even
 * code, |x / s| past 448 saturating, the sign kept), the scales and copied bytes
 * against the header's definition; bad input must leave the cache as it was. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vtinfer/cache_ops.h"
#include "vtinfer/codec.h"
#include "vtinfer/runtime.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* xorshift64*, [0, 1) */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(1.0 - uniform())) * cos(6.283185307179586 * uniform())); }

static uint16_t bf16_bits(float x) { /* truncation: exact for the values the tests build */
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

/* The e4m3fn code of y by search: nearest finite value, ties to the even code, saturating at 448. */
static uint8_t e4m3_brute(float y) {
    if (isnan(y)) return 0x7F;
    const uint8_t sign = signbit(y) ? 0x80 : 0x00;
    const float a = fabsf(y);
    if (a >= 448.0f) return sign | 0x7E;
    uint8_t best = 0;
    float err = INFINITY;
    for (int c = 0; c < 0x7F; c++) {
        float e = fabsf(vt_fp8_e4m3_to_f32((uint8_t)c) - a);
        if (e < err || (e == err && (c & 1) == 0)) best = (uint8_t)c, err = e;
    }
    return sign | best;
}

static const char *isa_names[] = {"scalar", "avx2", "avx512"};

/* p (its tokens, slots and cache geometry set) storing kv_c [num_tokens][kv_lora_rank] and
 * k_pe [num_tokens][pe_dim] (in_dtype, elem bytes an element, rows back to back) into cache, whose
 * entries of entry_bytes lie back to back, block_size of them a block, in cache_format. */
static vt_concat_mla_params with_buffers(vt_concat_mla_params p, const void *kv_c, const void *k_pe, vt_dtype in_dtype,
                                         int64_t elem, void *cache, int64_t entry_bytes, int cache_format) {
    p.kv_c = kv_c, p.kv_c_stride = elem * p.kv_lora_rank;
    p.k_pe = k_pe, p.k_pe_stride = elem * p.pe_dim;
    p.in_dtype = in_dtype;
    p.kv_cache = cache, p.entry_stride = p.entry_bytes = entry_bytes, p.block_stride = p.block_size * entry_bytes;
    p.cache_format = cache_format;
    return p;
}

/* fp8_ds_mla: 3 tokens (one skipped) into a 2-block cache of 4 entries per block. */
static void test_ds_mla(void) {
    enum { T = 3, NB = 2, BS = 4, E = VT_MLA_DS_ENTRY_BYTES };
    uint16_t kv_c[T][VT_MLA_DS_RANK], k_pe[T][VT_MLA_DS_PE];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < VT_MLA_DS_RANK; i++) kv_c[t][i] = bf16_bits(normal() * (float)(1 + 3 * (i / 128)));
        for (int i = 0; i < VT_MLA_DS_PE; i++) k_pe[t][i] = (uint16_t)(0x3F00 + t * 64 + i);
    }
    kv_c[1][5] = 0x7FC0;   /* a NaN: the tile's max ignores it, its code is the NaN code */
    kv_c[1][300] = 0x0000; /* +0 */
    kv_c[1][301] = 0x8000; /* -0: the sign kept */
    for (int i = 0; i < VT_MLA_DS_TILE; i++) kv_c[2][3 * VT_MLA_DS_TILE + i] = 0; /* an all-zero tile: scale FLT_MIN */
    const int64_t slots[T] = {6, -1, 1};
    static uint8_t ref[NB * BS * E], cache[NB * BS * E];
    const vt_concat_mla_params tokens = {.num_tokens = T, .kv_lora_rank = VT_MLA_DS_RANK, .pe_dim = VT_MLA_DS_PE,
                                         .slot_mapping = slots, .slot_stride = 1, .num_blocks = NB, .block_size = BS};
    for (int isa = VT_ISA_SCALAR; isa <= (int)vt_isa_best(); isa++) {
        CHECK(vt_isa_set((vt_isa)isa, NULL) == VT_OK, "set isa %d", isa);
        memset(cache, 0xAB, sizeof cache);
        vt_concat_mla_params p = with_buffers(tokens, kv_c, k_pe, VT_DTYPE_BF16, 2, cache, E, VT_MLA_DS_MLA);
        vt_error err;
        CHECK(vt_concat_and_cache_mla(&p, &err) == VT_OK, "%s: ds_mla store: %s", isa_names[isa], err.message);
        for (int t = 0; t < T; t++) {
            if (slots[t] < 0) continue;
            const uint8_t *e = cache + slots[t] * E;
            for (int j = 0; j < VT_MLA_DS_RANK / VT_MLA_DS_TILE; j++) {
                float mx = 0.0f;
                for (int i = 0; i < VT_MLA_DS_TILE; i++) {
                    float x = vt_bf16_to_f32(kv_c[t][j * VT_MLA_DS_TILE + i]);
                    if (!isnan(x) && fabsf(x) > mx) mx = fabsf(x);
                }
                const float s = fmaxf(mx / 448.0f, FLT_MIN);
                float got;
                memcpy(&got, e + VT_MLA_DS_RANK + 4 * j, 4);
                CHECK(got == s, "%s: token %d tile %d scale %g, want %g", isa_names[isa], t, j, (double)got, (double)s);
                for (int i = 0; i < VT_MLA_DS_TILE; i++) {
                    const int k = j * VT_MLA_DS_TILE + i;
                    const float x = vt_bf16_to_f32(kv_c[t][k]);
                    const uint8_t want = e4m3_brute(x / s);
                    const uint8_t c = e[k];
                    CHECK(c == want || (isnan(x) && (c & 0x7F) == 0x7F), "%s: token %d element %d code 0x%02x, want 0x%02x",
                          isa_names[isa], t, k, c, want);
                }
            }
            CHECK(memcmp(e + VT_MLA_DS_RANK + 16, k_pe[t], 2 * VT_MLA_DS_PE) == 0, "%s: token %d rope bytes",
                  isa_names[isa], t);
        }
        for (int s = 0; s < NB * BS; s++) /* only the stored slots were written */
            if (s != 6 && s != 1)
                for (int b = 0; b < E; b++) CHECK(cache[s * E + b] == 0xAB, "%s: slot %d byte %d written", isa_names[isa], s, b);
        if (isa == VT_ISA_SCALAR) memcpy(ref, cache, sizeof ref);
        else CHECK(memcmp(ref, cache, sizeof ref) == 0, "%s: bytes differ from the scalar ISA's", isa_names[isa]);

        /* bad input: nothing written */
        memcpy(ref, cache, sizeof ref);
        const int64_t bad_slots[T] = {0, 2, NB * BS};
        vt_concat_mla_params q = p;
        q.slot_mapping = bad_slots;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_INDEX && strstr(err.message, "slot_mapping[2]"),
              "%s: slot past the cache: %s", isa_names[isa], err.message);
        q = p, q.entry_bytes = E - 1;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_VALUE && strstr(err.message, "656"), "%s: entry bytes: %s",
              isa_names[isa], err.message);
        q = p, q.in_dtype = VT_DTYPE_F32;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_TYPE, "%s: float32 input to ds_mla accepted", isa_names[isa]);
        q = p, q.pe_dim = 32;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_VALUE && strstr(err.message, "pe_dim"), "%s: pe_dim: %s",
              isa_names[isa], err.message);
        CHECK(memcmp(ref, cache, sizeof ref) == 0, "%s: a refused call wrote the cache", isa_names[isa]);
    }
}

/* auto (float16 bytes copied) and fp8 e4m3 (float32 input, per-tensor scale). */
static void test_auto_and_fp8(void) {
    enum { T = 2, R = 24, PE = 8, NB = 1, BS = 4 };
    float x[T][R], pe[T][PE];
    uint16_t xh[T][R], peh[T][PE];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < R; i++) x[t][i] = normal() * 40.0f, xh[t][i] = (uint16_t)(0x3C00 + 17 * i + t);
        for (int i = 0; i < PE; i++) pe[t][i] = normal() * 300.0f, peh[t][i] = (uint16_t)(0xBC00 + 3 * i + t);
    }
    x[0][3] = 1e6f; /* saturates at 448 * scale */
    const int64_t slots[T] = {3, 0};
    const float scale = 0.5f;
    const vt_concat_mla_params tokens = {.num_tokens = T, .kv_lora_rank = R, .pe_dim = PE, .slot_mapping = slots,
                                         .slot_stride = 1, .num_blocks = NB, .block_size = BS};
    for (int isa = VT_ISA_SCALAR; isa <= (int)vt_isa_best(); isa++) {
        CHECK(vt_isa_set((vt_isa)isa, NULL) == VT_OK, "set isa %d", isa);
        vt_error err;
        uint16_t c16[NB * BS][R + PE];
        memset(c16, 0, sizeof c16);
        vt_concat_mla_params p = with_buffers(tokens, xh, peh, VT_DTYPE_F16, 2, c16, sizeof c16[0], VT_DTYPE_AUTO);
        CHECK(vt_concat_and_cache_mla(&p, &err) == VT_OK, "%s: auto store: %s", isa_names[isa], err.message);
        for (int t = 0; t < T; t++)
            CHECK(memcmp(c16[slots[t]], xh[t], sizeof xh[t]) == 0 && memcmp(c16[slots[t]] + R, peh[t], sizeof peh[t]) == 0,
                  "%s: auto entry of token %d is not kv_c ++ k_pe", isa_names[isa], t);

        uint8_t c8[NB * BS][R + PE];
        memset(c8, 0, sizeof c8);
        vt_concat_mla_params f = with_buffers(tokens, x, pe, VT_DTYPE_F32, 4, c8, sizeof c8[0], VT_DTYPE_FP8_E4M3);
        f.scale = scale;
        CHECK(vt_concat_and_cache_mla(&f, &err) == VT_OK, "%s: fp8 store: %s", isa_names[isa], err.message);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < R + PE; i++) {
                const float v = i < R ? x[t][i] : pe[t][i - R];
                CHECK(c8[slots[t]][i] == e4m3_brute(v / scale), "%s: fp8 token %d element %d code 0x%02x, want 0x%02x",
                      isa_names[isa], t, i, c8[slots[t]][i], e4m3_brute(v / scale));
            }
        uint8_t before[sizeof c8];
        memcpy(before, c8, sizeof c8);
        vt_concat_mla_params q = f;
        q.scale = 0.0f;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_VALUE && strstr(err.message, "scale"), "%s: zero scale: %s",
              isa_names[isa], err.message);
        q = f, q.entry_bytes = R + PE + 1;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_VALUE, "%s: fp8 entry bytes accepted", isa_names[isa]);
        q = f, q.cache_format = VT_DTYPE_INT8_PTH;
        CHECK(vt_concat_and_cache_mla(&q, &err) == VT_ERR_TYPE, "%s: int8 cache format accepted", isa_names[isa]);
        CHECK(memcmp(before, c8, sizeof c8) == 0, "%s: a refused fp8 call wrote the cache", isa_names[isa]);
    }
}

static void test_mask_empty_context_lse(void) {
    enum { H = 3, NT = 7, NR = 3 };
    float lse[H][NT], want[H][NT];
    for (int h = 0; h < H; h++)
        for (int t = 0; t < NT; t++) lse[h][t] = want[h][t] = (float)(h * 10 + t);
    const int32_t qsl[NR + 1] = {0, 2, 5, 7}, csl[NR + 1] = {0, 4, 4, 9}; /* request 1's context is empty */
    for (int h = 0; h < H; h++)
        for (int t = 2; t < 5; t++) want[h][t] = -INFINITY;
    vt_mask_lse_params p = {.lse = &lse[0][0], .num_heads = H, .num_tokens = NT, .stride_head = NT, .stride_tok = 1,
                            .query_start_loc = qsl, .context_start_loc = csl, .num_reqs = NR, .qsl_stride = 1,
                            .csl_stride = 1};
    vt_error err;
    CHECK(vt_mask_empty_context_lse(&p, &err) == VT_OK, "mask: %s", err.message);
    CHECK(memcmp(lse, want, sizeof lse) == 0, "mask: lse is not -inf exactly on request 1's tokens");
    const int32_t bad[NR + 1] = {0, 5, 2, 7};
    float before[H][NT];
    for (int h = 0; h < H; h++)
        for (int t = 0; t < NT; t++) lse[h][t] = before[h][t] = 1.0f;
    p.query_start_loc = bad;
    CHECK(vt_mask_empty_context_lse(&p, &err) == VT_ERR_VALUE && strstr(err.message, "non-decreasing"),
          "mask: decreasing query_start_loc: %s", err.message);
    const int32_t past[NR + 1] = {0, 2, 5, NT + 1};
    p.query_start_loc = past;
    CHECK(vt_mask_empty_context_lse(&p, &err) == VT_ERR_VALUE, "mask: query_start_loc past lse accepted");
    CHECK(memcmp(lse, before, sizeof lse) == 0, "mask: a refused call wrote lse");
}

int main(void) {
    test_ds_mla();
    test_auto_and_fp8();
    test_mask_empty_context_lse();
    return finish("test_cache_mla", "OK");
}
