/* vtinfer._C's slot-format functions (TurboQuant, UltraQuant; csrc/core/kv_slots.c):
 *
 *   _C.turboquant_store(key, value, kv_cache, slot_mapping, kv_cache_dtype, midpoints) -> None
 *   _C.turboquant_gather(kv_cache, slots, kv_cache_dtype, centroids, k_out, v_out, num_threads=None) -> None
 *
 * The codebook arrays come from vtinfer/_turboquant.py (the public wrappers). Every argument is
 * checked here and again in the core before a byte is written. */
#include "vt_binding.h"
#include "vt_store_args.h"
#include "vt_signature.h"
#include "vtinfer/turboquant.h"

#include <stdio.h>
#include <string.h>

VT_SIGNATURE(slot_store_sig, "turboquant_store", VT_SLOT_STORE_NPOS, VT_SLOT_STORE_ARGS);
VT_SIGNATURE(slot_gather_sig, "turboquant_gather", VT_SLOT_GATHER_NPOS, VT_SLOT_GATHER_ARGS);

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

/* The slot cache [num_blocks, block_size, H_kv, slot_bytes(D)] uint8 with contiguous slots. */
static int status_ok(tq_call *c, vt_status s, const vt_error *err) {
    if (s == VT_OK) return 0;
    vt_raise(c->st, err);
    return -1;
}

static int cache_of(tq_call *c, const vt_tensor *kc, int dtype, int64_t H, int64_t D, vt_tq_cache *out) {
    vt_error err; /* the format's own head-size rule first: the slot size follows from it */
    if (status_ok(c, vt_dtype_check_head_size(dtype, D, c->fn, "head_size", NULL, &err), &err) < 0) return -1;
    const int64_t slot = (int64_t)vt_dtype_slot_bytes(dtype, (size_t)D);
    if (check_rank(c, kc, "kv_cache", 4, "[num_blocks, block_size, num_kv_heads, slot_bytes]") < 0 ||
        check_elem(c, kc, "kv_cache", VT_ELEM_BIT(VT_ELEM_U8), "uint8") < 0)
        return -1;
    if (kc->shape[2] != H || kc->shape[3] != slot) {
        PyErr_Format(PyExc_ValueError, "%s: kv_cache must have shape [num_blocks, block_size, %lld, %lld] (num_kv_heads "
                     "and slot_size_aligned of kv_cache_dtype '%s' at head_size %lld); got [%lld, %lld, %lld, %lld]",
                     c->fn, (long long)H, (long long)slot, vt_dtype_get(dtype)->name, (long long)D,
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
    out->data = kc->data;
    out->stride_block = kc->strides[0], out->stride_pos = kc->strides[1], out->stride_head = kc->strides[2];
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
    tq_call c;
    memset(&c, 0, sizeof c);
    c.fn = "turboquant_store";
    c.st = vt_state(m);
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
    if (check_rank(&c, sm, "slot_mapping", 1, "[num_tokens]") < 0 ||
        check_elem(&c, sm, "slot_mapping", VT_ELEM_BIT(VT_ELEM_I64), "int64") < 0 ||
        check_contiguous(&c, sm, "slot_mapping") < 0)
        goto fail;
    if (sm->shape[0] != N) {
        PyErr_Format(PyExc_ValueError, "%s: slot_mapping must have shape [%lld] (key's num_tokens); got [%lld]", c.fn,
                     (long long)N, (long long)sm->shape[0]);
        goto fail;
    }
    if (cache_of(&c, kc, dtype, H, D, &cache) < 0) goto fail;
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
    if (status_ok(&c, s, &err) < 0) goto fail;
    release(&c);
    Py_RETURN_NONE;
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
    tq_call c;
    memset(&c, 0, sizeof c);
    c.fn = "turboquant_gather";
    c.st = vt_state(m);
    int dtype;
    vt_tensor *kc, *sl, *k, *v;
    vt_tq_cache cache;
    if (want_dtype(&c, dto, &dtype) < 0 || !(kc = pin(&c, co, "kv_cache", VT_TENSOR_NO_CONVERT)) ||
        !(sl = pin(&c, so, "slots", 0)) || !(k = pin(&c, ko, "k_out", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT)) ||
        !(v = pin(&c, vo, "v_out", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT)))
        goto fail;
    if (check_rank(&c, sl, "slots", 1, "[n]") < 0 || check_elem(&c, sl, "slots", VT_ELEM_BIT(VT_ELEM_I64), "int64") < 0 ||
        check_contiguous(&c, sl, "slots") < 0 || check_rank(&c, k, "k_out", 3, "[n, num_kv_heads, head_size]") < 0)
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
    if (cache_of(&c, kc, dtype, H, D, &cache) < 0) goto fail;
    if (vt_dtype_needs_codebook(dtype) &&
        !(cache.centroids = codebook(&c, cen, "centroids", dtype, 1 << vt_dtype_get(dtype)->key_bits)))
        goto fail;
    cache.midpoints = cache.centroids; /* unused by the read */
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_tq_gather(&cache, sl->data, n, k->data, v->data, nth, &err);
    Py_END_ALLOW_THREADS
    if (status_ok(&c, s, &err) < 0) goto fail;
    release(&c);
    Py_RETURN_NONE;
fail:
    release(&c);
    return NULL;
}

static char store_doc[512], gather_doc[512];

static PyMethodDef tq_functions[] = {
    {"turboquant_store", (PyCFunction)(void (*)(void))py_tq_store, METH_VARARGS | METH_KEYWORDS, store_doc},
    {"turboquant_gather", (PyCFunction)(void (*)(void))py_tq_gather, METH_VARARGS | METH_KEYWORDS, gather_doc},
    {NULL, NULL, 0, NULL},
};

int vt_tq_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&slot_store_sig, "vLLM's slot-format store (see vtinfer.turboquant_store).", store_doc,
                     sizeof store_doc);
    vt_signature_doc(&slot_gather_sig, "The dequantized read of slot-format slots (see vtinfer.turboquant_gather).",
                     gather_doc, sizeof gather_doc);
    return PyModule_AddFunctions(m, tq_functions);
}
