/* Paged attention: argument checks, work planning (query tiles x KV-head
 * groups x key splits), the thread schedule, the split-KV log-sum-exp merge
 * and the output writes. The per-tile math lives in attn_ref.c (scalar
 * twin) and attn_avx512.c / attn_avx2.c, taken from the active ISA's
 * kernel table once per call. */
#include <stdatomic.h>
#include <stdint.h>

#include "attn_internal.h"

#define FN "flash_attn_varlen_func"
#define ROWS_TARGET VT_ATTN_QT_MAX /* rows (queries x heads of a group) per tile */
#define SPLIT_MIN_KEYS 256

static int finite_f(float x) { return x == x && x - x == 0.0f; }

/* ---- checks: everything is read and judged before a byte is written ---- */

static vt_status check_descale(const float *d, int64_t sb, int64_t sh, int batch, int hkv, const char *name,
                               vt_error *err) {
    if (!d) return VT_OK;
    for (int b = 0; b < batch; b++)
        for (int g = 0; g < hkv; g++) {
            float x = d[b * sb + g * sh];
            if (!vt_scale_ok(x))
                return vt_error_set(err, VT_ERR_VALUE, FN ": %s must be finite and > 0; got %g at [%d, %d]", name,
                                    (double)x, b, g);
        }
    return VT_OK;
}

static vt_status check_params(const vt_attn_params *p, vt_error *err) {
    if (!p) return vt_error_set(err, VT_ERR_VALUE, FN ": params must not be NULL; got NULL");
    if (vt_float_index(p->q_dtype) < 0)
        return vt_error_set(err, VT_ERR_TYPE, FN ": q must be float32, float16 or bfloat16; got dtype id %d",
                            (int)p->q_dtype);
    if (!vt_dtype_get(p->kv_dtype))
        return vt_error_set(err, VT_ERR_TYPE, FN ": k must be a KV-cache dtype; got dtype id %d", (int)p->kv_dtype);
    if (p->num_heads <= 0 || p->num_kv_heads <= 0 || p->head_size <= 0 || p->block_size <= 0 || p->num_blocks < 0 ||
        p->batch < 0 || p->total_q < 0 || p->max_blocks < 0)
        return vt_error_set(err, VT_ERR_VALUE, FN ": q, k and block_table must have positive head counts, head size "
                            "and block size; got H=%d H_kv=%d D=%d block_size=%lld", p->num_heads, p->num_kv_heads,
                            p->head_size, (long long)p->block_size);
    if (p->num_heads % p->num_kv_heads)
        return vt_error_set(err, VT_ERR_VALUE, FN ": q must have a head count divisible by k's; got %d and %d",
                            p->num_heads, p->num_kv_heads);
    if (!finite_f(p->softmax_scale))
        return vt_error_set(err, VT_ERR_VALUE, FN ": softmax_scale must be finite; got %g", (double)p->softmax_scale);
    if (!(p->softcap >= 0.0f) || !finite_f(p->softcap))
        return vt_error_set(err, VT_ERR_VALUE, FN ": softcap must be finite and >= 0; got %g", (double)p->softcap);
    if (p->window_left < -1 || p->window_right < -1)
        return vt_error_set(err, VT_ERR_VALUE, FN ": window_size must be (left, right) with each >= -1; got (%d, %d)",
                            p->window_left, p->window_right);
    for (int h = 0; h < p->num_heads; h++) {
        if (p->alibi_slopes && !finite_f(p->alibi_slopes[h]))
            return vt_error_set(err, VT_ERR_VALUE, FN ": alibi_slopes must be finite; got %g at [%d]",
                                (double)p->alibi_slopes[h], h);
        if (p->s_aux && !finite_f(p->s_aux[h]))
            return vt_error_set(err, VT_ERR_VALUE, FN ": s_aux must be finite; got %g at [%d]", (double)p->s_aux[h], h);
    }
    const vt_dtype_info *kvi = vt_dtype_get(p->kv_dtype);
    if (kvi->read_family == VT_READ_NONE)
        return vt_error_set(err, VT_ERR_UNSUPPORTED, FN ": kv_cache_dtype '%s' is not read by this attention",
                            kvi->name);
    vt_status gst = vt_dtype_check_head_size(p->kv_dtype, p->head_size, FN, "q's head size", NULL, err);
    if (gst != VT_OK) return gst;
    if (kvi->read_family == VT_READ_SLOTS) {
        if (p->k_scale_cache || p->v_scale_cache || (!kvi->global_scale && (p->k_descale || p->v_descale)))
            return vt_error_set(err, VT_ERR_VALUE, FN ": %s must be None for kv_cache_dtype '%s' (its scales are in "
                                "each slot); got one", kvi->global_scale ? "k_scale_cache and v_scale_cache" :
                                "k_descale, v_descale, k_scale_cache and v_scale_cache", kvi->name);
        if (kvi->global_scale && ((p->k_descale && (p->k_descale_stride_b || p->k_descale_stride_h)) ||
                                  (p->v_descale && (p->v_descale_stride_b || p->v_descale_stride_h))))
            return vt_error_set(err, VT_ERR_VALUE, FN ": k_descale and v_descale must be one number each for "
                                "kv_cache_dtype '%s' (the layer's global scales); got one per sequence or KV head",
                                kvi->name);
        if (p->k != p->v)
            return vt_error_set(err, VT_ERR_VALUE, FN ": v must be k for kv_cache_dtype '%s' (one slot cache holds "
                                "K and V)", kvi->name);
        if (kvi->rope_block > 0 &&
            (p->slot_rope_dim < 0 || p->slot_rope_dim > p->head_size || p->slot_rope_dim % kvi->rope_block))
            return vt_error_set(err, VT_ERR_VALUE, FN ": the rotary dims (rope_dim) of kv_cache_dtype '%s' must be a "
                                "multiple of %d in [0, %d]; got %lld", kvi->name, kvi->rope_block, p->head_size,
                                (long long)p->slot_rope_dim);
    }
    if (kvi->causal_only && !p->causal)
        return vt_error_set(err, VT_ERR_VALUE, FN ": causal must be True for kv_cache_dtype '%s' (vLLM reads it "
                            "causal only); got False", kvi->name);
    if (vt_dtype_per_token_head(p->kv_dtype)) {
        if (!p->k_scale_cache || !p->v_scale_cache)
            return vt_error_set(err, VT_ERR_VALUE, FN ": k_scale_cache and v_scale_cache must be given for "
                                "kv_cache_dtype '%s'; got None", vt_dtype_get(p->kv_dtype)->name);
        if (p->k_descale || p->v_descale)
            return vt_error_set(err, VT_ERR_VALUE, FN ": k_descale and v_descale must be None for kv_cache_dtype "
                                "'%s' (its scales are per token, in k_scale_cache / v_scale_cache); got a descale",
                                vt_dtype_get(p->kv_dtype)->name);
    }
    vt_status s = check_descale(p->k_descale, p->k_descale_stride_b, p->k_descale_stride_h, p->batch,
                                p->num_kv_heads, "k_descale", err);
    if (s == VT_OK)
        s = check_descale(p->v_descale, p->v_descale_stride_b, p->v_descale_stride_h, p->batch, p->num_kv_heads,
                          "v_descale", err);
    if (s != VT_OK) return s;
    if (p->batch > 0 && (!p->cu_seqlens_q || !p->seqused_k || (!p->block_table && p->max_blocks > 0)))
        return vt_error_set(err, VT_ERR_VALUE, FN ": cu_seqlens_q, seqused_k and block_table must not be NULL");
    if (p->batch == 0) return VT_OK;
    if (p->cu_seqlens_q[0] < 0)
        return vt_error_set(err, VT_ERR_VALUE, FN ": cu_seqlens_q must start at >= 0; got %d", p->cu_seqlens_q[0]);
    for (int b = 0; b < p->batch; b++) {
        int64_t q0 = p->cu_seqlens_q[b], q1 = p->cu_seqlens_q[b + 1];
        if (q1 < q0)
            return vt_error_set(err, VT_ERR_VALUE, FN ": cu_seqlens_q must be non-decreasing; got %lld after %lld "
                                "at index %d", (long long)q1, (long long)q0, b + 1);
        if (q1 > p->total_q)
            return vt_error_set(err, VT_ERR_VALUE, FN ": cu_seqlens_q must end at most at q's %lld tokens; got %lld "
                                "at index %d", (long long)p->total_q, (long long)q1, b + 1);
        int64_t kl = p->seqused_k[b];
        if (kl < 0) return vt_error_set(err, VT_ERR_VALUE, FN ": seqused_k must be >= 0; got %lld at [%d]", (long long)kl, b);
        int64_t nb = (kl + p->block_size - 1) / p->block_size;
        if (nb > p->max_blocks)
            return vt_error_set(err, VT_ERR_VALUE, FN ": seqused_k must fit the %lld blocks of block_table's row (%lld "
                                "tokens); got %lld at [%d]", (long long)p->max_blocks,
                                (long long)(p->max_blocks * p->block_size), (long long)kl, b);
        if (p->causal && q1 - q0 > kl)
            return vt_error_set(err, VT_ERR_VALUE, FN ": seqused_k must be >= the sequence's query count when causal; "
                                "got %lld keys for %lld queries at [%d]", (long long)kl, (long long)(q1 - q0), b);
        for (int64_t i = 0; i < nb; i++) {
            int64_t id = p->block_table[(int64_t)b * p->bt_stride + i];
            if (id < 0 || id >= p->num_blocks)
                return vt_error_set(err, VT_ERR_INDEX, FN ": block_table must hold block ids in [0, %lld); got %lld at "
                                    "[%d, %lld]", (long long)p->num_blocks, (long long)id, b, (long long)i);
        }
    }
    return VT_OK;
}

/* ---- the plan: tiles, splits and scratch layout ---- */

typedef struct plan {
    int G, qt, gt;       /* heads per group, queries per tile, groups per tile */
    size_t rows;         /* qt * G * gt */
    int nth;
    size_t work_floats;  /* per thread */
    size_t part_floats;  /* per partial: rows * (D + 2) */
    int64_t n_items;
    size_t bytes;
    /* scratch pieces (valid in run only) */
    int64_t *item_off;   /* [batch + 1] */
    int64_t *part_off;   /* [batch + 1] partial index of the sequence's first item, -1 when unsplit */
    int32_t *nsplit;     /* [batch] */
    float *work;         /* nth * work_floats */
    float *direct;       /* nth * part_floats */
    float *parts;
} plan;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t seq_tiles(const vt_attn_params *p, const plan *pl, int b) {
    int64_t ql = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
    return cdiv(ql, pl->qt) * cdiv(p->num_kv_heads, pl->gt);
}

/* Splits of sequence b: only when the tiles alone give the threads too
 * little to do (flash-decoding); deterministic in (params, nth). */
static int32_t seq_splits(const vt_attn_params *p, const plan *pl, int64_t total_tiles, int b) {
    int64_t kl = p->seqused_k[b];
    if (total_tiles >= 2 * (int64_t)pl->nth || kl < 2 * SPLIT_MIN_KEYS) return 1;
    int64_t want = cdiv(4 * (int64_t)pl->nth, total_tiles > 0 ? total_tiles : 1);
    int64_t most = kl / SPLIT_MIN_KEYS;
    return (int32_t)(want < most ? want : most);
}

static vt_status make_plan(const vt_attn_params *p, int nth, plan *pl, void *scratch, vt_error *err) {
    pl->nth = nth < 1 ? 1 : (nth > VT_MAX_THREADS ? VT_MAX_THREADS : nth);
    pl->G = p->num_heads / p->num_kv_heads;
    /* queries per tile: up to ROWS_TARGET rows, never more than the longest
     * query run; then as many KV-head groups as fit VT_ATTN_ROWS_MAX rows,
     * so a tile walks each cache page once for all its heads */
    int64_t qmax = 1;
    for (int b = 0; b < p->batch; b++)
        if (p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b] > qmax) qmax = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
    pl->qt = pl->G >= ROWS_TARGET ? 1 : ROWS_TARGET / pl->G;
    if (pl->qt > qmax) pl->qt = (int)qmax;
    pl->gt = VT_ATTN_ROWS_MAX / (pl->qt * pl->G);
    if (pl->gt < 1) pl->gt = 1;
    if (pl->gt > p->num_kv_heads) pl->gt = p->num_kv_heads;
    pl->rows = (size_t)pl->qt * (size_t)pl->G * (size_t)pl->gt;
    size_t D = (size_t)p->head_size;
    pl->work_floats = vt_dtype_get(p->kv_dtype)->read_family == VT_READ_SLOTS
                          ? vt_attn_slot_work_floats(p, pl->rows, pl->gt)
                          : vt_attn_work_floats(pl->rows, D);
    pl->work_floats = (pl->work_floats + 15) & ~(size_t)15;
    pl->part_floats = (pl->rows * (D + 2) + 15) & ~(size_t)15;
    int64_t total_tiles = 0;
    for (int b = 0; b < p->batch; b++) total_tiles += seq_tiles(p, pl, b);
    size_t B1 = (size_t)p->batch + 1, n_parts = 0;
    int64_t items = 0;
    char *base = (char *)scratch;
    size_t head = 64 * ((B1 * 8 * 2 + B1 * 4 + 63) / 64);
    if (scratch) {
        pl->item_off = (int64_t *)base;
        pl->part_off = pl->item_off + B1;
        pl->nsplit = (int32_t *)(pl->part_off + B1);
    }
    for (int b = 0; b < p->batch; b++) {
        int32_t ns = seq_splits(p, pl, total_tiles, b);
        int64_t n = seq_tiles(p, pl, b) * ns;
        if (scratch) {
            pl->item_off[b] = items;
            pl->part_off[b] = ns > 1 ? (int64_t)n_parts : -1;
            pl->nsplit[b] = ns;
        }
        items += n;
        if (ns > 1) n_parts += (size_t)n;
    }
    if (scratch) pl->item_off[p->batch] = items;
    pl->n_items = items;
    size_t w, d, pp, total;
    if (vt_size_mul((size_t)pl->nth, pl->work_floats * 4, &w) || vt_size_mul((size_t)pl->nth, pl->part_floats * 4, &d) ||
        vt_size_mul(n_parts, pl->part_floats * 4, &pp) || vt_size_add(head, w, &total) ||
        vt_size_add(total, d, &total) || vt_size_add(total, pp, &total))
        return vt_error_set(err, VT_ERR_OVERFLOW, FN ": scratch must fit in 64 bits; got an overflow");
    pl->bytes = total + 64;
    if (scratch) {
        pl->work = (float *)(base + head);
        pl->direct = (float *)(base + head + w);
        pl->parts = (float *)(base + head + w + d);
    }
    return VT_OK;
}

vt_status vt_attn_scratch_size(const vt_attn_params *p, int num_threads, size_t *bytes, vt_error *err) {
    vt_error_clear(err);
    vt_status s = check_params(p, err);
    if (s != VT_OK) return s;
    plan pl;
    s = make_plan(p, num_threads, &pl, NULL, err);
    if (s == VT_OK) *bytes = pl.bytes;
    return s;
}

/* ---- execution ---- */

typedef struct run_ctx {
    const vt_attn_params *p;
    plan *pl;
    vt_attn_tile_fn tile;
    atomic_llong next;
} run_ctx;

/* The item of index `idx`: sequence by binary search, then (g, tile, split). */
static void item_at(const vt_attn_params *p, const plan *pl, int64_t idx, vt_attn_item *it, int32_t *split) {
    int lo = 0, hi = p->batch - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pl->item_off[mid] <= idx) lo = mid;
        else hi = mid - 1;
    }
    int b = lo;
    int64_t r = idx - pl->item_off[b];
    int32_t ns = pl->nsplit[b];
    int64_t q_len = p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b];
    int64_t n_qt = cdiv(q_len, pl->qt);
    *split = (int32_t)(r % ns);
    r /= ns;
    int64_t qt = r % n_qt;
    it->b = b;
    it->g = (int)(r / n_qt) * pl->gt;
    it->ng = p->num_kv_heads - it->g < pl->gt ? p->num_kv_heads - it->g : pl->gt;
    it->q_len = q_len;
    it->k_len = p->seqused_k[b];
    it->q_tok0 = p->cu_seqlens_q[b];
    it->q0 = qt * pl->qt;
    it->nq = q_len - it->q0 < pl->qt ? q_len - it->q0 : pl->qt;
    /* union of the tile's visible ranges, then this split's share */
    int64_t lo0, hi0, lo1, hi1, base = it->k_len - q_len;
    vt_attn_key_range(p, base + it->q0, it->k_len, &lo0, &hi0);
    vt_attn_key_range(p, base + it->q0 + it->nq - 1, it->k_len, &lo1, &hi1);
    int64_t a = lo0 < lo1 ? lo0 : lo1, z = hi0 > hi1 ? hi0 : hi1;
    if (z < a) z = a;
    int64_t n = z - a, c = *split;
    /* split boundaries on multiples of 16 keys */
    int64_t step = ((cdiv(n, ns) + 15) / 16) * 16;
    int64_t kb = a + c * step, ke = kb + step;
    if (kb > z) kb = z;
    if (ke > z) ke = z;
    it->kb = kb;
    it->ke = ke;
}

/* Write row x * mul (x is scratch: scaled in place) to out in q's dtype through
 * the active ISA's row converter (the codec's rounding: RNE, NaN kept quiet). */
static void store_row(const vt_attn_params *p, int64_t tok, int h, float *x, float mul) {
    uint8_t *dst = (uint8_t *)p->out + tok * p->out_stride_tok + (int64_t)h * p->out_stride_head;
    int D = p->head_size;
    for (int d = 0; d < D; d++) x[d] *= mul;
    vt_kernels_active()->codec->convert[VT_DTYPE_F32][vt_float_index(p->q_dtype)](x, dst, (size_t)D);
}

/* 1 when q's row (token tok, head h) holds a NaN: a magnitude above the
 * infinity pattern of q's dtype (bit test, so the loop vectorizes); for the
 * slot formats, the row as their read takes it (in the key basis, rounded). */
static int q_row_has_nan(const vt_attn_params *p, int64_t tok, int h) {
    const uint8_t *src = (const uint8_t *)p->q + tok * p->q_stride_tok + (int64_t)h * p->q_stride_head;
    if (vt_dtype_get(p->kv_dtype)->read_family == VT_READ_SLOTS) return vt_attn_slot_q_has_nan(p, src);
    int D = p->head_size, any = 0;
    if (p->q_dtype == VT_DTYPE_F32) {
        for (int d = 0; d < D; d++) {
            uint32_t u;
            memcpy(&u, src + 4 * d, 4);
            any |= (u & 0x7FFFFFFFu) > 0x7F800000u;
        }
    } else {
        uint16_t inf = p->q_dtype == VT_DTYPE_F16 ? 0x7C00u : 0x7F80u;
        for (int d = 0; d < D; d++) {
            uint16_t u;
            memcpy(&u, src + 2 * d, 2);
            any |= (u & 0x7FFFu) > inf;
        }
    }
    return any;
}

/* Merge the ns partials of a tile (ns == 1: just one), add the sink,
 * normalise and write out and lse. acc of part 0 is reused as the sum.
 * A row whose q holds a NaN and that sees at least one key is NaN (out and
 * lse): every one of its logits is NaN, whatever the kernels' max/exp make
 * of them. */
static void finish_tile(const vt_attn_params *p, const plan *pl, const vt_attn_item *it, float *part0, int32_t ns) {
    size_t D = (size_t)p->head_size, rg = (size_t)it->nq * (size_t)pl->G, rows = rg * (size_t)it->ng;
    /* a slot read scales V by a global-scale row's v_descale itself (vt_attn_tile_slots) */
    const float *vds = vt_dtype_get(p->kv_dtype)->read_family == VT_READ_SLOTS ? NULL : p->v_descale;
    for (size_t r = 0; r < rows; r++) {
        int g = it->g + (int)(r / rg);
        size_t lr = r % rg;
        float vd = vds ? vds[it->b * p->v_descale_stride_b + g * p->v_descale_stride_h] : 1.0f;
        float *m0 = part0, *l0 = part0 + pl->rows, *a0 = part0 + 2 * pl->rows + r * D;
        float M = m0[r];
        for (int32_t c = 1; c < ns; c++) {
            const float *pc = part0 + (size_t)c * pl->part_floats;
            if (pc[r] > M) M = pc[r];
        }
        int h = g * pl->G + (int)(lr % (size_t)pl->G);
        float sink = p->s_aux ? p->s_aux[h] : -INFINITY;
        float Mt = M > sink ? M : sink;
        float L = 0.0f;
        if (M != -INFINITY) {
            float w0 = expf(m0[r] - Mt);
            L = l0[r] * w0;
            for (size_t d = 0; d < D; d++) a0[d] *= w0;
            for (int32_t c = 1; c < ns; c++) {
                const float *pc = part0 + (size_t)c * pl->part_floats;
                if (pc[r] == -INFINITY) continue;
                float wc = expf(pc[r] - Mt);
                L += pc[pl->rows + r] * wc;
                const float *ac = pc + 2 * pl->rows + r * D;
                for (size_t d = 0; d < D; d++) a0[d] += ac[d] * wc;
            }
        } else {
            for (size_t d = 0; d < D; d++) a0[d] = 0.0f;
        }
        if (p->s_aux) L += expf(sink - Mt);
        int64_t tok = it->q_tok0 + it->q0 + (int64_t)(lr / (size_t)pl->G);
        float lse = L > 0.0f ? Mt + logf(L) : -INFINITY;
        int64_t klo, khi;
        vt_attn_key_range(p, it->k_len - it->q_len + it->q0 + (int64_t)(lr / (size_t)pl->G), it->k_len, &klo, &khi);
        if (khi > klo && q_row_has_nan(p, tok, h)) {
            for (size_t d = 0; d < D; d++) a0[d] = NAN;
            lse = NAN;
        }
        store_row(p, tok, h, a0, L > 0.0f ? vd / L : 0.0f);
        if (p->lse) p->lse[h * p->lse_stride_head + tok * p->lse_stride_tok] = lse;
    }
}

/* The next work item off the shared counter: its index, with *it and its chunk *c; -1 when all are taken. */
static int64_t next_item(run_ctx *ctx, vt_attn_item *it, int32_t *c) {
    const int64_t idx = atomic_fetch_add(&ctx->next, 1);
    if (idx >= ctx->pl->n_items) return -1;
    item_at(ctx->p, ctx->pl, idx, it, c);
    return idx;
}

/* Where split item idx (of sequence it->b) leaves its partial result. */
static float *part_of(const plan *pl, const vt_attn_item *it, int64_t idx) {
    return pl->parts + (size_t)(pl->part_off[it->b] + (idx - pl->item_off[it->b])) * pl->part_floats;
}

static void run_items(void *vctx, int ith, int nth) {
    (void)nth;
    run_ctx *ctx = (run_ctx *)vctx;
    const vt_attn_params *p = ctx->p;
    plan *pl = ctx->pl;
    float *work = pl->work + (size_t)ith * pl->work_floats;
    vt_attn_item it;
    int32_t c;
    for (int64_t idx; (idx = next_item(ctx, &it, &c)) >= 0;) {
        const int32_t ns = pl->nsplit[it.b];
        float *dst = ns > 1 ? part_of(pl, &it, idx) : pl->direct + (size_t)ith * pl->part_floats;
        ctx->tile(p, &it, work, dst, dst + pl->rows, dst + 2 * pl->rows);
        if (ns == 1) finish_tile(p, pl, &it, dst, 1);
    }
}

static void run_merges(void *vctx, int ith, int nth) {
    (void)ith, (void)nth;
    run_ctx *ctx = (run_ctx *)vctx;
    vt_attn_item it;
    int32_t c;
    for (int64_t idx; (idx = next_item(ctx, &it, &c)) >= 0;) {
        const int32_t ns = ctx->pl->nsplit[it.b];
        if (ns != 1 && c == 0) finish_tile(ctx->p, ctx->pl, &it, part_of(ctx->pl, &it, idx), ns);
    }
}

vt_status vt_attn_varlen(const vt_attn_params *p, void *scratch, size_t scratch_bytes, int num_threads,
                         vt_error *err) {
    vt_error_clear(err);
    vt_status s = check_params(p, err);
    if (s != VT_OK) return s;
    plan pl;
    if ((s = make_plan(p, num_threads, &pl, NULL, err)) != VT_OK) return s;
    if (pl.n_items == 0) return VT_OK;
    vt_attn_params with_book; /* a slot format's codebook: the caller's or the core's own */
    if (vt_dtype_needs_codebook(p->kv_dtype) && !p->slot_centroids) {
        with_book = *p;
        if ((s = vt_tq_centroids_shared(p->kv_dtype, p->head_size, &with_book.slot_centroids, err)) != VT_OK)
            return s;
        p = &with_book;
    }
    uintptr_t a = (uintptr_t)scratch, al = (a + 63) & ~(uintptr_t)63;
    if (!scratch || scratch_bytes < pl.bytes) /* pl.bytes has 64 spare bytes for the alignment */
        return vt_error_set(err, VT_ERR_VALUE, FN ": scratch must hold %zu bytes; got %zu", pl.bytes, scratch_bytes);
    if (!p->q || !p->out || ((!p->k || !p->v) && p->num_blocks > 0))
        return vt_error_set(err, VT_ERR_VALUE, FN ": q, k, v and out must not be NULL");
    make_plan(p, num_threads, &pl, (void *)al, err);
    const vt_kernels *kt = vt_kernels_active(); /* every tile reads the 8-bit per-token-head caches */
    vt_attn_tile_fn tile = kt->attn_tile[p->kv_dtype]; /* the check refused formats without a tile */
    run_ctx ctx = {.p = p, .pl = &pl, .tile = tile};
    atomic_init(&ctx.next, 0);
    int nth = pl.nth;
    if ((int64_t)nth > pl.n_items) nth = (int)pl.n_items;
    vt_parallel_for(run_items, &ctx, nth);
    int any_split = 0;
    for (int b = 0; b < p->batch; b++) any_split |= pl.nsplit[b] > 1;
    if (any_split) {
        atomic_store(&ctx.next, 0);
        vt_parallel_for(run_merges, &ctx, nth);
    }
    return VT_OK;
}
