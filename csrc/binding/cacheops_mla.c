/* vLLM's MLA cache store and the LSE mask of empty context chunks
 * (csrc/core/cache_mla.c):
 *
 *   _C.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False)
 *   _C.mask_empty_context_lse(lse, query_start_loc, context_start_loc)
 */
#include <string.h>

#include "vt_cacheops.h"
#include "vt_signature.h"

VT_SIGNATURE(mla_sig, "concat_and_cache_mla", VT_MLA_STORE_NPOS, VT_MLA_STORE_ARGS);
VT_SIGNATURE(mask_sig, "mask_empty_context_lse", VT_MASK_LSE_NPOS, VT_MASK_LSE_ARGS);

/* kv_cache_dtype: an element format (vt_co_parse_fp8_name) or "fp8_ds_mla". */
static int parse_mla_format(PyObject *obj, const char *fn, int *out) {
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s && strcmp(s, "fp8_ds_mla") == 0) {
        *out = VT_MLA_DS_MLA;
        return 0;
    }
    if (!s) PyErr_Clear();
    if (vt_co_parse_fp8_name(obj, fn, "kv_cache_dtype", out) == 0) return 0;
    if (s && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: kv_cache_dtype must be 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2' or "
                     "'fp8_ds_mla'; got '%.64s'", fn, s);
    }
    return -1;
}

/* The cache's dtype for its format: auto the input's; fp8 codes (uint8 or
 * the matching float8); fp8_ds_mla uint8 bytes. */
static int check_cache_dtype(const vt_tensor *cache, const vt_tensor *kv_c, int fmt, const char *fn) {
    if (fmt == VT_DTYPE_AUTO) {
        if (cache->elem != kv_c->elem) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache must have kv_c's dtype %s for kv_cache_dtype 'auto'; got %s",
                         fn, kv_c->dtype_name, cache->dtype_name);
            return -1;
        }
        return 0;
    }
    if (fmt == VT_MLA_DS_MLA) {
        if (cache->elem != VT_ELEM_U8) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache must be uint8 for kv_cache_dtype 'fp8_ds_mla'; got %s", fn,
                         cache->dtype_name);
            return -1;
        }
        return 0;
    }
    if (!vt_co_is_code(cache->elem)) {
        PyErr_Format(PyExc_TypeError, "%s: kv_cache must hold fp8 codes (uint8 or float8) for an fp8 "
                     "kv_cache_dtype; got %s", fn, cache->dtype_name);
        return -1;
    }
    return vt_co_code_fmt(cache, fmt, fn, "kv_cache", "kv_cache_dtype");
}

static PyObject *py_concat_and_cache_mla(PyObject *m, PyObject *args, PyObject *kw) {
    vt_module_state *st = vt_state(m);
    const char *fn = mla_sig.name;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&mla_sig, args, kw, a) < 0) return NULL;
    int fmt;
    float scale;
    if (parse_mla_format(a[4], fn, &fmt) < 0 || vt_co_parse_scale(a[5], fn, "scale", &scale) < 0) return NULL;
    if (a[6] && !PyBool_Check(a[6])) {
        PyErr_Format(PyExc_TypeError, "%s: skip_scale must be a bool; got %s", fn, Py_TYPE(a[6])->tp_name);
        return NULL;
    }
    if (a[6] == Py_True) scale = 1.0f; /* vLLM passes it for a scale of exactly 1: x / 1 is x */
    vt_co_pins p = {.n = 0};
    const int dst = VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE;
    vt_tensor *kc, *kp, *cache, *sm;
    if (!(kc = vt_co_pin(st, &p, a[0], fn, "kv_c", 0, VT_ELEMS_FLOAT, 2)) ||
        !(kp = vt_co_pin(st, &p, a[1], fn, "k_pe", 0, VT_ELEMS_FLOAT, 2)) ||
        !(cache = vt_co_pin(st, &p, a[2], fn, "kv_cache", dst, VT_CO_ALL_ELEMS, 3)) ||
        !(sm = vt_co_pin(st, &p, a[3], fn, "slot_mapping", 0, VT_ELEM_BIT(VT_ELEM_I64), 1)))
        goto fail;
    if (kp->elem != kc->elem) {
        PyErr_Format(PyExc_TypeError, "%s: k_pe must have kv_c's dtype %s; got %s", fn, kc->dtype_name, kp->dtype_name);
        goto fail;
    }
    const int64_t T = sm->shape[0];
    if (kc->shape[0] < T || kp->shape[0] < T) {
        PyErr_Format(PyExc_ValueError, "%s: kv_c and k_pe must have at least slot_mapping.shape[0] = %lld rows; got "
                     "%lld and %lld", fn, (long long)T, (long long)kc->shape[0], (long long)kp->shape[0]);
        goto fail;
    }
    if (check_cache_dtype(cache, kc, fmt, fn) < 0 || vt_co_last_dim_ok(kc, fn, "kv_c") < 0 ||
        vt_co_last_dim_ok(kp, fn, "k_pe") < 0 || vt_co_last_dim_ok(cache, fn, "kv_cache") < 0 ||
        vt_co_no_overlap(cache, "kv_cache", kc, "kv_c", fn) < 0 ||
        vt_co_no_overlap(cache, "kv_cache", kp, "k_pe", fn) < 0 ||
        vt_co_no_overlap(cache, "kv_cache", sm, "slot_mapping", fn) < 0)
        goto fail;
    vt_concat_mla_params mp = {
        .fn = fn, .kv_c = kc->data, .k_pe = kp->data, .in_dtype = (vt_dtype)kc->elem,
        .kv_c_stride = kc->strides[0], .k_pe_stride = kp->strides[0], .num_tokens = T,
        .kv_lora_rank = kc->shape[1], .pe_dim = kp->shape[1], .slot_mapping = (const int64_t *)sm->data,
        .slot_stride = sm->strides[0] / 8, .kv_cache = cache->data, .num_blocks = cache->shape[0],
        .block_size = cache->shape[1], .block_stride = cache->strides[0], .entry_stride = cache->strides[1],
        .entry_bytes = cache->shape[2] * (int64_t)cache->itemsize, .cache_format = fmt, .scale = scale,
    };
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_concat_and_cache_mla(&mp, &err);
    Py_END_ALLOW_THREADS
    return vt_co_done(st, &p, s, &err);
fail:
    vt_co_pins_release(&p);
    return NULL;
}

static PyObject *py_mask_empty_context_lse(PyObject *m, PyObject *args, PyObject *kw) {
    vt_module_state *st = vt_state(m);
    const char *fn = mask_sig.name;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&mask_sig, args, kw, a) < 0) return NULL;
    vt_co_pins p = {.n = 0};
    vt_tensor *lse, *q, *c;
    if (!(lse = vt_co_pin(st, &p, a[0], fn, "lse", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE,
                          VT_ELEM_BIT(VT_ELEM_F32), 2)) ||
        !(q = vt_co_pin(st, &p, a[1], fn, "query_start_loc", 0, VT_ELEM_BIT(VT_ELEM_I32), 1)) ||
        !(c = vt_co_pin(st, &p, a[2], fn, "context_start_loc", 0, VT_ELEM_BIT(VT_ELEM_I32), 1)))
        goto fail;
    if (q->shape[0] < 1 || c->shape[0] != q->shape[0]) {
        PyErr_Format(PyExc_ValueError, "%s: query_start_loc and context_start_loc must both have num_reqs + 1 >= 1 "
                     "elements; got %lld and %lld", fn, (long long)q->shape[0], (long long)c->shape[0]);
        goto fail;
    }
    if (vt_co_no_overlap(lse, "lse", q, "query_start_loc", fn) < 0 ||
        vt_co_no_overlap(lse, "lse", c, "context_start_loc", fn) < 0)
        goto fail;
    vt_mask_lse_params mp = {
        .fn = fn, .lse = (float *)lse->data, .num_heads = lse->shape[0], .num_tokens = lse->shape[1],
        .stride_head = lse->strides[0] / 4, .stride_tok = lse->strides[1] / 4,
        .query_start_loc = (const int32_t *)q->data, .context_start_loc = (const int32_t *)c->data,
        .num_reqs = q->shape[0] - 1, .qsl_stride = q->strides[0] / 4, .csl_stride = c->strides[0] / 4,
    };
    vt_error err;
    vt_status s = vt_mask_empty_context_lse(&mp, &err);
    return vt_co_done(st, &p, s, &err);
fail:
    vt_co_pins_release(&p);
    return NULL;
}

static char mla_doc[512], mask_doc[512];

static PyMethodDef mla_methods[] = {
    {"concat_and_cache_mla", (PyCFunction)(void (*)(void))py_concat_and_cache_mla, METH_VARARGS | METH_KEYWORDS,
     mla_doc},
    {"mask_empty_context_lse", (PyCFunction)(void (*)(void))py_mask_empty_context_lse, METH_VARARGS | METH_KEYWORDS,
     mask_doc},
    {NULL, NULL, 0, NULL},
};

int vt_cacheops_mla_exec(PyObject *m) {
    vt_signature_doc(&mla_sig, "vLLM's MLA cache store (auto, fp8 and fp8_ds_mla entries).", mla_doc, sizeof mla_doc);
    vt_signature_doc(&mask_sig, "Set the LSE of queries whose context chunk is empty to -inf.", mask_doc,
                     sizeof mask_doc);
    return PyModule_AddFunctions(m, mla_methods);
}
