/* vLLM's cache operations (swap_blocks, convert_fp8, the paged gathers,
 * merge_attn_states): memory-bound loops in scalar C; every row conversion
 * goes through the codec row kernels of the active ISA, which are the SIMD
 * part (their scalar twins are tested against them in the codec tests).
 * Semantics: csrc/include/vtinfer/cache_ops.h. */
#include <math.h>
#include <stdint.h>

#include "vt_internal.h"
#include "vtinfer/cache_ops.h"

/* Calls moving fewer bytes than this run on one thread. */
#define CACHE_OPS_PARALLEL_MIN_BYTES ((int64_t)1 << 20)
/* Elements converted at once through the float32 stack buffer. */
#define MERGE_PIECE 256

static int threads_for(int64_t bytes, int num_threads) {
    return vt_useful_threads(num_threads, bytes, CACHE_OPS_PARALLEL_MIN_BYTES, VT_MAX_THREADS);
}

/* ---------------------------------------------------------------- swap */

typedef struct swap_job {
    const vt_swap_blocks_params *p;
    int64_t src_stride, dst_stride;
} swap_job;

/* Blocks addressable in a buffer of `extent` bytes whose blocks start
 * `stride` bytes apart and are read/written `bytes` long (capped by the
 * view's own block count `nview` when > 0). */
static int64_t swap_blocks_in(int64_t extent, int64_t stride, int64_t bytes, int64_t nview) {
    int64_t n = extent < bytes ? 0 : stride == 0 ? 1 : (extent - bytes) / stride + 1;
    return nview > 0 && nview < n ? nview : n;
}

static void swap_task(void *ctx, int ith, int nth) {
    const swap_job *j = (const swap_job *)ctx;
    const vt_swap_blocks_params *p = j->p;
    size_t b0, b1;
    vt_split_range((size_t)p->block_bytes, 64, ith, nth, &b0, &b1);
    if (b1 <= b0) return;
    for (int64_t i = 0; i < p->num_pairs; i++) {
        const int64_t s = p->block_mapping[i * p->map_stride_pair];
        const int64_t d = p->block_mapping[i * p->map_stride_pair + p->map_stride_col];
        memmove((char *)p->dst + d * j->dst_stride + (int64_t)b0, (const char *)p->src + s * j->src_stride + (int64_t)b0,
                b1 - b0);
    }
}

vt_status vt_swap_blocks(const vt_swap_blocks_params *p, int num_threads, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_swap_blocks";
    if (p->block_bytes <= 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: block_size_in_bytes must be > 0; got %lld", fn,
                            (long long)p->block_bytes);
    if (p->num_pairs < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: block_mapping must have >= 0 rows; got %lld", fn,
                            (long long)p->num_pairs);
    if (p->num_pairs == 0) return VT_OK;
    if (!p->src || !p->dst || !p->block_mapping)
        return vt_error_set(err, VT_ERR_VALUE, "%s: src, dst and block_mapping must be non-NULL; got NULL", fn);
    if (p->src_block_stride < 0 || p->dst_block_stride < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: src and dst block strides must be >= 0; got %lld and %lld", fn,
                            (long long)p->src_block_stride, (long long)p->dst_block_stride);
    const int64_t ss = p->src_block_stride ? p->src_block_stride : p->block_bytes;
    const int64_t ds = p->dst_block_stride ? p->dst_block_stride : p->block_bytes;
    const int64_t nsrc = swap_blocks_in(p->src_extent, ss, p->block_bytes, p->src_num_blocks);
    const int64_t ndst = swap_blocks_in(p->dst_extent, ds, p->block_bytes, p->dst_num_blocks);
    for (int64_t i = 0; i < p->num_pairs; i++) {
        for (int col = 0; col < 2; col++) {
            const int64_t b = p->block_mapping[i * p->map_stride_pair + col * p->map_stride_col];
            const int64_t nb = col ? ndst : nsrc;
            if (b < 0 || b >= nb)
                return vt_error_set(err, VT_ERR_INDEX,
                                    "%s: block_mapping[%lld][%d] must be in [0, %lld) (blocks of %lld bytes, %lld "
                                    "apart, in %s); got %lld",
                                    fn, (long long)i, col, (long long)nb, (long long)p->block_bytes,
                                    (long long)(col ? ds : ss), col ? "dst" : "src", (long long)b);
        }
    }
    int64_t total = p->num_pairs > INT64_MAX / p->block_bytes ? INT64_MAX : p->num_pairs * p->block_bytes;
    int nth = threads_for(total, num_threads);
    if ((int64_t)nth * 64 > p->block_bytes) nth = (int)(p->block_bytes / 64) < 1 ? 1 : (int)(p->block_bytes / 64);
    swap_job j = {p, ss, ds};
    vt_parallel_for(swap_task, &j, nth);
    return VT_OK;
}

/* --------------------------------------------------------- convert_fp8 */

vt_status vt_convert_fp8(const vt_convert_fp8_params *p, int num_threads, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_convert_fp8";
    const int fs = vt_float_index(p->src_dtype), fd = vt_float_index(p->dst_dtype);
    if (fs >= 0 && fd >= 0) return vt_convert(p->src, p->src_dtype, p->dst, p->dst_dtype, p->n, num_threads, err);
    if (vt_fp8_index(p->fmt) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: kv_dtype must name an fp8 format; got dtype id %d", fn,
                            (int)p->fmt);
    if (!vt_scale_ok(p->scale))
        return vt_error_set(err, VT_ERR_VALUE, "%s: scale must be finite and > 0; got %g", fn, (double)p->scale);
    if (fs >= 0 && p->dst_dtype == p->fmt)
        return vt_fp8_quantize(p->src, p->src_dtype, p->dst, p->n, p->scale, p->fmt, num_threads, err);
    if (fd >= 0 && p->src_dtype == p->fmt)
        return vt_fp8_dequantize(p->src, p->fmt, p->dst, p->dst_dtype, p->n, p->scale, num_threads, err);
    return vt_error_set(err, VT_ERR_TYPE,
                        "%s: output and input must be float32/float16/bfloat16 and fp8 codes of kv_dtype (either "
                        "direction), or two float dtypes; got dtype ids %d and %d",
                        fn, (int)p->dst_dtype, (int)p->src_dtype);
}

/* -------------------------------------------------------------- gather */

/* The sequence of token t: token_to_seq[t], or found by walking
 * cu_seq_lens (monotone, so `*hint` only moves forward). */
static int64_t seq_of(const vt_gather_cache_params *p, int64_t t, int64_t *hint) {
    if (p->token_to_seq) return p->token_to_seq[t];
    int64_t b = *hint;
    while (b + 1 < p->batch && p->cu_seq_lens[b + 1] <= t) b++;
    *hint = b;
    return b;
}

/* Rows gathered: with token_to_seq, tokens [0, num_tokens); without, the
 * tokens of every sequence, [cu_seq_lens[0], cu_seq_lens[batch]). */
static void gather_range(const vt_gather_cache_params *p, int64_t *t0, int64_t *t1) {
    if (p->token_to_seq) {
        *t0 = 0;
        *t1 = p->num_tokens;
    } else {
        *t0 = p->batch > 0 ? p->cu_seq_lens[0] : 0;
        *t1 = p->batch > 0 ? p->cu_seq_lens[p->batch] : 0;
    }
}

static vt_status gather_check(const vt_gather_cache_params *p, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_gather_cache";
    const int f8 = vt_fp8_index(p->src_dtype);
    if (!vt_dtype_get(p->src_dtype) || !vt_dtype_get(p->dst_dtype))
        return vt_error_set(err, VT_ERR_TYPE, "%s: src_cache and dst must have storage dtypes; got ids %d, %d", fn,
                            (int)p->src_dtype, (int)p->dst_dtype);
    if (f8 >= 0 && p->dst_dtype != p->src_dtype && vt_float_index(p->dst_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: dst must be float32, float16 or bfloat16 for an fp8 cache; got "
                            "dtype id %d", fn, (int)p->dst_dtype);
    if (f8 < 0 && p->dst_dtype != p->src_dtype)
        return vt_error_set(err, VT_ERR_TYPE, "%s: dst must have src_cache's dtype (%s); got %s", fn,
                            vt_dtype_get(p->src_dtype)->name, vt_dtype_get(p->dst_dtype)->name);
    if (f8 >= 0 && p->dst_dtype != p->src_dtype && p->scale && !vt_scale_ok(*p->scale))
        return vt_error_set(err, VT_ERR_VALUE, "%s: scale must be finite and > 0; got %g", fn, (double)*p->scale);
    if (p->num_blocks <= 0 || p->block_size <= 0 || p->entry_rows <= 0 || p->row_len <= 0)
        return vt_error_set(err, VT_ERR_VALUE,
                            "%s: src_cache must have num_blocks, block_size and an entry of > 0 elements; got %lld, "
                            "%lld, %lld x %lld",
                            fn, (long long)p->num_blocks, (long long)p->block_size, (long long)p->entry_rows,
                            (long long)p->row_len);
    if (p->batch < 0 || p->max_blocks < 0 || p->dst_tokens < 0 || p->num_tokens < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: batch, block_table width, dst rows and num_tokens must be >= 0",
                            fn);
    if (!p->cu_seq_lens || !p->block_table)
        return vt_error_set(err, VT_ERR_VALUE, "%s: cu_seq_lens and block_table must be non-NULL; got NULL", fn);
    int32_t prev = 0;
    for (int64_t b = 0; b <= p->batch; b++) {
        const int32_t c = p->cu_seq_lens[b];
        if (c < prev)
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: cu_seq_lens must be non-decreasing from >= 0; got cu_seq_lens[%lld] = %d after "
                                "%d",
                                fn, (long long)b, (int)c, (int)prev);
        prev = c;
    }
    int64_t t0, t1, hint = 0;
    gather_range(p, &t0, &t1);
    if (t1 > p->dst_tokens)
        return vt_error_set(err, VT_ERR_VALUE, "%s: dst must have at least %lld rows (the tokens gathered); got %lld",
                            fn, (long long)t1, (long long)p->dst_tokens);
    if (p->token_to_seq && p->batch == 0 && t1 > t0)
        return vt_error_set(err, VT_ERR_INDEX, "%s: token_to_seq[0] must be in [0, 0) (no sequences); got %d", fn,
                            (int)p->token_to_seq[0]);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t b = seq_of(p, t, &hint);
        if (b < 0 || b >= p->batch)
            return vt_error_set(err, VT_ERR_INDEX, "%s: token_to_seq[%lld] must be in [0, %lld); got %lld", fn,
                                (long long)t, (long long)p->batch, (long long)b);
        if (t >= p->cu_seq_lens[b + 1]) continue; /* skipped, as vLLM's kernel returns */
        if (t < p->cu_seq_lens[b])
            return vt_error_set(err, VT_ERR_VALUE,
                                "%s: token_to_seq[%lld] must name a sequence with cu_seq_lens[b] <= %lld; got b = "
                                "%lld starting at %d",
                                fn, (long long)t, (long long)t, (long long)b, (int)p->cu_seq_lens[b]);
        const int64_t start = p->seq_starts ? p->seq_starts[b] : 0;
        if (start < 0)
            return vt_error_set(err, VT_ERR_VALUE, "%s: seq_starts[%lld] must be >= 0; got %lld", fn, (long long)b,
                                (long long)start);
        const int64_t pos = t - p->cu_seq_lens[b] + start, j = pos / p->block_size;
        if (j >= p->max_blocks)
            return vt_error_set(err, VT_ERR_INDEX,
                                "%s: block_table must have more than %lld columns for sequence %lld (token %lld at "
                                "position %lld); got %lld",
                                fn, (long long)j, (long long)b, (long long)t, (long long)pos,
                                (long long)p->max_blocks);
        const int32_t blk = p->block_table[b * p->bt_stride + j];
        if (blk < 0 || blk >= p->num_blocks)
            return vt_error_set(err, VT_ERR_INDEX, "%s: block_table[%lld, %lld] must be in [0, %lld); got %d", fn,
                                (long long)b, (long long)j, (long long)p->num_blocks, (int)blk);
    }
    return VT_OK;
}

typedef struct gather_job {
    const vt_gather_cache_params *p;
    vt_dequant_row_fn dequant;
    float scale;
    size_t row_bytes;
} gather_job;

static void gather_task(void *ctx, int ith, int nth) {
    const gather_job *j = ctx;
    const vt_gather_cache_params *p = j->p;
    int64_t t0, t1, hint = 0;
    gather_range(p, &t0, &t1);
    size_t a, e;
    vt_split_range((size_t)(t1 - t0), 1, ith, nth, &a, &e);
    for (int64_t t = t0 + (int64_t)a; t < t0 + (int64_t)e; t++) {
        const int64_t b = seq_of(p, t, &hint);
        if (t >= p->cu_seq_lens[b + 1]) continue;
        const int64_t pos = t - p->cu_seq_lens[b] + (p->seq_starts ? p->seq_starts[b] : 0);
        const int64_t blk = p->block_table[b * p->bt_stride + pos / p->block_size];
        const char *src = (const char *)p->src + blk * p->src_stride_block + (pos % p->block_size) * p->src_stride_tok;
        char *dst = (char *)p->dst + t * p->dst_stride_tok;
        for (int64_t r = 0; r < p->entry_rows; r++) {
            const char *s = src + r * p->src_stride_row;
            char *d = dst + r * p->dst_stride_row;
            if (j->dequant) j->dequant((const uint8_t *)s, d, (size_t)p->row_len, j->scale);
            else memcpy(d, s, j->row_bytes);
        }
    }
}

vt_status vt_gather_cache(const vt_gather_cache_params *p, int num_threads, vt_error *err) {
    vt_status st = gather_check(p, err);
    if (st != VT_OK) return st;
    gather_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.row_bytes = (size_t)p->row_len * vt_dtype_get(p->src_dtype)->elem_bytes;
    const int f8 = vt_fp8_index(p->src_dtype);
    if (f8 >= 0 && p->dst_dtype != p->src_dtype) {
        j.dequant = vt_codec_active()->dequant[f8][p->dst_dtype];
        j.scale = p->scale ? *p->scale : 1.0f;
    }
    int64_t t0, t1;
    gather_range(p, &t0, &t1);
    if (t1 <= t0) return VT_OK;
    const int64_t per_tok = (int64_t)j.row_bytes * p->entry_rows;
    int64_t total = (t1 - t0) > INT64_MAX / (per_tok > 0 ? per_tok : 1) ? INT64_MAX : (t1 - t0) * per_tok;
    vt_parallel_for(gather_task, &j, threads_for(total, num_threads));
    return VT_OK;
}

/* --------------------------------------------------------------- merge */

typedef struct merge_job {
    const vt_merge_attn_params *p;
    vt_convert_row_fn load;  /* in_dtype -> float32 */
    vt_convert_row_fn store; /* float32 -> out_dtype (plain) */
    vt_quant_row_fn quant;   /* float32 -> fp8 codes */
    float out_scale;
    size_t in_es, out_es;
} merge_job;

static void merge_row(const merge_job *j, int64_t t, int64_t h) {
    const vt_merge_attn_params *p = j->p;
    const int64_t D = p->head_size;
    const char *po = (const char *)p->prefix_output + t * p->prefix_stride_tok + h * p->prefix_stride_head;
    const char *so = (const char *)p->suffix_output + t * p->suffix_stride_tok + h * p->suffix_stride_head;
    char *o = (char *)p->output + t * p->out_stride_tok + h * p->out_stride_head;
    const float sl = p->suffix_lse[h * p->suffix_lse_stride_head + t * p->suffix_lse_stride_tok];
    float wp = 0.0f, ws = 1.0f, lse = sl;
    int copy_suffix = t >= p->prefill_tokens_with_context, zero = 0;
    if (!copy_suffix) {
        float a = p->prefix_lse[h * p->prefix_lse_stride_head + t * p->prefix_lse_stride_tok], b = sl;
        if (a == INFINITY) a = -INFINITY; /* FlashAttention-2 reports an empty row as +inf */
        if (b == INFINITY) b = -INFINITY;
        const float m = a > b ? a : b;
        /* A NaN LSE makes the row NaN (weights and LSE), whichever side it is on. */
        if (isnan(a) || isnan(b)) {
            wp = ws = lse = NAN;
        } else if (m == -INFINITY) {
            zero = 1;
            lse = -INFINITY;
        } else {
            const float ea = expf(a - m), eb = expf(b - m), sum = ea + eb;
            wp = ea / sum;
            ws = eb / sum;
            lse = logf(sum) + m;
        }
    }
    if (p->output_lse) p->output_lse[h * p->out_lse_stride_head + t * p->out_lse_stride_tok] = lse;
    _Alignas(64) float x[MERGE_PIECE], y[MERGE_PIECE];
    for (int64_t d0 = 0; d0 < D; d0 += MERGE_PIECE) {
        const size_t n = (size_t)(D - d0 < MERGE_PIECE ? D - d0 : MERGE_PIECE);
        j->load(so + d0 * (int64_t)j->in_es, y, n);
        if (zero) {
            for (size_t i = 0; i < n; i++) y[i] = 0.0f;
        } else if (!copy_suffix) {
            j->load(po + d0 * (int64_t)j->in_es, x, n);
            for (size_t i = 0; i < n; i++) y[i] = x[i] * wp + y[i] * ws;
        }
        char *od = o + d0 * (int64_t)j->out_es;
        if (j->quant) j->quant(y, (uint8_t *)od, n, j->out_scale);
        else j->store(y, od, n);
    }
}

static void merge_task(void *ctx, int ith, int nth) {
    const merge_job *j = ctx;
    const vt_merge_attn_params *p = j->p;
    size_t a, e;
    vt_split_range((size_t)(p->num_tokens * p->num_heads), 1, ith, nth, &a, &e);
    for (size_t r = a; r < e; r++) merge_row(j, (int64_t)r / p->num_heads, (int64_t)r % p->num_heads);
}

vt_status vt_merge_attn_states(const vt_merge_attn_params *p, int num_threads, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_merge_attn_states";
    if (vt_float_index(p->in_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: prefix_output must be float32, float16 or bfloat16; got dtype id %d",
                            fn, (int)p->in_dtype);
    const int f8 = vt_fp8_index(p->out_dtype);
    if (vt_float_index(p->out_dtype) < 0 && f8 < 0)
        return vt_error_set(err, VT_ERR_TYPE, "%s: output must be a float or fp8 dtype; got dtype id %d", fn,
                            (int)p->out_dtype);
    if (f8 >= 0 && !p->output_scale)
        return vt_error_set(err, VT_ERR_TYPE, "%s: output_scale must be given for an fp8 output; got None", fn);
    if (f8 < 0 && p->output_scale)
        return vt_error_set(err, VT_ERR_TYPE, "%s: output must be fp8 when output_scale is given; got dtype id %d", fn,
                            (int)p->out_dtype);
    if (p->output_scale && !vt_scale_ok(*p->output_scale))
        return vt_error_set(err, VT_ERR_VALUE, "%s: output_scale must be finite and > 0; got %g", fn,
                            (double)*p->output_scale);
    if (p->num_tokens < 0 || p->num_heads < 0 || p->head_size < 0)
        return vt_error_set(err, VT_ERR_VALUE, "%s: output must have non-negative dimensions; got %lld, %lld, %lld",
                            fn, (long long)p->num_tokens, (long long)p->num_heads, (long long)p->head_size);
    if (p->prefill_tokens_with_context < 0 || p->prefill_tokens_with_context > p->num_tokens)
        return vt_error_set(err, VT_ERR_VALUE, "%s: prefill_tokens_with_context must be in [0, %lld]; got %lld", fn,
                            (long long)p->num_tokens, (long long)p->prefill_tokens_with_context);
    if (p->num_tokens == 0 || p->num_heads == 0) return VT_OK;
    if (!p->prefix_output || !p->suffix_output || !p->prefix_lse || !p->suffix_lse || !p->output)
        return vt_error_set(err, VT_ERR_VALUE, "%s: every array must be non-NULL; got NULL", fn);
    const vt_codec_kernels *k = vt_codec_active();
    merge_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.load = k->convert[p->in_dtype][VT_DTYPE_F32];
    j.in_es = vt_dtype_get(p->in_dtype)->elem_bytes;
    j.out_es = vt_dtype_get(p->out_dtype)->elem_bytes;
    if (f8 >= 0) {
        j.quant = k->quant[VT_DTYPE_F32][f8];
        j.out_scale = *p->output_scale;
    } else {
        j.store = k->convert[VT_DTYPE_F32][p->out_dtype];
    }
    const int64_t rows = p->num_tokens * p->num_heads;
    int64_t total = rows > INT64_MAX / (p->head_size * 8 + 1) ? INT64_MAX : rows * (p->head_size * 8 + 1);
    int nth = threads_for(total, num_threads);
    if (nth > rows) nth = (int)rows;
    vt_parallel_for(merge_task, &j, nth);
    return VT_OK;
}
