/* Python surface of the codecs:
 *
 *   _C.fp8_quantize(x, scale=1.0, fmt="e4m3", *, out=None, num_threads=None) -> ndarray[uint8]
 *   _C.fp8_dequantize(codes, scale=1.0, fmt=None, dtype=None, *, out=None, num_threads=None) -> ndarray
 *   _C.convert(x, dtype, *, out=None, num_threads=None) -> ndarray
 *   _C.nvfp4_quantize(x, scale=1.0, *, four_over_six=False) -> (codes uint8 [..., n / 2], block_scales uint8 [..., n / 16])
 *   _C.nvfp4_dequantize(codes, block_scales, scale=1.0) -> float32 [..., 2 * codes.shape[-1]]
 */
#include "vt_binding.h"
#include "vt_signature.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

VT_SIGNATURE(quantize_sig, "fp8_quantize", VT_QUANTIZE_NPOS, VT_QUANTIZE_ARGS);
VT_SIGNATURE(dequantize_sig, "fp8_dequantize", VT_DEQUANTIZE_NPOS, VT_DEQUANTIZE_ARGS);
VT_SIGNATURE(convert_sig, "convert", VT_CONVERT_FLOAT_NPOS, VT_CONVERT_FLOAT_ARGS);
VT_SIGNATURE(nvfp4_quantize_sig, "nvfp4_quantize", VT_NVFP4_QUANTIZE_NPOS, VT_NVFP4_QUANTIZE_ARGS);
VT_SIGNATURE(nvfp4_dequantize_sig, "nvfp4_dequantize", VT_NVFP4_DEQUANTIZE_NPOS, VT_NVFP4_DEQUANTIZE_ARGS);

/* The fp8 rows' short name (their first alias), "e4m3" for an unknown id: from the table. */
static const char *short_name(int fmt) {
    const vt_dtype_info *t = vt_dtype_get(fmt);
    return t && t->aliases ? t->aliases[0] : "?";
}

/* "'e4m3' or 'e5m2' (or fp8_e4m3, fp8, float8_e4m3fn, fp8_e5m2, float8_e5m2)": every fp8 row's names. */
static void fmt_names(char *buf, size_t cap) {
    size_t n = 0;
    int first = 1;
    buf[0] = '\0';
    for (int d = 0; d < VT_DTYPE_COUNT && n < cap; d++)
        if (vt_dtype_get(d)->is_fp8 && vt_dtype_get(d)->aliases) {
            n += (size_t)snprintf(buf + n, cap - n, "%s'%s'", first ? "" : " or ", vt_dtype_get(d)->aliases[0]);
            first = 0;
        }
    first = 1;
    for (int d = 0; d < VT_DTYPE_COUNT && n < cap; d++) {
        const vt_dtype_info *t = vt_dtype_get(d);
        if (!t->is_fp8) continue;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", first ? " (or " : ", ", t->name);
        first = 0;
        for (const char *const *f = t->flags; *f && n < cap; f++)
            if (strcmp(*f, t->name) != 0) n += (size_t)snprintf(buf + n, cap - n, ", %s", *f);
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, ", %s", t->numpy_name);
    }
    if (!first && n < cap) snprintf(buf + n, cap - n, ")");
}

/* fmt: "e4m3"/"e5m2" or any dtype-table spelling of an fp8 dtype, or an
 * ml_dtypes float8 dtype. Returns 0 and sets *fmt, or -1 (ValueError). */
static int parse_fmt(vt_module_state *st, PyObject *obj, const char *fn, int *fmt) {
    char names[256];
    if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8(obj);
        if (!s) return -1;
        int d = vt_dtype_from_alias(s);
        if (d < 0 && vt_dtype_from_name(s, "fmt", &d, NULL) != VT_OK) d = -1;
        if (d >= 0 && vt_dtype_get(d)->is_fp8) {
            *fmt = d;
            return 0;
        }
        fmt_names(names, sizeof names);
        PyErr_Format(PyExc_ValueError, "%s: fmt must be %s; got '%.64s'", fn, names, s);
        return -1;
    }
    PyArray_Descr *d = NULL;
    if (PyArray_DescrConverter2(obj, &d) && d) {
        int n = d->type_num;
        Py_DECREF(d);
        if (n == st->typenum_e4m3) { *fmt = VT_DTYPE_FP8_E4M3; return 0; }
        if (n == st->typenum_e5m2) { *fmt = VT_DTYPE_FP8_E5M2; return 0; }
    }
    PyErr_Clear();
    fmt_names(names, sizeof names);
    PyErr_Format(PyExc_ValueError, "%s: fmt must be %s; got %R", fn, names, obj);
    return -1;
}

/* dtype of a float output: float32 (default), float16, bfloat16. */
static int parse_float_dtype(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, int *dtype) {
    if (obj == NULL || obj == Py_None) {
        *dtype = VT_DTYPE_F32;
        return 0;
    }
    PyArray_Descr *d = NULL;
    if (PyUnicode_Check(obj)) {
        int v;
        const char *s = PyUnicode_AsUTF8(obj);
        if (s && vt_dtype_from_name(s, arg, &v, NULL) == VT_OK && v >= 0 && !vt_dtype_get(v)->is_fp8) {
            *dtype = v;
            return 0;
        }
    } else if (PyArray_DescrConverter2(obj, &d) && d) {
        int n = d->type_num;
        Py_DECREF(d);
        if (n == NPY_FLOAT32) { *dtype = VT_DTYPE_F32; return 0; }
        if (n == NPY_FLOAT16) { *dtype = VT_DTYPE_F16; return 0; }
        if (n == st->typenum_bf16) { *dtype = VT_DTYPE_BF16; return 0; }
    }
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: %s must be float32, float16 or bfloat16; got %R", fn, arg, obj);
    return -1;
}

static int parse_scale(PyObject *obj, const char *fn, float *out) {
    if (obj == NULL) {
        *out = 1.0f;
        return 0;
    }
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj) || PyArray_IsScalar(obj, Number) ||
                               (PyArray_Check(obj) && PyArray_NDIM((PyArrayObject *)obj) == 0))) {
        PyErr_Format(PyExc_TypeError, "%s: scale must be a real number; got %s", fn, Py_TYPE(obj)->tp_name);
        return -1;
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    float f = (float)v;
    if (!(f > 0.0f) || isinf(f)) {
        PyErr_Format(PyExc_ValueError, "%s: scale must be finite and > 0 (as float32); got %R", fn, obj);
        return -1;
    }
    *out = f;
    return 0;
}

static PyArrayObject *new_array(vt_module_state *st, const vt_tensor *like, int dtype_or_u8) {
    npy_intp dims[VT_MAX_DIMS];
    for (int i = 0; i < like->ndim; i++) dims[i] = (npy_intp)like->shape[i];
    PyArray_Descr *d;
    if (dtype_or_u8 == -1) d = PyArray_DescrFromType(NPY_UINT8);
    else if (dtype_or_u8 == VT_DTYPE_F32) d = PyArray_DescrFromType(NPY_FLOAT32);
    else if (dtype_or_u8 == VT_DTYPE_F16) d = PyArray_DescrFromType(NPY_FLOAT16);
    else {
        d = st->descr_bf16;
        Py_INCREF(d);
    }
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, d, like->ndim, dims, NULL, NULL, 0, NULL);
}

/* Pin `out` (or make a new array) of the input's shape with an element in
 * `mask`, C-contiguous, writable, not overlapping the input. */
static PyObject *prepare_out(vt_module_state *st, PyObject *out_obj, const vt_tensor *in, const char *fn,
                             unsigned mask, int new_dtype, vt_tensor *out) {
    if (out_obj == NULL || out_obj == Py_None) {
        PyArrayObject *a = new_array(st, in, new_dtype);
        if (!a) return NULL;
        int rc = vt_tensor_from_object(st, (PyObject *)a, fn, "out", VT_TENSOR_WRITABLE, out);
        Py_DECREF(a);
        return rc < 0 ? NULL : out->owner;
    }
    if (vt_tensor_from_object(st, out_obj, fn, "out", VT_TENSOR_WRITABLE | VT_TENSOR_NO_CONVERT, out) < 0)
        return NULL;
    if (vt_tensor_check(out, fn, "out", mask, in->ndim, VT_MEMORY_CPU) < 0) goto fail;
    for (int i = 0; i < in->ndim; i++)
        if (out->shape[i] != in->shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: out must have the input's shape; dimension %d is %lld, not %lld", fn,
                         i, (long long)out->shape[i], (long long)in->shape[i]);
            goto fail;
        }
    if (!vt_tensor_is_contiguous(out)) {
        PyErr_Format(PyExc_ValueError, "%s: out must be C-contiguous", fn);
        goto fail;
    }
    if (vt_tensor_share_elements(in, out)) {
        PyErr_Format(PyExc_ValueError, "%s: out must not overlap the input", fn);
        goto fail;
    }
    return out->owner;
fail:
    vt_tensor_release(out);
    return NULL;
}

/* Pin the input `arg`: an element in `mask`, CPU, C-contiguous. On failure nothing stays pinned. */
static int pin_input(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, unsigned mask, vt_tensor *t) {
    if (vt_tensor_from_object(st, obj, fn, arg, 0, t) < 0) return -1;
    if (vt_tensor_check(t, fn, arg, mask, -1, VT_MEMORY_CPU) < 0 || vt_tensor_contiguous_input(st, t, fn, arg) < 0) {
        vt_tensor_release(t);
        return -1;
    }
    return 0;
}

/* The pinned input's element count and its output (see prepare_out); on failure the input is released too. */
static int pin_output(vt_module_state *st, PyObject *out_obj, vt_tensor *in, const char *fn, const char *arg,
                      unsigned mask, int new_dtype, vt_tensor *out, int64_t *n) {
    if ((*n = vt_tensor_numel(in, fn, arg)) < 0 || !prepare_out(st, out_obj, in, fn, mask, new_dtype, out)) {
        vt_tensor_release(in);
        return -1;
    }
    return 0;
}

/* The common end of every codec entry point: unpin the input, then raise
 * the core's error or return the (pinned) output array. */
static PyObject *finish(vt_module_state *st, vt_status s, const vt_error *err, vt_tensor *in, vt_tensor *out) {
    vt_tensor_release(in);
    PyObject *result = s == VT_OK ? Py_NewRef(out->owner) : vt_raise(st, err);
    vt_tensor_release(out);
    return result;
}

static PyObject *py_fp8_quantize(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "fp8_quantize";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&quantize_sig, args, kw, a) < 0) return NULL;
    PyObject *x_obj = a[0], *scale_obj = a[1], *fmt_obj = a[2], *out_obj = vt_arg_or_none(a[3]),
             *nt_obj = vt_arg_or_none(a[4]);
    int fmt = VT_DTYPE_FP8_E4M3, nth;
    float scale;
    if (fmt_obj && parse_fmt(st, fmt_obj, fn, &fmt) < 0) return NULL;
    if (parse_scale(scale_obj, fn, &scale) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_tensor x, out;
    int64_t n;
    const unsigned out_mask = VT_ELEM_BIT(VT_ELEM_U8) | VT_ELEM_BIT((vt_elem)fmt); /* the fp8 formats' own float8 elements */
    if (pin_input(st, x_obj, fn, "x", VT_ELEMS_FLOAT, &x) < 0 ||
        pin_output(st, out_obj, &x, fn, "x", out_mask, -1, &out, &n) < 0)
        return NULL;
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_fp8_quantize(x.data, (vt_dtype)x.elem, out.data, (size_t)n, scale, (vt_dtype)fmt, nth, &err);
    Py_END_ALLOW_THREADS
    return finish(st, s, &err, &x, &out);
}

static PyObject *py_fp8_dequantize(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "fp8_dequantize";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&dequantize_sig, args, kw, a) < 0) return NULL;
    PyObject *c_obj = a[0], *scale_obj = a[1], *fmt_obj = vt_arg_or_none(a[2]), *dtype_obj = vt_arg_or_none(a[3]),
             *out_obj = vt_arg_or_none(a[4]), *nt_obj = vt_arg_or_none(a[5]);
    int fmt = -1, dtype, nth;
    float scale;
    if (fmt_obj != Py_None && parse_fmt(st, fmt_obj, fn, &fmt) < 0) return NULL;
    if (parse_scale(scale_obj, fn, &scale) < 0) return NULL;
    if (parse_float_dtype(st, dtype_obj, fn, "dtype", &dtype) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_tensor c, out;
    if (pin_input(st, c_obj, fn, "codes", VT_ELEMS_CODES, &c) < 0) return NULL;
    int implied = c.elem == VT_ELEM_E4M3 ? VT_DTYPE_FP8_E4M3 : c.elem == VT_ELEM_E5M2 ? VT_DTYPE_FP8_E5M2 : -1;
    if (fmt < 0) fmt = implied < 0 ? VT_DTYPE_FP8_E4M3 : implied;
    if (implied >= 0 && implied != fmt) {
        PyErr_Format(PyExc_TypeError, "%s: codes of dtype %s must be read with fmt='%s'; got fmt='%s'", fn,
                     c.dtype_name, short_name(implied), short_name(fmt));
        vt_tensor_release(&c);
        return NULL;
    }
    int64_t n;
    if (pin_output(st, out_obj, &c, fn, "codes", VT_ELEM_BIT(dtype), dtype, &out, &n) < 0) return NULL;
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_fp8_dequantize(c.data, (vt_dtype)fmt, out.data, (vt_dtype)dtype, (size_t)n, scale, nth, &err);
    Py_END_ALLOW_THREADS
    return finish(st, s, &err, &c, &out);
}

static PyObject *py_convert(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "convert";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&convert_sig, args, kw, a) < 0) return NULL;
    PyObject *x_obj = a[0], *dtype_obj = a[1], *out_obj = vt_arg_or_none(a[2]), *nt_obj = vt_arg_or_none(a[3]);
    int dtype, nth;
    if (parse_float_dtype(st, dtype_obj, fn, "dtype", &dtype) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_tensor x, out;
    int64_t n;
    if (pin_input(st, x_obj, fn, "x", VT_ELEMS_FLOAT, &x) < 0 ||
        pin_output(st, out_obj, &x, fn, "x", VT_ELEM_BIT(dtype), dtype, &out, &n) < 0)
        return NULL;
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_convert(x.data, (vt_dtype)x.elem, out.data, (vt_dtype)dtype, (size_t)n, nth, &err);
    Py_END_ALLOW_THREADS
    return finish(st, s, &err, &x, &out);
}

/* A new C-contiguous array of like's shape with its last dimension `last`. */
static PyArrayObject *new_last(const vt_tensor *like, int64_t last, int typenum) {
    npy_intp dims[VT_MAX_DIMS];
    for (int i = 0; i < like->ndim; i++) dims[i] = (npy_intp)like->shape[i];
    dims[like->ndim - 1] = (npy_intp)last;
    return (PyArrayObject *)PyArray_SimpleNew(like->ndim, dims, typenum);
}

/* An input array of at least one dimension whose last is a multiple of `mult`. */
static int nvfp4_input(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, unsigned mask, int64_t mult,
                       const char *why, vt_tensor *t) {
    if (pin_input(st, obj, fn, arg, mask, t) < 0) return -1;
    if (t->ndim < 1 || t->shape[t->ndim - 1] % mult) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have a last dimension that is a multiple of %lld (%s); got shape "
                     "with last dimension %lld", fn, arg, (long long)mult, why,
                     t->ndim < 1 ? -1LL : (long long)t->shape[t->ndim - 1]);
        vt_tensor_release(t);
        return -1;
    }
    return 0;
}

static PyObject *py_nvfp4_quantize(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "nvfp4_quantize";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&nvfp4_quantize_sig, args, kw, a) < 0) return NULL;
    float scale;
    if (parse_scale(a[1], fn, &scale) < 0) return NULL;
    if (a[2] && !PyBool_Check(a[2])) {
        PyErr_Format(PyExc_TypeError, "%s: four_over_six must be a bool; got %s", fn, Py_TYPE(a[2])->tp_name);
        return NULL;
    }
    const int four = a[2] == Py_True;
    vt_tensor x;
    if (nvfp4_input(st, a[0], fn, "x", VT_ELEMS_FLOAT, 16, "one block scale per 16 elements", &x) < 0) return NULL;
    const int64_t last = x.shape[x.ndim - 1];
    int64_t n = vt_tensor_numel(&x, fn, "x");
    PyArrayObject *codes = n < 0 ? NULL : new_last(&x, last / 2, NPY_UINT8);
    PyArrayObject *scales = codes ? new_last(&x, last / 16, NPY_UINT8) : NULL;
    if (!scales) {
        Py_XDECREF(codes);
        vt_tensor_release(&x);
        return NULL;
    }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_nvfp4_quantize(x.data, (vt_dtype)x.elem, (size_t)n, scale, four, (uint8_t *)PyArray_DATA(codes),
                          (uint8_t *)PyArray_DATA(scales), &err);
    Py_END_ALLOW_THREADS
    vt_tensor_release(&x);
    return vt_pair_result(st, s, &err, codes, scales);
}

static PyObject *py_nvfp4_dequantize(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "nvfp4_dequantize";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&nvfp4_dequantize_sig, args, kw, a) < 0) return NULL;
    float scale;
    if (parse_scale(a[2], fn, &scale) < 0) return NULL;
    vt_tensor c, b;
    const unsigned u8 = VT_ELEM_BIT(VT_ELEM_U8), sc = VT_ELEM_BIT(VT_ELEM_U8) | VT_ELEM_BIT(VT_ELEM_E4M3);
    if (nvfp4_input(st, a[0], fn, "codes", u8, 8, "two codes per byte, 16 per block scale", &c) < 0) return NULL;
    if (nvfp4_input(st, a[1], fn, "block_scales", sc, 1, "e4m3 bytes", &b) < 0) {
        vt_tensor_release(&c);
        return NULL;
    }
    PyObject *result = NULL;
    int same = b.ndim == c.ndim;
    for (int i = 0; same && i < c.ndim - 1; i++) same = b.shape[i] == c.shape[i];
    if (!same || b.shape[b.ndim - 1] * 8 != c.shape[c.ndim - 1]) {
        PyErr_Format(PyExc_ValueError, "%s: block_scales must have codes' shape with the last dimension "
                     "codes.shape[-1] / 8 = %lld (one e4m3 byte per 16 elements); got a last dimension of %lld and "
                     "%d dimensions (codes: %d)", fn, (long long)(c.shape[c.ndim - 1] / 8),
                     (long long)b.shape[b.ndim - 1], b.ndim, c.ndim);
        goto done;
    }
    int64_t nb = vt_tensor_numel(&c, fn, "codes");
    PyArrayObject *out = nb < 0 ? NULL : new_last(&c, 2 * c.shape[c.ndim - 1], NPY_FLOAT32);
    if (!out) goto done;
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_nvfp4_dequantize((const uint8_t *)c.data, (const uint8_t *)b.data, 2 * (size_t)nb, scale,
                            (float *)PyArray_DATA(out), &err);
    Py_END_ALLOW_THREADS
    if (s != VT_OK) {
        Py_DECREF(out);
        result = vt_raise(st, &err);
    } else {
        result = (PyObject *)out;
    }
done:
    vt_tensor_release(&c);
    vt_tensor_release(&b);
    return result;
}

static char quantize_doc[512], dequantize_doc[512], convert_doc[512], nvfp4_q_doc[768], nvfp4_dq_doc[512];

static PyMethodDef codec_methods[] = {
    {"fp8_quantize", (PyCFunction)(void (*)(void))py_fp8_quantize, METH_VARARGS | METH_KEYWORDS, quantize_doc},
    {"fp8_dequantize", (PyCFunction)(void (*)(void))py_fp8_dequantize, METH_VARARGS | METH_KEYWORDS, dequantize_doc},
    {"convert", (PyCFunction)(void (*)(void))py_convert, METH_VARARGS | METH_KEYWORDS, convert_doc},
    {"nvfp4_quantize", (PyCFunction)(void (*)(void))py_nvfp4_quantize, METH_VARARGS | METH_KEYWORDS, nvfp4_q_doc},
    {"nvfp4_dequantize", (PyCFunction)(void (*)(void))py_nvfp4_dequantize, METH_VARARGS | METH_KEYWORDS,
     nvfp4_dq_doc},
    {NULL, NULL, 0, NULL},
};

int vt_codec_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&quantize_sig, "Quantize float32/float16/bfloat16 x to fp8 codes (uint8) with vLLM's CUDA store "
                     "semantics.", quantize_doc, sizeof quantize_doc);
    vt_signature_doc(&dequantize_sig, "Decode fp8 codes and multiply by scale (exact decode).", dequantize_doc,
                     sizeof dequantize_doc);
    vt_signature_doc(&convert_sig, "Convert between float32, float16 and bfloat16 (round to nearest even).",
                     convert_doc, sizeof convert_doc);
    vt_signature_doc(&nvfp4_quantize_sig, "NVFP4 codes (two FP4 E2M1 per byte) and e4m3 block scales (one per 16 "
                     "elements) of x with global scale 1 / scale, as vLLM's nvfp4 / nvfp4_4over6 KV store.",
                     nvfp4_q_doc, sizeof nvfp4_q_doc);
    vt_signature_doc(&nvfp4_dequantize_sig, "Decode NVFP4 codes: E2M1 value * e4m3 block scale * scale, float32.",
                     nvfp4_dq_doc, sizeof nvfp4_dq_doc);
    return PyModule_AddFunctions(m, codec_methods);
}
