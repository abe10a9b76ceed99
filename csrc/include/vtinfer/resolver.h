/* vtinfer public C API: the fp8 KV-cache dtype resolver, mirroring the
 * pinned vLLM release (see .agents/specs/resolver.md for the pin and the
 * functions mirrored).
 *
 * Order, as vLLM runs it:
 *   1. select the quantization config document: config.json's top-level
 *      "quantization_config"; hf_quant_config.json only when that key is
 *      missing or null (get_config);
 *   2. normalize it in place (_normalize_quantization_config): modelopt
 *      producer / legacy modelopt_quant_config marker, quant_algo families,
 *      lower-cased quant_method written back;
 *   3. resolve (resolve_kv_cache_dtype_string): a flag other than "auto"
 *      is returned unchanged; "auto" consults the normalized config;
 *   4. per layer (Attention.__init__): a compressed-tensors kv_cache_scheme
 *      turns a still-"auto" dtype into "fp8"; strategy "attn_head" means
 *      per-KV-head scales; fp8_e5m2 with an fp8 checkpoint is refused.
 * Python's semantics are kept: .get defaults, truthiness of `or` chains,
 * `dynamic is False` identity, 8.0 == 8, str() / upper() / lower().
 * A Python AttributeError upstream (calling .get / .lower on a value of
 * the wrong type) is VT_ERR_TYPE here; upstream ValueError is
 * VT_ERR_VALUE; upstream NotImplementedError is VT_ERR_UNSUPPORTED. */
#ifndef VTINFER_RESOLVER_H
#define VTINFER_RESOLVER_H

#include <stddef.h>

#include "vtinfer/json.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vt_kv_source {
    VT_KV_SOURCE_FLAG = 0,               /* an explicit --kv-cache-dtype */
    VT_KV_SOURCE_CONFIG_JSON = 1,        /* config.json's quantization_config decided */
    VT_KV_SOURCE_HF_QUANT_CONFIG = 2,    /* hf_quant_config.json decided */
    VT_KV_SOURCE_COMPRESSED_TENSORS = 3, /* the per-layer compressed-tensors rule */
    VT_KV_SOURCE_DEFAULT = 4             /* "auto": the model's dtype */
} vt_kv_source;

/* Which document held the quantization config. */
typedef enum vt_quant_file {
    VT_QUANT_FILE_NONE = 0,
    VT_QUANT_FILE_CONFIG_JSON = 1,
    VT_QUANT_FILE_HF_QUANT_CONFIG = 2
} vt_quant_file;

#define VT_RESOLVER_MAX_MESSAGES 6
#define VT_RESOLVER_NAME_MAX 64

typedef struct vt_resolution {
    char vllm_cache_dtype[VT_RESOLVER_NAME_MAX]; /* what resolve_kv_cache_dtype_string returns */
    char cache_dtype[VT_RESOLVER_NAME_MAX];      /* after the per-layer rule ("fp8" for a CT scheme) */
    int dtype;                  /* vt_dtype to store, VT_DTYPE_AUTO (model dtype), or -2 (not storable here) */
    vt_kv_source source;
    int declared_by_checkpoint; /* 1 when the checkpoint decided the dtype */
    int per_head_scales;        /* compressed-tensors strategy "attn_head" */
    int fp8_checkpoint;         /* the checkpoint makes vLLM load k/v scales */
    vt_quant_file quant_file;   /* which document held the quantization config */
    int has_quant_config;
    char quant_method[VT_RESOLVER_NAME_MAX]; /* normalized quant_method (truncated), "" when none */
    char rule[160];             /* the rule that fired, in words */
    size_t n_messages;          /* warnings/info vLLM would log, in order */
    char messages[VT_RESOLVER_MAX_MESSAGES][VT_ERROR_MESSAGE_MAX];
} vt_resolution;

/* vLLM's accepted --kv-cache-dtype values (CacheDType in the pinned
 * release), in upstream order; index i in [0, vt_vllm_kv_cache_dtype_count()). */
VT_API size_t vt_vllm_kv_cache_dtype_count(void);
VT_API const char *vt_vllm_kv_cache_dtype(size_t i);
/* For a vLLM value vtinfer does not store: what the format is and where
 * vLLM runs it (one phrase, no trailing period). NULL for a value vtinfer
 * stores, and for a name vLLM does not accept. */
VT_API const char *vt_vllm_kv_cache_dtype_unstored(const char *name);

/* Resolve.
 *   kv_cache_dtype : in, NUL-terminated flag value ("auto", "fp8", ...).
 *   config         : in/out, the parsed config.json; its root must be an
 *                    object. Normalization writes quant_method back into
 *                    it (as vLLM mutates the dict).
 *   hf_quant       : in/out, the parsed hf_quant_config.json or NULL when
 *                    the file does not exist. Consulted only when
 *                    config's quantization_config is missing or null; the
 *                    caller may pass a loader instead (see below).
 *   out            : out, filled on VT_OK; untouched otherwise.
 * Returns VT_OK; VT_ERR_VALUE for an unknown flag (the accepted values
 * listed), an unknown ModelOpt quant algo, fp8_e5m2 with an fp8
 * checkpoint; VT_ERR_TYPE where upstream raises AttributeError (a
 * non-dict quantization_config / producer / quantization where read, a
 * non-string quant_method); VT_ERR_UNSUPPORTED for a compressed-tensors
 * kv_cache_scheme vLLM refuses; VT_ERR_PARSE when config's root is not an
 * object. */
VT_API vt_status vt_resolve_kv_cache_dtype(const char *kv_cache_dtype, vt_json_doc *config, vt_json_doc *hf_quant,
                                           vt_resolution *out, vt_error *err);

/* Steps 1-3 only (what vLLM's resolve_kv_cache_dtype_string returns after
 * normalization, with no per-layer rule): out->vllm_cache_dtype is the
 * answer; cache_dtype equals it, dtype is VT_DTYPE_AUTO and the per-layer
 * fields are 0. Same statuses as above except the per-layer ones. Used by
 * the differential tests. */
VT_API vt_status vt_resolve_kv_cache_dtype_string(const char *kv_cache_dtype, vt_json_doc *config,
                                                  vt_json_doc *hf_quant, vt_resolution *out, vt_error *err);

/* 1 when config's top-level quantization_config is missing or null, i.e.
 * when vLLM would open hf_quant_config.json (if it exists). */
VT_API int vt_resolver_wants_hf_quant_config(const vt_json_doc *config);

/* The normalized quantization config of the last resolve on `config`
 * (hf_quant's root when it was used), or NULL when there is none. */
VT_API vt_json *vt_resolver_quant_config(vt_json_doc *config, vt_json_doc *hf_quant);

/* Stable name of a source: "flag", "config.json", "hf_quant_config.json",
 * "compressed-tensors kv_cache_scheme", "default". */
VT_API const char *vt_kv_source_name(vt_kv_source s);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_RESOLVER_H */
