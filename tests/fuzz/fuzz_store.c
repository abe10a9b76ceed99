/* libFuzzer harness: the KV cache and store argument validation
 * (csrc/core/kvcache.c, kv_store.c). The harness plays the binding: arrays
 * have the lengths their shapes say; every value in them (slots, layer,
 * scales, geometry) comes from the fuzz bytes. Any status is fine; a
 * crash, an out-of-bounds access or undefined behaviour is not. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "vtinfer/kvcache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const vt_dtype cache_dtypes[] = {VT_DTYPE_F32,      VT_DTYPE_F16,      VT_DTYPE_BF16,
                                        VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_INT8_PTH,
                                        VT_DTYPE_FP8_PTH,  VT_DTYPE_INT4_PTH, VT_DTYPE_TQ_K8V4,
                                        VT_DTYPE_UQ_4BIT,  VT_DTYPE_OCT_K3V4, VT_DTYPE_OCT_K3V3_COMPACT,
                                        VT_DTYPE_NVFP4,    VT_DTYPE_NVFP4_4OVER6};
static const vt_dtype src_dtypes[] = {VT_DTYPE_F32, VT_DTYPE_F16, VT_DTYPE_BF16};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size, 0};
    vt_error err;
    /* geometry sizes with raw 64-bit values: overflow checks only, no allocation */
    vt_kv_cache_config raw = {(int64_t)fz_bits(&f, 8), (int64_t)fz_bits(&f, 8), (int64_t)fz_bits(&f, 8),
                              (int64_t)fz_bits(&f, 8), (int64_t)fz_bits(&f, 8),
                              (vt_dtype)fz_range(&f, -1, VT_DTYPE_COUNT), (vt_kv_layout)fz_range(&f, -1, 3),
                              (int64_t)fz_bits(&f, 8)};
    size_t a, b, c, d;
    (void)vt_kv_cache_sizes(&raw, "fuzz", &a, &b, &c, &d, &err);

    vt_kv_cache_config cfg = {fz_range(&f, 1, 3), fz_range(&f, 1, 8), fz_range(&f, 1, 16), fz_range(&f, 1, 4),
                              fz_range(&f, 1, 64), cache_dtypes[fz_range(&f, 0, 11)],
                              (vt_kv_layout)fz_range(&f, 0, 1), fz_range(&f, -64, 128)};
    vt_kv_cache *cache = NULL;
    if (vt_kv_cache_create(&cfg, &cache, &err) != VT_OK) return 0;
    const int64_t L = cfg.num_layers, H = cfg.num_kv_heads, D = cfg.head_size;
    float ks[3 * 4], vs[3 * 4];
    for (int i = 0; i < 12; i++) {
        ks[i] = fz_float(&f);
        vs[i] = fz_float(&f);
    }
    (void)vt_kv_cache_set_scales(cache, (vt_kv_scale_mode)fz_range(&f, 0, 3), ks,
                                 (vt_kv_scale_mode)fz_range(&f, 0, 3), vs, &err);
    vt_dtype src = src_dtypes[fz_range(&f, 0, 2)];
    size_t es = src == VT_DTYPE_F32 ? 4 : 2;
    int64_t n = fz_range(&f, 0, 16);
    int64_t slots_limit = cfg.num_blocks * cfg.block_size;
    size_t row = (size_t)(H * D) * es;
    unsigned char *key = malloc((size_t)n * row + 1), *value = malloc((size_t)n * row + 1);
    int64_t *slots = malloc((size_t)n * sizeof(int64_t) + 1);
    float *ko = malloc((size_t)(n * H * D) * sizeof(float) + 1), *vo = malloc((size_t)(n * H * D) * sizeof(float) + 1);
    if (!key || !value || !slots || !ko || !vo) goto done;
    for (size_t i = 0; i < (size_t)n * row; i++) key[i] = (unsigned char)fz_bits(&f, 1), value[i] = key[i] ^ 0x5a;
    /* hostile (bit set): slots and layer anywhere; else in range (or -1) so the store runs */
    const int hostile = (int)(fz_bits(&f, 1) & 1);
    for (int64_t t = 0; t < n; t++) slots[t] = hostile ? fz_index(&f, slots_limit) : fz_range(&f, -1, slots_limit - 1);
    int64_t layer = hostile ? fz_index(&f, L) : fz_range(&f, 0, L - 1);
    (void)vt_kv_cache_store(cache, layer, key, (int64_t)row, D * (int64_t)es, value, (int64_t)row, D * (int64_t)es,
                            src, slots, n, (int)fz_range(&f, 1, 2), &err);
    (void)vt_kv_cache_gather_basis(cache, fz_index(&f, L), slots, n, ko, vo, (int)(fz_bits(&f, 1) & 1), &err);
    if (fz_bits(&f, 1) & 1) {
        vt_kv_cache_release(cache);
        (void)vt_kv_cache_store(cache, 0, key, (int64_t)row, D * (int64_t)es, value, (int64_t)row, D * (int64_t)es,
                                src, slots, n, 1, &err);
    }
done:
    free(key);
    free(value);
    free(slots);
    free(ko);
    free(vo);
    vt_kv_cache_free(cache);
    return 0;
}
