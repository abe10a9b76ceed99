/* vLLM's MLA cache store (concat_and_cache_mla, its fp8 and fp8_ds_mla
 * entries) and the LSE mask of empty context chunks. Semantics:
 * csrc/include/vtinfer/cache_ops.h. Rows go through the codec row kernels
 * of the active ISA. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/cache_ops.h"

static vt_status mla_check(const vt_concat_mla_params *p, int64_t *limit, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_concat_and_cache_mla";
    if (p->in_dtype != VT_DTYPE_F32 && p->in_dtype != VT_DTYPE_F16 && p->in_dtype != VT_DTYPE_BF16)
        return vt_error_set(err, VT_ERR_TYPE, "%s: kv_c must be float32, float16 or bfloat16", fn);
    const int fmt = p->cache_format;
    if (fmt != VT_DTYPE_AUTO && fmt != VT_DTYPE_FP8_E4M3 && fmt != VT_DTYPE_FP8_E5M2 && fmt != VT_MLA_DS_MLA)
        return vt_error_set(err, VT_ERR_TYPE,
                            "%s: kv_cache_dtype must be 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2' or 'fp8_ds_mla'", fn);
    if (p->num_tokens < 0 || p->kv_lora_rank < 1 || p->pe_dim < 0 || p->num_blocks < 0 || p->block_size < 1)
        return vt_error_set(err, VT_ERR_VALUE,
                            "%s: num_tokens, pe_dim, num_blocks must be >= 0 and kv_lora_rank, block_size >= 1", fn);
    if (p->num_tokens > 0 && (!p->kv_c || !p->slot_mapping || !p->kv_cache || (p->pe_dim > 0 && !p->k_pe)))
        return vt_error_set(err, VT_ERR_VALUE, "%s: kv_c, k_pe, kv_cache and slot_mapping must not be NULL", fn);
    const size_t in_es = vt_dtype_get(p->in_dtype)->elem_bytes;
    if (fmt == VT_MLA_DS_MLA) {
        if (p->kv_lora_rank != VT_MLA_DS_RANK || p->pe_dim != VT_MLA_DS_PE)
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: kv_lora_rank must be %d and pe_dim %d for kv_cache_dtype 'fp8_ds_mla'; got %lld "
                                "and %lld", fn, VT_MLA_DS_RANK, VT_MLA_DS_PE, (long long)p->kv_lora_rank,
                                (long long)p->pe_dim);
        if (in_es != 2)
            return vt_error_set(err, VT_ERR_TYPE,
                                "%s: kv_c and k_pe must be float16 or bfloat16 for kv_cache_dtype 'fp8_ds_mla'", fn);
        if (p->entry_bytes != VT_MLA_DS_ENTRY_BYTES)
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: kv_cache's entries must be %d bytes for kv_cache_dtype 'fp8_ds_mla' (512 e4m3 "
                                "codes, 4 float32 tile scales, 64 16-bit rope values); got %lld",
                                fn, VT_MLA_DS_ENTRY_BYTES, (long long)p->entry_bytes);
    } else {
        const int64_t es = fmt == VT_DTYPE_AUTO ? (int64_t)in_es : 1;
        if (p->entry_bytes != (p->kv_lora_rank + p->pe_dim) * es)
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: kv_cache's entries must hold kv_lora_rank + pe_dim = %lld elements; got %lld "
                                "bytes of %lld-byte elements",
                                fn, (long long)(p->kv_lora_rank + p->pe_dim), (long long)p->entry_bytes,
                                (long long)es);
        if (fmt != VT_DTYPE_AUTO && !vt_scale_ok(p->scale))
            return vt_error_set(err, VT_ERR_VALUE, "%s: scale must be finite and > 0; got %g", fn, (double)p->scale);
    }
    size_t slots;
    if (vt_size_mul((size_t)p->num_blocks, (size_t)p->block_size, &slots) != 0 || slots > (size_t)INT64_MAX)
        return vt_error_set(err, VT_ERR_OVERFLOW, "%s: num_blocks * block_size must fit in 64 bits", fn);
    *limit = (int64_t)slots;
    for (int64_t t = 0; t < p->num_tokens; t++) {
        int64_t s = p->slot_mapping[t * p->slot_stride];
        if (s >= *limit)
            return vt_error_set(err, VT_ERR_INDEX,
                                "%s: slot_mapping[%lld] must be < num_blocks * block_size = %lld (or negative to "
                                "skip); got %lld",
                                fn, (long long)t, (long long)*limit, (long long)s);
    }
    return VT_OK;
}

/* |x| of a 16-bit element as float32. */
static float abs16(const uint16_t *x, int64_t i, vt_dtype dt) {
    return fabsf(dt == VT_DTYPE_BF16 ? vt_bf16_to_f32(x[i]) : vt_f16_to_f32(x[i]));
}

/* One fp8_ds_mla entry: four e4m3 tiles with their float32 scales, then the rope values verbatim. */
static void store_ds_entry(const vt_codec_kernels *ck, int si, const uint16_t *kv_c, const uint16_t *k_pe,
                           vt_dtype dt, uint8_t *e) {
    for (int j = 0; j < VT_MLA_DS_RANK / VT_MLA_DS_TILE; j++) {
        const uint16_t *x = kv_c + j * VT_MLA_DS_TILE;
        float mx = abs16(x, 0, dt);
        for (int i = 1; i < VT_MLA_DS_TILE; i++) mx = fmaxf(mx, abs16(x, i, dt));
        float s = fmaxf(mx / 448.0f, FLT_MIN);
        ck->quant[si][0](x, e + j * VT_MLA_DS_TILE, VT_MLA_DS_TILE, s);
        memcpy(e + VT_MLA_DS_RANK + 4 * j, &s, 4);
    }
    memcpy(e + VT_MLA_DS_RANK + 16, k_pe, 2 * VT_MLA_DS_PE);
}

vt_status vt_concat_and_cache_mla(const vt_concat_mla_params *p, vt_error *err) {
    if (!p) return vt_error_set(err, VT_ERR_VALUE, "vt_concat_and_cache_mla: params must not be NULL");
    int64_t limit;
    vt_status st = mla_check(p, &limit, err);
    if (st != VT_OK) return st;
    const vt_codec_kernels *ck = vt_codec_active();
    const int si = vt_float_index(p->in_dtype), fmt = p->cache_format;
    const int64_t in_es = (int64_t)vt_dtype_get(p->in_dtype)->elem_bytes;
    const int64_t out_es = fmt == VT_DTYPE_AUTO ? in_es : 1;
    for (int64_t t = 0; t < p->num_tokens; t++) {
        const int64_t s = p->slot_mapping[t * p->slot_stride];
        if (s < 0) continue;
        uint8_t *e = (uint8_t *)p->kv_cache + (s / p->block_size) * p->block_stride + (s % p->block_size) * p->entry_stride;
        const char *kc = (const char *)p->kv_c + t * p->kv_c_stride;
        const char *kp = p->pe_dim ? (const char *)p->k_pe + t * p->k_pe_stride : NULL;
        if (fmt == VT_MLA_DS_MLA) {
            store_ds_entry(ck, si, (const uint16_t *)kc, (const uint16_t *)kp, p->in_dtype, e);
        } else if (fmt == VT_DTYPE_AUTO) {
            memcpy(e, kc, (size_t)(p->kv_lora_rank * in_es));
            if (kp) memcpy(e + p->kv_lora_rank * out_es, kp, (size_t)(p->pe_dim * in_es));
        } else {
            const int fi = vt_fp8_index(fmt);
            ck->quant[si][fi](kc, e, (size_t)p->kv_lora_rank, p->scale);
            if (kp) ck->quant[si][fi](kp, e + p->kv_lora_rank, (size_t)p->pe_dim, p->scale);
        }
    }
    return VT_OK;
}

vt_status vt_mask_empty_context_lse(const vt_mask_lse_params *p, vt_error *err) {
    if (!p) return vt_error_set(err, VT_ERR_VALUE, "vt_mask_empty_context_lse: params must not be NULL");
    const char *fn = p->fn ? p->fn : "vt_mask_empty_context_lse";
    if (p->num_heads < 0 || p->num_tokens < 0 || p->num_reqs < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: lse's shape and the request count must be >= 0", fn);
    if (!p->query_start_loc || !p->context_start_loc || (p->num_heads > 0 && p->num_tokens > 0 && !p->lse))
        return vt_error_set(err, VT_ERR_VALUE, "%s: lse, query_start_loc and context_start_loc must not be NULL", fn);
    int64_t prev = 0;
    for (int64_t r = 0; r <= p->num_reqs; r++) {
        int64_t q = p->query_start_loc[r * p->qsl_stride];
        if (q < prev || q > p->num_tokens)
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: query_start_loc must be non-decreasing from >= 0 and at most lse.shape[1] = %lld; "
                                "query_start_loc[%lld] = %lld after %lld",
                                fn, (long long)p->num_tokens, (long long)r, (long long)q, (long long)prev);
        prev = q;
    }
    for (int64_t r = 0; r < p->num_reqs; r++) {
        if (p->context_start_loc[r * p->csl_stride] != p->context_start_loc[(r + 1) * p->csl_stride]) continue;
        const int64_t t0 = p->query_start_loc[r * p->qsl_stride], t1 = p->query_start_loc[(r + 1) * p->qsl_stride];
        for (int64_t h = 0; h < p->num_heads; h++)
            for (int64_t t = t0; t < t1; t++) p->lse[h * p->stride_head + t * p->stride_tok] = -INFINITY;
    }
    return VT_OK;
}
