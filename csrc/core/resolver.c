/* The fp8 KV-cache dtype resolver: vLLM's get_config selection,
 * _normalize_quantization_config, get_kv_cache_quant_algo_string /
 * resolve_kv_cache_dtype_string and the per-layer compressed-tensors rule,
 * with Python's semantics (see vtinfer/resolver.h). */
#include "vtinfer/resolver.h"

#include <stdio.h>
#include <string.h>

#include "vtinfer/dtype.h"

/* CacheDType of the pinned vLLM (vllm/config/cache.py), upstream order; for
 * the values vtinfer does not store (no row in the dtype table), what the
 * format is and where vLLM runs it. */
typedef struct vllm_kv_dtype {
    const char *name;
    const char *unstored; /* NULL: vtinfer stores it */
} vllm_kv_dtype;

static const vllm_kv_dtype vllm_kv_cache_dtypes[] = {
    {"auto", NULL}, {"float16", NULL}, {"bfloat16", NULL}, {"fp8", NULL}, {"fp8_e4m3", NULL}, {"fp8_e5m2", NULL},
    {"fp8_inc", "Intel Gaudi's fp8 (e4m3 through Intel Neural Compressor; vLLM runs it on HPU only)"},
    {"fp8_ds_mla", "DeepSeek MLA's 656-byte latent entry (written by concat_and_cache_mla; no per-head K/V page, "
                   "so PagedKVCache does not hold it)"},
    {"nvfp4_ds_mla", "DeepSeek MLA latents in NVFP4 (vLLM's GPU MLA backends only)"},
    {"turboquant_k8v4", NULL}, {"turboquant_4bit_nc", NULL}, {"turboquant_k3v4_nc", NULL},
    {"turboquant_3bit_nc", NULL},
    {"octave_k3v4", NULL}, {"octave_k3v3", NULL}, {"octave_k3v3_compact", NULL},
    {"ultraquant_4bit", NULL},
    {"int4_per_token_head", NULL}, {"int8_per_token_head", NULL}, {"fp8_per_token_head", NULL},
    {"nvfp4", NULL}, {"nvfp4_4over6", NULL},
};
#define N_VLLM_DTYPES (sizeof vllm_kv_cache_dtypes / sizeof vllm_kv_cache_dtypes[0])

size_t vt_vllm_kv_cache_dtype_count(void) { return N_VLLM_DTYPES; }
const char *vt_vllm_kv_cache_dtype(size_t i) { return i < N_VLLM_DTYPES ? vllm_kv_cache_dtypes[i].name : NULL; }

const char *vt_vllm_kv_cache_dtype_unstored(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_VLLM_DTYPES; i++)
        if (strcmp(name, vllm_kv_cache_dtypes[i].name) == 0) return vllm_kv_cache_dtypes[i].unstored;
    return NULL;
}

const char *vt_kv_source_name(vt_kv_source s) {
    switch (s) {
    case VT_KV_SOURCE_FLAG: return "flag";
    case VT_KV_SOURCE_CONFIG_JSON: return "config.json";
    case VT_KV_SOURCE_HF_QUANT_CONFIG: return "hf_quant_config.json";
    case VT_KV_SOURCE_COMPRESSED_TENSORS: return "compressed-tensors kv_cache_scheme";
    case VT_KV_SOURCE_DEFAULT: return "default";
    }
    return "unknown";
}

static void add_message(vt_resolution *r, const char *fmt, const char *a, const char *b) {
    if (r->n_messages >= VT_RESOLVER_MAX_MESSAGES) return;
    snprintf(r->messages[r->n_messages++], VT_ERROR_MESSAGE_MAX, fmt, a, b);
}

static void copy_name(char *dst, const char *src, size_t n) {
    size_t k = n < VT_RESOLVER_NAME_MAX - 1 ? n : VT_RESOLVER_NAME_MAX - 1;
    memcpy(dst, src, k);
    dst[k] = '\0';
}

/* Python's type name of a JSON value, for messages mirroring AttributeError. */
static const char *py_type(const vt_json *v) {
    if (!v) return "NoneType";
    switch (v->kind) {
    case VT_JSON_NULL: return "NoneType";
    case VT_JSON_FALSE:
    case VT_JSON_TRUE: return "bool";
    case VT_JSON_INT: return "int";
    case VT_JSON_FLOAT: return "float";
    case VT_JSON_STRING: return "str";
    case VT_JSON_ARRAY: return "list";
    case VT_JSON_OBJECT: return "dict";
    }
    return "object";
}

static int is_obj(const vt_json *v) { return v && v->kind == VT_JSON_OBJECT; }
static int is_none(const vt_json *v) { return !v || v->kind == VT_JSON_NULL; }

/* Python's str.upper() where it can produce ASCII: ASCII letters plus the
 * non-ASCII code points whose upper case is pure ASCII (sharp s, dotless i,
 * long s, the Latin ligatures). Other bytes are kept. Writes at most cap-1
 * bytes; returns 0, or -1 when truncated. */
static int py_upper(const char *s, size_t n, char *o, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        const char *rep = NULL;
        size_t adv = 1;
        if (n - i >= 2 && u[0] == 0xC3 && u[1] == 0x9F) { rep = "SS"; adv = 2; }
        else if (n - i >= 2 && u[0] == 0xC4 && u[1] == 0xB1) { rep = "I"; adv = 2; }
        else if (n - i >= 2 && u[0] == 0xC5 && u[1] == 0xBF) { rep = "S"; adv = 2; }
        else if (n - i >= 3 && u[0] == 0xEF && u[1] == 0xAC && u[2] <= 0x86) {
            static const char *const lig[] = {"FF", "FI", "FL", "FFI", "FFL", "ST", "ST"};
            rep = lig[u[2] - 0x80];
            adv = 3;
        }
        char one[2] = {(char)u[0], 0};
        if (!rep) {
            if (u[0] >= 'a' && u[0] <= 'z') one[0] = (char)(u[0] - 32);
            rep = one;
            adv = 1;
            if (u[0] >= 0x80) { /* copy the whole non-ASCII sequence unchanged */
                size_t k = 1;
                while (i + k < n && (((unsigned char)s[i + k]) & 0xC0) == 0x80) k++;
                if (w + k >= cap) return -1;
                memcpy(o + w, s + i, k);
                w += k;
                i += k;
                continue;
            }
        }
        size_t rl = strlen(rep);
        if (w + rl >= cap) return -1;
        memcpy(o + w, rep, rl);
        w += rl;
        i += adv;
    }
    o[w] = '\0';
    return 0;
}

/* Python's str.lower() where it can produce ASCII: ASCII letters, KELVIN
 * SIGN -> "k", LATIN CAPITAL I WITH DOT -> "i" + U+0307. Other non-ASCII
 * code points are kept (a difference only in the written-back string of
 * non-ASCII quant_method values, never in a decision: spec). Returns the
 * bytes written, or (size_t)-1 when it does not fit. */
static size_t py_lower(const char *s, size_t n, char *o, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        if (n - i >= 3 && u[0] == 0xE2 && u[1] == 0x84 && u[2] == 0xAA) {
            if (w + 1 >= cap) return (size_t)-1;
            o[w++] = 'k';
            i += 3;
            continue;
        }
        if (n - i >= 2 && u[0] == 0xC4 && u[1] == 0xB0) {
            if (w + 3 >= cap) return (size_t)-1;
            o[w++] = 'i';
            o[w++] = (char)0xCC;
            o[w++] = (char)0x87;
            i += 2;
            continue;
        }
        if (w + 1 >= cap) return (size_t)-1;
        o[w++] = (u[0] >= 'A' && u[0] <= 'Z') ? (char)(u[0] + 32) : (char)u[0];
        i++;
    }
    o[w] = '\0';
    return w;
}

/* str(value) for the "Unknown ModelOpt quant algo" message. */
static void py_str(const vt_json *v, char *buf, size_t cap) {
    if (v && v->kind == VT_JSON_STRING) {
        size_t k = v->len < cap - 1 ? v->len : cap - 1;
        memcpy(buf, v->str, k);
        buf[k] = '\0';
    } else {
        vt_json_repr(v, buf, cap);
    }
}

#define QM_CAP 4096

/* _normalize_quantization_config on one config object (`holder`: the
 * config.json root or a text_config object). `doc_qc` owns the quant
 * config value, used for writing quant_method back. `which` names the
 * attribute path in messages. */
static vt_status normalize(vt_json *qc_attr, vt_json *compression, vt_json_doc *doc_qc, vt_json_doc *doc_cc,
                           const char *where, vt_json **result, vt_error *err) {
    const char *fn = "resolve_kv_cache_dtype";
    vt_json *quant_cfg = qc_attr;
    vt_json_doc *owner = doc_qc;
    *result = NULL;
    if (is_none(quant_cfg)) {
        quant_cfg = compression; /* compressed-tensors' older "compression_config" */
        owner = doc_cc;
    } else {
        if (!is_obj(quant_cfg))
            return vt_error_set(err, VT_ERR_TYPE, "%s: %s must be a JSON object (vLLM calls .get on it); got %s", fn,
                                where, py_type(quant_cfg));
        vt_json *producer = vt_json_get(quant_cfg, "producer");
        const vt_json *producer_name = NULL;
        if (producer) { /* .get("producer", {}) */
            if (!is_obj(producer))
                return vt_error_set(err, VT_ERR_TYPE, "%s: %s.producer must be a JSON object; got %s", fn, where,
                                    py_type(producer));
            producer_name = vt_json_get(producer, "name");
        }
        vt_json *mq = vt_json_get(quant_cfg, "quantization"); /* NULL: the {} fallback */
        int legacy = is_obj(mq) && vt_json_get(mq, "modelopt_quant_config") != NULL;
        if (vt_json_str_eq(producer_name, "modelopt") || legacy) {
            if (mq && !is_obj(mq))
                return vt_error_set(err, VT_ERR_TYPE, "%s: %s.quantization must be a JSON object; got %s", fn,
                                    where, py_type(mq));
            vt_json *algo = mq ? vt_json_get(mq, "quant_algo") : NULL;
            if (!is_none(algo)) {
                char s[256], up[512];
                py_str(algo, s, sizeof s);
                int fits = py_upper(s, strlen(s), up, sizeof up) == 0;
                const char *method = NULL;
                if (fits && (!strcmp(up, "FP8") || !strcmp(up, "FP8_PER_CHANNEL_PER_TOKEN") ||
                             !strcmp(up, "FP8_PB_WO")))
                    method = "modelopt";
                else if (fits && !strcmp(up, "NVFP4"))
                    method = "modelopt_fp4";
                else if (fits && !strcmp(up, "MIXED_PRECISION"))
                    method = "modelopt_mixed";
                if (!method) return vt_error_set(err, VT_ERR_VALUE, "Unknown ModelOpt quant algo: %s", s);
                vt_status st = vt_json_set_string(owner, quant_cfg, "quant_method", method, strlen(method), err);
                if (st != VT_OK) return st;
            }
        }
    }
    if (!is_none(quant_cfg)) {
        if (!is_obj(quant_cfg))
            return vt_error_set(err, VT_ERR_TYPE, "%s: %s must be a JSON object (vLLM calls .get on it); got %s", fn,
                                where, py_type(quant_cfg));
        vt_json *qm = vt_json_get(quant_cfg, "quant_method");
        char lowbuf[QM_CAP], outbuf[QM_CAP];
        size_t n = 0;
        if (qm) {
            if (qm->kind != VT_JSON_STRING)
                return vt_error_set(err, VT_ERR_TYPE,
                                    "%s: %s.quant_method must be a string (vLLM calls .lower() on it); got %s", fn,
                                    where, py_type(qm));
            n = py_lower(qm->str, qm->len, lowbuf, sizeof lowbuf);
            if (n == (size_t)-1)
                return vt_error_set(err, VT_ERR_VALUE, "%s: %s.quant_method must be at most %d bytes; got %zu", fn,
                                    where, QM_CAP / 4, qm->len);
        }
        /* .replace("compressed_tensors", "compressed-tensors"), every occurrence */
        size_t w = 0;
        static const char pat[] = "compressed_tensors";
        for (size_t i = 0; i < n;) {
            if (n - i >= sizeof pat - 1 && memcmp(lowbuf + i, pat, sizeof pat - 1) == 0) {
                memcpy(outbuf + w, "compressed-tensors", sizeof pat - 1);
                w += sizeof pat - 1;
                i += sizeof pat - 1;
            } else {
                outbuf[w++] = lowbuf[i++];
            }
        }
        vt_status st = vt_json_set_string(owner, quant_cfg, "quant_method", outbuf, w, err);
        if (st != VT_OK) return st;
    }
    *result = is_none(quant_cfg) ? NULL : quant_cfg;
    return VT_OK;
}

int vt_resolver_wants_hf_quant_config(const vt_json_doc *config) {
    vt_json *root = vt_json_root(config);
    return is_none(vt_json_get(root, "quantization_config"));
}

vt_json *vt_resolver_quant_config(vt_json_doc *config, vt_json_doc *hf_quant) {
    vt_json *qc = vt_json_get(vt_json_root(config), "quantization_config");
    if (is_none(qc) && hf_quant) qc = vt_json_root(hf_quant);
    return is_none(qc) ? NULL : qc;
}

static int is_flag_known(const char *s) {
    for (size_t i = 0; i < N_VLLM_DTYPES; i++)
        if (!strcmp(s, vllm_kv_cache_dtypes[i].name)) return 1;
    return 0;
}

static void supported_list(char *buf, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < N_VLLM_DTYPES && w + 1 < cap; i++) {
        int k = snprintf(buf + w, cap - w, "%s'%s'", i ? ", " : "[", vllm_kv_cache_dtypes[i].name);
        if (k < 0) break;
        w += (size_t)k;
    }
    if (w + 2 < cap) {
        buf[w++] = ']';
        buf[w] = '\0';
    }
}

/* get_kv_cache_quant_algo_string: returns 1 and sets *res when it returns
 * a string, 0 for None. */
static vt_status kv_algo_string(vt_json *quant_cfg, vt_resolution *r, const char **res, char *rule, size_t rcap,
                                vt_error *err) {
    *res = NULL;
    vt_json *qm = vt_json_get(quant_cfg, "quant_method");
    /* after normalization quant_method is always a str */
    if (!(qm && qm->kind == VT_JSON_STRING && qm->len >= 8 && memcmp(qm->str, "modelopt", 8) == 0)) {
        snprintf(rule, rcap, "quant_method does not start with 'modelopt': the checkpoint does not choose");
        return VT_OK;
    }
    vt_json *inner = vt_json_get(quant_cfg, "quantization");
    if (!inner) inner = quant_cfg; /* .get("quantization", quant_cfg) */
    if (!is_obj(inner))
        return vt_error_set(err, VT_ERR_TYPE,
                            "resolve_kv_cache_dtype: quantization_config.quantization must be a JSON object; got %s",
                            py_type(inner));
    const char *names[4] = {"quantization.kv_cache_scheme", "kv_cache_scheme", "quantization.kv_cache_quant_algo",
                            "kv_cache_quant_algo"};
    vt_json *cands[4] = {vt_json_get(inner, "kv_cache_scheme"), vt_json_get(quant_cfg, "kv_cache_scheme"),
                         vt_json_get(inner, "kv_cache_quant_algo"), vt_json_get(quant_cfg, "kv_cache_quant_algo")};
    vt_json *kv = cands[3];
    const char *from = names[3];
    for (int i = 0; i < 4; i++) {
        if (vt_json_truthy(cands[i])) {
            kv = cands[i];
            from = names[i];
            break;
        }
    }
    static const char warn[] = "WARNING: Unknown kv_cache_quant_algo '%s' in model config. Supported values: "
                               "%s. Falling back to 'auto'.";
    char rep[256];
    if (is_obj(kv)) {
        vt_json *dyn = vt_json_get(kv, "dynamic");
        vt_json *nb = vt_json_get(kv, "num_bits");
        vt_json *ty = vt_json_get(kv, "type");
        if (dyn && dyn->kind == VT_JSON_FALSE && vt_json_num_eq(nb, 8) && vt_json_str_eq(ty, "float")) {
            snprintf(rule, rcap, "%s is a dict with dynamic False, num_bits 8, type 'float' -> fp8_e4m3", from);
            *res = "fp8_e4m3";
            return VT_OK;
        }
        if (vt_json_num_eq(nb, 4) && vt_json_str_eq(ty, "float")) {
            snprintf(rule, rcap, "%s is a dict with num_bits 4, type 'float' -> nvfp4", from);
            *res = "nvfp4";
            return VT_OK;
        }
        vt_json_repr(kv, rep, sizeof rep);
        add_message(r, warn, rep, "['fp8', 'nvfp4']");
        snprintf(rule, rcap, "%s is a dict vLLM does not recognise -> auto (warned)", from);
        *res = "auto";
        return VT_OK;
    }
    if (kv && kv->kind == VT_JSON_STRING) {
        char low[64];
        size_t n = kv->len < 32 ? py_lower(kv->str, kv->len, low, sizeof low) : (size_t)-1;
        if (n != (size_t)-1 && !strcmp(low, "fp8")) {
            snprintf(rule, rcap, "%s = '%.32s' -> fp8_e4m3", from, kv->str);
            *res = "fp8_e4m3";
            return VT_OK;
        }
        if (n != (size_t)-1 && !strcmp(low, "nvfp4")) {
            snprintf(rule, rcap, "%s = '%.32s' -> nvfp4", from, kv->str);
            *res = "nvfp4";
            return VT_OK;
        }
        size_t k = kv->len < sizeof rep - 1 ? kv->len : sizeof rep - 1;
        memcpy(rep, kv->str, k);
        rep[k] = '\0';
        add_message(r, warn, rep, "['fp8', 'nvfp4']");
        snprintf(rule, rcap, "%s = '%.32s' is not a known algorithm -> auto (warned)", from, kv->str);
        *res = "auto";
        return VT_OK;
    }
    snprintf(rule, rcap, "modelopt config without a usable KV key (%s is %s): the checkpoint does not choose", from,
             kv ? py_type(kv) : "missing");
    return VT_OK;
}

static vt_status resolve(const char *kv_cache_dtype, vt_json_doc *config, vt_json_doc *hf_quant, int layers,
                         vt_resolution *out, vt_error *err) {
    const char *fn = "resolve_kv_cache_dtype";
    if (!kv_cache_dtype || !config || !out)
        return vt_error_set(err, VT_ERR_VALUE, "%s: arguments must be non-NULL; got NULL", fn);
    vt_json *root = vt_json_root(config);
    if (!is_obj(root))
        return vt_error_set(err, VT_ERR_PARSE, "%s: config.json must hold a JSON object; got %s", fn, py_type(root));
    if (!is_flag_known(kv_cache_dtype)) {
        char list[600];
        supported_list(list, sizeof list);
        return vt_error_set(err, VT_ERR_VALUE, "%s: kv_cache_dtype must be one of %s; got '%.64s'", fn, list,
                            kv_cache_dtype);
    }
    vt_resolution r;
    memset(&r, 0, sizeof r);

    /* get_config: inline quantization_config, else hf_quant_config.json */
    vt_json *qc = vt_json_get(root, "quantization_config");
    vt_json_doc *qc_doc = config;
    const char *where = "config.json quantization_config";
    r.quant_file = is_none(qc) ? VT_QUANT_FILE_NONE : VT_QUANT_FILE_CONFIG_JSON;
    if (is_none(qc) && hf_quant) {
        qc = vt_json_root(hf_quant);
        qc_doc = hf_quant;
        where = "hf_quant_config.json";
        r.quant_file = is_none(qc) ? VT_QUANT_FILE_NONE : VT_QUANT_FILE_HF_QUANT_CONFIG;
    }
    if (!is_none(qc) && !is_obj(qc)) /* get_config reads quantization_config.get("scale_fmt") */
        return vt_error_set(err, VT_ERR_TYPE, "%s: %s must be a JSON object (vLLM calls .get on it); got %s", fn,
                            where, py_type(qc));

    /* ModelConfig: get_quantization_config normalizes in place */
    vt_json *norm = NULL;
    vt_status st = normalize(is_none(qc) ? NULL : qc, vt_json_get(root, "compression_config"), qc_doc, config, where,
                             &norm, err);
    if (st != VT_OK) return st;
    vt_json *text = vt_json_get(root, "text_config");
    if (!norm && is_obj(text)) {
        vt_json *tnorm = NULL;
        st = normalize(vt_json_get(text, "quantization_config"), vt_json_get(text, "compression_config"), config,
                       config, "text_config.quantization_config", &tnorm, err);
        if (st != VT_OK) return st;
    }
    r.has_quant_config = !is_none(qc);
    if (r.has_quant_config) {
        vt_json *qm = vt_json_get(qc, "quant_method");
        if (qm && qm->kind == VT_JSON_STRING) copy_name(r.quant_method, qm->str, qm->len);
    }

    /* resolve_kv_cache_dtype_string */
    const char *resolved = kv_cache_dtype;
    if (strcmp(kv_cache_dtype, "auto") != 0) {
        r.source = VT_KV_SOURCE_FLAG;
        snprintf(r.rule, sizeof r.rule, "an explicit kv_cache_dtype '%s' is returned unchanged", kv_cache_dtype);
    } else if (!r.has_quant_config) {
        r.source = VT_KV_SOURCE_DEFAULT;
        snprintf(r.rule, sizeof r.rule, "no quantization config: auto");
    } else {
        const char *s = NULL;
        st = kv_algo_string(qc, &r, &s, r.rule, sizeof r.rule, err);
        if (st != VT_OK) return st;
        if (s && strcmp(s, "auto") != 0) {
            resolved = s;
            r.source = r.quant_file == VT_QUANT_FILE_HF_QUANT_CONFIG ? VT_KV_SOURCE_HF_QUANT_CONFIG
                                                                     : VT_KV_SOURCE_CONFIG_JSON;
            r.declared_by_checkpoint = 1;
        } else {
            r.source = VT_KV_SOURCE_DEFAULT;
        }
    }
    copy_name(r.vllm_cache_dtype, resolved, strlen(resolved));
    copy_name(r.cache_dtype, resolved, strlen(resolved));

    if (!layers) {
        r.dtype = VT_DTYPE_AUTO;
        *out = r;
        return VT_OK;
    }

    /* Attention.__init__: the compressed-tensors per-layer rule */
    int is_ct = r.has_quant_config && !strcmp(r.quant_method, "compressed-tensors");
    vt_json *scheme = is_ct ? vt_json_get(qc, "kv_cache_scheme") : NULL;
    if (is_none(scheme)) scheme = NULL;
    if (scheme) {
        /* CompressedTensorsKVCacheMethod.validate_kv_cache_scheme */
        if (!is_obj(scheme))
            return vt_error_set(err, VT_ERR_TYPE, "%s: kv_cache_scheme must be a JSON object; got %s", fn,
                                py_type(scheme));
        vt_json *ty = vt_json_get(scheme, "type"), *nb = vt_json_get(scheme, "num_bits");
        char a[64], b[64];
        if (!vt_json_str_eq(ty, "float") || !vt_json_num_eq(nb, 8)) {
            py_str(nb, a, sizeof a);
            py_str(ty, b, sizeof b);
            return vt_error_set(err, VT_ERR_UNSUPPORTED,
                                "%s: kv_cache_scheme must have num_bits=8, type=float (vLLM's only supported KV "
                                "scheme); got num_bits=%s, type=%s", fn, a, b);
        }
        vt_json *strat = vt_json_get(scheme, "strategy");
        int per_head = vt_json_str_eq(strat, "attn_head");
        if (!per_head && !vt_json_str_eq(strat, "tensor")) {
            py_str(strat, a, sizeof a);
            return vt_error_set(err, VT_ERR_UNSUPPORTED,
                                "%s: kv_cache_scheme.strategy must be 'tensor' or 'attn_head'; got %s", fn, a);
        }
        if (!vt_json_truthy(vt_json_get(scheme, "symmetric"))) {
            py_str(vt_json_get(scheme, "symmetric"), a, sizeof a);
            return vt_error_set(err, VT_ERR_UNSUPPORTED, "%s: kv_cache_scheme.symmetric must be true; got %s", fn, a);
        }
        r.per_head_scales = per_head;
        if (!strcmp(r.cache_dtype, "auto")) {
            copy_name(r.cache_dtype, "fp8", 3);
            r.source = VT_KV_SOURCE_COMPRESSED_TENSORS;
            r.declared_by_checkpoint = 1;
            snprintf(r.rule, sizeof r.rule,
                     "compressed-tensors kv_cache_scheme (strategy %s) turns auto into fp8 for every attention layer",
                     per_head ? "attn_head" : "tensor");
        }
    }
    r.fp8_checkpoint = r.has_quant_config && (scheme != NULL || !strcmp(r.quant_method, "fp8") ||
                                              !strncmp(r.quant_method, "modelopt", 8));
    if (!strcmp(r.cache_dtype, "fp8_e5m2") && r.fp8_checkpoint)
        return vt_error_set(err, VT_ERR_VALUE, "fp8_e5m2 kv-cache is not supported with fp8 checkpoints.");

    int d = VT_DTYPE_AUTO;
    if (strcmp(r.cache_dtype, "auto") != 0 &&
        vt_dtype_from_name(r.cache_dtype, "kv_cache_dtype", &d, NULL) != VT_OK)
        d = -2;
    r.dtype = d;
    if (r.declared_by_checkpoint) {
        add_message(&r, "checkpoint declares kv_cache_dtype %s (%s)", r.cache_dtype,
                    vt_kv_source_name(r.source));
    }
    if (d != VT_DTYPE_AUTO && d >= 0) {
        const vt_dtype_info *info = vt_dtype_get(d);
        if (info && info->is_fp8)
            add_message(&r,
                        "Using %s data type to store kv cache. It reduces the GPU memory footprint and boosts the "
                        "performance. Meanwhile, it may cause accuracy drop without a proper scaling factor%s",
                        r.cache_dtype, "");
    }
    *out = r;
    return VT_OK;
}

vt_status vt_resolve_kv_cache_dtype(const char *kv_cache_dtype, vt_json_doc *config, vt_json_doc *hf_quant,
                                    vt_resolution *out, vt_error *err) {
    return resolve(kv_cache_dtype, config, hf_quant, 1, out, err);
}

vt_status vt_resolve_kv_cache_dtype_string(const char *kv_cache_dtype, vt_json_doc *config, vt_json_doc *hf_quant,
                                           vt_resolution *out, vt_error *err) {
    return resolve(kv_cache_dtype, config, hf_quant, 0, out, err);
}
