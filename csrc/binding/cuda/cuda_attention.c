/* vtinfer._cuda's paged attention: _C's signature (VT_ATTN_ARGS) plus validate.
 *
 *   _cuda.flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, seqused_k, block_table,
 *       max_seqlen_q=None, ..., num_threads=None, k_scale_cache=None,
 *       v_scale_cache=None, validate=True) -> out | (out, lse)
 *
 * Every argument rule is the shared layer's (common/attn_args.c), with the
 * CUDA device check and the C-contiguity refusal of DLPack (what _C says
 * of a DLPack tensor): a bad argument gets _C's exception and message,
 * before the CUDA runtime is reached. What is the arm's own: k_descale /
 * v_descale may be Python numbers (uploaded; the CPU's Python wrapper
 * makes arrays of them); all tensors on one device; the index arrays'
 * values are judged on host copies by the core's checks
 * (vt_attn_scratch_size, vt_attn_check_max_seqlen; validate=False skips
 * them, as vLLM does), and max_seqlen_* default to the real maxima read
 * from those copies; out (when not given) and lse are allocated after
 * every check with the tensor's own library (vtinfer._cuda_ops._new_zeros);
 * per-token-head caches are not supported yet (NotImplementedError). */
#include "vt_attn_args.h"
#include "vt_cuda.h"
#include "vt_cuda_glue.h"

#include <stdlib.h>
#include <string.h>

static const char FN[] = "flash_attn_varlen_func";

static int fail(PyObject *m, int status, const vt_error *err) {
    vt_cu_raise(m, status, err);
    return -1;
}

typedef struct cu_attn {
    vt_attn_call c;
    int validate;
    int desc_given[2];          /* k_descale / v_descale given as a Python number ... */
    float desc_number[2];       /* ... of this value */
    void *h_cu, *h_sk, *h_bt, *h_al, *h_sa, *h_desc[2]; /* host copies (malloc'd) */
    float *dev_desc;            /* the numbers on the device */
    void *ws;                   /* the kernel's workspace */
} cu_attn;

static void cu_attn_release(cu_attn *x) {
    vt_cuda_free(x->ws, FN, NULL);
    vt_cuda_free(x->dev_desc, FN, NULL);
    void *host[] = {x->h_cu, x->h_sk, x->h_bt, x->h_al, x->h_sa, x->h_desc[0], x->h_desc[1]};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    vt_attn_release(&x->c);
}

/* validate, and k_descale / v_descale given as numbers: taken out of the
 * arguments the shared layer pins. */
static int arm_scalars(cu_attn *x) {
    vt_attn_pyargs *a = &x->c.a;
    x->validate = a->validate ? PyObject_IsTrue(a->validate) : 1;
    if (x->validate < 0) return -1;
    PyObject **desc[2] = {&a->k_descale, &a->v_descale};
    for (int i = 0; i < 2; i++) {
        PyObject *o = *desc[i];
        if (!o || PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) continue;
        double d = PyFloat_AsDouble(o);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        x->desc_given[i] = 1;
        x->desc_number[i] = (float)d;
        *desc[i] = NULL;
    }
    return 0;
}

/* Every pinned tensor on q's device; no per-token-head cache. */
static int arm_checks(cu_attn *x) {
    vt_attn_call *c = &x->c;
    struct { const vt_tensor *t; const char *name; } all[] = {
        {&c->k, "k"}, {&c->v, "v"}, {&c->cu_seqlens_q, "cu_seqlens_q"}, {&c->seqused_k, "seqused_k"},
        {&c->block_table, "block_table"}, {&c->alibi_slopes, "alibi_slopes"}, {&c->s_aux, "s_aux"},
        {&c->k_descale, "k_descale"}, {&c->v_descale, "v_descale"}, {&c->out, "out"}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].t->owner && vt_cu_same_device(&c->q, all[i].t, FN, all[i].name) < 0) return -1;
    if (vt_dtype_per_token_head(c->kv_dtype)) {
        PyErr_Format(PyExc_NotImplementedError, "%s: kv_cache_dtype '%s' is not built for CUDA tensors", FN,
                     c->kv_name);
        return -1;
    }
    return 0;
}

static int copy_opt(PyObject *m, const vt_tensor *t, const char *arg, void **out) {
    return t->owner ? vt_cu_copy_host(m, t, FN, arg, out) : 0;
}

/* Host copies of what the core's checks read; the checks; *mq / *mk: the
 * grid's maxima (given, or read from the copies). */
static int host_checks(PyObject *m, cu_attn *x, const vt_attn_params *p, long long *mq, long long *mk) {
    vt_attn_call *c = &x->c;
    *mq = c->max_seqlen_q, *mk = c->max_seqlen_k;
    if (!x->validate && *mq >= 0 && *mk >= 0) return 0;
    if (copy_opt(m, &c->cu_seqlens_q, "cu_seqlens_q", &x->h_cu) < 0 ||
        copy_opt(m, &c->seqused_k, "seqused_k", &x->h_sk) < 0)
        return -1;
    vt_attn_params hp = *p;
    hp.cu_seqlens_q = x->h_cu;
    hp.seqused_k = x->h_sk;
    if (x->validate) {
        if (copy_opt(m, &c->block_table, "block_table", &x->h_bt) < 0 ||
            copy_opt(m, &c->alibi_slopes, "alibi_slopes", &x->h_al) < 0 || copy_opt(m, &c->s_aux, "s_aux", &x->h_sa) < 0 ||
            copy_opt(m, &c->k_descale, "k_descale", &x->h_desc[0]) < 0 ||
            copy_opt(m, &c->v_descale, "v_descale", &x->h_desc[1]) < 0)
            return -1;
        hp.block_table = x->h_bt, hp.alibi_slopes = x->h_al, hp.s_aux = x->h_sa;
        hp.k_descale = x->desc_given[0] ? &x->desc_number[0] : x->h_desc[0];
        hp.v_descale = x->desc_given[1] ? &x->desc_number[1] : x->h_desc[1];
        vt_error err;
        size_t unused;
        int st = vt_attn_scratch_size(&hp, 1, &unused, &err);
        if (st != VT_OK) return fail(m, st, &err);
    }
    long long rq, rk;
    if (vt_attn_check_max_seqlen(c, &hp, &rq, &rk) < 0) return -1;
    if (*mq < 0) *mq = rq;
    if (*mk < 0) *mk = rk;
    return 0;
}

/* A zero-filled tensor like q (its library, its device) of `shape`. */
static int new_output(PyObject *q, PyObject *shape, int float32, const char *arg, PyObject **obj, vt_tensor *t) {
    PyObject *ops = PyImport_ImportModule("vtinfer._cuda_ops");
    if (!ops || !shape) {
        Py_XDECREF(ops);
        Py_XDECREF(shape);
        return -1;
    }
    *obj = PyObject_CallMethod(ops, "_new_zeros", "OOO", q, shape, float32 ? Py_True : Py_False);
    Py_DECREF(ops);
    Py_DECREF(shape);
    if (!*obj) return -1;
    return vt_cu_pin(NULL, *obj, FN, arg, VT_TENSOR_WRITABLE, t);
}

static int new_outputs(cu_attn *x) {
    vt_attn_call *c = &x->c;
    const long long T = c->q.shape[0], H = c->q.shape[1], D = c->q.shape[2];
    if (!c->out_obj && new_output(c->a.q, Py_BuildValue("(LLL)", T, H, D), 0, "out", &c->out_obj, &c->out) < 0)
        return -1;
    if (c->return_lse && new_output(c->a.q, Py_BuildValue("(LL)", H, T), 1, "lse", &c->lse_obj, &c->lse) < 0)
        return -1;
    return 0;
}

/* Device copies of the number descales; the workspace; the launch. */
static int launch(PyObject *m, cu_attn *x, vt_attn_params *p, long long mq, long long mk) {
    vt_error err;
    vt_error_clear(&err);
    int st = vt_cuda_set_device(x->c.q.device_id, FN, &err);
    if (st != VT_OK) return fail(m, VT_CUDA_ERR_RUNTIME, &err);
    if (x->desc_given[0] || x->desc_given[1]) {
        st = vt_cuda_malloc((void **)&x->dev_desc, sizeof x->desc_number, FN, &err);
        if (st == VT_OK) st = vt_cuda_to_device(x->dev_desc, x->desc_number, sizeof x->desc_number, FN, &err);
        if (st != VT_OK) return fail(m, st, &err);
        if (x->desc_given[0]) p->k_descale = x->dev_desc;
        if (x->desc_given[1]) p->v_descale = x->dev_desc + 1;
    }
    size_t ws_bytes = 0;
    if ((st = vt_cuda_attn_workspace(p, mq, mk, &ws_bytes, NULL, &err)) != VT_OK ||
        (st = vt_cuda_malloc(&x->ws, ws_bytes, FN, &err)) != VT_OK)
        return fail(m, st, &err);
    Py_BEGIN_ALLOW_THREADS
    st = vt_cuda_attn(p, mq, mk, x->ws, ws_bytes, NULL, &err);
    if (st == VT_OK && (x->ws || x->dev_desc)) st = vt_cuda_synchronize(FN, &err); /* before the frees */
    Py_END_ALLOW_THREADS
    if (st != VT_OK) return fail(m, st, &err);
    return 0;
}

static PyObject *py_attn(PyObject *m, PyObject *args, PyObject *kw) {
    cu_attn x;
    memset(&x, 0, sizeof x);
    vt_attn_call *c = &x.c;
    c->mem = VT_MEMORY_CUDA, c->pin = vt_cu_pin, c->contig = vt_refuse_noncontiguous, c->ctx = NULL;
    PyObject *result = NULL;
    vt_attn_params p;
    long long mq, mk;
    if (vt_attn_pyargs_parse(args, kw, 1, &c->a) < 0 || vt_attn_parse_scalars(c) < 0 || arm_scalars(&x) < 0 ||
        vt_attn_pin_inputs(c) < 0 || vt_attn_check_inputs(c) < 0 || vt_attn_pin_given_out(c) < 0 ||
        arm_checks(&x) < 0)
        goto done;
    vt_attn_fill_params(c, &p);
    if (host_checks(m, &x, &p, &mq, &mk) < 0 || new_outputs(&x) < 0) goto done;
    vt_attn_fill_params(c, &p); /* now with the outputs */
    if (launch(m, &x, &p, mq, mk) < 0) goto done;
    result = c->return_lse ? PyTuple_Pack(2, c->out_obj, c->lse_obj) : Py_NewRef(c->out_obj);
done:
    cu_attn_release(&x);
    return result;
}

static char attn_doc[1024];

static PyMethodDef attention_methods[] = {
    {"flash_attn_varlen_func", (PyCFunction)(void (*)(void))py_attn, METH_VARARGS | METH_KEYWORDS, attn_doc},
    {NULL, NULL, 0, NULL},
};

int vt_cu_attention_exec(PyObject *m) {
    vt_signature_doc(vt_attn_signature(1), "Paged attention on CUDA tensors (see vtinfer.flash_attn_varlen_func; "
                     "num_threads is unused).", attn_doc, sizeof attn_doc);
    return PyModule_AddFunctions(m, attention_methods);
}
