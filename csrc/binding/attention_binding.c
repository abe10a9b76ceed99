/* Python surface of paged attention:
 *
 *   _C.flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, seqused_k, block_table,
 *       max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=True,
 *       window_size=(-1, -1), softcap=0.0, alibi_slopes=None, s_aux=None,
 *       k_descale=None, v_descale=None, kv_cache_dtype="auto", out=None,
 *       return_lse=False, num_threads=None) -> out | (out, lse)
 *
 * Arguments are checked in the fixed order type, rank, shape, dtype,
 * contiguity, device; the core then judges the index arrays' contents
 * (vt_attn_scratch_size) before anything is written. The GIL is released
 * around the kernel after every input is pinned. */
#include "vt_binding.h"

#include <math.h>
#include <string.h>

#include "vtinfer/attention.h"

static const char FN[] = "flash_attn_varlen_func";

enum { T_Q, T_K, T_V, T_CU, T_SK, T_BT, T_AL, T_SA, T_KD, T_VD, T_OUT, T_LSE, T_N };

typedef struct args {
    vt_tensor t[T_N];
    int have[T_N];
} args;

static void release_all(args *a) {
    for (int i = 0; i < T_N; i++)
        if (a->have[i]) {
            vt_tensor_release(&a->t[i]);
            a->have[i] = 0;
        }
}

/* Pin an optional input (None -> absent). */
static int pin(vt_module_state *st, args *a, int i, PyObject *obj, const char *name, unsigned mask, int ndim,
               int flags) {
    if (obj == NULL || obj == Py_None) return 0;
    if (vt_tensor_from_object(st, obj, FN, name, flags, &a->t[i]) < 0) return -1;
    a->have[i] = 1;
    return vt_tensor_check(&a->t[i], FN, name, mask, ndim);
}

static int shape_err(const char *name, const char *want, const vt_tensor *t) {
    char got[160] = "[";
    size_t n = 1;
    for (int i = 0; i < t->ndim && n < sizeof got - 24; i++)
        n += (size_t)snprintf(got + n, sizeof got - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    snprintf(got + n, sizeof got - n, "]");
    PyErr_Format(PyExc_ValueError, "%s: %s must have shape %s; got %s", FN, name, want, got);
    return -1;
}

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
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) {
        *sb = 0, *sh = 0;
    } else if (t->ndim == 1 && t->shape[0] == hkv) {
        *sb = 0, *sh = 1;
    } else if (t->ndim == 2 && t->shape[0] == B && t->shape[1] == hkv) {
        *sb = hkv, *sh = 1;
    } else {
        char want[96];
        snprintf(want, sizeof want, "[], [%lld] or [%lld, %lld]", (long long)hkv, (long long)B, (long long)hkv);
        return shape_err(name, want, t);
    }
    (void)n;
    return 0;
}

static PyObject *new_zeros(vt_module_state *st, int nd, const int64_t *shape, vt_elem e) {
    npy_intp dims[4];
    for (int i = 0; i < nd; i++) dims[i] = (npy_intp)shape[i];
    PyArray_Descr *d;
    if (e == VT_ELEM_F32) d = PyArray_DescrFromType(NPY_FLOAT32);
    else if (e == VT_ELEM_F16) d = PyArray_DescrFromType(NPY_FLOAT16);
    else {
        d = st->descr_bf16;
        Py_INCREF(d);
    }
    return PyArray_Zeros(nd, dims, d, 0);
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
        if (PyBool_Check(x) || !PyLong_Check(x)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_TypeError, "%s: window_size must be a pair (left, right) of ints; got %R", FN, obj);
            return -1;
        }
        v[i] = PyLong_AsLong(x);
        if (v[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v[i] < -1 || v[i] > INT32_MAX) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: window_size must hold values >= -1; got %R", FN, obj);
            return -1;
        }
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
    if (PyBool_Check(obj) || !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int or None; got %s", FN, name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = PyLong_AsLongLong(obj);
    if (*out == -1 && PyErr_Occurred()) return -1;
    if (*out < 0) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be >= 0; got %lld", FN, name, *out);
        return -1;
    }
    return 0;
}

static PyObject *py_flash_attn(PyObject *m, PyObject *pargs, PyObject *kw) {
    static char *kwlist[] = {"q", "k", "v", "cu_seqlens_q", "seqused_k", "block_table", "max_seqlen_q",
                             "max_seqlen_k", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
                             "s_aux", "k_descale", "v_descale", "kv_cache_dtype", "out", "return_lse",
                             "num_threads", NULL};
    vt_module_state *st = vt_state(m);
    PyObject *o[20] = {NULL};
    for (int i = 0; i < 20; i++) o[i] = NULL;
    int causal = 1, return_lse = 0;
    const char *kvd = "auto";
    if (!PyArg_ParseTupleAndKeywords(pargs, kw, "OOO|$OOOOOOpOOOOOOsOpO:flash_attn_varlen_func", kwlist, &o[0],
                                     &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &causal, &o[10],
                                     &o[11], &o[12], &o[13], &o[14], &o[15], &kvd, &o[17], &return_lse, &o[19]))
        return NULL;
    for (int i = 3; i <= 5; i++)
        if (!o[i]) {
            PyErr_Format(PyExc_TypeError, "%s: %s is required", FN, kwlist[i]);
            return NULL;
        }
    /* scalars first: nothing pinned yet */
    double scale, cap;
    int wl, wr, nth;
    long long msq, msk;
    if (parse_opt_int(o[6], "max_seqlen_q", &msq) < 0 || parse_opt_int(o[7], "max_seqlen_k", &msk) < 0 ||
        parse_float(o[8], "softmax_scale", NAN, &scale) < 0 || parse_window(o[10], &wl, &wr) < 0 ||
        parse_float(o[11], "softcap", 0.0, &cap) < 0)
        return NULL;
    if ((nth = vt_num_threads_arg(o[19], FN)) < 0) return NULL;
    int kv_flag;
    {
        vt_error e;
        if (vt_dtype_from_name(kvd, "kv_cache_dtype", &kv_flag, &e) != VT_OK) {
            PyErr_Format(PyExc_ValueError, "%s: %s", FN, e.message);
            return NULL;
        }
    }

    args a;
    memset(&a, 0, sizeof a);
    PyObject *result = NULL, *out_obj = NULL, *lse_obj = NULL;
    void *scratch = NULL;
    const unsigned F32 = VT_ELEM_BIT(VT_ELEM_F32), I32 = VT_ELEM_BIT(VT_ELEM_I32);
    if (pin(st, &a, T_Q, o[0], "q", VT_ELEMS_FLOAT, 3, 0) < 0 ||
        pin(st, &a, T_K, o[1], "k", VT_ELEMS_FLOAT | VT_ELEMS_CODES, 4, VT_TENSOR_NO_CONVERT) < 0 ||
        pin(st, &a, T_V, o[2], "v", VT_ELEMS_FLOAT | VT_ELEMS_CODES, 4, VT_TENSOR_NO_CONVERT) < 0 ||
        pin(st, &a, T_CU, o[3], "cu_seqlens_q", I32, 1, 0) < 0 || pin(st, &a, T_SK, o[4], "seqused_k", I32, 1, 0) < 0 ||
        pin(st, &a, T_BT, o[5], "block_table", I32, 2, 0) < 0 ||
        pin(st, &a, T_AL, o[12], "alibi_slopes", F32, 1, 0) < 0 || pin(st, &a, T_SA, o[13], "s_aux", F32, 1, 0) < 0 ||
        pin(st, &a, T_KD, o[14], "k_descale", F32, -1, 0) < 0 || pin(st, &a, T_VD, o[15], "v_descale", F32, -1, 0) < 0)
        goto done;
    vt_tensor *q = &a.t[T_Q], *k = &a.t[T_K], *v = &a.t[T_V];
    int64_t T = q->shape[0], H = q->shape[1], D = q->shape[2];
    int64_t NB = k->shape[0], BS = k->shape[1], HKV = k->shape[2];
    int64_t B = a.t[T_CU].shape[0] - 1;
    char want[128];
    /* shapes */
    for (int i = 0; i < 4; i++)
        if (v->shape[i] != k->shape[i]) {
            snprintf(want, sizeof want, "[%lld, %lld, %lld, %lld] (k's)", (long long)NB, (long long)BS,
                     (long long)HKV, (long long)k->shape[3]);
            shape_err("v", want, v);
            goto done;
        }
    if (k->shape[3] != D) {
        snprintf(want, sizeof want, "[num_blocks, block_size, num_kv_heads, %lld] (q's head size)", (long long)D);
        shape_err("k", want, k);
        goto done;
    }
    if (HKV < 1 || H % HKV) {
        PyErr_Format(PyExc_ValueError, "%s: q must have a head count divisible by k's num_kv_heads; got %lld and %lld",
                     FN, (long long)H, (long long)HKV);
        goto done;
    }
    if (B < 0) {
        shape_err("cu_seqlens_q", "[batch + 1]", &a.t[T_CU]);
        goto done;
    }
    if (a.t[T_SK].shape[0] != B) {
        snprintf(want, sizeof want, "[%lld] (batch)", (long long)B);
        shape_err("seqused_k", want, &a.t[T_SK]);
        goto done;
    }
    if (a.t[T_BT].shape[0] != B) {
        snprintf(want, sizeof want, "[%lld, max_blocks]", (long long)B);
        shape_err("block_table", want, &a.t[T_BT]);
        goto done;
    }
    for (int i = T_AL; i <= T_SA; i++)
        if (a.have[i] && a.t[i].shape[0] != H) {
            snprintf(want, sizeof want, "[%lld] (num_heads)", (long long)H);
            shape_err(i == T_AL ? "alibi_slopes" : "s_aux", want, &a.t[i]);
            goto done;
        }
    int64_t ksb = 0, ksh = 0, vsb = 0, vsh = 0;
    if (a.have[T_KD] && descale_strides(&a.t[T_KD], "k_descale", B, HKV, &ksb, &ksh) < 0) goto done;
    if (a.have[T_VD] && descale_strides(&a.t[T_VD], "v_descale", B, HKV, &vsb, &vsh) < 0) goto done;
    if (H > INT32_MAX || D > INT32_MAX || B > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: q and cu_seqlens_q must have sizes below 2^31", FN);
        goto done;
    }
    /* dtypes: the cache's and kv_cache_dtype must agree */
    if (k->elem != v->elem) {
        PyErr_Format(PyExc_TypeError, "%s: v must have k's dtype %s; got %s", FN, k->dtype_name, v->dtype_name);
        goto done;
    }
    int kv_dtype;
    int codes = k->elem == VT_ELEM_U8 || k->elem == VT_ELEM_E4M3 || k->elem == VT_ELEM_E5M2;
    if (codes) {
        if (kv_flag < 0 || !vt_dtype_get(kv_flag)->is_fp8) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be 'fp8', 'fp8_e4m3' or 'fp8_e5m2' for a cache of "
                         "%s codes (another value would read the codes as numbers); got '%s'", FN, k->dtype_name, kvd);
            goto done;
        }
        if ((k->elem == VT_ELEM_E4M3 && kv_flag != VT_DTYPE_FP8_E4M3) ||
            (k->elem == VT_ELEM_E5M2 && kv_flag != VT_DTYPE_FP8_E5M2)) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must match k's dtype %s; got '%s'", FN, k->dtype_name, kvd);
            goto done;
        }
        kv_dtype = kv_flag;
    } else {
        if (kv_flag >= 0 && kv_flag != (int)k->elem) {
            PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be 'auto' or k's dtype for a %s cache; got '%s' "
                         "(an fp8 cache holds uint8 or float8 codes)", FN, k->dtype_name, kvd);
            goto done;
        }
        kv_dtype = (int)k->elem;
    }
    /* contiguity */
    if (vt_tensor_contiguous_input(st, q, FN, "q") < 0 || inner_contiguous(k, "k") < 0 ||
        inner_contiguous(v, "v") < 0)
        goto done;
    for (int i = T_CU; i <= T_VD; i++)
        if (a.have[i] && vt_tensor_contiguous_input(st, &a.t[i], FN, kwlist[i == T_CU ? 3 : i == T_SK ? 4 : i == T_BT ? 5 : i - T_AL + 12]) < 0)
            goto done;
    /* out */
    if (o[17] && o[17] != Py_None) {
        if (pin(st, &a, T_OUT, o[17], "out", VT_ELEM_BIT(q->elem), 3, VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT) < 0)
            goto done;
        vt_tensor *ot = &a.t[T_OUT];
        if (ot->shape[0] != T || ot->shape[1] != H || ot->shape[2] != D) {
            snprintf(want, sizeof want, "[%lld, %lld, %lld] (q's)", (long long)T, (long long)H, (long long)D);
            shape_err("out", want, ot);
            goto done;
        }
        if (inner_contiguous(ot, "out") < 0) goto done;
        if (vt_tensor_overlap(ot, q) || vt_tensor_overlap(ot, k) || vt_tensor_overlap(ot, v)) {
            PyErr_Format(PyExc_ValueError, "%s: out must not overlap q, k or v", FN);
            goto done;
        }
        out_obj = Py_NewRef(o[17]);
    } else {
        out_obj = new_zeros(st, 3, q->shape, q->elem);
        if (!out_obj || vt_tensor_from_object(st, out_obj, FN, "out", VT_TENSOR_WRITABLE, &a.t[T_OUT]) < 0) goto done;
        a.have[T_OUT] = 1;
    }
    if (return_lse) {
        int64_t ls[2] = {H, T};
        lse_obj = new_zeros(st, 2, ls, VT_ELEM_F32);
        if (!lse_obj || vt_tensor_from_object(st, lse_obj, FN, "lse", VT_TENSOR_WRITABLE, &a.t[T_LSE]) < 0) goto done;
        a.have[T_LSE] = 1;
    }

    vt_attn_params p;
    memset(&p, 0, sizeof p);
    p.q = q->data;
    p.q_dtype = (vt_dtype)q->elem;
    p.total_q = T;
    p.q_stride_tok = q->strides[0];
    p.q_stride_head = q->strides[1];
    p.k = k->data;
    p.v = v->data;
    p.kv_dtype = (vt_dtype)kv_dtype;
    p.num_blocks = NB;
    p.block_size = BS;
    p.k_stride_block = k->strides[0], p.k_stride_tok = k->strides[1], p.k_stride_head = k->strides[2];
    p.v_stride_block = v->strides[0], p.v_stride_tok = v->strides[1], p.v_stride_head = v->strides[2];
    p.num_heads = (int)H;
    p.num_kv_heads = (int)HKV;
    p.head_size = (int)D;
    p.batch = (int)B;
    p.cu_seqlens_q = a.t[T_CU].data;
    p.seqused_k = a.t[T_SK].data;
    p.block_table = a.t[T_BT].data;
    p.max_blocks = a.t[T_BT].shape[1];
    p.bt_stride = a.t[T_BT].shape[1];
    p.softmax_scale = (float)(o[8] == NULL || o[8] == Py_None ? 1.0 / sqrt((double)D) : scale);
    p.causal = causal;
    p.window_left = wl;
    p.window_right = wr;
    p.softcap = (float)cap;
    p.alibi_slopes = a.have[T_AL] ? a.t[T_AL].data : NULL;
    p.s_aux = a.have[T_SA] ? a.t[T_SA].data : NULL;
    p.k_descale = a.have[T_KD] ? a.t[T_KD].data : NULL;
    p.v_descale = a.have[T_VD] ? a.t[T_VD].data : NULL;
    p.k_descale_stride_b = ksb, p.k_descale_stride_h = ksh;
    p.v_descale_stride_b = vsb, p.v_descale_stride_h = vsh;
    p.out = a.t[T_OUT].data;
    p.out_stride_tok = a.t[T_OUT].strides[0];
    p.out_stride_head = a.t[T_OUT].strides[1];
    if (return_lse) {
        p.lse = a.t[T_LSE].data;
        p.lse_stride_head = T;
        p.lse_stride_tok = 1;
    }
    vt_error err;
    size_t bytes;
    if (vt_attn_scratch_size(&p, nth, &bytes, &err) != VT_OK) {
        vt_raise(st, &err);
        goto done;
    }
    /* max_seqlen_*: FlashAttention sizes its grid from them; a value below
     * the real maximum would be a caller's bug, so it is refused. */
    {
        long long mq = 0, mk = 0;
        const int32_t *cu = p.cu_seqlens_q, *sk = p.seqused_k;
        for (int b = 0; b < p.batch; b++) {
            if (cu[b + 1] - cu[b] > mq) mq = cu[b + 1] - cu[b];
            if (sk[b] > mk) mk = sk[b];
        }
        if (msq >= 0 && msq < mq) {
            PyErr_Format(PyExc_ValueError, "%s: max_seqlen_q must be >= the longest query run %lld; got %lld", FN, mq, msq);
            goto done;
        }
        if (msk >= 0 && msk < mk) {
            PyErr_Format(PyExc_ValueError, "%s: max_seqlen_k must be >= the largest seqused_k %lld; got %lld", FN, mk, msk);
            goto done;
        }
    }
    scratch = PyMem_RawMalloc(bytes ? bytes : 1);
    if (!scratch) {
        PyErr_Format(PyExc_MemoryError, "%s: scratch of %zu bytes could not be allocated", FN, bytes);
        goto done;
    }
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_attn_varlen(&p, scratch, bytes, nth, &err);
    Py_END_ALLOW_THREADS
    if (s != VT_OK) {
        vt_raise(st, &err);
        goto done;
    }
    result = return_lse ? PyTuple_Pack(2, out_obj, lse_obj) : Py_NewRef(out_obj);
done:
    PyMem_RawFree(scratch);
    release_all(&a);
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    return result;
}

static PyMethodDef attention_methods[] = {
    {"flash_attn_varlen_func", (PyCFunction)(void (*)(void))py_flash_attn, METH_VARARGS | METH_KEYWORDS,
     "flash_attn_varlen_func($module, /, q, k, v, *, cu_seqlens_q, seqused_k, block_table, max_seqlen_q=None, "
     "max_seqlen_k=None, softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
     "s_aux=None, k_descale=None, v_descale=None, kv_cache_dtype='auto', out=None, return_lse=False, "
     "num_threads=None)\n--\n\n"
     "Paged attention over block tables with vLLM's FlashAttention-backend meaning."},
    {NULL, NULL, 0, NULL},
};

int vt_attention_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    return PyModule_AddFunctions(m, attention_methods);
}
