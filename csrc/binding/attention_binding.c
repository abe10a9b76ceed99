/* Python surface of paged attention:
 *
 *   _C.flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, seqused_k, block_table,
 *       max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, causal=True,
 *       window_size=(-1, -1), softcap=0.0, alibi_slopes=None, s_aux=None,
 *       k_descale=None, v_descale=None, kv_cache_dtype="auto", out=None,
 *       return_lse=False, num_threads=None, k_scale_cache=None,
 *       v_scale_cache=None) -> out | (out, lse)
 *
 * Every argument rule lives in the shared argument layer
 * (common/attn_args.c, also vtinfer._cuda's); this file adds the CPU front
 * door (NumPy or DLPack; a non-contiguous NumPy index array or q is
 * copied), the NumPy outputs, the threads, and the core's judgement of the
 * index arrays' contents (vt_attn_scratch_size) before anything is
 * written. The GIL is released around the kernel after every input is
 * pinned. The signature is VT_ATTN_ARGS (vt_signature.h). */
#include "vt_attn_args.h"
#include "vt_binding.h"

#include <string.h>

static const char FN[] = "flash_attn_varlen_func";

static int cpu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    return vt_tensor_from_object((vt_module_state *)ctx, obj, fn, arg, flags, t);
}

static int cpu_contig(void *ctx, vt_tensor *t, const char *fn, const char *arg) {
    return vt_tensor_contiguous_input((vt_module_state *)ctx, t, fn, arg);
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

/* out when not given (zeros of q's shape and dtype) and lse when asked for. */
static int new_outputs(vt_module_state *st, vt_attn_call *c) {
    const vt_tensor *q = &c->q;
    if (!c->out_obj) {
        c->out_obj = new_zeros(st, 3, q->shape, q->elem);
        if (!c->out_obj || vt_tensor_from_object(st, c->out_obj, FN, "out", VT_TENSOR_WRITABLE, &c->out) < 0)
            return -1;
    }
    if (c->return_lse) {
        int64_t ls[2] = {q->shape[1], q->shape[0]};
        c->lse_obj = new_zeros(st, 2, ls, VT_ELEM_F32);
        if (!c->lse_obj || vt_tensor_from_object(st, c->lse_obj, FN, "lse", VT_TENSOR_WRITABLE, &c->lse) < 0)
            return -1;
    }
    return 0;
}

/* The largest scratch kept between calls: a decode's is ~100 KB per thread plus its splits' partials, the slot
 * formats' ~1 MB per thread. Fresh pages cost their first-touch faults on every call (measured ~10% of a slot
 * format's 32K-key decode). */
#define SCRATCH_KEEP_MAX ((size_t)64 << 20)

/* A scratch of at least `bytes` (*have: its size): the module's kept one when it is large enough, else new. */
static void *scratch_take(vt_module_state *st, size_t bytes, size_t *have) {
    if (st->attn_scratch && st->attn_scratch_bytes >= bytes) {
        void *s = st->attn_scratch;
        *have = st->attn_scratch_bytes;
        st->attn_scratch = NULL, st->attn_scratch_bytes = 0;
        return s;
    }
    *have = bytes ? bytes : 1;
    return PyMem_RawMalloc(*have);
}

/* Keep the larger of the given scratch and the kept one (none past SCRATCH_KEEP_MAX); free the other. */
static void scratch_give(vt_module_state *st, void *s, size_t have) {
    if (have > SCRATCH_KEEP_MAX || (st->attn_scratch && st->attn_scratch_bytes >= have)) {
        PyMem_RawFree(s);
        return;
    }
    PyMem_RawFree(st->attn_scratch);
    st->attn_scratch = s, st->attn_scratch_bytes = have;
}

static int run_kernel(vt_module_state *st, const vt_attn_call *c, const vt_attn_params *p, int num_threads) {
    vt_error err;
    size_t bytes;
    if (vt_attn_scratch_size(p, num_threads, &bytes, &err) != VT_OK) {
        vt_raise(st, &err);
        return -1;
    }
    if (vt_attn_check_max_seqlen(c, p, NULL, NULL) < 0) return -1;
    size_t have;
    void *scratch = scratch_take(st, bytes, &have);
    if (!scratch) {
        PyErr_Format(PyExc_MemoryError, "%s: scratch of %zu bytes could not be allocated", FN, bytes);
        return -1;
    }
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_attn_varlen(p, scratch, bytes, num_threads, &err);
    Py_END_ALLOW_THREADS
    scratch_give(st, scratch, have);
    if (s != VT_OK) {
        vt_raise(st, &err);
        return -1;
    }
    return 0;
}

static PyObject *py_flash_attn(PyObject *m, PyObject *args, PyObject *kw) {
    vt_module_state *st = vt_state(m);
    vt_attn_call c;
    memset(&c, 0, sizeof c);
    c.mem = VT_MEMORY_CPU, c.pin = cpu_pin, c.contig = cpu_contig, c.ctx = st;
    int nth;
    if (vt_attn_pyargs_parse(args, kw, 0, &c.a) < 0 || vt_attn_parse_scalars(&c) < 0 ||
        (nth = vt_num_threads_arg(c.a.num_threads, FN)) < 0)
        return NULL;
    PyObject *result = NULL;
    vt_attn_params p;
    if (vt_attn_pin_inputs(&c) < 0 || vt_attn_check_inputs(&c) < 0 || vt_attn_pin_given_out(&c) < 0 ||
        new_outputs(st, &c) < 0)
        goto done;
    vt_attn_fill_params(&c, &p);
    if (run_kernel(st, &c, &p, nth) < 0) goto done;
    result = c.return_lse ? PyTuple_Pack(2, c.out_obj, c.lse_obj) : Py_NewRef(c.out_obj);
done:
    vt_attn_release(&c);
    return result;
}

static char attn_doc[1024];

static PyMethodDef attention_methods[] = {
    {"flash_attn_varlen_func", (PyCFunction)(void (*)(void))py_flash_attn, METH_VARARGS | METH_KEYWORDS, attn_doc},
    {NULL, NULL, 0, NULL},
};

int vt_attention_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(vt_attn_signature(0), "Paged attention over block tables with vLLM's FlashAttention-backend "
                     "meaning.", attn_doc, sizeof attn_doc);
    return PyModule_AddFunctions(m, attention_methods);
}
