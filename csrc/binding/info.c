/* Build and runtime information, the dtype table, the ISA switch:
 *
 *   _C.build_info() -> dict
 *   _C.dtype_table() -> tuple[dict, ...]
 *   _C.kv_cache_flags() -> tuple[str, ...]
 *   _C.set_isa(name: str) -> None     (lower the ISA; tests force each path)
 *   _C.isa() -> str
 */
#include "vt_binding.h"
#include "vt_signature.h"

#include <string.h>

#ifndef VTINFER_CUDA_BUILT
#define VTINFER_CUDA_BUILT 0
#endif

static PyObject *features_dict(void) {
    const vt_cpu_features *f = vt_cpu_get();
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "sse4_2", f->sse42 ? Py_True : Py_False,
                         "avx", f->avx ? Py_True : Py_False, "avx2", f->avx2 ? Py_True : Py_False, "fma",
                         f->fma ? Py_True : Py_False, "f16c", f->f16c ? Py_True : Py_False, "avx512f",
                         f->avx512f ? Py_True : Py_False, "avx512bw", f->avx512bw ? Py_True : Py_False, "avx512vl",
                         f->avx512vl ? Py_True : Py_False, "avx512dq", f->avx512dq ? Py_True : Py_False,
                         "avx512_bf16", f->avx512bf16 ? Py_True : Py_False, "avx512_vbmi",
                         f->avx512vbmi ? Py_True : Py_False, "avx512_fp16", f->avx512fp16 ? Py_True : Py_False,
                         "avx512_vnni", f->avx512vnni ? Py_True : Py_False);
}

static PyObject *py_build_info(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    PyObject *feat = features_dict();
    if (!feat) return NULL;
    PyObject *r = Py_BuildValue("{s:s,s:s,s:s,s:N,s:s,s:O,s:s}", "version", VTINFER_VERSION_STRING, "isa",
                                vt_isa_name(vt_isa_active()), "isa_best", vt_isa_name(vt_isa_best()), "cpu_features",
                                feat, "compiler", vt_compiler_string(), "cuda_built",
                                VTINFER_CUDA_BUILT ? Py_True : Py_False, "numpy_build_api", "2.0");
    return r;
}

static PyObject *py_dtype_table(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    PyObject *t = PyTuple_New(VT_DTYPE_COUNT);
    if (!t) return NULL;
    for (int d = 0; d < VT_DTYPE_COUNT; d++) {
        const vt_dtype_info *i = vt_dtype_get(d);
        Py_ssize_t nflags = 0;
        while (i->flags[nflags]) nflags++;
        PyObject *flags = PyTuple_New(nflags);
        if (!flags) goto fail;
        for (Py_ssize_t k = 0; k < nflags; k++) {
            PyObject *s = PyUnicode_FromString(i->flags[k]);
            if (!s) {
                Py_DECREF(flags);
                goto fail;
            }
            PyTuple_SET_ITEM(flags, k, s);
        }
        static const char *const scale_kinds[] = {"none", "tensor", "token_head", "slot"};
        static const char *const layouts[] = {"dense", "scale_planes", "slots"};
        static const char *const key_bases[] = {"model", "hadamard"};
        const vt_dtype_info *code = i->code_dtype >= 0 ? vt_dtype_get(i->code_dtype) : NULL;
        PyObject *row = Py_BuildValue(
            "{s:i,s:s,s:s,s:N,s:n,s:O,s:d,s:i,s:i,s:i,s:O,s:z,s:s,s:d,s:d,s:s,s:i,s:i,s:O,s:s,s:s,s:O,s:i,s:s,s:i,s:O,s:O,s:O}", "id", d, "name", i->name,
            "numpy_name", i->numpy_name, "flags", flags, "elem_bytes", (Py_ssize_t)i->elem_bytes, "is_fp8",
            i->is_fp8 ? Py_True : Py_False, "max_finite", i->max_finite, "exponent_bits", i->exponent_bits,
            "mantissa_bits", i->mantissa_bits, "elem_bits", i->elem_bits, "is_int", i->is_int ? Py_True : Py_False,
            "code_dtype", code ? code->name : NULL, "scale_kind", scale_kinds[i->scale_kind], "quant_max",
            (double)i->quant_max, "quant_min", (double)i->quant_min, "page_layout", layouts[i->page_layout], "key_bits", i->key_bits,
            "value_bits", i->value_bits, "norm_correction", i->norm_correction ? Py_True : Py_False, "family",
            i->family, "query_dtype", vt_dtype_get(i->query_dtype)->name, "needs_codebook",
            vt_dtype_needs_codebook(d) ? Py_True : Py_False, "rope_block", i->rope_block, "key_basis",
            key_bases[i->key_basis], "boundary_layers", i->boundary_layers, "pair_dot",
            i->pair_dot ? Py_True : Py_False, "causal_only", i->causal_only ? Py_True : Py_False,
            "global_scale", i->global_scale ? Py_True : Py_False);
        if (!row) goto fail;
        PyTuple_SET_ITEM(t, d, row);
    }
    return t;
fail:
    Py_DECREF(t);
    return NULL;
}

static PyObject *py_kv_cache_flags(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    size_t n = vt_kv_cache_flag_count();
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (!t) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(vt_kv_cache_flag(i));
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, s);
    }
    return t;
}

static PyObject *py_set_isa(PyObject *m, PyObject *arg) {
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!name) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "set_isa: isa must be a str; got %s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    vt_isa isa;
    if (strcmp(name, "scalar") == 0) isa = VT_ISA_SCALAR;
    else if (strcmp(name, "avx2") == 0) isa = VT_ISA_AVX2;
    else if (strcmp(name, "avx512") == 0) isa = VT_ISA_AVX512;
    else {
        PyErr_Format(PyExc_ValueError, "set_isa: isa must be 'scalar', 'avx2' or 'avx512'; got '%.32s'", name);
        return NULL;
    }
    vt_error err;
    if (vt_isa_set(isa, &err) != VT_OK) return vt_raise(vt_state(m), &err);
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *m, PyObject *unused) {
    (void)m, (void)unused;
    return PyUnicode_FromString(vt_isa_name(vt_isa_active()));
}

/* _C._bench_copy(dst, src, num_threads): memcpy of src's bytes into dst,
 * split over threads like the codecs split their work. The benchmarks'
 * same-run bandwidth reference; not public API. */
typedef struct copy_job { char *dst; const char *src; size_t n; } copy_job;

static void copy_task(void *ctx, int ith, int nth) {
    const copy_job *j = ctx;
    size_t b, e;
    vt_split_range(j->n, 4096, ith, nth, &b, &e);
    if (b < e) memcpy(j->dst + b, j->src + b, e - b);
}

VT_SIGNATURE(slot_bytes_sig, "dtype_slot_bytes", VT_SLOT_BYTES_NPOS, VT_SLOT_BYTES_ARGS);
VT_SIGNATURE(head_rule_sig, "dtype_head_size_error", VT_HEAD_RULE_NPOS, VT_HEAD_RULE_ARGS);
VT_SIGNATURE(bench_copy_sig, "_bench_copy", VT_BENCH_COPY_NPOS, VT_BENCH_COPY_ARGS);

static PyObject *py_bench_copy(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&bench_copy_sig, args, kw, a) < 0) return NULL;
    PyObject *dst_obj = a[0], *src_obj = a[1], *nt_obj = vt_arg_or_none(a[2]);
    vt_module_state *st = vt_state(m);
    int nth = vt_num_threads_arg(nt_obj, "_bench_copy");
    if (nth < 0) return NULL;
    vt_tensor d, s;
    if (vt_tensor_from_object(st, dst_obj, "_bench_copy", "dst", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT, &d) < 0)
        return NULL;
    if (vt_tensor_from_object(st, src_obj, "_bench_copy", "src", VT_TENSOR_NO_CONVERT, &s) < 0) {
        vt_tensor_release(&d);
        return NULL;
    }
    int64_t dn = vt_tensor_numel(&d, "_bench_copy", "dst"), sn = vt_tensor_numel(&s, "_bench_copy", "src");
    if (dn < 0 || sn < 0 || !vt_tensor_is_contiguous(&d) || !vt_tensor_is_contiguous(&s) ||
        (size_t)dn * d.itemsize < (size_t)sn * s.itemsize || vt_tensor_share_elements(&d, &s)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "_bench_copy: dst and src must be contiguous, disjoint, dst large enough");
        vt_tensor_release(&d);
        vt_tensor_release(&s);
        return NULL;
    }
    copy_job j = {d.data, s.data, (size_t)sn * s.itemsize};
    Py_BEGIN_ALLOW_THREADS
    vt_parallel_for(copy_task, &j, nth);
    Py_END_ALLOW_THREADS
    vt_tensor_release(&d);
    vt_tensor_release(&s);
    Py_RETURN_NONE;
}

/* The (dtype name, head_size > 0) pair the dtype helpers take; -1 with an exception set. */
static int dtype_and_head(PyObject *const *a, const char *fn, int *id, int64_t *d) {
    const char *name = PyUnicode_Check(a[0]) ? PyUnicode_AsUTF8(a[0]) : NULL;
    if (!name) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s: dtype must be a str; got %s", fn, Py_TYPE(a[0])->tp_name);
        return -1;
    }
    if (vt_int_arg(a[1], fn, "head_size", INT64_MIN, INT64_MAX, d) < 0) return -1;
    vt_error err;
    if (vt_dtype_from_name(name, "dtype", id, &err) != VT_OK) {
        PyErr_Format(PyExc_ValueError, "%s: %s", fn, err.message);
        return -1;
    }
    if (*d <= 0) {
        PyErr_Format(PyExc_ValueError, "%s: head_size must be > 0; got %lld", fn, (long long)*d);
        return -1;
    }
    return 0;
}

static PyObject *py_dtype_slot_bytes(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    PyObject *a[VT_SIG_MAX_ARGS];
    int id;
    int64_t d;
    if (vt_sig_parse(&slot_bytes_sig, args, kw, a) < 0 || dtype_and_head(a, "dtype_slot_bytes", &id, &d) < 0)
        return NULL;
    int64_t r = d; /* no rope_dim: every dim rotary, vLLM's rule without a partial_rotary_factor */
    if (a[2] && a[2] != Py_None && vt_int_arg(a[2], "dtype_slot_bytes", "rope_dim", INT64_MIN, INT64_MAX, &r) < 0)
        return NULL;
    const vt_dtype_info *t = id < 0 ? NULL : vt_dtype_get(id);
    if (t && t->rope_block > 0 && (r < 0 || r > d || r % t->rope_block != 0)) {
        PyErr_Format(PyExc_ValueError, "dtype_slot_bytes: rope_dim must be a multiple of %d in [0, head_size = %lld] "
                     "for dtype '%s'; got %lld", t->rope_block, (long long)d, t->name, (long long)r);
        return NULL;
    }
    return PyLong_FromSize_t(t ? vt_dtype_slot_bytes_rope(id, (size_t)d, (size_t)r) : 0);
}

static PyObject *py_dtype_head_size_error(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    PyObject *a[VT_SIG_MAX_ARGS];
    int id;
    int64_t d;
    if (vt_sig_parse(&head_rule_sig, args, kw, a) < 0 || dtype_and_head(a, "dtype_head_size_error", &id, &d) < 0)
        return NULL;
    vt_error err;
    if (id < 0 || vt_dtype_check_head_size(id, d, "dtype_head_size_error", "head_size", "dtype", &err) == VT_OK)
        Py_RETURN_NONE;
    return PyUnicode_FromString(err.message);
}

static char slot_bytes_doc[256], head_rule_doc[256], bench_copy_doc[256];

static PyMethodDef info_methods[] = {
    {"dtype_slot_bytes", (PyCFunction)(void (*)(void))py_dtype_slot_bytes, METH_VARARGS | METH_KEYWORDS,
     slot_bytes_doc},
    {"dtype_head_size_error", (PyCFunction)(void (*)(void))py_dtype_head_size_error, METH_VARARGS | METH_KEYWORDS,
     head_rule_doc},
    {"_bench_copy", (PyCFunction)(void (*)(void))py_bench_copy, METH_VARARGS | METH_KEYWORDS, bench_copy_doc},
    {"build_info", py_build_info, METH_NOARGS,
     "build_info($module, /)\n--\n\nVersion, ISA chosen, CPU features, compiler, whether the CUDA arm was built."},
    {"dtype_table", py_dtype_table, METH_NOARGS, "dtype_table($module, /)\n--\n\nThe C dtype table, one dict per dtype."},
    {"kv_cache_flags", py_kv_cache_flags, METH_NOARGS,
     "kv_cache_flags($module, /)\n--\n\nThe --kv-cache-dtype values of the dtype table, 'auto' first."},
    {"set_isa", py_set_isa, METH_O,
     "set_isa($module, isa, /)\n--\n\nSelect the kernels of 'scalar', 'avx2' or 'avx512' (no higher than the CPU allows). "
     "Not thread-safe against running kernels: for tests and benchmarks."},
    {"isa", py_isa, METH_NOARGS, "isa($module, /)\n--\n\nThe active instruction set."},
    {NULL, NULL, 0, NULL},
};

int vt_info_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&slot_bytes_sig, "Slot bytes of a slot format (vLLM's slot_size_aligned / slot_size); 0 for "
                     "other dtypes.", slot_bytes_doc, sizeof slot_bytes_doc);
    vt_signature_doc(&head_rule_sig, "None when the dtype stores head rows of head_size elements, else its geometry "
                     "rule's message.", head_rule_doc, sizeof head_rule_doc);
    vt_signature_doc(&bench_copy_sig, "Threaded memcpy of src into dst (benchmarks only).", bench_copy_doc,
                     sizeof bench_copy_doc);
    return PyModule_AddFunctions(m, info_methods);
}
