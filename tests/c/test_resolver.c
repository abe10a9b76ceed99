/* Resolver tests in plain C: the rules of vtinfer/resolver.h on hand-made
 * documents (the exhaustive agreement with vLLM's own functions is in
 * tests/differential). */
#include <stdio.h>
#include <string.h>

#include "vtinfer/resolver.h"

#include "check.h"

/* Resolve `flag` on config text `cfg` and optional hf_quant text; returns
 * the status, fills r and err. */
static vt_status run(const char *flag, const char *cfg, const char *hq, vt_resolution *r, vt_error *err) {
    vt_json_doc *c = NULL, *h = NULL;
    vt_status st = vt_json_parse(cfg, strlen(cfg), "config.json", NULL, &c, err);
    if (st == VT_OK && hq) st = vt_json_parse(hq, strlen(hq), "hf_quant_config.json", NULL, &h, err);
    if (st == VT_OK) st = vt_resolve_kv_cache_dtype(flag, c, h, r, err);
    vt_json_free(c);
    vt_json_free(h);
    return st;
}

static void expect(const char *flag, const char *cfg, const char *hq, const char *want, const char *source) {
    vt_resolution r;
    vt_error err;
    vt_error_clear(&err);
    vt_status st = run(flag, cfg, hq, &r, &err);
    CHECK(st == VT_OK, "%s on %s: %s", flag, cfg, err.message);
    if (st != VT_OK) return;
    CHECK(!strcmp(r.vllm_cache_dtype, want), "%s on %s: got %s want %s", flag, cfg, r.vllm_cache_dtype, want);
    CHECK(!strcmp(vt_kv_source_name(r.source), source), "%s on %s: source %s want %s", flag, cfg,
          vt_kv_source_name(r.source), source);
    int declares = 0;
    for (size_t i = 0; i < r.n_messages; i++) declares |= strstr(r.messages[i], "checkpoint declares") != NULL;
    CHECK(declares == r.declared_by_checkpoint, "'checkpoint declares' only when the checkpoint decided");
    if (strcmp(flag, "auto") != 0) CHECK(!r.declared_by_checkpoint, "a typed flag is never declared by the checkpoint");
}

static void expect_err(const char *flag, const char *cfg, const char *hq, vt_status want, const char *needle) {
    vt_resolution r;
    vt_error err;
    vt_error_clear(&err);
    vt_status st = run(flag, cfg, hq, &r, &err);
    CHECK(st == want, "%s on %s: status %d want %d (%s)", flag, cfg, (int)st, (int)want, err.message);
    CHECK(strstr(err.message, needle) != NULL, "message '%s' lacks '%s'", err.message, needle);
}

#define MO "\"producer\": {\"name\": \"modelopt\"}"

int main(void) {
    expect("auto", "{}", NULL, "auto", "default");
    expect("bfloat16", "{\"quantization_config\": {\"quant_method\": \"modelopt\", \"kv_cache_quant_algo\": \"FP8\"}}",
           NULL, "bfloat16", "flag");
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"ModelOpt\", \"kv_cache_quant_algo\": \"FP8\"}}", NULL,
           "fp8_e4m3", "config.json");
    /* producer-only legacy file: resolves only after normalization */
    expect("auto", "{}", "{" MO ", \"quantization\": {\"quant_algo\": \"FP8\", \"kv_cache_quant_algo\": \"FP8\"}}",
           "fp8_e4m3", "hf_quant_config.json");
    /* inline wins over the legacy file, never merged */
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"fp8\"}}",
           "{" MO ", \"quantization\": {\"quant_algo\": \"FP8\", \"kv_cache_quant_algo\": \"FP8\"}}", "auto", "default");
    /* inline null: the legacy file */
    expect("auto", "{\"quantization_config\": null}",
           "{" MO ", \"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": \"NVFP4\"}}", "nvfp4",
           "hf_quant_config.json");
    /* dict schemes: dynamic is False (identity), 8.0 == 8 */
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"modelopt\", \"kv_cache_scheme\": {\"dynamic\": false, "
           "\"num_bits\": 8.0, \"type\": \"float\"}}}", NULL, "fp8_e4m3", "config.json");
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"modelopt\", \"kv_cache_scheme\": {\"dynamic\": 0, "
           "\"num_bits\": 8, \"type\": \"float\"}}}", NULL, "auto", "default");
    /* quant_algo null: no quant_method is set (the `is not None` guard) */
    expect("auto", "{\"quantization_config\": {" MO ", \"quantization\": {\"quant_algo\": null, "
           "\"kv_cache_quant_algo\": \"FP8\"}}}", NULL, "auto", "default");
    /* the legacy marker is the key modelopt_quant_config, not any "quantization" dict */
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"quantization\": {\"quant_algo\": \"W4A16\"}}}",
           NULL, "auto", "default");
    /* compressed-tensors per-layer rule */
    expect("auto", "{\"quantization_config\": {\"quant_method\": \"compressed_tensors\", \"kv_cache_scheme\": "
           "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"attn_head\", \"symmetric\": true}}}", NULL, "auto",
           "compressed-tensors kv_cache_scheme");

    expect_err("auto", "{\"quantization_config\": {" MO ", \"quantization\": {\"quant_algo\": \"INT4\"}}}", NULL,
               VT_ERR_VALUE, "Unknown ModelOpt quant algo: INT4");
    expect_err("auto", "{\"quantization_config\": {\"quant_method\": 7}}", NULL, VT_ERR_TYPE, "quant_method must be a string");
    expect_err("auto", "{\"quantization_config\": [1]}", NULL, VT_ERR_TYPE, "must be a JSON object");
    expect_err("auto", "{\"quantization_config\": {\"producer\": \"modelopt\"}}", NULL, VT_ERR_TYPE, "producer");
    expect_err("fp8_x", "{}", NULL, VT_ERR_VALUE, "'fp8_e5m2'");
    expect_err("fp8_e5m2", "{\"quantization_config\": {\"quant_method\": \"fp8\"}}", NULL, VT_ERR_VALUE,
               "fp8_e5m2 kv-cache is not supported with fp8 checkpoints.");
    expect_err("auto", "[]", NULL, VT_ERR_PARSE, "config.json must hold a JSON object");
    return finish("test_resolver", "ok");
}
