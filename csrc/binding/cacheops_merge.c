/* vLLM's merge of two partial attention results (csrc/core/cache_ops.c):
 *
 *   _C.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
 *                        prefill_tokens_with_context=None, output_scale=None, *, num_threads=None)
 */
#include "vt_cacheops.h"
#include "vt_signature.h"

/* --------------------------------------------------------------- merge */

static const char FN[] = "merge_attn_states";
VT_SIGNATURE(merge_sig, "merge_attn_states", VT_MERGE_NPOS, VT_MERGE_ARGS);

/* One call: the pinned arrays (ol NULL when absent) and the scalars. */
typedef struct merge_call {
    vt_co_pins p;
    vt_tensor *out, *po, *pl, *so, *sl, *ol;
    PyObject *ptc_obj, *os_obj;
    float oscale;
    int nth;
} merge_call;

static int parse_and_pin(vt_module_state *st, merge_call *c, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&merge_sig, args, kw, a) < 0) return -1;
    PyObject *o_obj = a[0], *po_obj = a[1], *pl_obj = a[2], *so_obj = a[3], *sl_obj = a[4];
    PyObject *ol_obj = vt_arg_or_none(a[5]), *nt_obj = vt_arg_or_none(a[8]);
    c->ptc_obj = vt_arg_or_none(a[6]);
    c->os_obj = vt_arg_or_none(a[7]);
    if (c->os_obj != Py_None && vt_co_parse_scale(c->os_obj, FN, "output_scale", &c->oscale) < 0) return -1;
    if ((c->nth = vt_num_threads_arg(nt_obj, FN)) < 0) return -1;
    vt_co_pins *p = &c->p;
    const unsigned outs = VT_ELEMS_FLOAT | VT_ELEM_BIT(VT_ELEM_E4M3) | VT_ELEM_BIT(VT_ELEM_E5M2);
    const unsigned f32 = VT_ELEM_BIT(VT_ELEM_F32);
    const int dst = VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE;
    if (!(c->out = vt_co_pin(st, p, o_obj, FN, "output", dst, outs, 3)) ||
        !(c->po = vt_co_pin(st, p, po_obj, FN, "prefix_output", 0, VT_ELEMS_FLOAT, 3)) ||
        !(c->pl = vt_co_pin(st, p, pl_obj, FN, "prefix_lse", 0, f32, 2)) ||
        !(c->so = vt_co_pin(st, p, so_obj, FN, "suffix_output", 0, VT_ELEMS_FLOAT, 3)) ||
        !(c->sl = vt_co_pin(st, p, sl_obj, FN, "suffix_lse", 0, f32, 2)))
        return -1;
    if (ol_obj != Py_None && !(c->ol = vt_co_pin(st, p, ol_obj, FN, "output_lse", dst, f32, 2))) return -1;
    return 0;
}

/* Outputs [T, H, D] like output, LSEs [H, T]; one input dtype; contiguous heads. */
static int check_shapes(const merge_call *c) {
    const int64_t T = c->out->shape[0], H = c->out->shape[1], D = c->out->shape[2];
    const vt_tensor *o3[2] = {c->po, c->so};
    const char *o3n[2] = {"prefix_output", "suffix_output"};
    for (int i = 0; i < 2; i++)
        if (o3[i]->shape[0] != T || o3[i]->shape[1] != H || o3[i]->shape[2] != D) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have output's shape (%lld, %lld, %lld); got (%lld, %lld, %lld)",
                         FN, o3n[i], (long long)T, (long long)H, (long long)D, (long long)o3[i]->shape[0],
                         (long long)o3[i]->shape[1], (long long)o3[i]->shape[2]);
            return -1;
        }
    const vt_tensor *l2[3] = {c->pl, c->sl, c->ol};
    const char *l2n[3] = {"prefix_lse", "suffix_lse", "output_lse"};
    for (int i = 0; i < 3; i++)
        if (l2[i] && (l2[i]->shape[0] != H || l2[i]->shape[1] != T)) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (num_heads, num_tokens) = (%lld, %lld); got (%lld, "
                         "%lld)", FN, l2n[i], (long long)H, (long long)T, (long long)l2[i]->shape[0],
                         (long long)l2[i]->shape[1]);
            return -1;
        }
    if (c->so->elem != c->po->elem) {
        PyErr_Format(PyExc_TypeError, "%s: suffix_output must have prefix_output's dtype %s; got %s", FN,
                     c->po->dtype_name, c->so->dtype_name);
        return -1;
    }
    return vt_co_last_dim_ok(c->out, FN, "output") < 0 || vt_co_last_dim_ok(c->po, FN, "prefix_output") < 0 ||
                   vt_co_last_dim_ok(c->so, FN, "suffix_output") < 0
               ? -1
               : 0;
}

/* prefill_tokens_with_context (*ptc) and output_scale against output's dtype. */
static int check_scalars(const merge_call *c, int64_t *ptc) {
    const vt_tensor *out = c->out;
    const int64_t T = out->shape[0];
    *ptc = T;
    if (c->ptc_obj != Py_None && vt_co_parse_int(c->ptc_obj, FN, "prefill_tokens_with_context", 0, ptc) < 0) return -1;
    if (*ptc > T) {
        PyErr_Format(PyExc_ValueError, "%s: prefill_tokens_with_context must be <= num_tokens = %lld; got %lld", FN,
                     (long long)T, (long long)*ptc);
        return -1;
    }
    int out_fp8 = out->elem == VT_ELEM_E4M3 || out->elem == VT_ELEM_E5M2;
    if (out_fp8 != (c->os_obj != Py_None)) {
        PyErr_Format(PyExc_TypeError, out_fp8 ? "%s: output_scale must be given for an fp8 output (%s); got None"
                                              : "%s: output must be float8_e4m3fn or float8_e5m2 when output_scale is "
                                                "given; got %s",
                     FN, out->dtype_name);
        return -1;
    }
    return 0;
}

/* Neither output shares an element with an input or the other output. */
static int check_overlap(const merge_call *c) {
    const vt_tensor *ins[4] = {c->po, c->pl, c->so, c->sl};
    const char *insn[4] = {"prefix_output", "prefix_lse", "suffix_output", "suffix_lse"};
    for (int i = 0; i < 4; i++)
        if (vt_co_no_overlap(c->out, "output", ins[i], insn[i], FN) < 0 ||
            vt_co_no_overlap(c->ol, "output_lse", ins[i], insn[i], FN) < 0)
            return -1;
    return vt_co_no_overlap(c->out, "output", c->ol, "output_lse", FN);
}

static void fill_params(const merge_call *c, int64_t ptc, vt_merge_attn_params *mp) {
    const vt_tensor *out = c->out, *po = c->po, *so = c->so, *pl = c->pl, *sl = c->sl, *ol = c->ol;
    const int out_fp8 = out->elem == VT_ELEM_E4M3 || out->elem == VT_ELEM_E5M2;
    *mp = (vt_merge_attn_params){
        .fn = FN, .num_tokens = out->shape[0], .num_heads = out->shape[1], .head_size = out->shape[2],
        .prefix_output = po->data, .suffix_output = so->data, .in_dtype = (vt_dtype)po->elem,
        .prefix_stride_tok = po->strides[0], .prefix_stride_head = po->strides[1],
        .suffix_stride_tok = so->strides[0], .suffix_stride_head = so->strides[1],
        .prefix_lse = (const float *)pl->data, .suffix_lse = (const float *)sl->data,
        .prefix_lse_stride_head = pl->strides[0] / 4, .prefix_lse_stride_tok = pl->strides[1] / 4,
        .suffix_lse_stride_head = sl->strides[0] / 4, .suffix_lse_stride_tok = sl->strides[1] / 4,
        .output = out->data, .out_dtype = (vt_dtype)out->elem, .out_stride_tok = out->strides[0],
        .out_stride_head = out->strides[1], .output_lse = ol ? (float *)ol->data : NULL,
        .out_lse_stride_head = ol ? ol->strides[0] / 4 : 0, .out_lse_stride_tok = ol ? ol->strides[1] / 4 : 0,
        .prefill_tokens_with_context = ptc, .output_scale = out_fp8 ? &c->oscale : NULL,
    };
}

static PyObject *py_merge_attn_states(PyObject *m, PyObject *args, PyObject *kw) {
    vt_module_state *st = vt_state(m);
    merge_call c = {.p = {.n = 0}};
    int64_t ptc;
    if (parse_and_pin(st, &c, args, kw) < 0 || check_shapes(&c) < 0 || check_scalars(&c, &ptc) < 0 ||
        check_overlap(&c) < 0) {
        vt_co_pins_release(&c.p);
        return NULL;
    }
    vt_merge_attn_params mp;
    fill_params(&c, ptc, &mp);
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_merge_attn_states(&mp, c.nth, &err);
    Py_END_ALLOW_THREADS
    return vt_co_done(st, &c.p, s, &err);
}

static char merge_doc[512];

static PyMethodDef merge_methods[] = {
    {"merge_attn_states", (PyCFunction)(void (*)(void))py_merge_attn_states, METH_VARARGS | METH_KEYWORDS, merge_doc},
    {NULL, NULL, 0, NULL},
};

int vt_cacheops_merge_exec(PyObject *m) {
    vt_signature_doc(&merge_sig, "Merge two partial attention results by their log-sum-exps.", merge_doc,
                     sizeof merge_doc);
    return PyModule_AddFunctions(m, merge_methods);
}
