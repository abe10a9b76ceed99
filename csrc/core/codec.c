/* Bulk codecs: argument checks, the split over threads, and the choice of
 * row kernels from the active ISA's table (vt_kernels_active). */
#include "vt_internal.h"

const vt_codec_kernels *vt_codec_active(void) { return vt_kernels_active()->codec; }

/* Arrays smaller than this run on one thread: waking workers costs more. */
#define PARALLEL_MIN_ELEMS ((size_t)1 << 18)
#define CHUNK_ALIGN ((size_t)64)

typedef struct codec_job {
    int kind; /* 0 quantize, 1 dequantize, 2 convert */
    const void *src;
    void *dst;
    size_t n, src_es, dst_es;
    float scale;
    vt_quant_row_fn quant;
    vt_dequant_row_fn dequant;
    vt_convert_row_fn convert;
} codec_job;

static void codec_task(void *ctx, int ith, int nth) {
    const codec_job *j = ctx;
    size_t b, e;
    vt_split_range(j->n, CHUNK_ALIGN, ith, nth, &b, &e);
    if (b >= e) return;
    const char *s = (const char *)j->src + b * j->src_es;
    char *d = (char *)j->dst + b * j->dst_es;
    if (j->kind == 0) j->quant(s, (uint8_t *)d, e - b, j->scale);
    else if (j->kind == 1) j->dequant((const uint8_t *)s, d, e - b, j->scale);
    else j->convert(s, d, e - b);
}

static void codec_run(codec_job *j, int num_threads) {
    int nth = num_threads < 1 ? 1 : num_threads;
    size_t max_useful = j->n / PARALLEL_MIN_ELEMS;
    if ((size_t)nth > max_useful) nth = max_useful < 1 ? 1 : (int)max_useful;
    vt_parallel_for(codec_task, j, nth);
}

static vt_status check_common(const char *fn, const void *src, const void *dst, size_t n, vt_error *err) {
    if (n > 0 && (!src || !dst))
        return vt_error_set(err, VT_ERR_VALUE, "%s: src and dst must be non-NULL when n > 0; got NULL", fn);
    return VT_OK;
}

static vt_status check_float_dtype(const char *fn, const char *arg, vt_dtype d, vt_error *err) {
    if (vt_float_index(d) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: %s must be float32, float16 or bfloat16; got dtype id %d", fn, arg,
                            (int)d);
    return VT_OK;
}

static vt_status check_fp8(const char *fn, const char *arg, vt_dtype d, vt_error *err) {
    if (vt_fp8_index(d) < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: %s must be e4m3 or e5m2; got dtype id %d", fn, arg, (int)d);
    return VT_OK;
}

static vt_status check_scale(const char *fn, float scale, vt_error *err) {
    if (!vt_scale_ok(scale))
        return vt_error_set(err, VT_ERR_VALUE, "%s: scale must be finite and > 0; got %g", fn, (double)scale);
    return VT_OK;
}

vt_status vt_fp8_quantize(const void *src, vt_dtype src_dtype, uint8_t *dst, size_t n, float scale, vt_dtype fmt,
                          int num_threads, vt_error *err) {
    static const char fn[] = "fp8_quantize";
    vt_status st;
    if ((st = check_float_dtype(fn, "x", src_dtype, err)) || (st = check_fp8(fn, "fmt", fmt, err)) ||
        (st = check_scale(fn, scale, err)) || (st = check_common(fn, src, dst, n, err)))
        return st;
    codec_job j = {0, src, dst, n, vt_dtype_get(src_dtype)->elem_bytes, 1, scale, NULL, NULL, NULL};
    j.quant = vt_codec_active()->quant[src_dtype][vt_fp8_index(fmt)];
    codec_run(&j, num_threads);
    return VT_OK;
}

vt_status vt_fp8_dequantize(const uint8_t *src, vt_dtype fmt, void *dst, vt_dtype dst_dtype, size_t n, float scale,
                            int num_threads, vt_error *err) {
    static const char fn[] = "fp8_dequantize";
    vt_status st;
    if ((st = check_fp8(fn, "fmt", fmt, err)) || (st = check_float_dtype(fn, "dtype", dst_dtype, err)) ||
        (st = check_scale(fn, scale, err)) || (st = check_common(fn, src, dst, n, err)))
        return st;
    codec_job j = {1, src, dst, n, 1, vt_dtype_get(dst_dtype)->elem_bytes, scale, NULL, NULL, NULL};
    j.dequant = vt_codec_active()->dequant[vt_fp8_index(fmt)][dst_dtype];
    codec_run(&j, num_threads);
    return VT_OK;
}

vt_status vt_convert(const void *src, vt_dtype src_dtype, void *dst, vt_dtype dst_dtype, size_t n, int num_threads,
                     vt_error *err) {
    static const char fn[] = "convert";
    vt_status st;
    if ((st = check_float_dtype(fn, "src dtype", src_dtype, err)) ||
        (st = check_float_dtype(fn, "dst dtype", dst_dtype, err)) || (st = check_common(fn, src, dst, n, err)))
        return st;
    codec_job j = {2, src, dst, n, vt_dtype_get(src_dtype)->elem_bytes, vt_dtype_get(dst_dtype)->elem_bytes,
                   1.0f, NULL, NULL, NULL};
    j.convert = vt_codec_active()->convert[src_dtype][dst_dtype];
    codec_run(&j, num_threads);
    return VT_OK;
}
