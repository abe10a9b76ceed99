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
 * Every check runs before the GIL is released and before any write. This
 * file: swap_blocks, convert_fp8 and the module hook; cacheops_gather.c:
 * the two gathers; cacheops_merge.c: merge_attn_states; cacheops_args.c:
 * the helpers they share (vt_cacheops.h). */
#include "vt_cacheops.h"
#include "vt_signature.h"

VT_SIGNATURE(swap_sig, "swap_blocks", VT_SWAP_NPOS, VT_SWAP_ARGS);
VT_SIGNATURE(convert_sig, "convert_fp8", VT_CONVERT_NPOS, VT_CONVERT_ARGS);

/* ---------------------------------------------------------------- swap */

/* A swap view's blocks, as vLLM's swap_blocks addresses them: block i
 * starts i * stride(0) bytes after the view's first element and is copied
 * block_size_in_bytes (bb) long. Refused: a 0-d view; bb past the block
 * stride (the copy would run into the next block); blocks whose elements
 * (dimensions 1..) do not fill one run of bytes, in any dimension order
 * (a byte copy would move the bytes between them). *stride / *nblocks: the
 * core's block stride and the view's block count. */
static int swap_view_blocks(const vt_tensor *t, const char *fn, const char *arg, int64_t bb, int64_t *stride,
                            int64_t *nblocks) {
    if (t->ndim < 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have >= 1 dimension (num_blocks, ...); got 0", fn, arg);
        return -1;
    }
    *nblocks = t->shape[0];
    *stride = t->shape[0] > 1 ? t->strides[0] : bb;
    if (t->shape[0] > 1 && bb > t->strides[0]) {
        PyErr_Format(PyExc_ValueError, "%s: block_size_in_bytes must be <= %s's block stride (%s.stride(0) * element "
                     "size = %lld bytes: block i starts i * that many bytes in); got %lld", fn, arg, arg,
                     (long long)t->strides[0], (long long)bb);
        return -1;
    }
    /* dimensions 1.. ordered by stride must nest densely: each stride is the span of those below it */
    int order[VT_MAX_DIMS], n = 0;
    for (int i = 1; i < t->ndim; i++) {
        if (t->shape[i] <= 1) continue;
        int k = n++;
        while (k > 0 && t->strides[order[k - 1]] > t->strides[i]) order[k] = order[k - 1], k--;
        order[k] = i;
    }
    int64_t span = (int64_t)t->itemsize;
    for (int k = 0; k < n; k++) {
        if (t->strides[order[k]] != span) {
            PyErr_Format(PyExc_ValueError, "%s: %s must have each block's elements in one run of bytes (dimensions "
                         "1.. dense, as a byte copy moves them); got a stride of %lld bytes in dimension %d where "
                         "%lld would be dense", fn, arg, (long long)t->strides[order[k]], order[k], (long long)span);
            return -1;
        }
        span *= t->shape[order[k]];
    }
    return 0;
}

static PyObject *py_swap_blocks(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "swap_blocks";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&swap_sig, args, kw, a) < 0) return NULL;
    PyObject *src_obj = a[0], *dst_obj = a[1], *bb_obj = a[2], *map_obj = a[3], *se_obj = vt_arg_or_none(a[4]),
             *de_obj = vt_arg_or_none(a[5]), *nt_obj = vt_arg_or_none(a[6]);
    int64_t bb;
    int nth;
    if (vt_co_parse_int(bb_obj, fn, "block_size_in_bytes", 1, &bb) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_co_pins p = {.n = 0};
    vt_tensor *src, *dst, *map;
    const unsigned any = VT_CO_ALL_ELEMS | VT_ELEM_BIT(VT_ELEM_I32) | VT_ELEM_BIT(VT_ELEM_I64) | VT_ELEM_BIT(VT_ELEM_F64);
    if (!(src = vt_co_pin(st, &p, src_obj, fn, "src", VT_TENSOR_NO_CONVERT, any, -1)) ||
        !(dst = vt_co_pin(st, &p, dst_obj, fn, "dst", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, any, -1)) ||
        !(map = vt_co_pin(st, &p, map_obj, fn, "block_mapping", 0, VT_ELEM_BIT(VT_ELEM_I64), 2)))
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
    int64_t se = vt_co_view_extent(src, fn, "src"), de = vt_co_view_extent(dst, fn, "dst");
    if (se < 0 || de < 0) goto fail;
    int64_t sstride, dstride, snb, dnb;
    if (swap_view_blocks(src, fn, "src", bb, &sstride, &snb) < 0 ||
        swap_view_blocks(dst, fn, "dst", bb, &dstride, &dnb) < 0)
        goto fail;
    if (snb == 0 || dnb == 0) se = snb ? se : 0, de = dnb ? de : 0; /* an empty view holds no block */
    if (snb && se_obj != Py_None && vt_co_parse_int(se_obj, fn, "src_extent", se, &se) < 0) goto fail;
    if (dnb && de_obj != Py_None && vt_co_parse_int(de_obj, fn, "dst_extent", de, &de) < 0) goto fail;
    vt_swap_blocks_params sp = {
        .fn = fn, .src = src->data, .src_extent = se, .dst = dst->data, .dst_extent = de, .block_bytes = bb,
        .block_mapping = (const int64_t *)map->data, .num_pairs = map->shape[0],
        .map_stride_pair = map->strides[0] / 8, .map_stride_col = map->strides[1] / 8,
        .src_block_stride = sstride, .dst_block_stride = dstride, .src_num_blocks = snb, .dst_num_blocks = dnb,
    };
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_swap_blocks(&sp, nth, &err);
    Py_END_ALLOW_THREADS
    return vt_co_done(st, &p, s, &err);
fail:
    vt_co_pins_release(&p);
    return NULL;
}

/* --------------------------------------------------------- convert_fp8 */

static PyObject *py_convert_fp8(PyObject *m, PyObject *args, PyObject *kw) {
    static const char fn[] = "convert_fp8";
    vt_module_state *st = vt_state(m);
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&convert_sig, args, kw, a) < 0) return NULL;
    PyObject *o_obj = a[0], *i_obj = a[1], *scale_obj = a[2], *dt_obj = a[3], *nt_obj = vt_arg_or_none(a[4]);
    float scale = 1.0f;
    int fmt = VT_DTYPE_FP8_E4M3, nth;
    if (scale_obj && vt_co_parse_scale(scale_obj, fn, "scale", &scale) < 0) return NULL;
    if (dt_obj && vt_co_parse_fp8_name(dt_obj, fn, "kv_dtype", &fmt) < 0) return NULL;
    if ((nth = vt_num_threads_arg(nt_obj, fn)) < 0) return NULL;
    vt_co_pins p = {.n = 0};
    vt_tensor *out, *in;
    if (!(out = vt_co_pin(st, &p, o_obj, fn, "output", VT_TENSOR_NO_CONVERT | VT_TENSOR_WRITABLE, VT_CO_ALL_ELEMS, -1)) ||
        !(in = vt_co_pin(st, &p, i_obj, fn, "input", 0, VT_CO_ALL_ELEMS, -1)))
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
    if (vt_co_is_code(out->elem) == vt_co_is_code(in->elem) && vt_co_is_code(in->elem)) {
        PyErr_Format(PyExc_TypeError, "%s: output and input must not both be fp8 codes; got %s and %s", fn,
                     out->dtype_name, in->dtype_name);
        goto fail;
    }
    if (vt_co_is_code(out->elem) && vt_co_code_fmt(out, fmt, fn, "output", "kv_dtype") < 0) goto fail;
    if (vt_co_is_code(in->elem) && vt_co_code_fmt(in, fmt, fn, "input", "kv_dtype") < 0) goto fail;
    if (!vt_tensor_is_contiguous(out)) {
        PyErr_Format(PyExc_ValueError, "%s: output must be C-contiguous", fn);
        goto fail;
    }
    if (vt_tensor_contiguous_input(st, in, fn, "input") < 0) goto fail;
    if (vt_co_no_overlap(out, "output", in, "input", fn) < 0) goto fail;
    int64_t n = vt_tensor_numel(in, fn, "input");
    if (n < 0) goto fail;
    int sd = vt_co_is_code(in->elem) ? fmt : (int)in->elem, dd = vt_co_is_code(out->elem) ? fmt : (int)out->elem;
    vt_convert_fp8_params cp = {.fn = fn, .src = in->data, .src_dtype = (vt_dtype)sd, .dst = out->data,
                                .dst_dtype = (vt_dtype)dd, .n = (size_t)n, .scale = scale,
                                .fmt = (vt_dtype)(fmt == VT_DTYPE_AUTO ? VT_DTYPE_FP8_E4M3 : fmt)};
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_convert_fp8(&cp, nth, &err);
    Py_END_ALLOW_THREADS
    return vt_co_done(st, &p, s, &err);
fail:
    vt_co_pins_release(&p);
    return NULL;
}

static char swap_doc[512], convert_doc[512];

static PyMethodDef cacheops_methods[] = {
    {"swap_blocks", (PyCFunction)(void (*)(void))py_swap_blocks, METH_VARARGS | METH_KEYWORDS, swap_doc},
    {"convert_fp8", (PyCFunction)(void (*)(void))py_convert_fp8, METH_VARARGS | METH_KEYWORDS, convert_doc},
    {NULL, NULL, 0, NULL},
};

int vt_cacheops_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&swap_sig, "Copy block_size_in_bytes bytes of block s of src (s * src.stride(0) bytes in) to "
                     "block d of dst, for each (s, d) of block_mapping (int64 [n, 2]).", swap_doc, sizeof swap_doc);
    vt_signature_doc(&convert_sig, "Quantize floats to fp8 codes or dequantize codes to floats (the direction "
                     "follows the dtypes).", convert_doc, sizeof convert_doc);
    if (PyModule_AddFunctions(m, cacheops_methods) < 0 || vt_cacheops_gather_exec(m) < 0) return -1;
    if (vt_cacheops_merge_exec(m) < 0) return -1;
    return vt_cacheops_mla_exec(m);
}
