/* vLLM's cache gathers (csrc/core/cache_ops.c):
 *
 *   _C.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
 *                                     kv_cache_dtype, scale, seq_starts=None, *, num_threads=None)
 *   _C.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None, *,
 *                      num_threads=None)
 */
#include "vt_cacheops.h"
#include "vt_signature.h"

VT_SIGNATURE(gather_sig, "gather_and_maybe_dequant_cache", VT_GATHER_NPOS, VT_GATHER_ARGS);
VT_SIGNATURE(cp_gather_sig, "cp_gather_cache", VT_CP_GATHER_NPOS, VT_CP_GATHER_ARGS);

/* -------------------------------------------------------------- gather */

/* Describe the entries [*entries] of a cache (from dim `first`) as rows of
 * a contiguous last dimension: rows, row_len, row stride. */
static int entry_rows(const vt_tensor *t, int first, const char *fn, const char *arg, int64_t *rows,
                      int64_t *row_len, int64_t *row_stride) {
    if (vt_co_last_dim_ok(t, fn, arg) < 0) return -1;
    *row_len = t->shape[t->ndim - 1];
    *rows = 1;
    *row_stride = 0;
    for (int i = t->ndim - 2; i >= first; i--) {
        if (t->shape[i] == 1) continue;
        if (*rows == 1) {
            *row_stride = t->strides[i];
        } else if (t->strides[i] != *row_stride * *rows) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have entry dimensions that collapse to rows of its last "
                         "dimension (dimension %d has stride %lld)", fn, arg, i, (long long)t->strides[i]);
            return -1;
        }
        *rows *= t->shape[i];
    }
    return 0;
}

/* One gather call: its scalars and pinned arrays (tts, ss NULL when absent). */
typedef struct gather_call {
    const char *fn;
    int dequant, fmt, nth;
    int64_t count; /* num_tokens (dequant) or batch_size */
    float scale;
    vt_co_pins p;
    vt_tensor *sc, *dst, *bt, *cu, *tts, *ss;
} gather_call;

static int parse_and_pin(vt_module_state *st, gather_call *g, PyObject *args, PyObject *kw) {
    const char *fn = g->fn;
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(g->dequant ? &gather_sig : &cp_gather_sig, args, kw, a) < 0) return -1;
    PyObject *sc_obj = a[0], *dst_obj = a[1], *bt_obj = a[2], *cu_obj = a[3];
    PyObject *tts_obj = Py_None, *n_obj, *dt_obj = Py_None, *scale_obj = Py_None, *ss_obj, *nt_obj;
    if (g->dequant) {
        tts_obj = a[4], n_obj = a[5], dt_obj = a[6], scale_obj = a[7];
        ss_obj = vt_arg_or_none(a[8]), nt_obj = vt_arg_or_none(a[9]);
    } else {
        n_obj = a[4], ss_obj = vt_arg_or_none(a[5]), nt_obj = vt_arg_or_none(a[6]);
    }
    if (vt_co_parse_int(n_obj, fn, g->dequant ? "num_tokens" : "batch_size", 0, &g->count) < 0) return -1;
    if (g->dequant && vt_co_parse_fp8_name(dt_obj, fn, "kv_cache_dtype", &g->fmt) < 0) return -1;
    if (g->dequant && scale_obj != Py_None && vt_co_parse_scale(scale_obj, fn, "scale", &g->scale) < 0) return -1;
    if ((g->nth = vt_num_threads_arg(nt_obj, fn)) < 0) return -1;
    vt_co_pins *p = &g->p;
    if (!(g->sc = vt_co_pin(st, p, sc_obj, fn, "src_cache", VT_TENSOR_NO_CONVERT, VT_CO_ALL_ELEMS, -1)) ||
        !(g->dst = vt_co_pin(st, p, dst_obj, fn, "dst", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, VT_CO_ALL_ELEMS,
                             -1)) ||
        !(g->bt = vt_co_pin_index(st, p, bt_obj, fn, "block_table", 2)) ||
        !(g->cu = vt_co_pin_index(st, p, cu_obj, fn, "cu_seq_lens", 1)))
        return -1;
    if (g->dequant && !(g->tts = vt_co_pin_index(st, p, tts_obj, fn, "token_to_seq", 1))) return -1;
    if (ss_obj != Py_None && !(g->ss = vt_co_pin_index(st, p, ss_obj, fn, "seq_starts", 1))) return -1;
    return 0;
}

/* The cache and dst ranks and entry shapes. */
static int check_entry_shapes(const gather_call *g) {
    const char *fn = g->fn;
    const vt_tensor *sc = g->sc, *dst = g->dst;
    if (sc->ndim < 3) {
        PyErr_Format(PyExc_ValueError, "%s: src_cache must have >= 3 dimensions [num_blocks, block_size, ...]; got %d",
                     fn, sc->ndim);
        return -1;
    }
    if (dst->ndim != sc->ndim - 1) {
        PyErr_Format(PyExc_ValueError, "%s: dst must have %d dimensions [tokens, ...entry]; got %d", fn, sc->ndim - 1,
                     dst->ndim);
        return -1;
    }
    for (int i = 1; i < dst->ndim; i++)
        if (dst->shape[i] != sc->shape[i + 1]) {
            PyErr_Format(PyExc_ValueError, "%s: dst must have src_cache's entry shape; dimension %d is %lld, not %lld",
                         fn, i, (long long)dst->shape[i], (long long)sc->shape[i + 1]);
            return -1;
        }
    return 0;
}

/* The index arrays' lengths against the batch (*batch: its size). */
static int check_index_lengths(const gather_call *g, int64_t *batch) {
    const char *fn = g->fn;
    const int64_t b = g->dequant ? g->cu->shape[0] - 1 : g->count, count = g->count;
    if (g->cu->shape[0] < b + 1 || b < 0) {
        PyErr_Format(PyExc_ValueError, "%s: cu_seq_lens must have %s + 1 = %lld elements; got %lld", fn,
                     g->dequant ? "batch" : "batch_size", (long long)(b + 1), (long long)g->cu->shape[0]);
        return -1;
    }
    if (g->bt->shape[0] < b) {
        PyErr_Format(PyExc_ValueError, "%s: block_table must have at least %lld rows (one per sequence); got %lld", fn,
                     (long long)b, (long long)g->bt->shape[0]);
        return -1;
    }
    if (g->tts && g->tts->shape[0] < count) {
        PyErr_Format(PyExc_ValueError, "%s: token_to_seq must have at least num_tokens = %lld elements; got %lld", fn,
                     (long long)count, (long long)g->tts->shape[0]);
        return -1;
    }
    if (g->ss && g->ss->shape[0] < b) {
        PyErr_Format(PyExc_ValueError, "%s: seq_starts must have at least %lld elements (one per sequence); got %lld",
                     fn, (long long)b, (long long)g->ss->shape[0]);
        return -1;
    }
    if (g->bt->strides[0] % 4) {
        PyErr_Format(PyExc_ValueError, "%s: block_table must have a row stride that is a multiple of 4 bytes", fn);
        return -1;
    }
    *batch = b;
    return 0;
}

/* The source and destination dtypes the core converts between. */
static int resolve_dtypes(const gather_call *g, int *sd, int *dd) {
    const char *fn = g->fn;
    const vt_tensor *sc = g->sc, *dst = g->dst;
    const int fmt = g->fmt;
    if (vt_co_is_code(sc->elem) && fmt != VT_DTYPE_AUTO) {
        if (vt_co_code_fmt(sc, fmt, fn, "src_cache", "kv_cache_dtype") < 0) return -1;
        if (!(VT_ELEMS_FLOAT & VT_ELEM_BIT(dst->elem))) {
            PyErr_Format(PyExc_TypeError, "%s: dst must have dtype float32, float16 or bfloat16 for an fp8 cache; "
                         "got %s", fn, dst->dtype_name);
            return -1;
        }
        *sd = fmt;
        *dd = (int)dst->elem;
        return 0;
    }
    if (fmt != VT_DTYPE_AUTO) {
        PyErr_Format(PyExc_TypeError, "%s: src_cache must hold fp8 codes (uint8 or float8) for kv_cache_dtype "
                     "'%s'; got %s", fn, vt_dtype_get(fmt)->name, sc->dtype_name);
        return -1;
    }
    if (sc->elem != dst->elem) {
        PyErr_Format(PyExc_TypeError, "%s: dst must have src_cache's dtype %s; got %s", fn, sc->dtype_name,
                     dst->dtype_name);
        return -1;
    }
    /* plain copy: code arrays move as bytes (the dtype table's fp8 id keeps the element size) */
    *sd = *dd = vt_co_is_code(sc->elem) ? VT_DTYPE_FP8_E4M3 : (int)sc->elem;
    return 0;
}

/* Every check, then the params. */
static int fill_params(gather_call *g, vt_gather_cache_params *gp) {
    const char *fn = g->fn;
    const vt_tensor *sc = g->sc, *dst = g->dst, *bt = g->bt;
    int64_t batch, rows, row_len, srow, drows, drow_len, drow;
    int sd, dd;
    if (check_entry_shapes(g) < 0 || check_index_lengths(g, &batch) < 0 || resolve_dtypes(g, &sd, &dd) < 0 ||
        entry_rows(sc, 2, fn, "src_cache", &rows, &row_len, &srow) < 0 ||
        entry_rows(dst, 1, fn, "dst", &drows, &drow_len, &drow) < 0 ||
        vt_co_no_overlap(dst, "dst", sc, "src_cache", fn) < 0)
        return -1;
    *gp = (vt_gather_cache_params){
        .fn = fn, .src = sc->data, .src_dtype = (vt_dtype)sd, .num_blocks = sc->shape[0],
        .block_size = sc->shape[1], .entry_rows = rows, .row_len = row_len, .src_stride_block = sc->strides[0],
        .src_stride_tok = sc->strides[1], .src_stride_row = srow, .dst = dst->data, .dst_dtype = (vt_dtype)dd,
        .dst_tokens = dst->shape[0], .dst_stride_tok = dst->strides[0], .dst_stride_row = drow, .batch = batch,
        .cu_seq_lens = (const int32_t *)g->cu->data, .block_table = (const int32_t *)bt->data,
        .max_blocks = bt->shape[1], .bt_stride = bt->strides[0] / 4,
        .seq_starts = g->ss ? (const int32_t *)g->ss->data : NULL,
        .token_to_seq = g->tts ? (const int32_t *)g->tts->data : NULL, .num_tokens = g->count,
        .scale = g->dequant ? &g->scale : NULL,
    };
    return 0;
}

static PyObject *gather_common(PyObject *m, PyObject *args, PyObject *kw, int dequant) {
    vt_module_state *st = vt_state(m);
    gather_call g = {.fn = dequant ? "gather_and_maybe_dequant_cache" : "cp_gather_cache", .dequant = dequant,
                     .fmt = VT_DTYPE_AUTO, .scale = 1.0f};
    vt_gather_cache_params gp;
    if (parse_and_pin(st, &g, args, kw) < 0 || fill_params(&g, &gp) < 0) {
        vt_co_pins_release(&g.p);
        return NULL;
    }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_gather_cache(&gp, g.nth, &err);
    Py_END_ALLOW_THREADS
    return vt_co_done(st, &g.p, s, &err);
}

static PyObject *py_gather_and_maybe_dequant_cache(PyObject *m, PyObject *args, PyObject *kw) {
    return gather_common(m, args, kw, 1);
}

static PyObject *py_cp_gather_cache(PyObject *m, PyObject *args, PyObject *kw) {
    return gather_common(m, args, kw, 0);
}

static char gather_doc[512], cp_gather_doc[512];

static PyMethodDef gather_methods[] = {
    {"gather_and_maybe_dequant_cache", (PyCFunction)(void (*)(void))py_gather_and_maybe_dequant_cache,
     METH_VARARGS | METH_KEYWORDS, gather_doc},
    {"cp_gather_cache", (PyCFunction)(void (*)(void))py_cp_gather_cache, METH_VARARGS | METH_KEYWORDS, cp_gather_doc},
    {NULL, NULL, 0, NULL},
};

int vt_cacheops_gather_exec(PyObject *m) {
    vt_signature_doc(&gather_sig, "Gather paged cache entries of a batch into contiguous rows, dequantizing fp8.",
                     gather_doc, sizeof gather_doc);
    vt_signature_doc(&cp_gather_sig, "Gather paged cache entries of a batch into contiguous rows (same dtype).",
                     cp_gather_doc, sizeof cp_gather_doc);
    return PyModule_AddFunctions(m, gather_methods);
}
