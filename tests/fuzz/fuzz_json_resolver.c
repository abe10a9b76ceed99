/* libFuzzer harness: the JSON reader and the resolver (csrc/core/json.c,
 * resolver.c). Input: byte 0 picks the flag, byte 1 says whether an
 * hf_quant_config.json document is given and where the split is; the rest
 * is config.json (and hf_quant_config.json). Any status is fine; a crash,
 * an out-of-bounds access or undefined behaviour is not. */
#include <stdlib.h>
#include <string.h>

#include "vtinfer/json.h"
#include "vtinfer/resolver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t nflags = vt_vllm_kv_cache_dtype_count();
    const char *flag;
    char junk[8] = {0};
    if (data[0] < nflags) {
        flag = vt_vllm_kv_cache_dtype(data[0]);
    } else if (data[0] == 255) {
        memcpy(junk, "fp8\xff", 4); /* a flag that is not a flag */
        flag = junk;
    } else {
        flag = "auto";
    }
    int two = data[1] & 1;
    const uint8_t *body = data + 2;
    size_t n = size - 2, split = two ? (n * (size_t)(data[1] >> 1)) / 127 : n;
    if (split > n) split = n;
    vt_json_limits lim = {1 << 20, 64 + (data[1] & 0x3f)};
    vt_error err;
    vt_json_doc *cfg = NULL, *hq = NULL;
    if (vt_json_parse((const char *)body, split, "config.json", &lim, &cfg, &err) != VT_OK) return 0;
    if (two && vt_json_parse((const char *)body + split, n - split, "hf_quant_config.json", &lim, &hq, &err) != VT_OK)
        hq = NULL;
    vt_resolution r;
    (void)vt_resolve_kv_cache_dtype(flag, cfg, hq, &r, &err);
    (void)vt_resolve_kv_cache_dtype_string(flag, cfg, hq, &r, &err);
    (void)vt_resolver_wants_hf_quant_config(cfg);
    (void)vt_resolver_quant_config(cfg, hq);
    vt_json_free(hq);
    vt_json_free(cfg);
    return 0;
}
