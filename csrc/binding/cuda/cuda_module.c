/* vtinfer._cuda: the CUDA arm's Python glue (a separate extension, built
 * only when nvcc is found or VTINFER_CUDA=1; links the CUDA runtime).
 *
 *   _cuda.device_count() -> int          0 on a machine without a device (never raises)
 *   _cuda.device_status() -> str         the runtime's answer, e.g. "cudaErrorNoDevice: ..."
 *   _cuda.runtime_version() -> int
 *   _cuda.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
 *                                 kv_cache_dtype, k_scale, v_scale, *, layout=None,
 *                                 num_threads=None) -> None   (_C's signature; num_threads unused)
 *   _cuda.flash_attn_varlen_func(q, k, v, cu_seqlens_q, seqused_k, block_table, out, lse,
 *                                max_seqlen_q, max_seqlen_k, softmax_scale, causal,
 *                                window_left, window_right, softcap, alibi_slopes, s_aux,
 *                                k_descale, v_descale, kv_cache_dtype, validate) -> None
 *   _cuda.CudaError                      (VtinferError, RuntimeError): the CUDA runtime failed
 *
 * Arrays are DLPack CUDA tensors (torch CUDA tensors), all on one device;
 * scales may also be Python floats. Tensors come in through the importer
 * vtinfer._C uses (common/tensor_dlpack.c); the store's arguments go
 * through the same argument layer as the CPU's (common/store_args.c),
 * with the CUDA device check; the index and scale values are judged on
 * host copies by the core's own checks (vt_kv_store_check,
 * vt_attn_scratch_size): the same exceptions and messages as the CPU
 * path. No NumPy, no torch. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vt_cuda.h"
#include "vt_signature.h"
#include "vt_status_map.h"
#include "vt_store_args.h"
#include "vtinfer/vtinfer.h"

typedef struct cu_state {
    PyObject *CudaError;
    PyObject *VtinferError;
} cu_state;

static cu_state *cu_get_state(PyObject *m) { return (cu_state *)PyModule_GetState(m); }

static PyObject *cu_raise(PyObject *m, int status, const vt_error *err) {
    PyObject *type = status == VT_CUDA_ERR_RUNTIME ? cu_get_state(m)->CudaError
                                                   : vt_status_exception(status, cu_get_state(m)->VtinferError, NULL);
    PyErr_SetString(type, err->message[0] ? err->message : "vtinfer._cuda: unknown error");
    return NULL;
}

/* ---- CUDA tensors: the shared importer with the CUDA device check ---- */

/* The arm's front door for the shared argument layer: DLPack only. */
static int cu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    (void)ctx;
    memset(t, 0, sizeof *t);
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a CUDA tensor (an object with __dlpack__); got %s", fn, arg,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return vt_tensor_from_dlpack(obj, fn, arg, flags, t);
}

/* Pin obj as a CUDA tensor of `ndim` dimensions (any dtype: the caller checks). */
static int cu_tensor_from(PyObject *obj, const char *fn, const char *arg, int ndim, vt_tensor *t) {
    const unsigned any = 0xffffffffu;
    if (cu_pin(NULL, obj, fn, arg, 0, t) < 0) return -1;
    if (vt_tensor_check(t, fn, arg, any, ndim, VT_MEMORY_CUDA) < 0) {
        vt_tensor_release(t);
        return -1;
    }
    return 0;
}

static int cu_dtype_err(const char *fn, const char *arg, const char *want, const vt_tensor *t) {
    PyErr_Format(PyExc_TypeError, "%s: %s must be %s; got %s", fn, arg, want, t->dtype_name);
    return -1;
}

/* A small index/scale array (1-D or 2-D, contiguous) copied to host memory (malloc'd). */
static int cu_copy_host(PyObject *m, const vt_tensor *t, const char *fn, const char *arg, void **out) {
    if (!vt_tensor_is_contiguous(t)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be contiguous", fn, arg);
        return -1;
    }
    size_t n = (size_t)vt_tensor_count(t) * t->itemsize;
    *out = malloc(n ? n : 1);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_to_host(*out, t->data, n, fn, &err);
    if (st != VT_OK) {
        free(*out);
        *out = NULL;
        cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

/* ---- module functions ---- */

static PyObject *py_device_count(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    int n = 0;
    char msg[256];
    (void)vt_cuda_device_count(&n, msg, sizeof msg);
    return PyLong_FromLong(n);
}

static PyObject *py_device_status(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    int n = 0;
    char msg[256];
    (void)vt_cuda_device_count(&n, msg, sizeof msg);
    return PyUnicode_FromString(msg);
}

static PyObject *py_runtime_version(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    return Py_BuildValue("(ii)", vt_cuda_runtime_version(), vt_cuda_driver_version());
}

/* A scale argument: a Python float (host) or a CUDA float32 tensor of 1 or
 * n elements. host[] receives its values (for the checks); *dev is the
 * tensor's data or NULL for a float. */
typedef struct cu_scale {
    vt_tensor t;
    int is_tensor;
    int count;
    float *host;
    float value;
} cu_scale;

static void scale_release(cu_scale *s) {
    if (s->is_tensor) vt_tensor_release(&s->t);
    if (s->host != &s->value) free(s->host);
    s->host = NULL;
}

static int scale_arg(PyObject *m, PyObject *obj, const char *fn, const char *arg, cu_scale *s) {
    memset(s, 0, sizeof *s);
    if (PyFloat_Check(obj) || PyLong_Check(obj)) {
        s->value = (float)PyFloat_AsDouble(obj);
        if (PyErr_Occurred()) return -1;
        s->host = &s->value;
        s->count = 1;
        return 0;
    }
    if (cu_tensor_from(obj, fn, arg, -1, &s->t) < 0) return -1;
    s->is_tensor = 1;
    if (s->t.elem != VT_ELEM_F32) {
        cu_dtype_err(fn, arg, "float32", &s->t);
        goto fail;
    }
    s->count = (int)vt_tensor_count(&s->t);
    void *h = NULL;
    if (cu_copy_host(m, &s->t, fn, arg, &h) < 0) goto fail;
    s->host = h;
    return 0;
fail:
    scale_release(s);
    return -1;
}

/* Device copies of the host-valued scales (NULL when all are tensors). */
static int upload_floats(PyObject *m, const float *vals, int n, float **dev, const char *fn) {
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_malloc((void **)dev, (size_t)n * sizeof(float), fn, &err);
    if (st == VT_OK) st = vt_cuda_to_device(*dev, vals, (size_t)n * sizeof(float), fn, &err);
    if (st != VT_OK) {
        vt_cuda_free(*dev, fn, NULL);
        *dev = NULL;
        cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

static int same_device(const vt_tensor *a, const vt_tensor *b, const char *fn, const char *arg) {
    if (a->device_id == b->device_id) return 0;
    PyErr_Format(PyExc_ValueError, "%s: %s must be on cuda:%d like the first tensor; got cuda:%d", fn, arg, a->device_id,
                 b->device_id);
    return -1;
}

/* A store scale: a Python number or a CUDA float32 tensor, as host values. */
static int store_scale(PyObject *m, PyObject *obj, const char *fn, const char *arg, cu_scale *s) {
    if (scale_arg(m, obj, fn, arg, s) < 0) return -1;
    if (s->is_tensor && s->t.ndim > 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have 1 or num_kv_heads elements in at most 1 dimension; got %d "
                     "dimensions", fn, arg, s->t.ndim);
        return -1;
    }
    return 0;
}

/* Host copy of slot_mapping; the core's checks on host values; then the
 * arm's duplicate policy. *cleared: tokens whose slot a later one names. */
static int store_host_checks(PyObject *m, vt_store_call *c, int64_t **slots, int64_t *cleared) {
    void *hs = NULL;
    if (cu_copy_host(m, &c->slots, c->fn, "slot_mapping", &hs) < 0) return -1;
    *slots = hs;
    vt_kv_store_params hp = c->p;
    hp.slot_mapping = *slots;
    vt_error err;
    vt_error_clear(&err);
    int st = vt_kv_store_check(&hp, &err); /* host copies: the CPU's checks and messages */
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        return -1;
    }
    if ((*cleared = vt_cuda_clear_repeated_slots(*slots, hp.num_tokens)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Device copies of the (host) scales and, when duplicates were cleared,
 * of the slots; the launch; the frees. */
static int store_launch(PyObject *m, vt_store_call *c, const int64_t *slots, int64_t cleared) {
    const char *fn = c->fn;
    vt_kv_store_params p = c->p;
    float *dev_scales = NULL;
    int64_t *dev_slots = NULL;
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_set_device(c->key.device_id, fn, &err);
    if (st != VT_OK) st = VT_CUDA_ERR_RUNTIME;
    const size_t nsc = p.scale_per_head ? (size_t)p.num_kv_heads : 1;
    if (st == VT_OK && c->scales) {
        st = vt_cuda_malloc((void **)&dev_scales, 2 * nsc * sizeof(float), fn, &err);
        if (st == VT_OK) st = vt_cuda_to_device(dev_scales, c->scales, 2 * nsc * sizeof(float), fn, &err);
        p.k_scale = dev_scales;
        p.v_scale = dev_scales + nsc;
    }
    if (st == VT_OK && cleared > 0) {
        st = vt_cuda_malloc((void **)&dev_slots, (size_t)p.num_tokens * 8, fn, &err);
        if (st == VT_OK) st = vt_cuda_to_device(dev_slots, slots, (size_t)p.num_tokens * 8, fn, &err);
        p.slot_mapping = dev_slots;
    }
    if (st == VT_OK) {
        Py_BEGIN_ALLOW_THREADS
        st = vt_cuda_kv_store(&p, NULL, &err);
        if (st == VT_OK && (dev_scales || dev_slots)) st = vt_cuda_synchronize(fn, &err); /* before the frees */
        Py_END_ALLOW_THREADS
    }
    vt_cuda_free(dev_scales, fn, NULL);
    vt_cuda_free(dev_slots, fn, NULL);
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        return -1;
    }
    return 0;
}

static PyObject *py_store(PyObject *m, PyObject *args, PyObject *kw) {
    vt_store_pyargs a;
    vt_store_call c;
    memset(&c, 0, sizeof c);
    c.fn = "reshape_and_cache_flash";
    c.mem = VT_MEMORY_CUDA;
    if (vt_store_pyargs_parse(args, kw, 0, &a) < 0 ||
        vt_parse_dtype_name(a.kv_cache_dtype, c.fn, "kv_cache_dtype", &c.kv_flag) < 0 ||
        vt_parse_layout(a.layout, c.fn, &c.hnd) < 0)
        return NULL;
    cu_scale ks = {0}, vs = {0};
    int64_t *slots = NULL, cleared = 0;
    PyObject *ret = NULL;
    if (vt_store_pin_inputs(&c, cu_pin, NULL, a.key, a.value, a.slot_mapping, -1, -1) < 0 ||
        vt_store_pin_caches(&c, cu_pin, NULL, a.key_cache, a.value_cache) < 0 ||
        vt_store_pin_scale_caches(&c, cu_pin, NULL, a.k_scale_cache, a.v_scale_cache) < 0 ||
        same_device(&c.key, &c.value, c.fn, "value") || same_device(&c.key, &c.key_cache, c.fn, "key_cache") ||
        same_device(&c.key, &c.value_cache, c.fn, "value_cache") ||
        same_device(&c.key, &c.slots, c.fn, "slot_mapping") || vt_store_check(&c) < 0)
        goto done;
    if (vt_dtype_per_token_head(c.p.cache_dtype)) { /* the CUDA store has no per-token-head kernel yet */
        PyErr_Format(PyExc_NotImplementedError, "%s: kv_cache_dtype '%s' is not built for CUDA tensors", c.fn,
                     vt_dtype_get(c.p.cache_dtype)->name);
        goto done;
    }
    if (vt_dtype_get(c.p.cache_dtype)->is_fp8 &&
        (store_scale(m, a.k_scale, c.fn, "k_scale", &ks) < 0 || store_scale(m, a.v_scale, c.fn, "v_scale", &vs) < 0 ||
         vt_store_set_scales(&c, ks.host, ks.count, vs.host, vs.count) < 0))
        goto done;
    if (store_host_checks(m, &c, &slots, &cleared) < 0 || store_launch(m, &c, slots, cleared) < 0) goto done;
    ret = Py_NewRef(Py_None);
done:
    free(slots);
    scale_release(&ks);
    scale_release(&vs);
    vt_store_release(&c);
    return ret;
}

/* Optional small float array (alibi_slopes, s_aux): None, or a CUDA float32 tensor of n elements. */
static int opt_floats(PyObject *m, PyObject *obj, const char *fn, const char *arg, int n, vt_tensor *t, void **host) {
    *host = NULL;
    memset(t, 0, sizeof *t);
    if (obj == Py_None) return 0;
    if (cu_tensor_from(obj, fn, arg, 1, t) < 0) return -1;
    if (t->elem != VT_ELEM_F32) return cu_dtype_err(fn, arg, "float32", t);
    if (t->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have shape (%d,); got (%lld,)", fn, arg, n, (long long)t->shape[0]);
        return -1;
    }
    return cu_copy_host(m, t, fn, arg, host);
}

/* A descale: None, a float, or a CUDA float32 tensor of shape (), (1,), (H_kv,) or (B, H_kv). */
static int descale_arg(PyObject *m, PyObject *obj, const char *fn, const char *arg, int B, int hkv, cu_scale *s,
                       int64_t *sb, int64_t *sh) {
    memset(s, 0, sizeof *s);
    *sb = *sh = 0;
    if (obj == Py_None) return 0;
    if (scale_arg(m, obj, fn, arg, s) < 0) return -1;
    if (s->count == 1) return 0;
    if (s->t.ndim == 1 && s->count == hkv) {
        *sh = 1;
        return 0;
    }
    if (s->t.ndim == 2 && s->t.shape[0] == B && s->t.shape[1] == hkv) {
        *sb = hkv;
        *sh = 1;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: %s must have shape (), (%d,) or (%d, %d); got %d elements", fn, arg, hkv, B, hkv,
                 s->count);
    return -1;
}

static PyObject *py_attn(PyObject *m, PyObject *args) {
    static const char *fn = "flash_attn_varlen_func";
    PyObject *qo, *ko, *vo, *cuo, *sko, *bto, *outo, *lseo, *alo, *sao, *kdo, *vdo;
    long long max_q, max_k;
    float scale, softcap;
    int causal, wl, wr, validate;
    const char *dtype_name;
    if (!PyArg_ParseTuple(args, "OOOOOOOOLLfpiifOOOOsp:flash_attn_varlen_func", &qo, &ko, &vo, &cuo, &sko, &bto,
                          &outo, &lseo, &max_q, &max_k, &scale, &causal, &wl, &wr, &softcap, &alo, &sao, &kdo, &vdo,
                          &dtype_name, &validate))
        return NULL;
    vt_tensor q = {0}, k = {0}, v = {0}, cu = {0}, sk = {0}, bt = {0}, out = {0}, lse = {0}, al = {0}, sa = {0};
    cu_scale kd = {0}, vd = {0};
    void *h_cu = NULL, *h_sk = NULL, *h_bt = NULL, *h_al = NULL, *h_sa = NULL, *ws = NULL;
    float *dev_desc = NULL;
    PyObject *ret = NULL;
    vt_error err;
    vt_error_clear(&err);
    int st;
    if (cu_tensor_from(qo, fn, "q", 3, &q) < 0 || cu_tensor_from(ko, fn, "k", 4, &k) < 0 ||
        cu_tensor_from(vo, fn, "v", 4, &v) < 0 || cu_tensor_from(cuo, fn, "cu_seqlens_q", 1, &cu) < 0 ||
        cu_tensor_from(sko, fn, "seqused_k", 1, &sk) < 0 || cu_tensor_from(bto, fn, "block_table", 2, &bt) < 0 ||
        cu_tensor_from(outo, fn, "out", 3, &out) < 0)
        goto done;
    if (lseo != Py_None && cu_tensor_from(lseo, fn, "lse", 2, &lse) < 0) goto done;
    if (same_device(&q, &k, fn, "k") || same_device(&q, &v, fn, "v") || same_device(&q, &cu, fn, "cu_seqlens_q") ||
        same_device(&q, &sk, fn, "seqused_k") || same_device(&q, &bt, fn, "block_table") ||
        same_device(&q, &out, fn, "out") || (lse.owner && same_device(&q, &lse, fn, "lse")))
        goto done;
    /* the CPU path's rule (attention_binding.c): out may share no element with q, k or v */
    if (vt_refuse_self_alias(fn, &out, "out") < 0 || vt_refuse_shared(fn, &q, "q", &out, "out") < 0 || vt_refuse_shared(fn, &k, "k", &out, "out") < 0 ||
        vt_refuse_shared(fn, &v, "v", &out, "out") < 0)
        goto done;
    const int H = (int)q.shape[1], D = (int)q.shape[2], Hkv = (int)k.shape[2];
    const int B = (int)sk.shape[0];
    if (q.elem != VT_ELEM_F32 && q.elem != VT_ELEM_F16 && q.elem != VT_ELEM_BF16) {
        cu_dtype_err(fn, "q", "float32, float16 or bfloat16", &q);
        goto done;
    }
    if (out.elem != q.elem) {
        cu_dtype_err(fn, "out", vt_elem_name(q.elem), &out);
        goto done;
    }
    if (cu.elem != VT_ELEM_I32 || sk.elem != VT_ELEM_I32 || bt.elem != VT_ELEM_I32) {
        const vt_tensor *bad = cu.elem != VT_ELEM_I32 ? &cu : sk.elem != VT_ELEM_I32 ? &sk : &bt;
        cu_dtype_err(fn, cu.elem != VT_ELEM_I32 ? "cu_seqlens_q" : sk.elem != VT_ELEM_I32 ? "seqused_k" : "block_table", "int32",
                     bad);
        goto done;
    }
    if (lse.owner && (lse.elem != VT_ELEM_F32 || lse.shape[0] != H || lse.shape[1] != q.shape[0])) {
        PyErr_Format(PyExc_ValueError, "%s: lse must be float32 of shape (%d, %lld)", fn, H, (long long)q.shape[0]);
        goto done;
    }
    for (int i = 0; i < 4; i++)
        if (v.shape[i] != k.shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: v must have k's shape; got a difference in dimension %d", fn, i);
            goto done;
        }
    if (k.shape[3] != D || out.shape[0] != q.shape[0] || out.shape[1] != H || out.shape[2] != D ||
        cu.shape[0] != B + 1 || bt.shape[0] != B) {
        PyErr_Format(PyExc_ValueError, "%s: q, k, out, cu_seqlens_q, seqused_k and block_table must have matching "
                     "shapes (head_size %d, batch %d)", fn, D, B);
        goto done;
    }
    int kv_dt;
    if (vt_dtype_from_name(dtype_name, "kv_cache_dtype", &kv_dt, &err) != VT_OK) {
        cu_raise(m, err.status, &err);
        goto done;
    }
    if (k.elem == VT_ELEM_E4M3 || k.elem == VT_ELEM_E5M2) {
        if (kv_dt != VT_DTYPE_AUTO && kv_dt != (int)k.elem) {
            cu_dtype_err(fn, "k", vt_elem_name((vt_elem)kv_dt), &k);
            goto done;
        }
        kv_dt = (int)k.elem;
    } else if (k.elem == VT_ELEM_U8) {
        if (kv_dt != VT_DTYPE_FP8_E4M3 && kv_dt != VT_DTYPE_FP8_E5M2) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must name the fp8 format of a uint8 cache; got '%.32s'",
                         fn, dtype_name);
            goto done;
        }
    } else if (k.elem == VT_ELEM_F32 || k.elem == VT_ELEM_F16 || k.elem == VT_ELEM_BF16) {
        kv_dt = (int)k.elem;
    } else {
        cu_dtype_err(fn, "k", "a KV-cache dtype", &k);
        goto done;
    }
    if (v.elem != k.elem) {
        cu_dtype_err(fn, "v", vt_elem_name(k.elem), &v);
        goto done;
    }
    if (!vt_tensor_last_dim_contiguous(&q) || !vt_tensor_last_dim_contiguous(&k) ||
        !vt_tensor_last_dim_contiguous(&v) || !vt_tensor_last_dim_contiguous(&out) ||
        !vt_tensor_last_dim_contiguous(&bt)) {
        PyErr_Format(PyExc_ValueError, "%s: q, k, v, out and block_table must have a contiguous last dimension", fn);
        goto done;
    }
    if (opt_floats(m, alo, fn, "alibi_slopes", H, &al, &h_al) < 0 || opt_floats(m, sao, fn, "s_aux", H, &sa, &h_sa) < 0)
        goto done;
    vt_attn_params p;
    memset(&p, 0, sizeof p);
    if (descale_arg(m, kdo, fn, "k_descale", B, Hkv, &kd, &p.k_descale_stride_b, &p.k_descale_stride_h) < 0 ||
        descale_arg(m, vdo, fn, "v_descale", B, Hkv, &vd, &p.v_descale_stride_b, &p.v_descale_stride_h) < 0)
        goto done;
    /* Host copies of the index arrays (validate), or at least nothing to check. */
    if (validate && (cu_copy_host(m, &cu, fn, "cu_seqlens_q", &h_cu) < 0 ||
                     cu_copy_host(m, &sk, fn, "seqused_k", &h_sk) < 0))
        goto done;
    if (validate && bt.strides[0] % 4 == 0) {
        /* the table as the core reads it: rows of bt_stride elements */
        size_t n = (size_t)(B > 0 ? (B - 1) * (bt.strides[0] / 4) + bt.shape[1] : 0);
        h_bt = malloc(n ? n * 4 : 4);
        if (!h_bt) {
            PyErr_NoMemory();
            goto done;
        }
        if ((st = vt_cuda_to_host(h_bt, bt.data, n * 4, fn, &err)) != VT_OK) {
            cu_raise(m, st, &err);
            goto done;
        }
    }
    p.q = q.data;
    p.q_dtype = (vt_dtype)q.elem;
    p.total_q = q.shape[0];
    p.q_stride_tok = q.strides[0];
    p.q_stride_head = q.strides[1];
    p.k = k.data;
    p.v = v.data;
    p.kv_dtype = (vt_dtype)kv_dt;
    p.num_blocks = k.shape[0];
    p.block_size = k.shape[1];
    p.k_stride_block = k.strides[0];
    p.k_stride_tok = k.strides[1];
    p.k_stride_head = k.strides[2];
    p.v_stride_block = v.strides[0];
    p.v_stride_tok = v.strides[1];
    p.v_stride_head = v.strides[2];
    p.num_heads = H;
    p.num_kv_heads = Hkv;
    p.head_size = D;
    p.batch = B;
    p.max_blocks = bt.shape[1];
    p.bt_stride = bt.strides[0] / 4;
    p.softmax_scale = scale;
    p.causal = causal;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = softcap;
    p.out = out.data;
    p.out_stride_tok = out.strides[0];
    p.out_stride_head = out.strides[1];
    p.lse = lse.owner ? (float *)lse.data : NULL;
    p.lse_stride_head = lse.owner ? lse.strides[0] / 4 : 0;
    p.lse_stride_tok = lse.owner ? lse.strides[1] / 4 : 0;
    if (validate) {
        vt_attn_params hp = p; /* host copies for the core's checks */
        hp.cu_seqlens_q = h_cu;
        hp.seqused_k = h_sk;
        hp.block_table = h_bt;
        hp.alibi_slopes = h_al;
        hp.s_aux = h_sa;
        hp.k_descale = kd.host;
        hp.v_descale = vd.host;
        size_t dummy;
        if ((st = vt_attn_scratch_size(&hp, 1, &dummy, &err)) != VT_OK) {
            cu_raise(m, st, &err);
            goto done;
        }
        for (int b = 0; b < B; b++) {
            const int32_t *c = h_cu, *s = h_sk;
            if (c[b + 1] - c[b] > max_q || s[b] > max_k) {
                PyErr_Format(PyExc_ValueError, "%s: max_seqlen_q and max_seqlen_k must be at least the real maxima; got "
                             "%lld and %lld, sequence %d has %d queries and %d keys", fn, max_q, max_k, b,
                             c[b + 1] - c[b], s[b]);
                goto done;
            }
        }
    }
    if (vt_cuda_set_device(q.device_id, fn, &err) != VT_OK) {
        cu_raise(m, VT_CUDA_ERR_RUNTIME, &err);
        goto done;
    }
    float hd[2] = {kd.host ? kd.host[0] : 1.0f, vd.host ? vd.host[0] : 1.0f};
    if ((kd.host && !kd.is_tensor) || (vd.host && !vd.is_tensor))
        if (upload_floats(m, hd, 2, &dev_desc, fn) < 0) goto done;
    p.cu_seqlens_q = (const int32_t *)cu.data;
    p.seqused_k = (const int32_t *)sk.data;
    p.block_table = (const int32_t *)bt.data;
    p.alibi_slopes = al.owner ? (const float *)al.data : NULL;
    p.s_aux = sa.owner ? (const float *)sa.data : NULL;
    p.k_descale = !kd.host ? NULL : kd.is_tensor ? (const float *)kd.t.data : dev_desc;
    p.v_descale = !vd.host ? NULL : vd.is_tensor ? (const float *)vd.t.data : dev_desc + 1;
    size_t ws_bytes = 0;
    if ((st = vt_cuda_attn_workspace(&p, max_q, max_k, &ws_bytes, NULL, &err)) != VT_OK ||
        (st = vt_cuda_malloc(&ws, ws_bytes, fn, &err)) != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    st = vt_cuda_attn(&p, max_q, max_k, ws, ws_bytes, NULL, &err);
    if (st == VT_OK && (ws || dev_desc)) st = vt_cuda_synchronize(fn, &err); /* before the frees */
    Py_END_ALLOW_THREADS
    if (st != VT_OK) {
        cu_raise(m, st, &err);
        goto done;
    }
    ret = Py_NewRef(Py_None);
done:
    vt_cuda_free(ws, fn, NULL);
    vt_cuda_free(dev_desc, fn, NULL);
    free(h_cu);
    free(h_sk);
    free(h_bt);
    free(h_al);
    free(h_sa);
    scale_release(&kd);
    scale_release(&vd);
    vt_tensor *all[] = {&q, &k, &v, &cu, &sk, &bt, &out, &lse, &al, &sa};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) vt_tensor_release(all[i]);
    return ret;
}

static char store_doc[512];

static PyMethodDef cu_methods[] = {
    {"device_count", py_device_count, METH_NOARGS,
     "device_count($module, /)\n--\n\nNumber of CUDA devices; 0 when the runtime finds none (never raises)."},
    {"device_status", py_device_status, METH_NOARGS,
     "device_status($module, /)\n--\n\nThe CUDA runtime's answer to a device count, as text."},
    {"runtime_version", py_runtime_version, METH_NOARGS,
     "runtime_version($module, /)\n--\n\n(runtime, driver) versions in CUDA's encoding; 0 when unknown."},
    {"reshape_and_cache_flash", (PyCFunction)(void (*)(void))py_store, METH_VARARGS | METH_KEYWORDS,
     store_doc},
    {"flash_attn_varlen_func", py_attn, METH_VARARGS,
     "flash_attn_varlen_func($module, q, k, v, cu_seqlens_q, seqused_k, block_table, out, lse, max_seqlen_q, "
     "max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, s_aux, k_descale, "
     "v_descale, kv_cache_dtype, validate, /)\n--\n\nPaged attention on CUDA tensors (see "
     "vtinfer.flash_attn_varlen_func; this is the positional form the Python layer calls)."},
    {NULL, NULL, 0, NULL},
};

static int cu_exec(PyObject *m) {
    cu_state *st = cu_get_state(m);
    vt_signature_doc(vt_store_flash_signature(), "vLLM's store on CUDA tensors (see vtinfer.reshape_and_cache_flash).",
                     store_doc, sizeof store_doc);
    PyObject *c = PyImport_ImportModule("vtinfer._C");
    if (!c) return -1;
    st->VtinferError = PyObject_GetAttrString(c, "VtinferError");
    Py_DECREF(c);
    if (!st->VtinferError) return -1;
    PyObject *bases = PyTuple_Pack(2, st->VtinferError, PyExc_RuntimeError);
    if (!bases) return -1;
    st->CudaError = PyErr_NewExceptionWithDoc("vtinfer.CudaError", "The CUDA runtime reported an error.", bases, NULL);
    Py_DECREF(bases);
    if (!st->CudaError || PyModule_AddObjectRef(m, "CudaError", st->CudaError) < 0) return -1;
    return PyModule_AddFunctions(m, cu_methods);
}

static int cu_traverse(PyObject *m, visitproc visit, void *arg) {
    cu_state *st = cu_get_state(m);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->VtinferError);
    return 0;
}

static int cu_clear(PyObject *m) {
    cu_state *st = cu_get_state(m);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->VtinferError);
    return 0;
}

static void cu_free(void *m) { cu_clear((PyObject *)m); }

static PyModuleDef_Slot cu_slots[] = {
    {Py_mod_exec, cu_exec},
    {0, NULL},
};

static PyModuleDef cu_module_def = {
    PyModuleDef_HEAD_INIT, "vtinfer._cuda", "vtinfer's CUDA arm (see csrc/cuda).", sizeof(cu_state), NULL, cu_slots,
    cu_traverse, cu_clear, cu_free,
};

PyMODINIT_FUNC PyInit__cuda(void);
PyMODINIT_FUNC PyInit__cuda(void) { return PyModuleDef_Init(&cu_module_def); }
