/* vtinfer._C's slot-format functions (TurboQuant, UltraQuant, Octave; csrc/core/kv_slots.c):
 *
 *   _C.turboquant_store(key, value, kv_cache, slot_mapping, kv_cache_dtype, midpoints) -> None
 *   _C.turboquant_gather(kv_cache, slots, kv_cache_dtype, centroids, k_out, v_out, num_threads=None) -> None
 *   _C.nvfp4_store(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, four_over_six=False) -> None
 *   _C.nvfp4_read_pages(key_cache, value_cache, blocks, k_scale, v_scale, num_threads=None) -> (k, v)
 *   _C.turboquant_codebook(kv_cache_dtype, head_size) -> (centroids, midpoints) float32, or None
 *
 * The codebook arrays the store and gather take are the core's (vt_tq_codebook, through
 * turboquant_codebook), passed by vtinfer/_turboquant.py (the public wrappers). Every argument is
 * checked here and again in the core before a byte is written. */
#include "vt_binding.h"
#include "vt_cacheops.h"
#include "vt_store_args.h"
#include "vt_signature.h"
#include "vtinfer/codec.h"
#include "vtinfer/turboquant.h"

#include <stdio.h>
#include <string.h>

VT_SIGNATURE(slot_store_sig, "turboquant_store", VT_SLOT_STORE_NPOS, VT_SLOT_STORE_ARGS);
VT_SIGNATURE(slot_gather_sig, "turboquant_gather", VT_SLOT_GATHER_NPOS, VT_SLOT_GATHER_ARGS);
VT_SIGNATURE(nvfp4_store_sig, "nvfp4_store", VT_NVFP4_STORE_NPOS, VT_NVFP4_STORE_ARGS);
VT_SIGNATURE(nvfp4_read_sig, "nvfp4_read_pages", VT_NVFP4_READ_NPOS, VT_NVFP4_READ_ARGS);
VT_SIGNATURE(codebook_sig, "turboquant_codebook", VT_TQ_CODEBOOK_NPOS, VT_TQ_CODEBOOK_ARGS);

#define NPIN 7

typedef struct tq_call {
    const char *fn;
    vt_module_state *st;
    vt_tensor t[NPIN];
    int n;
} tq_call;

static vt_tensor *pin(tq_call *c, PyObject *obj, const char *arg, int flags) {
    vt_tensor *t = &c->t[c->n];
    if (vt_tensor_from_object(c->st, obj, c->fn, arg, flags, t) < 0) return NULL;
    c->n++;
    /* CPU memory, and strides of whole elements (the stores step by elements: an odd byte stride of
     * a NumPy view is refused, never read between elements) */
    if (vt_tensor_check(t, c->fn, arg, ~0u, -1, VT_MEMORY_CPU) < 0) return NULL;
    return t;
}

static void release(tq_call *c) {
    for (int i = 0; i < c->n; i++) vt_tensor_release(&c->t[i]);
}

static int want_dtype(tq_call *c, PyObject *obj, int *dtype) {
    if (vt_parse_dtype_name(obj, c->fn, "kv_cache_dtype", dtype) < 0) return -1;
    if (*dtype < 0 || vt_dtype_get(*dtype)->page_layout != VT_PAGE_SLOTS) {
        char list[256];
        size_t used = 0;
        list[0] = '\0';
        for (int d = 0; d < VT_DTYPE_COUNT; d++)
            if (vt_dtype_get(d)->page_layout == VT_PAGE_SLOTS && used < sizeof list)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                                         vt_dtype_get(d)->name);
        PyErr_Format(PyExc_ValueError, "%s: kv_cache_dtype must be a slot format (%s); got %R", c->fn, list, obj);
        return -1;
    }
    return 0;
}

static int check_rank(tq_call *c, const vt_tensor *t, const char *arg, int ndim, const char *shape) {
    if (t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have shape %s; got %d dimensions", c->fn, arg, shape, t->ndim);
        return -1;
    }
    return 0;
}

static int check_elem(tq_call *c, const vt_tensor *t, const char *arg, unsigned mask, const char *what) {
    if (!(VT_ELEM_BIT(t->elem) & mask)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be %s; got %s", c->fn, arg, what, t->dtype_name);
        return -1;
    }
    return 0;
}

static int check_contiguous(tq_call *c, const vt_tensor *t, const char *arg) {
    if (!vt_tensor_is_contiguous(t)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be C-contiguous", c->fn, arg);
        return -1;
    }
    return 0;
}

static int status_ok(tq_call *c, vt_status s, const vt_error *err) {
    if (s == VT_OK) return 0;
    vt_raise(c->st, err);
    return -1;
}

/* A call's end after the core ran: the pins released, then None or the core's error raised. */
static PyObject *finish(tq_call *c, vt_status s, const vt_error *err) {
    release(c);
    if (status_ok(c, s, err) < 0) return NULL;
    Py_RETURN_NONE;
}

/* An index argument: int64 [n], C-contiguous. */
static int check_index(tq_call *c, const vt_tensor *t, const char *arg, const char *shape) {
    return check_rank(c, t, arg, 1, shape) < 0 ||
                   check_elem(c, t, arg, VT_ELEM_BIT(VT_ELEM_I64), "int64") < 0 || check_contiguous(c, t, arg) < 0
               ? -1
               : 0;
}

/* The slot widths of a rope-dependent row at head size D, for rotary dims 0, rope_block, .., D (each rope_block
 * of rotary dims adds rope_block / 8 bytes to the K codes), listed for a message. */
static void slot_widths(int dtype, int64_t D, char *widths, size_t cap) {
    size_t used = 0;
    widths[0] = '\0';
    for (int64_t r = 0; r <= D && used < cap; r += vt_dtype_get(dtype)->rope_block)
        used += (size_t)snprintf(widths + used, cap - used, "%s%lld", used ? ", " : "",
                                 (long long)vt_dtype_slot_bytes_rope(dtype, (size_t)D, (size_t)r));
}

/* The slot cache [num_blocks, block_size, H_kv, slot_bytes(D)] uint8 with contiguous slots. */
static int cache_of(tq_call *c, const vt_tensor *kc, int dtype, int64_t H, int64_t D, vt_tq_cache *out) {
    vt_error err; /* the format's own head-size rule first: the slot size follows from it */
    if (status_ok(c, vt_dtype_check_head_size(dtype, D, c->fn, "head_size", NULL, &err), &err) < 0) return -1;
    if (check_rank(c, kc, "kv_cache", 4, "[num_blocks, block_size, num_kv_heads, slot_bytes]") < 0 ||
        check_elem(c, kc, "kv_cache", VT_ELEM_BIT(VT_ELEM_U8), "uint8") < 0)
        return -1;
    const vt_dtype_info *t = vt_dtype_get(dtype);
    int64_t rope = D, slot = (int64_t)vt_dtype_slot_bytes(dtype, (size_t)D);
    char widths[160];
    if (t->rope_block > 0 && (rope = vt_dtype_rope_of_slot_width(dtype, (size_t)D, (size_t)kc->shape[3])) >= 0)
        slot = kc->shape[3];
    if (kc->shape[2] != H || kc->shape[3] != slot) {
        if (t->rope_block > 0) {
            slot_widths(dtype, D, widths, sizeof widths);
            PyErr_Format(PyExc_ValueError, "%s: kv_cache must have shape [num_blocks, block_size, %lld, slot_bytes] "
                         "with slot_bytes that of kv_cache_dtype '%s' at head_size %lld for rotary dims (rope_dim) "
                         "0, %d, .. %lld: one of %s; got [%lld, %lld, %lld, %lld]", c->fn, (long long)H, t->name,
                         (long long)D, t->rope_block, (long long)D, widths, (long long)kc->shape[0],
                         (long long)kc->shape[1], (long long)kc->shape[2], (long long)kc->shape[3]);
        } else
            PyErr_Format(PyExc_ValueError, "%s: kv_cache must have shape [num_blocks, block_size, %lld, %lld] "
                         "(num_kv_heads and slot_size_aligned of kv_cache_dtype '%s' at head_size %lld); got [%lld, "
                         "%lld, %lld, %lld]", c->fn, (long long)H, (long long)slot, t->name, (long long)D,
                         (long long)kc->shape[0], (long long)kc->shape[1], (long long)kc->shape[2],
                         (long long)kc->shape[3]);
        return -1;
    }
    if (!vt_tensor_last_dim_contiguous(kc)) {
        PyErr_Format(PyExc_ValueError, "%s: kv_cache must have contiguous slots (last dimension stride 1)", c->fn);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    out->num_blocks = kc->shape[0], out->block_size = kc->shape[1], out->num_kv_heads = H, out->head_size = D;
    out->rope_dim = t->rope_block > 0 ? rope : 0;
    out->data = kc->data;
    out->stride_block = kc->strides[0], out->stride_pos = kc->strides[1], out->stride_head = kc->strides[2];
    out->k_scale = out->v_scale = 1.0f; /* NVFP4's global scales on a slot cache: vLLM's default */
    return 0;
}

/* k_scale / v_scale (NULL or None: 1.0): a global-scale row's (NVFP4's) global scales; None for every other row. */
static int global_scales(tq_call *c, PyObject *ko, PyObject *vo, int dtype, vt_tq_cache *cache) {
    PyObject *obj[2] = {ko, vo};
    float *dst[2] = {&cache->k_scale, &cache->v_scale};
    static const char *const names[2] = {"k_scale", "v_scale"};
    const vt_dtype_info *t = vt_dtype_get(dtype);
    for (int i = 0; i < 2; i++) {
        if (!obj[i] || obj[i] == Py_None) continue;
        if (!t->global_scale) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be None for kv_cache_dtype '%s' (its scales are in each slot); "
                         "got %s", c->fn, names[i], t->name, Py_TYPE(obj[i])->tp_name);
            return -1;
        }
        if (vt_co_parse_scale(obj[i], c->fn, names[i], dst[i]) < 0) return -1;
    }
    return 0;
}

/* The codebook array (MSE presets): float32 [n] C-contiguous. */
static const float *codebook(tq_call *c, PyObject *obj, const char *arg, int dtype, int64_t n) {
    if (vt_dtype_get(dtype)->key_bits == 8) return NULL;
    vt_tensor *t = pin(c, obj, arg, 0);
    if (!t || check_elem(c, t, arg, VT_ELEM_BIT(VT_ELEM_F32), "float32") < 0 || check_contiguous(c, t, arg) < 0)
        return NULL;
    if (t->ndim != 1 || t->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have shape [%lld]; got %d dimensions", c->fn, arg, (long long)n,
                     t->ndim);
        return NULL;
    }
    return t->data;
}


static PyObject *py_tq_store(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&slot_store_sig, args, kw, a) < 0) return NULL;
    PyObject *ko = a[0], *vo = a[1], *co = a[2], *so = a[3], *dto = a[4], *mo = vt_arg_or_none(a[5]);
    tq_call c = {.fn = "turboquant_store", .st = vt_state(m)};
    int dtype;
    vt_tensor *k, *v, *kc, *sm;
    vt_tq_cache cache;
    if (want_dtype(&c, dto, &dtype) < 0 || !(k = pin(&c, ko, "key", 0)) || !(v = pin(&c, vo, "value", 0)) ||
        !(kc = pin(&c, co, "kv_cache", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT)) ||
        !(sm = pin(&c, so, "slot_mapping", 0)))
        goto fail;
    if (check_rank(&c, k, "key", 3, "[num_tokens, num_kv_heads, head_size]") < 0 ||
        check_elem(&c, k, "key", VT_ELEMS_FLOAT, "float32, float16 or bfloat16") < 0)
        goto fail;
    const int64_t N = k->shape[0], H = k->shape[1], D = k->shape[2];
    if (v->ndim != 3 || v->shape[0] != N || v->shape[1] != H || v->shape[2] != D) {
        PyErr_Format(PyExc_ValueError, "%s: value must have key's shape [%lld, %lld, %lld]", c.fn, (long long)N,
                     (long long)H, (long long)D);
        goto fail;
    }
    if (v->elem != k->elem) {
        PyErr_Format(PyExc_TypeError, "%s: value must have key's dtype %s; got %s", c.fn, k->dtype_name, v->dtype_name);
        goto fail;
    }
    if (!vt_tensor_last_dim_contiguous(k) || !vt_tensor_last_dim_contiguous(v)) {
        PyErr_Format(PyExc_ValueError, "%s: key and value must have a contiguous last dimension", c.fn);
        goto fail;
    }
    if (check_index(&c, sm, "slot_mapping", "[num_tokens]") < 0) goto fail;
    if (sm->shape[0] != N) {
        PyErr_Format(PyExc_ValueError, "%s: slot_mapping must have shape [%lld] (key's num_tokens); got [%lld]", c.fn,
                     (long long)N, (long long)sm->shape[0]);
        goto fail;
    }
    if (cache_of(&c, kc, dtype, H, D, &cache) < 0 ||
        global_scales(&c, a[6], a[7], dtype, &cache) < 0)
        goto fail;
    if (vt_tensor_self_overlaps(kc)) {
        PyErr_Format(PyExc_ValueError, "%s: kv_cache must not alias itself (a broadcast or overlapping view)", c.fn);
        goto fail;
    }
    const vt_tensor *ins[3] = {k, v, sm};
    static const char *const names[3] = {"key", "value", "slot_mapping"};
    for (int i = 0; i < 3; i++)
        if (vt_tensor_share_elements(kc, ins[i])) {
            PyErr_Format(PyExc_ValueError, "%s: kv_cache must not share memory with %s", c.fn, names[i]);
            goto fail;
        }
    if (vt_dtype_needs_codebook(dtype) &&
        !(cache.midpoints = codebook(&c, mo, "midpoints", dtype, (1 << vt_dtype_get(dtype)->key_bits) - 1)))
        goto fail;
    cache.centroids = cache.midpoints; /* unused by the store; the core asks for both */
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_tq_store(&cache, (int)k->elem, k->data, k->strides[0], k->strides[1], v->data, v->strides[0],
                    v->strides[1], sm->data, N, &err);
    Py_END_ALLOW_THREADS
    return finish(&c, s, &err);
fail:
    release(&c);
    return NULL;
}

static PyObject *py_tq_gather(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&slot_gather_sig, args, kw, a) < 0) return NULL;
    PyObject *co = a[0], *so = a[1], *dto = a[2], *cen = a[3], *ko = a[4], *vo = a[5];
    const int nth = vt_num_threads_arg(vt_arg_or_none(a[6]), "turboquant_gather");
    if (nth < 0) return NULL;
    tq_call c = {.fn = "turboquant_gather", .st = vt_state(m)};
    int dtype;
    vt_tensor *kc, *sl, *k, *v;
    vt_tq_cache cache;
    if (want_dtype(&c, dto, &dtype) < 0 || !(kc = pin(&c, co, "kv_cache", VT_TENSOR_NO_CONVERT)) ||
        !(sl = pin(&c, so, "slots", 0)) || !(k = pin(&c, ko, "k_out", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT)) ||
        !(v = pin(&c, vo, "v_out", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT)))
        goto fail;
    if (check_index(&c, sl, "slots", "[n]") < 0 || check_rank(&c, k, "k_out", 3, "[n, num_kv_heads, head_size]") < 0)
        goto fail;
    const int64_t n = sl->shape[0], H = k->shape[1], D = k->shape[2];
    for (int w = 0; w < 2; w++) {
        const vt_tensor *o = w ? v : k;
        const char *arg = w ? "v_out" : "k_out";
        if (check_elem(&c, o, arg, VT_ELEM_BIT(VT_ELEM_F32), "float32") < 0 || check_contiguous(&c, o, arg) < 0)
            goto fail;
        if (o->ndim != 3 || o->shape[0] != n || o->shape[1] != H || o->shape[2] != D) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape [%lld, %lld, %lld]", c.fn, arg, (long long)n,
                         (long long)H, (long long)D);
            goto fail;
        }
    }
    if (cache_of(&c, kc, dtype, H, D, &cache) < 0 ||
        global_scales(&c, a[7], a[8], dtype, &cache) < 0)
        goto fail;
    if (vt_dtype_needs_codebook(dtype) &&
        !(cache.centroids = codebook(&c, cen, "centroids", dtype, 1 << vt_dtype_get(dtype)->key_bits)))
        goto fail;
    cache.midpoints = cache.centroids; /* unused by the read */
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_tq_gather(&cache, sl->data, n, k->data, v->data, nth, &err);
    Py_END_ALLOW_THREADS
    return finish(&c, s, &err);
fail:
    release(&c);
    return NULL;
}

/* vLLM's two NVFP4 side views [num_blocks, block_size, H_kv, D / 2 + D / 16] uint8: the same shape and
 * strides, dense sides (HND or NHD strides), the two sides disjoint. */
static int nvfp4_pages_of(tq_call *c, const vt_tensor *kc, const vt_tensor *vc, vt_nvfp4_pages *out) {
    for (int w = 0; w < 2; w++) {
        const vt_tensor *t = w ? vc : kc;
        const char *arg = w ? "value_cache" : "key_cache";
        if (check_rank(c, t, arg, 4, "[num_blocks, block_size, num_kv_heads, head_size / 2 + head_size / 16]") < 0 ||
            check_elem(c, t, arg, VT_ELEM_BIT(VT_ELEM_U8), "uint8") < 0)
            return -1;
    }
    const int64_t nb = kc->shape[0], bs = kc->shape[1], H = kc->shape[2], full = kc->shape[3];
    if (full <= 0 || full % 9) {
        PyErr_Format(PyExc_ValueError, "%s: key_cache's last dimension must be D / 2 + D / 16 for a head size D that "
                     "is a multiple of 16; got %lld", c->fn, (long long)full);
        return -1;
    }
    const int64_t *st = kc->strides;
    const int hnd = st[1] == full && st[2] == bs * full;
    if (st[3] != 1 || !(hnd || (st[1] == H * full && st[2] == full))) {
        PyErr_Format(PyExc_ValueError, "%s: key_cache must be a dense NVFP4 side (HND strides (page, %lld, %lld, 1) or "
                     "NHD (page, %lld, %lld, 1)); got (%lld, %lld, %lld, %lld)", c->fn, (long long)full,
                     (long long)(bs * full), (long long)(H * full), (long long)full, (long long)st[0],
                     (long long)st[1], (long long)st[2], (long long)st[3]);
        return -1;
    }
    for (int i = 0; i < 4; i++)
        if (vc->shape[i] != kc->shape[i] || vc->strides[i] != kc->strides[i]) {
            PyErr_Format(PyExc_ValueError, "%s: value_cache must have key_cache's shape and strides (the two sides of "
                         "one NVFP4 cache); dimension %d differs", c->fn, i);
            return -1;
        }
    const int64_t side = H * bs * full, page = st[0];
    const int64_t dist = (int64_t)((const uint8_t *)vc->data - (const uint8_t *)kc->data);
    if (nb > 0) {
        int64_t d = nb > 1 && page > 0 ? ((dist % page) + page) % page : (dist < 0 ? -dist : dist);
        if ((nb > 1 && (page <= 0 || d < side || d > page - side)) || (nb <= 1 && d < side)) {
            PyErr_Format(PyExc_ValueError, "%s: key_cache and value_cache overlap (their %lld-byte sides must be "
                         "disjoint)", c->fn, (long long)side);
            return -1;
        }
    }
    memset(out, 0, sizeof *out);
    out->k = kc->data, out->v = vc->data, out->page_stride = page, out->num_blocks = nb, out->block_size = bs;
    out->num_kv_heads = H, out->head_size = full / 9 * 16, out->hnd = hnd;
    return 0;
}

static PyObject *py_nvfp4_store(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&nvfp4_store_sig, args, kw, a) < 0) return NULL;
    tq_call c = {.fn = "reshape_and_cache_flash", .st = vt_state(m)};
    float ks, vs;
    if (vt_co_parse_scale(a[5], c.fn, "k_scale", &ks) < 0 || vt_co_parse_scale(a[6], c.fn, "v_scale", &vs) < 0)
        return NULL;
    if (a[7] && !PyBool_Check(a[7])) {
        PyErr_Format(PyExc_TypeError, "%s: four_over_six must be a bool; got %s", c.fn, Py_TYPE(a[7])->tp_name);
        return NULL;
    }
    const int nth = vt_num_threads_arg(vt_arg_or_none(a[8]), c.fn);
    if (nth < 0) return NULL;
    vt_tensor *k, *v, *kc, *vc, *sm;
    vt_nvfp4_pages pages;
    const int flags = VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT;
    if (!(k = pin(&c, a[0], "key", 0)) || !(v = pin(&c, a[1], "value", 0)) ||
        !(kc = pin(&c, a[2], "key_cache", flags)) || !(vc = pin(&c, a[3], "value_cache", flags)) ||
        !(sm = pin(&c, a[4], "slot_mapping", 0)))
        goto fail;
    if (check_rank(&c, k, "key", 3, "[num_tokens, num_kv_heads, head_size]") < 0 ||
        check_elem(&c, k, "key", VT_ELEMS_FLOAT, "float32, float16 or bfloat16") < 0 ||
        nvfp4_pages_of(&c, kc, vc, &pages) < 0)
        goto fail;
    if (v->ndim != 3 || v->elem != k->elem || memcmp(v->shape, k->shape, 3 * sizeof k->shape[0]) ||
        !vt_tensor_last_dim_contiguous(k) || !vt_tensor_last_dim_contiguous(v)) {
        PyErr_Format(PyExc_ValueError, "%s: value must have key's shape and dtype, both with a contiguous last "
                     "dimension", c.fn);
        goto fail;
    }
    if (k->shape[1] != pages.num_kv_heads || k->shape[2] != pages.head_size) {
        PyErr_Format(PyExc_ValueError, "%s: key is [%lld, %lld, %lld], key_cache's pages hold %lld KV heads of head "
                     "size %lld", c.fn, (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                     (long long)pages.num_kv_heads, (long long)pages.head_size);
        goto fail;
    }
    if (check_index(&c, sm, "slot_mapping", "[n]") < 0) goto fail;
    if (sm->shape[0] > k->shape[0]) {
        PyErr_Format(PyExc_ValueError, "%s: slot_mapping must have at most num_tokens = %lld entries; got %lld", c.fn,
                     (long long)k->shape[0], (long long)sm->shape[0]);
        goto fail;
    }
    const vt_tensor *ins[3] = {k, v, sm};
    for (int i = 0; i < 3; i++)
        if (vt_tensor_share_elements(kc, ins[i]) || vt_tensor_share_elements(vc, ins[i])) {
            PyErr_Format(PyExc_ValueError, "%s: the caches must not share memory with the inputs", c.fn);
            goto fail;
        }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_nvfp4_store(&pages, (int)k->elem, k->data, k->strides[0], k->strides[1], v->data, v->strides[0],
                       v->strides[1], sm->data, sm->shape[0], ks, vs, a[7] == Py_True, nth, &err);
    Py_END_ALLOW_THREADS
    return finish(&c, s, &err);
fail:
    release(&c);
    return NULL;
}

static PyObject *py_nvfp4_read(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&nvfp4_read_sig, args, kw, a) < 0) return NULL;
    tq_call c = {.fn = "flash_attn_varlen_func", .st = vt_state(m)};
    float ks, vs;
    const int nth = vt_num_threads_arg(vt_arg_or_none(a[5]), c.fn);
    if (nth < 0 || vt_co_parse_scale(a[3], c.fn, "k_descale", &ks) < 0 ||
        vt_co_parse_scale(a[4], c.fn, "v_descale", &vs) < 0)
        return NULL;
    vt_tensor *kc, *vc, *bl;
    vt_nvfp4_pages pages;
    if (!(kc = pin(&c, a[0], "k", VT_TENSOR_NO_CONVERT)) || !(vc = pin(&c, a[1], "v", VT_TENSOR_NO_CONVERT)) ||
        !(bl = pin(&c, a[2], "blocks", 0)) || nvfp4_pages_of(&c, kc, vc, &pages) < 0)
        goto fail;
    if (check_index(&c, bl, "blocks", "[n]") < 0) goto fail;
    npy_intp dims[4] = {(npy_intp)bl->shape[0], (npy_intp)pages.block_size, (npy_intp)pages.num_kv_heads,
                        (npy_intp)pages.head_size};
    PyArrayObject *ko = (PyArrayObject *)PyArray_SimpleNew(4, dims, NPY_FLOAT32);
    PyArrayObject *vo = ko ? (PyArrayObject *)PyArray_SimpleNew(4, dims, NPY_FLOAT32) : NULL;
    if (!vo) {
        Py_XDECREF(ko);
        goto fail;
    }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_nvfp4_read_pages(&pages, bl->data, bl->shape[0], ks, vs, PyArray_DATA(ko), PyArray_DATA(vo), nth, &err);
    Py_END_ALLOW_THREADS
    release(&c);
    return vt_pair_result(c.st, s, &err, ko, vo);
fail:
    release(&c);
    return NULL;
}

static PyObject *py_tq_codebook(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&codebook_sig, args, kw, a) < 0) return NULL;
    tq_call c = {.fn = "turboquant_codebook", .st = vt_state(m)};
    int dtype;
    int64_t d;
    if (want_dtype(&c, a[0], &dtype) < 0 || vt_int_arg(a[1], c.fn, "head_size", INT64_MIN, INT64_MAX, &d) < 0)
        return NULL;
    if (!vt_dtype_needs_codebook(dtype)) Py_RETURN_NONE;
    npy_intp n = (npy_intp)1 << vt_dtype_get(dtype)->key_bits, n1 = n - 1;
    PyArrayObject *cen = (PyArrayObject *)PyArray_SimpleNew(1, &n, NPY_FLOAT32);
    PyArrayObject *mid = cen ? (PyArrayObject *)PyArray_SimpleNew(1, &n1, NPY_FLOAT32) : NULL;
    if (!mid) {
        Py_XDECREF(cen);
        return NULL;
    }
    vt_error err;
    const vt_status s = vt_tq_codebook(dtype, d, PyArray_DATA(cen), PyArray_DATA(mid), &err);
    return vt_pair_result(c.st, s, &err, cen, mid);
}

static char store_doc[512], gather_doc[512], nvfp4_store_doc[512], nvfp4_read_doc[512], codebook_doc[512];

static PyMethodDef tq_functions[] = {
    {"turboquant_store", (PyCFunction)(void (*)(void))py_tq_store, METH_VARARGS | METH_KEYWORDS, store_doc},
    {"turboquant_gather", (PyCFunction)(void (*)(void))py_tq_gather, METH_VARARGS | METH_KEYWORDS, gather_doc},
    {"nvfp4_store", (PyCFunction)(void (*)(void))py_nvfp4_store, METH_VARARGS | METH_KEYWORDS, nvfp4_store_doc},
    {"nvfp4_read_pages", (PyCFunction)(void (*)(void))py_nvfp4_read, METH_VARARGS | METH_KEYWORDS, nvfp4_read_doc},
    {"turboquant_codebook", (PyCFunction)(void (*)(void))py_tq_codebook, METH_VARARGS | METH_KEYWORDS, codebook_doc},
    {NULL, NULL, 0, NULL},
};

int vt_tq_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&slot_store_sig, "vLLM's slot-format store (see vtinfer.turboquant_store).", store_doc,
                     sizeof store_doc);
    vt_signature_doc(&slot_gather_sig, "The dequantized read of slot-format slots (see vtinfer.turboquant_gather).",
                     gather_doc, sizeof gather_doc);
    vt_signature_doc(&nvfp4_store_sig, "Store into vLLM's NVFP4 pages (see vtinfer.reshape_and_cache_flash).",
                     nvfp4_store_doc, sizeof nvfp4_store_doc);
    vt_signature_doc(&nvfp4_read_sig, "K and V of whole NVFP4 pages, dequantized to float32 [n, block_size, H_kv, D].",
                     nvfp4_read_doc, sizeof nvfp4_read_doc);
    vt_signature_doc(&codebook_sig, "The Lloyd-Max (centroids, midpoints) an MSE preset's keys index (vLLM's "
                     "solve for N(0, 1 / head_size)); None for a slot format without a codebook.", codebook_doc,
                     sizeof codebook_doc);
    return PyModule_AddFunctions(m, tq_functions);
}
