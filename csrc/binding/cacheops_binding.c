/* Python surface of vLLM's cache ops (csrc/core/cache_ops.c), in vLLM's
 * argument order (vllm/_custom_ops.py of the pinned release):
 *
 *   _C.swap_blocks(src, dst, block_size_in_bytes, block_mapping, *, src_extent=None, dst_extent=None,
 *                  num_threads=None)
 *   _C.convert_fp8(output, input, scale=1.0, kv_dtype="fp8", *, num_threads=None)
 *   _C.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
 *                                     kv_cache_dtype, scale, seq_starts=None, *, num_threads=None)
 *   _C.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None, *,
 *                      num_threads=None)
 *   _C.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
 *                        prefill_tokens_with_context=None, output_scale=None, *, num_threads=None)
 *
 * Every check runs before the GIL is released and before any write. */
#include "vt_binding.h"

#include <math.h>
#include <string.h>

#include "vtinfer/cache_ops.h"

/* Up to 8 pinned tensors per call, released together. */
typedef struct pins {
    vt_tensor t[8];
    int n;
} pins;

static void pins_release(pins *p) {
    for (int i = 0; i < p->n; i++) vt_tensor_release(&p->t[i]);
    p->n = 0;
}

/* Pin obj (elem in mask, ndim dims or any when < 0). */
static vt_tensor *pin(vt_module_state *st, pins *p, PyObject *obj, const char *fn, const char *arg, int flags,
                      unsigned mask, int ndim) {
    vt_tensor *t = &p->t[p->n];
    if (vt_tensor_from_object(st, obj, fn, arg, flags, t) < 0) return NULL;
    p->n++;
    if (vt_tensor_check(t, fn, arg, mask, ndim, VT_MEMORY_CPU) < 0) return NULL;
    return t;
}

/* An int32 index array of ndim dims with a contiguous last dimension (a
 * NumPy array without one is copied). */
static vt_tensor *pin_index(vt_module_state *st, pins *p, PyObject *obj, const char *fn, const char *arg, int ndim) {
    vt_tensor *t = pin(st, p, obj, fn, arg, 0, VT_ELEM_BIT(VT_ELEM_I32), ndim);
    if (!t) return NULL;
    if (t->shape[ndim - 1] > 1 && t->strides[ndim - 1] != 4 && vt_tensor_contiguous_input(st, t, fn, arg) < 0)
        return NULL;
    return t;
}

static int last_dim_ok(const vt_tensor *t, const char *fn, const char *arg) {
    if (t->ndim > 0 && t->shape[t->ndim - 1] > 1 && t->strides[t->ndim - 1] != (int64_t)t->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have a contiguous last dimension (stride %zu bytes); got %lld",
                     fn, arg, t->itemsize, (long long)t->strides[t->ndim - 1]);
        return -1;
    }
    return 0;
}

static int no_overlap(const vt_tensor *a, const char *an, const vt_tensor *b, const char *bn, const char *fn) {
    if (a && b && vt_tensor_share_elements(a, b)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must not share elements with %s", fn, an, bn);
        return -1;
    }
    return 0;
}

/* Bytes from t->data to the end of its last element; -1 with ValueError
 * when a stride is negative. */
static int64_t view_extent(const vt_tensor *t, const char *fn, const char *arg) {
    int64_t hi = (int64_t)t->itemsize;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) return 0;
        if (t->strides[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have non-negative strides; got %lld in dimension %d", fn, arg,
                         (long long)t->strides[i], i);
            return -1;
        }
        hi += (t->shape[i] - 1) * t->strides[i];
    }
    return hi;
}

static int parse_int(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t *out) {
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyObject *idx = PyNumber_Check(obj) && !PyFloat_Check(obj) && !PyBool_Check(obj) ? PyNumber_Index(obj) : NULL;
        if (!idx) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: %s must be an int; got %s", fn, arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        long long v = PyLong_AsLongLong(idx);
        Py_DECREF(idx);
        if (v == -1 && PyErr_Occurred()) return -1;
        *out = v;
    } else {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred()) return -1;
        *out = v;
    }
    if (*out < lo) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be >= %lld; got %lld", fn, arg, (long long)lo, (long long)*out);
        return -1;
    }
    return 0;
}

/* A positive finite scale: a number (a one-element array is turned into
 * a float by the Python wrapper). */
static int parse_scale(PyObject *obj, const char *fn, const char *arg, float *out) {
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj))) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a real number; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    float f = (float)v;
    if (!(f > 0.0f) || isinf(f)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be finite and > 0 (as float32); got %R", fn, arg, obj);
        return -1;
    }
    *out = f;
    return 0;
}

/* kv_dtype / kv_cache_dtype: "auto" (VT_DTYPE_AUTO) or an fp8 format. */
static int parse_fp8_name(PyObject *obj, const char *fn, const char *arg, int *out) {
    const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
    if (!s) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a str; got %s", fn, arg, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (strcmp(s, "auto") == 0) {
        *out = VT_DTYPE_AUTO;
        return 0;
    }
    if (strcmp(s, "fp8") == 0 || strcmp(s, "fp8_e4m3") == 0) {
        *out = VT_DTYPE_FP8_E4M3;
        return 0;
    }
    if (strcmp(s, "fp8_e5m2") == 0) {
        *out = VT_DTYPE_FP8_E5M2;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s: %s must be 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'; got '%.64s'", fn, arg, s);
    return -1;
}

static int is_code(vt_elem e) { return e == VT_ELEM_U8 || e == VT_ELEM_E4M3 || e == VT_ELEM_E5M2; }

/* The fp8 format a code array holds under `fmt` (TypeError when an
 * ml_dtypes float8 array names the other one). */
static int code_fmt(const vt_tensor *t, int fmt, const char *fn, const char *arg, const char *flag) {
    int implied = t->elem == VT_ELEM_E4M3 ? VT_DTYPE_FP8_E4M3 : t->elem == VT_ELEM_E5M2 ? VT_DTYPE_FP8_E5M2 : -1;
    if (fmt == VT_DTYPE_AUTO) {
        PyErr_Format(PyExc_TypeError, "%s: %s must name the fp8 format ('fp8', 'fp8_e4m3' or 'fp8_e5m2') for %s of "
                     "dtype %s; got 'auto'", fn, flag, arg, t->dtype_name);
        return -1;
    }
    if (implied >= 0 && implied != fmt) {
        PyErr_Format(PyExc_TypeError, "%s: %s of dtype %s must be read with %s '%s'; got '%s'", fn, arg,
                     t->dtype_name, flag, implied == VT_DTYPE_FP8_E4M3 ? "fp8_e4m3" : "fp8_e5m2",
                     fmt == VT_DTYPE_FP8_E4M3 ? "fp8_e4m3" : "fp8_e5m2");
        return -1;
    }
    return 0;
}

static PyObject *done(vt_module_state *st, pins *p, vt_status s, const vt_error *err) {
    pins_release(p);
    if (s != VT_OK) return vt_raise(st, err);
    Py_RETURN_NONE;
}

#define ALL_ELEMS (VT_ELEMS_FLOAT | VT_ELEMS_CODES)

/* ---------------------------------------------------------------- swap */

static PyObject *py_swap_blocks(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "swap_blocks";
    static char *kwlist[] = {"src", "dst", "block_size_in_bytes", "block_mapping", "src_extent", "dst_extent",
                             "num_threads", NULL};
    vt_module_state *st = vt_state(m);
    PyObject *src_obj, *dst_obj, *bb_obj, *map_obj, *se_obj = Py_None, *de_obj = Py_None, *nt_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$OOO:swap_blocks", kwlist, &src_obj, &dst_obj, &bb_obj,
                                     &map_obj, &se_obj, &de_obj, &nt_obj))
        return NULL;
    int64_t bb;
    int nth;
    if (parse_int(bb_obj, fn, "block_size_in_bytes", 1, &bb) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    pins p = {.n = 0};
    vt_tensor *src, *dst, *map;
    const unsigned any = ALL_ELEMS | VT_ELEM_BIT(VT_ELEM_I32) | VT_ELEM_BIT(VT_ELEM_I64) | VT_ELEM_BIT(VT_ELEM_F64);
    if (!(src = pin(st, &p, src_obj, fn, "src", VT_TENSOR_NO_CONVERT, any, -1)) ||
        !(dst = pin(st, &p, dst_obj, fn, "dst", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, any, -1)) ||
        !(map = pin(st, &p, map_obj, fn, "block_mapping", 0, VT_ELEM_BIT(VT_ELEM_I64), 2)))
        goto fail;
    if (map->shape[1] != 2) {
        PyErr_Format(PyExc_ValueError, "%s: block_mapping must have shape (num_pairs, 2); got (%lld, %lld)", fn,
                     (long long)map->shape[0], (long long)map->shape[1]);
        goto fail;
    }
    if (map->strides[0] % 8 || map->strides[1] % 8) {
        PyErr_Format(PyExc_ValueError, "%s: block_mapping must have strides that are multiples of 8 bytes", fn);
        goto fail;
    }
    int64_t se = view_extent(src, fn, "src"), de = view_extent(dst, fn, "dst");
    if (se < 0 || de < 0) goto fail;
    if (se_obj != Py_None && parse_int(se_obj, fn, "src_extent", se, &se) < 0) goto fail;
    if (de_obj != Py_None && parse_int(de_obj, fn, "dst_extent", de, &de) < 0) goto fail;
    vt_swap_blocks_params sp = {
        .fn = fn, .src = src->data, .src_extent = se, .dst = dst->data, .dst_extent = de, .block_bytes = bb,
        .block_mapping = (const int64_t *)map->data, .num_pairs = map->shape[0],
        .map_stride_pair = map->strides[0] / 8, .map_stride_col = map->strides[1] / 8,
    };
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_swap_blocks(&sp, nth, &err);
    Py_END_ALLOW_THREADS
    return done(st, &p, s, &err);
fail:
    pins_release(&p);
    return NULL;
}

/* --------------------------------------------------------- convert_fp8 */

static PyObject *py_convert_fp8(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "convert_fp8";
    static char *kwlist[] = {"output", "input", "scale", "kv_dtype", "num_threads", NULL};
    vt_module_state *st = vt_state(m);
    PyObject *o_obj, *i_obj, *scale_obj = NULL, *dt_obj = NULL, *nt_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO$O:convert_fp8", kwlist, &o_obj, &i_obj, &scale_obj, &dt_obj,
                                     &nt_obj))
        return NULL;
    float scale = 1.0f;
    int fmt = VT_DTYPE_FP8_E4M3, nth;
    if (scale_obj && parse_scale(scale_obj, fn, "scale", &scale) < 0) return NULL;
    if (dt_obj && parse_fp8_name(dt_obj, fn, "kv_dtype", &fmt) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    pins p = {.n = 0};
    vt_tensor *out, *in;
    if (!(out = pin(st, &p, o_obj, fn, "output", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, ALL_ELEMS, -1)) ||
        !(in = pin(st, &p, i_obj, fn, "input", 0, ALL_ELEMS, -1)))
        goto fail;
    if (in->ndim != out->ndim) {
        PyErr_Format(PyExc_ValueError, "%s: input must have output's %d dimensions; got %d", fn, out->ndim, in->ndim);
        goto fail;
    }
    for (int i = 0; i < in->ndim; i++)
        if (in->shape[i] != out->shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: input must have output's shape; dimension %d is %lld, not %lld", fn, i,
                         (long long)in->shape[i], (long long)out->shape[i]);
            goto fail;
        }
    if (is_code(out->elem) == is_code(in->elem) && is_code(in->elem)) {
        PyErr_Format(PyExc_TypeError, "%s: output and input must not both be fp8 codes; got %s and %s", fn,
                     out->dtype_name, in->dtype_name);
        goto fail;
    }
    if (is_code(out->elem) && code_fmt(out, fmt, fn, "output", "kv_dtype") < 0) goto fail;
    if (is_code(in->elem) && code_fmt(in, fmt, fn, "input", "kv_dtype") < 0) goto fail;
    if (!vt_tensor_is_contiguous(out)) {
        PyErr_Format(PyExc_ValueError, "%s: output must be C-contiguous", fn);
        goto fail;
    }
    if (vt_tensor_contiguous_input(st, in, fn, "input") < 0) goto fail;
    if (no_overlap(out, "output", in, "input", fn) < 0) goto fail;
    int64_t n = vt_tensor_numel(in, fn, "input");
    if (n < 0) goto fail;
    int sd = is_code(in->elem) ? fmt : (int)in->elem, dd = is_code(out->elem) ? fmt : (int)out->elem;
    vt_convert_fp8_params cp = {.fn = fn, .src = in->data, .src_dtype = (vt_dtype)sd, .dst = out->data,
                                .dst_dtype = (vt_dtype)dd, .n = (size_t)n, .scale = scale,
                                .fmt = (vt_dtype)(fmt == VT_DTYPE_AUTO ? VT_DTYPE_FP8_E4M3 : fmt)};
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_convert_fp8(&cp, nth, &err);
    Py_END_ALLOW_THREADS
    return done(st, &p, s, &err);
fail:
    pins_release(&p);
    return NULL;
}

/* -------------------------------------------------------------- gather */

/* Describe the entries [*entries] of a cache (from dim `first`) as rows of
 * a contiguous last dimension: rows, row_len, row stride. */
static int entry_rows(const vt_tensor *t, int first, const char *fn, const char *arg, int64_t *rows,
                      int64_t *row_len, int64_t *row_stride) {
    if (last_dim_ok(t, fn, arg) < 0) return -1;
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

static PyObject *gather_common(PyObject *m, PyObject *args, PyObject *kw, int dequant) {
    const char *fn = dequant ? "gather_and_maybe_dequant_cache" : "cp_gather_cache";
    static char *kw_dq[] = {"src_cache", "dst", "block_table", "cu_seq_lens", "token_to_seq", "num_tokens",
                            "kv_cache_dtype", "scale", "seq_starts", "num_threads", NULL};
    static char *kw_cp[] = {"src_cache", "dst", "block_table", "cu_seq_lens", "batch_size", "seq_starts",
                            "num_threads", NULL};
    vt_module_state *st = vt_state(m);
    PyObject *sc_obj, *dst_obj, *bt_obj, *cu_obj, *tts_obj = Py_None, *n_obj = Py_None, *dt_obj = Py_None,
                                                  *scale_obj = Py_None, *ss_obj = Py_None, *nt_obj = Py_None;
    int ok = dequant ? PyArg_ParseTupleAndKeywords(args, kw, "OOOOOOOO|O$O:gather_and_maybe_dequant_cache", kw_dq,
                                                   &sc_obj, &dst_obj, &bt_obj, &cu_obj, &tts_obj, &n_obj, &dt_obj,
                                                   &scale_obj, &ss_obj, &nt_obj)
                     : PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|O$O:cp_gather_cache", kw_cp, &sc_obj, &dst_obj,
                                                   &bt_obj, &cu_obj, &n_obj, &ss_obj, &nt_obj);
    if (!ok) return NULL;
    int64_t count;
    int fmt = VT_DTYPE_AUTO, nth;
    float scale = 1.0f;
    if (parse_int(n_obj, fn, dequant ? "num_tokens" : "batch_size", 0, &count) < 0) return NULL;
    if (dequant && parse_fp8_name(dt_obj, fn, "kv_cache_dtype", &fmt) < 0) return NULL;
    if (dequant && scale_obj != Py_None && parse_scale(scale_obj, fn, "scale", &scale) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    pins p = {.n = 0};
    vt_tensor *sc, *dst, *bt, *cu, *tts = NULL, *ss = NULL;
    if (!(sc = pin(st, &p, sc_obj, fn, "src_cache", VT_TENSOR_NO_CONVERT, ALL_ELEMS, -1)) ||
        !(dst = pin(st, &p, dst_obj, fn, "dst", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, ALL_ELEMS, -1)) ||
        !(bt = pin_index(st, &p, bt_obj, fn, "block_table", 2)) ||
        !(cu = pin_index(st, &p, cu_obj, fn, "cu_seq_lens", 1)))
        goto fail;
    if (dequant && !(tts = pin_index(st, &p, tts_obj, fn, "token_to_seq", 1))) goto fail;
    if (ss_obj != Py_None && !(ss = pin_index(st, &p, ss_obj, fn, "seq_starts", 1))) goto fail;
    if (sc->ndim < 3) {
        PyErr_Format(PyExc_ValueError, "%s: src_cache must have >= 3 dimensions [num_blocks, block_size, ...]; got %d",
                     fn, sc->ndim);
        goto fail;
    }
    if (dst->ndim != sc->ndim - 1) {
        PyErr_Format(PyExc_ValueError, "%s: dst must have %d dimensions [tokens, ...entry]; got %d", fn, sc->ndim - 1,
                     dst->ndim);
        goto fail;
    }
    for (int i = 1; i < dst->ndim; i++)
        if (dst->shape[i] != sc->shape[i + 1]) {
            PyErr_Format(PyExc_ValueError, "%s: dst must have src_cache's entry shape; dimension %d is %lld, not %lld",
                         fn, i, (long long)dst->shape[i], (long long)sc->shape[i + 1]);
            goto fail;
        }
    int64_t batch = dequant ? cu->shape[0] - 1 : count;
    if (cu->shape[0] < batch + 1 || batch < 0) {
        PyErr_Format(PyExc_ValueError, "%s: cu_seq_lens must have %s + 1 = %lld elements; got %lld", fn,
                     dequant ? "batch" : "batch_size", (long long)(batch + 1), (long long)cu->shape[0]);
        goto fail;
    }
    if (bt->shape[0] < batch) {
        PyErr_Format(PyExc_ValueError, "%s: block_table must have at least %lld rows (one per sequence); got %lld", fn,
                     (long long)batch, (long long)bt->shape[0]);
        goto fail;
    }
    if (tts && tts->shape[0] < count) {
        PyErr_Format(PyExc_ValueError, "%s: token_to_seq must have at least num_tokens = %lld elements; got %lld", fn,
                     (long long)count, (long long)tts->shape[0]);
        goto fail;
    }
    if (ss && ss->shape[0] < batch) {
        PyErr_Format(PyExc_ValueError, "%s: seq_starts must have at least %lld elements (one per sequence); got %lld",
                     fn, (long long)batch, (long long)ss->shape[0]);
        goto fail;
    }
    int sd, dd;
    if (is_code(sc->elem) && fmt != VT_DTYPE_AUTO) {
        if (code_fmt(sc, fmt, fn, "src_cache", "kv_cache_dtype") < 0) goto fail;
        if (!(VT_ELEMS_FLOAT & VT_ELEM_BIT(dst->elem))) {
            PyErr_Format(PyExc_TypeError, "%s: dst must have dtype float32, float16 or bfloat16 for an fp8 cache; "
                         "got %s", fn, dst->dtype_name);
            goto fail;
        }
        sd = fmt;
        dd = (int)dst->elem;
    } else {
        if (fmt != VT_DTYPE_AUTO) {
            PyErr_Format(PyExc_TypeError, "%s: src_cache must hold fp8 codes (uint8 or float8) for kv_cache_dtype "
                         "'%s'; got %s", fn, fmt == VT_DTYPE_FP8_E4M3 ? "fp8_e4m3" : "fp8_e5m2", sc->dtype_name);
            goto fail;
        }
        if (sc->elem != dst->elem) {
            PyErr_Format(PyExc_TypeError, "%s: dst must have src_cache's dtype %s; got %s", fn, sc->dtype_name,
                         dst->dtype_name);
            goto fail;
        }
        /* plain copy: code arrays move as bytes (the dtype table's fp8 id keeps the element size) */
        sd = dd = is_code(sc->elem) ? VT_DTYPE_FP8_E4M3 : (int)sc->elem;
    }
    int64_t rows, row_len, srow, drows, drow_len, drow;
    if (entry_rows(sc, 2, fn, "src_cache", &rows, &row_len, &srow) < 0 ||
        entry_rows(dst, 1, fn, "dst", &drows, &drow_len, &drow) < 0)
        goto fail;
    if (no_overlap(dst, "dst", sc, "src_cache", fn) < 0) goto fail;
    vt_gather_cache_params gp = {
        .fn = fn, .src = sc->data, .src_dtype = (vt_dtype)sd, .num_blocks = sc->shape[0],
        .block_size = sc->shape[1], .entry_rows = rows, .row_len = row_len, .src_stride_block = sc->strides[0],
        .src_stride_tok = sc->strides[1], .src_stride_row = srow, .dst = dst->data, .dst_dtype = (vt_dtype)dd,
        .dst_tokens = dst->shape[0], .dst_stride_tok = dst->strides[0], .dst_stride_row = drow, .batch = batch,
        .cu_seq_lens = (const int32_t *)cu->data, .block_table = (const int32_t *)bt->data,
        .max_blocks = bt->shape[1], .bt_stride = bt->strides[0] / 4,
        .seq_starts = ss ? (const int32_t *)ss->data : NULL, .token_to_seq = tts ? (const int32_t *)tts->data : NULL,
        .num_tokens = count, .scale = dequant ? &scale : NULL,
    };
    if (bt->strides[0] % 4) {
        PyErr_Format(PyExc_ValueError, "%s: block_table must have a row stride that is a multiple of 4 bytes", fn);
        goto fail;
    }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_gather_cache(&gp, nth, &err);
    Py_END_ALLOW_THREADS
    return done(st, &p, s, &err);
fail:
    pins_release(&p);
    return NULL;
}

static PyObject *py_gather_and_maybe_dequant_cache(PyObject *m, PyObject *args, PyObject *kw) {
    return gather_common(m, args, kw, 1);
}

static PyObject *py_cp_gather_cache(PyObject *m, PyObject *args, PyObject *kw) {
    return gather_common(m, args, kw, 0);
}

/* --------------------------------------------------------------- merge */

static PyObject *py_merge_attn_states(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "merge_attn_states";
    static char *kwlist[] = {"output", "prefix_output", "prefix_lse", "suffix_output", "suffix_lse", "output_lse",
                             "prefill_tokens_with_context", "output_scale", "num_threads", NULL};
    vt_module_state *st = vt_state(m);
    PyObject *o_obj, *po_obj, *pl_obj, *so_obj, *sl_obj, *ol_obj = Py_None, *ptc_obj = Py_None, *os_obj = Py_None,
                                                         *nt_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|OOO$O:merge_attn_states", kwlist, &o_obj, &po_obj, &pl_obj,
                                     &so_obj, &sl_obj, &ol_obj, &ptc_obj, &os_obj, &nt_obj))
        return NULL;
    int nth;
    float oscale = 0.0f;
    if (os_obj != Py_None && parse_scale(os_obj, fn, "output_scale", &oscale) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    pins p = {.n = 0};
    vt_tensor *out, *po, *pl, *so, *sl, *ol = NULL;
    const unsigned outs = VT_ELEMS_FLOAT | VT_ELEM_BIT(VT_ELEM_E4M3) | VT_ELEM_BIT(VT_ELEM_E5M2);
    const unsigned f32 = VT_ELEM_BIT(VT_ELEM_F32);
    if (!(out = pin(st, &p, o_obj, fn, "output", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, outs, 3)) ||
        !(po = pin(st, &p, po_obj, fn, "prefix_output", 0, VT_ELEMS_FLOAT, 3)) ||
        !(pl = pin(st, &p, pl_obj, fn, "prefix_lse", 0, f32, 2)) ||
        !(so = pin(st, &p, so_obj, fn, "suffix_output", 0, VT_ELEMS_FLOAT, 3)) ||
        !(sl = pin(st, &p, sl_obj, fn, "suffix_lse", 0, f32, 2)))
        goto fail;
    if (ol_obj != Py_None &&
        !(ol = pin(st, &p, ol_obj, fn, "output_lse", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, f32, 2)))
        goto fail;
    const int64_t T = out->shape[0], H = out->shape[1], D = out->shape[2];
    const vt_tensor *o3[2] = {po, so};
    const char *o3n[2] = {"prefix_output", "suffix_output"};
    for (int i = 0; i < 2; i++)
        if (o3[i]->shape[0] != T || o3[i]->shape[1] != H || o3[i]->shape[2] != D) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have output's shape (%lld, %lld, %lld); got (%lld, %lld, %lld)",
                         fn, o3n[i], (long long)T, (long long)H, (long long)D, (long long)o3[i]->shape[0],
                         (long long)o3[i]->shape[1], (long long)o3[i]->shape[2]);
            goto fail;
        }
    const vt_tensor *l2[3] = {pl, sl, ol};
    const char *l2n[3] = {"prefix_lse", "suffix_lse", "output_lse"};
    for (int i = 0; i < 3; i++)
        if (l2[i] && (l2[i]->shape[0] != H || l2[i]->shape[1] != T)) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have shape (num_heads, num_tokens) = (%lld, %lld); got (%lld, "
                         "%lld)", fn, l2n[i], (long long)H, (long long)T, (long long)l2[i]->shape[0],
                         (long long)l2[i]->shape[1]);
            goto fail;
        }
    if (so->elem != po->elem) {
        PyErr_Format(PyExc_TypeError, "%s: suffix_output must have prefix_output's dtype %s; got %s", fn,
                     po->dtype_name, so->dtype_name);
        goto fail;
    }
    if (last_dim_ok(out, fn, "output") < 0 || last_dim_ok(po, fn, "prefix_output") < 0 ||
        last_dim_ok(so, fn, "suffix_output") < 0)
        goto fail;
    int64_t ptc = T;
    if (ptc_obj != Py_None && parse_int(ptc_obj, fn, "prefill_tokens_with_context", 0, &ptc) < 0) goto fail;
    if (ptc > T) {
        PyErr_Format(PyExc_ValueError, "%s: prefill_tokens_with_context must be <= num_tokens = %lld; got %lld", fn,
                     (long long)T, (long long)ptc);
        goto fail;
    }
    int out_fp8 = out->elem == VT_ELEM_E4M3 || out->elem == VT_ELEM_E5M2;
    if (out_fp8 != (os_obj != Py_None)) {
        PyErr_Format(PyExc_TypeError, out_fp8 ? "%s: output_scale must be given for an fp8 output (%s); got None"
                                              : "%s: output must be float8_e4m3fn or float8_e5m2 when output_scale is "
                                                "given; got %s",
                     fn, out->dtype_name);
        goto fail;
    }
    const vt_tensor *ins[4] = {po, pl, so, sl};
    const char *insn[4] = {"prefix_output", "prefix_lse", "suffix_output", "suffix_lse"};
    for (int i = 0; i < 4; i++)
        if (no_overlap(out, "output", ins[i], insn[i], fn) < 0 || no_overlap(ol, "output_lse", ins[i], insn[i], fn) < 0)
            goto fail;
    if (no_overlap(out, "output", ol, "output_lse", fn) < 0) goto fail;
    vt_merge_attn_params mp = {
        .fn = fn, .num_tokens = T, .num_heads = H, .head_size = D, .prefix_output = po->data,
        .suffix_output = so->data, .in_dtype = (vt_dtype)po->elem, .prefix_stride_tok = po->strides[0],
        .prefix_stride_head = po->strides[1], .suffix_stride_tok = so->strides[0], .suffix_stride_head = so->strides[1],
        .prefix_lse = (const float *)pl->data, .suffix_lse = (const float *)sl->data,
        .prefix_lse_stride_head = pl->strides[0] / 4, .prefix_lse_stride_tok = pl->strides[1] / 4,
        .suffix_lse_stride_head = sl->strides[0] / 4, .suffix_lse_stride_tok = sl->strides[1] / 4,
        .output = out->data, .out_dtype = (vt_dtype)out->elem, .out_stride_tok = out->strides[0],
        .out_stride_head = out->strides[1], .output_lse = ol ? (float *)ol->data : NULL,
        .out_lse_stride_head = ol ? ol->strides[0] / 4 : 0, .out_lse_stride_tok = ol ? ol->strides[1] / 4 : 0,
        .prefill_tokens_with_context = ptc, .output_scale = out_fp8 ? &oscale : NULL,
    };
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_merge_attn_states(&mp, nth, &err);
    Py_END_ALLOW_THREADS
    return done(st, &p, s, &err);
fail:
    pins_release(&p);
    return NULL;
}

static PyMethodDef cacheops_methods[] = {
    {"swap_blocks", (PyCFunction)(void (*)(void))py_swap_blocks, METH_VARARGS | METH_KEYWORDS,
     "swap_blocks($module, /, src, dst, block_size_in_bytes, block_mapping, *, src_extent=None, dst_extent=None, "
     "num_threads=None)\n--\n\nCopy blocks of bytes from src to dst by block_mapping (int64 [n, 2])."},
    {"convert_fp8", (PyCFunction)(void (*)(void))py_convert_fp8, METH_VARARGS | METH_KEYWORDS,
     "convert_fp8($module, /, output, input, scale=1.0, kv_dtype='fp8', *, num_threads=None)\n--\n\n"
     "Quantize floats to fp8 codes or dequantize codes to floats (the direction follows the dtypes)."},
    {"gather_and_maybe_dequant_cache", (PyCFunction)(void (*)(void))py_gather_and_maybe_dequant_cache,
     METH_VARARGS | METH_KEYWORDS,
     "gather_and_maybe_dequant_cache($module, /, src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, "
     "kv_cache_dtype, scale, seq_starts=None, *, num_threads=None)\n--\n\n"
     "Gather paged cache entries of a batch into contiguous rows, dequantizing fp8."},
    {"cp_gather_cache", (PyCFunction)(void (*)(void))py_cp_gather_cache, METH_VARARGS | METH_KEYWORDS,
     "cp_gather_cache($module, /, src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None, *, "
     "num_threads=None)\n--\n\nGather paged cache entries of a batch into contiguous rows (same dtype)."},
    {"merge_attn_states", (PyCFunction)(void (*)(void))py_merge_attn_states, METH_VARARGS | METH_KEYWORDS,
     "merge_attn_states($module, /, output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None, "
     "prefill_tokens_with_context=None, output_scale=None, *, num_threads=None)\n--\n\n"
     "Merge two partial attention results by their log-sum-exps."},
    {NULL, NULL, 0, NULL},
};

int vt_cacheops_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    return PyModule_AddFunctions(m, cacheops_methods);
}
