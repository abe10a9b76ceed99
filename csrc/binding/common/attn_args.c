/* The attention argument layer (vt_attn_args.h), shared by both extensions. */
#include "vt_attn_args.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char FN[] = "flash_attn_varlen_func";

static int inner_contiguous(const vt_tensor *t, const char *name) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 0; /* no element: any stride is fine (NumPy/DLPack may report 0) */
    if (t->shape[t->ndim - 1] > 1 && t->strides[t->ndim - 1] != (int64_t)t->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have a contiguous last (head_size) dimension; got a stride of "
                     "%lld bytes", FN, name, (long long)t->strides[t->ndim - 1]);
        return -1;
    }
    return 0;
}

/* Descale [] / [1] / [H_kv] / [B, H_kv] -> element strides (b, h). */
static int descale_strides(const vt_tensor *t, const char *name, int64_t B, int64_t hkv, int64_t *sb, int64_t *sh) {
    if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) {
        *sb = 0, *sh = 0;
    } else if (t->ndim == 1 && t->shape[0] == hkv) {
        *sb = 0, *sh = 1;
    } else if (t->ndim == 2 && t->shape[0] == B && t->shape[1] == hkv) {
        *sb = hkv, *sh = 1;
    } else {
        char want[96];
        snprintf(want, sizeof want, "[], [%lld] or [%lld, %lld]", (long long)hkv, (long long)B, (long long)hkv);
        return vt_shape_error(FN, name, want, t);
    }
    return 0;
}

static int parse_window(PyObject *obj, int *left, int *right) {
    if (obj == NULL || obj == Py_None) {
        *left = *right = -1;
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, "");
    if (!seq || PySequence_Fast_GET_SIZE(seq) != 2) {
        Py_XDECREF(seq);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: window_size must be a pair (left, right) of ints; got %R", FN, obj);
        return -1;
    }
    long v[2];
    for (int i = 0; i < 2; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
        int64_t w;
        if (vt_int_arg(x, FN, i ? "window_size[1]" : "window_size[0]", -1, INT32_MAX, &w) < 0) {
            Py_DECREF(seq);
            return -1;
        }
        v[i] = (long)w;
    }
    Py_DECREF(seq);
    *left = (int)v[0];
    *right = (int)v[1];
    return 0;
}

static int parse_float(PyObject *obj, const char *name, double dflt, double *out) {
    if (obj == NULL || obj == Py_None) {
        *out = dflt;
        return 0;
    }
    if (PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number; got bool", FN, name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number; got %s", FN, name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_opt_int(PyObject *obj, const char *name, long long *out) {
    *out = -1;
    if (obj == NULL || obj == Py_None) return 0;
    int64_t v;
    if (vt_int_arg(obj, FN, name, 0, INT64_MAX, &v) < 0) return -1;
    *out = (long long)v;
    return 0;
}

void vt_attn_release(vt_attn_call *c) {
    vt_tensor *all[] = {&c->q, &c->k, &c->v, &c->cu_seqlens_q, &c->seqused_k, &c->block_table, &c->alibi_slopes,
                        &c->s_aux, &c->k_descale, &c->v_descale, &c->out, &c->lse, &c->k_scale_cache,
                        &c->v_scale_cache};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vt_tensor_release(all[i]);
    Py_CLEAR(c->out_obj);
    Py_CLEAR(c->lse_obj);
}

/* Pin an optional input (None -> absent, owner stays NULL). */
static int pin(vt_attn_call *c, PyObject *obj, const char *name, unsigned mask, int ndim, int flags, vt_tensor *t) {
    if (obj == NULL || obj == Py_None) return 0;
    if (c->pin(c->ctx, obj, FN, name, flags, t) < 0) return -1;
    return vt_tensor_check(t, FN, name, mask, ndim, c->mem);
}

int vt_attn_parse_scalars(vt_attn_call *c) {
    const vt_attn_pyargs *a = &c->a;
    c->causal = a->causal ? PyObject_IsTrue(a->causal) : 1;
    c->return_lse = a->return_lse ? PyObject_IsTrue(a->return_lse) : 0;
    if (c->causal < 0 || c->return_lse < 0) return -1;
    if (parse_opt_int(a->max_seqlen_q, "max_seqlen_q", &c->max_seqlen_q) < 0 ||
        parse_opt_int(a->max_seqlen_k, "max_seqlen_k", &c->max_seqlen_k) < 0 ||
        parse_float(a->softmax_scale, "softmax_scale", NAN, &c->softmax_scale) < 0 ||
        parse_window(a->window_size, &c->window_left, &c->window_right) < 0 ||
        parse_float(a->softcap, "softcap", 0.0, &c->softcap) < 0)
        return -1;
    const char *kvd = "auto";
    if (a->kv_cache_dtype && !(kvd = PyUnicode_Check(a->kv_cache_dtype) ? PyUnicode_AsUTF8(a->kv_cache_dtype) : NULL)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be a str; got %s", FN,
                         Py_TYPE(a->kv_cache_dtype)->tp_name);
        return -1;
    }
    c->kv_name = kvd;
    vt_error e;
    if (vt_dtype_from_name(kvd, "kv_cache_dtype", &c->kv_flag, &e) != VT_OK) {
        PyErr_Format(PyExc_ValueError, "%s: %s", FN, e.message);
        return -1;
    }
    if (c->kv_flag >= 0 && vt_dtype_get(c->kv_flag)->read_family == VT_READ_SLOTS && c->mem != VT_MEMORY_CPU) {
        PyErr_Format(PyExc_NotImplementedError, "%s: kv_cache_dtype '%s' is not read on CUDA tensors yet (its packed "
                     "K+V slots are read on the CPU)", FN, kvd);
        return -1;
    }
    return 0;
}

int vt_attn_pin_inputs(vt_attn_call *c) {
    const vt_attn_pyargs *a = &c->a;
    const unsigned F32 = VT_ELEM_BIT(VT_ELEM_F32), I32 = VT_ELEM_BIT(VT_ELEM_I32);
    const unsigned KV = VT_ELEMS_FLOAT | VT_ELEMS_CODES | VT_ELEM_BIT(VT_ELEM_I8);
    return pin(c, a->q, "q", VT_ELEMS_FLOAT, 3, 0, &c->q) < 0 || pin(c, a->k, "k", KV, 4, VT_TENSOR_NO_CONVERT, &c->k) < 0 ||
                   pin(c, a->v, "v", KV, 4, VT_TENSOR_NO_CONVERT, &c->v) < 0 ||
                   pin(c, a->cu_seqlens_q, "cu_seqlens_q", I32, 1, 0, &c->cu_seqlens_q) < 0 ||
                   pin(c, a->seqused_k, "seqused_k", I32, 1, 0, &c->seqused_k) < 0 ||
                   pin(c, a->block_table, "block_table", I32, 2, 0, &c->block_table) < 0 ||
                   pin(c, a->alibi_slopes, "alibi_slopes", F32, 1, 0, &c->alibi_slopes) < 0 ||
                   pin(c, a->s_aux, "s_aux", F32, 1, 0, &c->s_aux) < 0 ||
                   pin(c, a->k_descale, "k_descale", F32, -1, 0, &c->k_descale) < 0 ||
                   pin(c, a->v_descale, "v_descale", F32, -1, 0, &c->v_descale) < 0 ||
                   pin(c, a->k_scale_cache, "k_scale_cache", F32, 3, VT_TENSOR_NO_CONVERT, &c->k_scale_cache) < 0 ||
                   pin(c, a->v_scale_cache, "v_scale_cache", F32, 3, VT_TENSOR_NO_CONVERT, &c->v_scale_cache) < 0
               ? -1
               : 0;
}

/* k_scale_cache / v_scale_cache: k's [num_blocks, block_size, num_kv_heads]. */
static int check_scale_cache_shapes(const vt_attn_call *c) {
    const vt_tensor *k = &c->k, *sc[2] = {&c->k_scale_cache, &c->v_scale_cache};
    static const char *const scn[2] = {"k_scale_cache", "v_scale_cache"};
    for (int i = 0; i < 2; i++)
        if (sc[i]->owner && (sc[i]->shape[0] != k->shape[0] || sc[i]->shape[1] != k->shape[1] ||
                             sc[i]->shape[2] != k->shape[2])) {
            char want[128];
            snprintf(want, sizeof want, "[%lld, %lld, %lld] (k's num_blocks, block_size, num_kv_heads)",
                     (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2]);
            return vt_shape_error(FN, scn[i], want, sc[i]);
        }
    return 0;
}

static int check_shapes(vt_attn_call *c) {
    const vt_tensor *q = &c->q, *k = &c->k, *v = &c->v;
    const int64_t H = q->shape[1], D = q->shape[2], HKV = k->shape[2], B = c->cu_seqlens_q.shape[0] - 1;
    char want[128];
    for (int i = 0; i < 4; i++)
        if (v->shape[i] != k->shape[i]) {
            snprintf(want, sizeof want, "[%lld, %lld, %lld, %lld] (k's)", (long long)k->shape[0],
                     (long long)k->shape[1], (long long)HKV, (long long)k->shape[3]);
            return vt_shape_error(FN, "v", want, v);
        }
    const int pth = c->kv_flag >= 0 && vt_dtype_per_token_head(c->kv_flag);
    vt_error gerr;
    if (c->kv_flag >= 0 && vt_dtype_check_head_size(c->kv_flag, D, FN, "q's head size", NULL, &gerr) != VT_OK) {
        PyErr_SetString(PyExc_ValueError, gerr.message);
        return -1;
    }
    const int64_t row = vt_cache_row_elems(c->kv_flag, D); /* code elements (bytes for packed codes) of a head row */
    if (c->kv_flag >= 0 && vt_dtype_get(c->kv_flag)->read_family == VT_READ_SLOTS) {
        if ((c->slot_rope_dim = vt_dtype_rope_of_slot_width(c->kv_flag, (size_t)D, (size_t)k->shape[3])) < 0) {
            snprintf(want, sizeof want, "[num_blocks, block_size, num_kv_heads, slot_bytes] (the slot bytes of '%s' at "
                     "head size %lld%s)", c->kv_name, (long long)D,
                     vt_dtype_get(c->kv_flag)->rope_block > 0 ? " for some rotary dims" : "");
            return vt_shape_error(FN, "k", want, k);
        }
    } else if (k->shape[3] != row && !(pth && k->shape[3] == row + 4)) { /* + 4: vLLM's padded per-token-head views */
        char dr[16];
        vt_cache_row_words(c->kv_flag, dr, sizeof dr);
        snprintf(want, sizeof want, "[num_blocks, block_size, num_kv_heads, %lld%s%s%s] (q's head size%s)",
                 (long long)row, pth ? " or " : "", pth ? dr : "", pth ? " + 4" : "", dr + 1); /* "D / 2" -> " / 2" */
        return vt_shape_error(FN, "k", want, k);
    }
    if (HKV < 1 || H % HKV) {
        PyErr_Format(PyExc_ValueError, "%s: q must have a head count divisible by k's num_kv_heads; got %lld and %lld",
                     FN, (long long)H, (long long)HKV);
        return -1;
    }
    if (B < 0) return vt_shape_error(FN, "cu_seqlens_q", "[batch + 1]", &c->cu_seqlens_q);
    snprintf(want, sizeof want, "[%lld] (batch)", (long long)B);
    if (c->seqused_k.shape[0] != B) return vt_shape_error(FN, "seqused_k", want, &c->seqused_k);
    snprintf(want, sizeof want, "[%lld, max_blocks]", (long long)B);
    if (c->block_table.shape[0] != B) return vt_shape_error(FN, "block_table", want, &c->block_table);
    snprintf(want, sizeof want, "[%lld] (num_heads)", (long long)H);
    if (c->alibi_slopes.owner && c->alibi_slopes.shape[0] != H)
        return vt_shape_error(FN, "alibi_slopes", want, &c->alibi_slopes);
    if (c->s_aux.owner && c->s_aux.shape[0] != H) return vt_shape_error(FN, "s_aux", want, &c->s_aux);
    if ((c->k_descale.owner &&
         descale_strides(&c->k_descale, "k_descale", B, HKV, &c->k_descale_sb, &c->k_descale_sh) < 0) ||
        (c->v_descale.owner &&
         descale_strides(&c->v_descale, "v_descale", B, HKV, &c->v_descale_sb, &c->v_descale_sh) < 0) ||
        check_scale_cache_shapes(c) < 0)
        return -1;
    if (H > INT32_MAX || D > INT32_MAX || B > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: q and cu_seqlens_q must have sizes below 2^31", FN);
        return -1;
    }
    return 0;
}

/* A per-token-head kv_cache_dtype: codes of the table's element, scales
 * from the scale caches. */
static int resolve_per_token_head(vt_attn_call *c) {
    char what[48];
    if (!vt_elem_holds_codes(c->kv_flag, c->k.elem, what, sizeof what)) {
        PyErr_Format(PyExc_TypeError, "%s: k must hold %s codes for kv_cache_dtype '%s'; got %s", FN, what,
                     c->kv_name, c->k.dtype_name);
        return -1;
    }
    if (!c->k_scale_cache.owner || !c->v_scale_cache.owner) {
        PyErr_Format(PyExc_ValueError, "%s: k_scale_cache and v_scale_cache must be given for kv_cache_dtype "
                     "'%s' (float32 [num_blocks, block_size, num_kv_heads]); got None", FN, c->kv_name);
        return -1;
    }
    c->kv_dtype = c->kv_flag;
    return 0;
}

/* The cache's dtype and kv_cache_dtype must agree: sets c->kv_dtype. */
static int resolve_kv_dtype(vt_attn_call *c) {
    const vt_tensor *k = &c->k, *v = &c->v;
    const int flag = c->kv_flag;
    const char *kvd = c->kv_name;
    if (k->elem != v->elem) {
        PyErr_Format(PyExc_TypeError, "%s: v must have k's dtype %s; got %s", FN, k->dtype_name, v->dtype_name);
        return -1;
    }
    if (flag >= 0 && vt_dtype_per_token_head(flag)) return resolve_per_token_head(c);
    if (flag >= 0 && vt_dtype_get(flag)->read_family == VT_READ_SLOTS) {
        if (k->elem != VT_ELEM_U8) {
            PyErr_Format(PyExc_TypeError, "%s: k must be the uint8 slot cache for kv_cache_dtype '%s'; got %s", FN, kvd,
                         k->dtype_name);
            return -1;
        }
        int same = v->data == k->data;
        for (int i = 0; i < 4; i++) same &= v->strides[i] == k->strides[i];
        if (!same) {
            PyErr_Format(PyExc_ValueError, "%s: v must be k (the same slot cache: one slot holds a token's K and V) "
                         "for kv_cache_dtype '%s'; got another array", FN, kvd);
            return -1;
        }
        c->kv_dtype = flag;
        return 0;
    }
    if (c->k_scale_cache.owner || c->v_scale_cache.owner) {
        PyErr_Format(PyExc_ValueError, "%s: k_scale_cache and v_scale_cache must be None unless kv_cache_dtype is a "
                     "per-token-head format; got kv_cache_dtype '%s'", FN, kvd);
        return -1;
    }
    if (k->elem == VT_ELEM_I8) {
        PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be 'int8_per_token_head' for a cache of int8 codes; "
                     "got '%s'", FN, kvd);
        return -1;
    }
    if (k->elem == VT_ELEM_U8 || k->elem == VT_ELEM_E4M3 || k->elem == VT_ELEM_E5M2) {
        if (flag < 0 || !vt_dtype_get(flag)->is_fp8) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be 'fp8', 'fp8_e4m3' or 'fp8_e5m2' for a cache of "
                         "%s codes (another value would read the codes as numbers); got '%s'", FN, k->dtype_name, kvd);
            return -1;
        }
        if (k->elem != VT_ELEM_U8 && (int)k->elem != flag) { /* a float8 array names its own format */
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must match k's dtype %s; got '%s'", FN, k->dtype_name, kvd);
            return -1;
        }
        c->kv_dtype = flag;
        return 0;
    }
    if (flag >= 0 && flag != (int)k->elem) {
        PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be 'auto' or k's dtype for a %s cache; got '%s' "
                     "(an fp8 cache holds uint8 or float8 codes)", FN, k->dtype_name, kvd);
        return -1;
    }
    c->kv_dtype = (int)k->elem;
    return 0;
}

static int check_contiguity(vt_attn_call *c) {
    if (c->contig(c->ctx, &c->q, FN, "q") < 0 || inner_contiguous(&c->k, "k") < 0 || inner_contiguous(&c->v, "v") < 0)
        return -1;
    struct { vt_tensor *t; const char *name; } small[] = {
        {&c->cu_seqlens_q, "cu_seqlens_q"}, {&c->seqused_k, "seqused_k"}, {&c->block_table, "block_table"},
        {&c->alibi_slopes, "alibi_slopes"}, {&c->s_aux, "s_aux"}, {&c->k_descale, "k_descale"},
        {&c->v_descale, "v_descale"}};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        if (small[i].t->owner && c->contig(c->ctx, small[i].t, FN, small[i].name) < 0) return -1;
    return 0;
}

int vt_attn_check_inputs(vt_attn_call *c) {
    return check_shapes(c) < 0 || resolve_kv_dtype(c) < 0 || check_contiguity(c) < 0 ? -1 : 0;
}

int vt_attn_pin_given_out(vt_attn_call *c) {
    const vt_tensor *q = &c->q;
    PyObject *given = c->a.out;
    if (!given || given == Py_None) return 0;
    if (pin(c, given, "out", VT_ELEM_BIT(q->elem), 3, VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT, &c->out) < 0)
        return -1;
    if (c->out.shape[0] != q->shape[0] || c->out.shape[1] != q->shape[1] || c->out.shape[2] != q->shape[2]) {
        char want[96];
        snprintf(want, sizeof want, "[%lld, %lld, %lld] (q's)", (long long)q->shape[0], (long long)q->shape[1],
                 (long long)q->shape[2]);
        return vt_shape_error(FN, "out", want, &c->out);
    }
    if (inner_contiguous(&c->out, "out") < 0 || vt_refuse_self_alias(FN, &c->out, "out") < 0 ||
        vt_refuse_shared(FN, q, "q", &c->out, "out") < 0 || vt_refuse_shared(FN, &c->k, "k", &c->out, "out") < 0 ||
        vt_refuse_shared(FN, &c->v, "v", &c->out, "out") < 0)
        return -1;
    c->out_obj = Py_NewRef(given);
    return 0;
}

static void fill_cache_params(const vt_attn_call *c, vt_attn_params *p) {
    const vt_tensor *k = &c->k, *v = &c->v;
    p->k = k->data;
    p->v = v->data;
    p->kv_dtype = (vt_dtype)c->kv_dtype;
    p->num_blocks = k->shape[0];
    p->block_size = k->shape[1];
    p->k_stride_block = k->strides[0], p->k_stride_tok = k->strides[1], p->k_stride_head = k->strides[2];
    p->v_stride_block = v->strides[0], p->v_stride_tok = v->strides[1], p->v_stride_head = v->strides[2];
    p->num_kv_heads = (int)k->shape[2];
    p->slot_rope_dim = c->slot_rope_dim;
    if (c->k_scale_cache.owner) {
        const vt_tensor *ks = &c->k_scale_cache, *vs = &c->v_scale_cache;
        p->k_scale_cache = ks->data;
        p->v_scale_cache = vs->data;
        p->ks_stride_block = ks->strides[0], p->ks_stride_tok = ks->strides[1], p->ks_stride_head = ks->strides[2];
        p->vs_stride_block = vs->strides[0], p->vs_stride_tok = vs->strides[1], p->vs_stride_head = vs->strides[2];
    }
}

void vt_attn_fill_params(const vt_attn_call *c, vt_attn_params *p) {
    const vt_tensor *q = &c->q;
    memset(p, 0, sizeof *p);
    p->q = q->data;
    p->q_dtype = (vt_dtype)q->elem;
    p->total_q = q->shape[0];
    p->q_stride_tok = q->strides[0], p->q_stride_head = q->strides[1];
    fill_cache_params(c, p);
    p->num_heads = (int)q->shape[1];
    p->head_size = (int)q->shape[2];
    p->batch = (int)(c->cu_seqlens_q.shape[0] - 1);
    p->cu_seqlens_q = c->cu_seqlens_q.data;
    p->seqused_k = c->seqused_k.data;
    p->block_table = c->block_table.data;
    p->max_blocks = p->bt_stride = c->block_table.shape[1];
    const int scale_given = c->a.softmax_scale && c->a.softmax_scale != Py_None;
    p->softmax_scale = (float)(scale_given ? c->softmax_scale : 1.0 / sqrt((double)q->shape[2]));
    p->causal = c->causal;
    p->window_left = c->window_left, p->window_right = c->window_right;
    p->softcap = (float)c->softcap;
    p->alibi_slopes = c->alibi_slopes.owner ? c->alibi_slopes.data : NULL;
    p->s_aux = c->s_aux.owner ? c->s_aux.data : NULL;
    p->k_descale = c->k_descale.owner ? c->k_descale.data : NULL;
    p->v_descale = c->v_descale.owner ? c->v_descale.data : NULL;
    p->k_descale_stride_b = c->k_descale_sb, p->k_descale_stride_h = c->k_descale_sh;
    p->v_descale_stride_b = c->v_descale_sb, p->v_descale_stride_h = c->v_descale_sh;
    p->out = c->out.data;
    p->out_stride_tok = c->out.strides[0], p->out_stride_head = c->out.strides[1];
    if (c->return_lse) {
        p->lse = c->lse.data;
        p->lse_stride_head = q->shape[0];
        p->lse_stride_tok = 1;
    }
}

int vt_attn_check_max_seqlen(const vt_attn_call *c, const vt_attn_params *p, long long *mq_out, long long *mk_out) {
    long long mq = 0, mk = 0;
    for (int b = 0; b < p->batch; b++) {
        if (p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b] > mq) mq = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
        if (p->seqused_k[b] > mk) mk = p->seqused_k[b];
    }
    if (c->max_seqlen_q >= 0 && c->max_seqlen_q < mq) {
        PyErr_Format(PyExc_ValueError, "%s: max_seqlen_q must be >= the longest query run %lld; got %lld", FN, mq,
                     c->max_seqlen_q);
        return -1;
    }
    if (c->max_seqlen_k >= 0 && c->max_seqlen_k < mk) {
        PyErr_Format(PyExc_ValueError, "%s: max_seqlen_k must be >= the largest seqused_k %lld; got %lld", FN, mk,
                     c->max_seqlen_k);
        return -1;
    }
    if (mq_out) *mq_out = mq;
    if (mk_out) *mk_out = mk;
    return 0;
}
