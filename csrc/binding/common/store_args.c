/* The store's argument layer (vt_store_args.h), shared by both extensions. */
#include "vt_store_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vt_parse_dtype_name(PyObject *obj, const char *fn, const char *arg, int *out) {
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a str naming a dtype; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8(obj);
    if (!s) return -1;
    vt_error err;
    if (vt_dtype_from_name(s, arg, out, &err) != VT_OK) {
        PyErr_Format(PyExc_ValueError, "%s: %s", fn, err.message);
        return -1;
    }
    return 0;
}

int vt_parse_layout(PyObject *obj, const char *fn, int *hnd) {
    *hnd = 0;
    if (!obj || obj == Py_None) return 0;
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (s && strcmp(s, "HND") == 0) *hnd = 1;
    else if (!(s && strcmp(s, "NHD") == 0)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: layout must be None, 'NHD' or 'HND'; got %R", fn, obj);
        return -1;
    }
    return 0;
}

int vt_store_pin_inputs(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *key, PyObject *value, PyObject *slots,
                        int64_t H, int64_t D) {
    const char *fn = c->fn;
    if (pin(ctx, key, fn, "key", 0, &c->key) < 0 || pin(ctx, value, fn, "value", 0, &c->value) < 0 ||
        pin(ctx, slots, fn, "slot_mapping", 0, &c->slots) < 0)
        return -1;
    if (vt_tensor_check(&c->key, fn, "key", VT_ELEMS_FLOAT, 3, c->mem) < 0 ||
        vt_tensor_check(&c->value, fn, "value", VT_ELEMS_FLOAT, 3, c->mem) < 0 ||
        vt_tensor_check(&c->slots, fn, "slot_mapping", VT_ELEM_BIT(VT_ELEM_I64), 1, c->mem) < 0)
        return -1;
    if (c->key.elem != c->value.elem) {
        PyErr_Format(PyExc_TypeError, "%s: value must have key's dtype %s; got %s", fn, c->key.dtype_name,
                     c->value.dtype_name);
        return -1;
    }
    if (H < 0) H = c->key.shape[1];
    if (D < 0) D = c->key.shape[2];
    for (int i = 0; i < 2; i++) {
        const vt_tensor *t = i ? &c->value : &c->key;
        if (t->shape[1] != H || t->shape[2] != D) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape [num_tokens, %lld, %lld]; got [%lld, %lld, %lld]",
                         fn, i ? "value" : "key", (long long)H, (long long)D, (long long)t->shape[0],
                         (long long)t->shape[1], (long long)t->shape[2]);
            return -1;
        }
    }
    if (c->key.shape[0] != c->value.shape[0]) {
        PyErr_Format(PyExc_ValueError, "%s: value must have key's token count %lld; got %lld", fn,
                     (long long)c->key.shape[0], (long long)c->value.shape[0]);
        return -1;
    }
    if (c->slots.shape[0] > c->key.shape[0]) {
        PyErr_Format(PyExc_ValueError, "%s: slot_mapping must have at most key.shape[0] = %lld elements; got %lld", fn,
                     (long long)c->key.shape[0], (long long)c->slots.shape[0]);
        return -1;
    }
    return 0;
}

int vt_store_pin_caches(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *key_cache, PyObject *value_cache) {
    const int flags = VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT;
    const unsigned mask = VT_ELEMS_FLOAT | VT_ELEMS_CODES | VT_ELEM_BIT(VT_ELEM_I8);
    if (pin(ctx, key_cache, c->fn, "key_cache", flags, &c->key_cache) < 0 ||
        pin(ctx, value_cache, c->fn, "value_cache", flags, &c->value_cache) < 0)
        return -1;
    return vt_tensor_check(&c->key_cache, c->fn, "key_cache", mask, c->xsplit ? 5 : 4, c->mem) < 0 ||
                   vt_tensor_check(&c->value_cache, c->fn, "value_cache", mask, 4, c->mem) < 0
               ? -1
               : 0;
}

int vt_store_pin_scale_caches(vt_store_call *c, vt_pin_fn pin, void *ctx, PyObject *k_scale_cache,
                              PyObject *v_scale_cache) {
    const int flags = VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT;
    PyObject *obj[2] = {k_scale_cache, v_scale_cache};
    vt_tensor *t[2] = {&c->k_scale_cache, &c->v_scale_cache};
    static const char *const names[2] = {"k_scale_cache", "v_scale_cache"};
    for (int w = 0; w < 2; w++) {
        if (!obj[w] || obj[w] == Py_None) continue;
        if (pin(ctx, obj[w], c->fn, names[w], flags, t[w]) < 0 ||
            vt_tensor_check(t[w], c->fn, names[w], VT_ELEM_BIT(VT_ELEM_F32), 3, c->mem) < 0)
            return -1;
    }
    return 0;
}

static int is_pth(const vt_store_call *c) { return c->kv_flag >= 0 && vt_dtype_per_token_head(c->kv_flag); }

int vt_store_check_inputs_contiguous(const vt_store_call *c) {
    const vt_tensor *in[3] = {&c->key, &c->value, &c->slots};
    static const char *const names[3] = {"key", "value", "slot_mapping"};
    for (int i = 0; i < 3; i++)
        if (!vt_tensor_last_dim_contiguous(in[i])) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have a contiguous last dimension; got a stride of %lld bytes",
                         c->fn, names[i], (long long)in[i]->strides[in[i]->ndim - 1]);
            return -1;
        }
    return 0;
}

/* The flash layouts: [num_blocks, block_size, H, D] (HND: H and block_size swapped). */
static int check_flash_shapes(const vt_store_call *c, int64_t H, int64_t D) {
    const vt_tensor *kc = &c->key_cache;
    const int64_t nb = kc->shape[0], bs = c->hnd ? kc->shape[2] : kc->shape[1];
    vt_error gerr;
    if (c->kv_flag >= 0 && vt_dtype_check_head_size(c->kv_flag, D, c->fn, "key's head size", NULL, &gerr) != VT_OK) {
        PyErr_SetString(PyExc_ValueError, gerr.message);
        return -1;
    }
    const int64_t row = vt_cache_row_elems(c->kv_flag, D); /* code elements (bytes for packed codes) of a head row */
    const int64_t want[4] = {nb, c->hnd ? H : bs, c->hnd ? bs : H, row};
    const int64_t padded = is_pth(c) ? row + 4 : row; /* vLLM's per-token-head views: codes, then the scale's 4 bytes */
    for (int w = 0; w < 2; w++) {
        const vt_tensor *t = w ? &c->value_cache : kc;
        for (int i = 0; i < 4; i++)
            if (t->shape[i] != want[i] && !(i == 3 && t->shape[3] == padded)) {
                char dr[16];
                vt_cache_row_words(c->kv_flag, dr, sizeof dr);
                PyErr_Format(PyExc_ValueError,
                             "%s: %s must have shape [num_blocks, %s, %s] = [%lld, %lld, %lld, %lld] (H_kv and D from "
                             "key%s%s%s); got [%lld, %lld, %lld, %lld]",
                             c->fn, w ? "value_cache" : "key_cache", c->hnd ? "H_kv, block_size" : "block_size, H_kv",
                             dr, (long long)want[0], (long long)want[1], (long long)want[2], (long long)want[3],
                             padded != row ? "; or " : "", padded != row ? dr : "",
                             padded != row ? " + 4 as vLLM's per-token-head views" : "",
                             (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                             (long long)t->shape[3]);
                return -1;
            }
    }
    return 0;
}

/* vLLM's x-split layout: key [nb, H, D/x, bs, x], value [nb, H, D, bs]. */
static int check_xsplit_shapes(const vt_store_call *c, int64_t H, int64_t D) {
    const vt_tensor *kc = &c->key_cache, *vc = &c->value_cache;
    const int64_t nb = kc->shape[0], bs = kc->shape[3], x = kc->shape[4];
    if (x <= 0 || D % x != 0 || kc->shape[1] != H || kc->shape[2] != D / x) {
        PyErr_Format(PyExc_ValueError,
                     "%s: key_cache must have shape [num_blocks, H_kv=%lld, D/x, block_size, x] with x dividing "
                     "D=%lld; got [%lld, %lld, %lld, %lld, %lld]",
                     c->fn, (long long)H, (long long)D, (long long)kc->shape[0], (long long)kc->shape[1],
                     (long long)kc->shape[2], (long long)kc->shape[3], (long long)kc->shape[4]);
        return -1;
    }
    if (vc->shape[0] != nb || vc->shape[1] != H || vc->shape[2] != D || vc->shape[3] != bs) {
        PyErr_Format(PyExc_ValueError,
                     "%s: value_cache must have shape [num_blocks, H_kv, D, block_size] = [%lld, %lld, %lld, "
                     "%lld]; got [%lld, %lld, %lld, %lld]",
                     c->fn, (long long)nb, (long long)H, (long long)D, (long long)bs, (long long)vc->shape[0],
                     (long long)vc->shape[1], (long long)vc->shape[2], (long long)vc->shape[3]);
        return -1;
    }
    return 0;
}

/* Does a cache's element type fit kv_cache_dtype (key's dtype for "auto")?
 * Returns the storage dtype or -1 with TypeError set. */
static int cache_dtype_for(const vt_store_call *c, const char *arg, const vt_tensor *cache) {
    int want = c->kv_flag == VT_DTYPE_AUTO ? (int)c->key.elem : c->kv_flag;
    const vt_dtype_info *di = vt_dtype_get(want);
    if (is_pth(c)) { /* codes of the table's element: int8, e4m3 (uint8 or float8_e4m3fn), int4 (uint8 bytes) */
        char what[48];
        if (!vt_elem_holds_codes(want, cache->elem, what, sizeof what)) {
            PyErr_Format(PyExc_TypeError, "%s: %s must hold %s codes for kv_cache_dtype '%s'; got %s", c->fn, arg,
                         what, di->name, cache->dtype_name);
            return -1;
        }
        return want;
    }
    int ok = di->is_fp8 ? (cache->elem == VT_ELEM_U8 || (int)cache->elem == want) : (int)cache->elem == want;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: %s must have dtype %s%s for kv_cache_dtype %s; got %s", c->fn, arg,
                     di->is_fp8 ? "uint8 or " : "", di->numpy_name,
                     c->kv_flag == VT_DTYPE_AUTO ? "'auto' (key's dtype)" : di->name, cache->dtype_name);
        return -1;
    }
    return want;
}

/* Destinations: strides of each cache, its last dimension contiguous. */
static int fill_destinations(vt_store_call *c, int64_t D) {
    const vt_tensor *kc = &c->key_cache, *vc = &c->value_cache;
    for (int w = 0; w < 2; w++) {
        const vt_tensor *t = w ? vc : kc;
        if (!vt_tensor_last_dim_contiguous(t) && !(c->xsplit && w == 1)) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have a contiguous last dimension (stride %zu bytes); got %lld",
                         c->fn, w ? "value_cache" : "key_cache", t->itemsize, (long long)t->strides[t->ndim - 1]);
            return -1;
        }
    }
    if (c->xsplit) {
        c->p.key_cache = (vt_kv_dst){kc->data, kc->strides[0], kc->strides[3], kc->strides[1], kc->strides[2],
                                     kc->shape[4]};
        c->p.value_cache = (vt_kv_dst){vc->data, vc->strides[0], vc->strides[3], vc->strides[1], vc->strides[2], 1};
        return 0;
    }
    const int is = c->hnd ? 2 : 1, ih = c->hnd ? 1 : 2;
    c->p.key_cache = (vt_kv_dst){kc->data, kc->strides[0], kc->strides[is], kc->strides[ih], 0, D};
    c->p.value_cache = (vt_kv_dst){vc->data, vc->strides[0], vc->strides[is], vc->strides[ih], 0, D};
    return 0;
}

/* Overlap means shared elements: K/V views of one allocation (kv[:, 0],
 * kv[:, 1]) are fine; caches sharing an element, or an input inside a
 * destination, are not. */
static int check_overlap(const vt_store_call *c) {
    const char *fn = c->fn;
    const vt_tensor *in[3] = {&c->key, &c->value, &c->slots};
    static const char *const names[3] = {"key", "value", "slot_mapping"};
    if (vt_refuse_self_alias(fn, &c->key_cache, "key_cache") < 0 ||
        vt_refuse_self_alias(fn, &c->value_cache, "value_cache") < 0)
        return -1;
    if (vt_refuse_shared(fn, &c->key_cache, "key_cache", &c->value_cache, "value_cache") < 0) return -1;
    for (int i = 0; i < 3; i++)
        if (vt_refuse_shared(fn, in[i], names[i], &c->key_cache, "key_cache") < 0 ||
            vt_refuse_shared(fn, in[i], names[i], &c->value_cache, "value_cache") < 0)
            return -1;
    if (!c->k_scale_cache.owner) return 0;
    /* The scale caches: the codes (narrowed to D, so vLLM's padded views pass), the inputs, each other. */
    const vt_tensor *sc[2] = {&c->k_scale_cache, &c->v_scale_cache};
    static const char *const scn[2] = {"k_scale_cache", "v_scale_cache"};
    vt_tensor codes[2] = {c->key_cache, c->value_cache};
    static const char *const cn[2] = {"key_cache", "value_cache"};
    for (int w = 0; w < 2; w++) codes[w].shape[3] = (int64_t)vt_dtype_row_bytes(c->p.cache_dtype, (size_t)c->key.shape[2]);
    if (vt_refuse_shared(fn, sc[0], scn[0], sc[1], scn[1]) < 0) return -1;
    for (int w = 0; w < 2; w++) {
        if (vt_refuse_self_alias(fn, sc[w], scn[w]) < 0) return -1;
        for (int i = 0; i < 3; i++)
            if (vt_refuse_shared(fn, in[i], names[i], sc[w], scn[w]) < 0) return -1;
        for (int j = 0; j < 2; j++)
            if (vt_refuse_shared(fn, sc[w], scn[w], &codes[j], cn[j]) < 0) return -1;
    }
    return 0;
}

/* kv_cache_dtype per-token-head: both scale caches, [num_blocks, block_size, H_kv]; otherwise none. */
static int check_scale_caches(vt_store_call *c) {
    const vt_tensor *sc[2] = {&c->k_scale_cache, &c->v_scale_cache};
    static const char *const scn[2] = {"k_scale_cache", "v_scale_cache"};
    if (!is_pth(c)) {
        if (!sc[0]->owner && !sc[1]->owner) return 0;
        PyErr_Format(PyExc_ValueError, "%s: k_scale_cache and v_scale_cache must be None unless kv_cache_dtype is a "
                     "per-token-head format; got kv_cache_dtype '%s'", c->fn, vt_dtype_get(c->p.cache_dtype)->name);
        return -1;
    }
    const char *name = vt_dtype_get(c->kv_flag)->name;
    if (c->xsplit) {
        PyErr_Format(PyExc_ValueError, "%s: kv_cache_dtype must not be '%s' (vLLM stores per-token-head formats in "
                     "the flash layout: use reshape_and_cache_flash)", c->fn, name);
        return -1;
    }
    if (!sc[0]->owner || !sc[1]->owner) {
        PyErr_Format(PyExc_ValueError, "%s: k_scale_cache and v_scale_cache must be given for kv_cache_dtype '%s' "
                     "(float32 [num_blocks, block_size, num_kv_heads]); got None", c->fn, name);
        return -1;
    }
    const int64_t want[3] = {c->p.num_blocks, c->p.block_size, c->p.num_kv_heads};
    for (int w = 0; w < 2; w++)
        if (sc[w]->shape[0] != want[0] || sc[w]->shape[1] != want[1] || sc[w]->shape[2] != want[2]) {
            char buf[120];
            snprintf(buf, sizeof buf, "[%lld, %lld, %lld] (the caches' num_blocks, block_size, H_kv)",
                     (long long)want[0], (long long)want[1], (long long)want[2]);
            return vt_shape_error(c->fn, scn[w], buf, sc[w]);
        }
    vt_kv_dst *d[2] = {&c->p.k_scale_cache, &c->p.v_scale_cache};
    for (int w = 0; w < 2; w++)
        *d[w] = (vt_kv_dst){sc[w]->data, sc[w]->strides[0], sc[w]->strides[1], sc[w]->strides[2], 0, 1};
    return 0;
}

int vt_store_check(vt_store_call *c) {
    const int64_t H = c->key.shape[1], D = c->key.shape[2];
    if (c->kv_flag >= 0 && vt_dtype_get(c->kv_flag)->page_layout == VT_PAGE_SLOTS) {
        PyErr_Format(PyExc_NotImplementedError, "%s: kv_cache_dtype '%s' packs K and V into one slot cache; store it "
                     "with turboquant_store(key, value, kv_cache, slot_mapping, kv_cache_dtype)", c->fn,
                     vt_dtype_get(c->kv_flag)->name);
        return -1;
    }
    if ((c->xsplit ? check_xsplit_shapes(c, H, D) : check_flash_shapes(c, H, D)) < 0) return -1;
    int cdt = cache_dtype_for(c, "key_cache", &c->key_cache);
    if (cdt < 0 || cache_dtype_for(c, "value_cache", &c->value_cache) < 0) return -1;
    if (vt_store_check_inputs_contiguous(c) < 0 || fill_destinations(c, D) < 0) return -1;
    vt_kv_store_params *p = &c->p;
    p->fn = c->fn;
    p->key = c->key.data;
    p->value = c->value.data;
    p->key_stride_token = c->key.strides[0], p->key_stride_head = c->key.strides[1];
    p->value_stride_token = c->value.strides[0], p->value_stride_head = c->value.strides[1];
    p->slot_mapping = c->slots.data;
    p->num_tokens = c->slots.shape[0];
    p->num_kv_heads = H;
    p->head_size = D;
    p->block_size = c->xsplit ? c->key_cache.shape[3] : c->key_cache.shape[c->hnd ? 2 : 1];
    p->num_blocks = c->key_cache.shape[0];
    p->src_dtype = (vt_dtype)c->key.elem;
    p->cache_dtype = (vt_dtype)cdt;
    return check_scale_caches(c) < 0 || check_overlap(c) < 0 ? -1 : 0;
}

int vt_store_set_scales(vt_store_call *c, const float *k, int64_t nk, const float *v, int64_t nv) {
    const int64_t H = c->p.num_kv_heads;
    if (!vt_dtype_get(c->p.cache_dtype)->is_fp8) return 0; /* plain dtypes ignore them */
    const int64_t n[2] = {nk, nv};
    for (int w = 0; w < 2; w++)
        if (n[w] != 1 && n[w] != H) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have 1 or num_kv_heads = %lld elements; got %lld", c->fn,
                         w ? "v_scale" : "k_scale", (long long)H, (long long)n[w]);
            return -1;
        }
    const int per_head = nk != 1 || nv != 1;
    const int64_t m = per_head ? H : 1;
    free(c->scales);
    if (!(c->scales = malloc((size_t)(2 * m) * sizeof(float)))) {
        PyErr_NoMemory();
        return -1;
    }
    for (int64_t h = 0; h < m; h++) { /* a one-value scale beside a per-head one: expanded */
        c->scales[h] = k[nk == 1 ? 0 : h];
        c->scales[m + h] = v[nv == 1 ? 0 : h];
    }
    c->p.k_scale = c->scales;
    c->p.v_scale = c->scales + m;
    c->p.scale_per_head = per_head;
    return 0;
}

void vt_store_release(vt_store_call *c) {
    vt_tensor *all[7] = {&c->key, &c->value, &c->key_cache, &c->value_cache, &c->slots, &c->k_scale_cache,
                         &c->v_scale_cache};
    for (int i = 0; i < 7; i++) vt_tensor_release(all[i]);
    free(c->scales);
    c->scales = NULL;
}
