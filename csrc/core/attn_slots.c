/* The slot formats' read (TurboQuant, UltraQuant, Octave: read family VT_READ_SLOTS).
 *
 * One tile kernel for every ISA: it decodes the item's keys a chunk at a time with the format's slot codec
 * (vt_slot_codec.attn_read where the codec has one: K and V in the codec's rotated bases, the query rotated
 * into K's once and each output row rotated back once; else .read: K in the key basis the row names, V in the
 * model's) into float32 rows of the thread's
 * work area, runs the active ISA's float32 tile over the chunk as over a paged float32 cache (a block table
 * of the chunk's own pages), and merges each chunk's softmax state (max, sum, accumulator) into the item's,
 * as the split-KV merge does. A chunk is written and read while it sits in L2: the cache is never copied
 * whole. Chunks are whole blocks, ~CHUNK_BYTES of decoded K and V. The item's query rows are put in the key
 * basis and rounded as the row says once, into float32 rows the float32 tile reads as its q. */
#include "attn_internal.h"
#include "vtinfer/turboquant.h"

#define CHUNK_BYTES (256 * 1024)

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Keys per chunk for ng KV heads: whole blocks, at least one. */
static int64_t chunk_keys(const vt_attn_params *p, int64_t ng) {
    const int64_t per_key = ng * (int64_t)p->head_size * 8, bs = p->block_size;
    const int64_t n = CHUNK_BYTES / per_key / bs * bs;
    return n < bs ? bs : n;
}

/* Float32 rows of one chunk buffer (K or V) for ng heads: the chunk's keys x ng, plus room for the heads
 * before the item's first (a row is addressed by its absolute KV head, as the float32 tile addresses it). */
static size_t chunk_rows(const vt_attn_params *p, int64_t ng) {
    return (size_t)(chunk_keys(p, ng) * ng + p->num_kv_heads);
}

size_t vt_attn_slot_work_floats(const vt_attn_params *p, size_t rows, int max_groups) {
    const size_t D = (size_t)p->head_size;
    size_t most = 0;
    for (int ng = 1; ng <= max_groups; ng++)
        if (chunk_rows(p, ng) > most) most = chunk_rows(p, ng);
    return round16(vt_attn_work_floats(rows, D)) + round16(rows * (D + 2)) + round16(rows * D) +
           2 * round16(most * D) + round16((size_t)p->max_blocks);
}

/* A query row (float32, in place) as the row's read takes it (vLLM's decode): key_basis HADAMARD rotates it,
 * q H / sqrt(D) with the butterflies in double, rounded once to float32; a codec's attn_query puts it in its
 * attn_read's K basis; query_dtype FP8_E4M3 then rounds it to e4m3fn (UltraQuant, as vLLM's launcher does: NaN
 * past e4m3fn's range). */
static void query_in_key_basis(const vt_dtype_info *t, float *q, int64_t D) {
    if (t->key_basis == VT_KEY_BASIS_HADAMARD && D <= VT_SLOT_MAX_D && (D & (D - 1)) == 0) {
        double y[VT_SLOT_MAX_D];
        for (int64_t d = 0; d < D; d++) y[d] = (double)q[d];
        vt_fwht_f64(y, D);
        const double n = sqrt((double)D);
        for (int64_t d = 0; d < D; d++) q[d] = (float)(y[d] / n);
    }
    if (t->slot->attn_query) t->slot->attn_query(t, q, D);
    if (t->query_dtype == VT_DTYPE_FP8_E4M3)
        for (int64_t d = 0; d < D; d++) q[d] = vt_f32_round_e4m3fn(q[d]);
}

int vt_attn_slot_q_has_nan(const vt_attn_params *p, const uint8_t *src) {
    float q[VT_SLOT_MAX_D];
    const int64_t D = p->head_size <= VT_SLOT_MAX_D ? p->head_size : VT_SLOT_MAX_D;
    vt_attn_load_q(p, src, q, (int)D);
    query_in_key_basis(vt_dtype_get(p->kv_dtype), q, D);
    int any = 0;
    for (int64_t d = 0; d < D; d++) any |= q[d] != q[d];
    return any;
}

/* The item's query rows, each as query_in_key_basis makes it, head-major ([KV head x G][query]) in qbuf, and
 * the params / item the float32 tile reads them through: its q row address (q_tok0 + q0 + t) * stride_tok +
 * h * stride_head lands on row (h - g G) * nq + t when stride_tok is one row, stride_head nq rows and q_tok0
 * takes the item's first head off. */
static void query_rows(const vt_attn_params *p, const vt_attn_item *it, const vt_dtype_info *t, float *qbuf,
                       vt_attn_params *cp, vt_attn_item *sub) {
    const int64_t D = p->head_size, G = p->num_heads / p->num_kv_heads, nh = it->ng * G;
    for (int64_t hl = 0; hl < nh; hl++)
        for (int64_t i = 0; i < it->nq; i++) {
            const uint8_t *src = (const uint8_t *)p->q + (it->q_tok0 + it->q0 + i) * p->q_stride_tok +
                                 (it->g * G + hl) * p->q_stride_head;
            float *dst = qbuf + (hl * it->nq + i) * D;
            vt_attn_load_q(p, src, dst, (int)D);
            query_in_key_basis(t, dst, D);
        }
    cp->q = qbuf, cp->q_dtype = VT_DTYPE_F32;
    cp->q_stride_tok = D * (int64_t)sizeof(float);
    cp->q_stride_head = it->nq * cp->q_stride_tok;
    sub->q_tok0 = -it->q0 - (int64_t)it->g * G * it->nq;
}

/* Fold a chunk's state (m2, l2, a2) into the item's (m, l, acc), row by row. */
static void merge(int64_t rows, int64_t D, float *m, float *l, float *acc, const float *m2, const float *l2,
                  const float *a2) {
    for (int64_t r = 0; r < rows; r++) {
        if (m2[r] == -INFINITY) continue; /* no visible key of the row in the chunk */
        float *a = acc + r * D;
        const float *b = a2 + r * D;
        if (m[r] == -INFINITY) {
            m[r] = m2[r], l[r] = l2[r];
            memcpy(a, b, (size_t)D * sizeof *a);
            continue;
        }
        const float M = m2[r] > m[r] ? m2[r] : m[r];
        const float wa = expf(m[r] - M), wb = expf(m2[r] - M);
        l[r] = l[r] * wa + l2[r] * wb;
        for (int64_t d = 0; d < D; d++) a[d] = a[d] * wa + b[d] * wb;
        m[r] = M;
    }
}

void vt_attn_tile_slots(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                        float *acc) {
    const vt_dtype_info *t = vt_dtype_get(p->kv_dtype);
    const int64_t D = p->head_size, G = p->num_heads / p->num_kv_heads, ng = it->ng, bs = p->block_size;
    const int64_t rows = it->nq * G * ng, ck = chunk_keys(p, ng);
    const size_t buf = round16(chunk_rows(p, ng) * (size_t)D);
    float *pm = work + round16(vt_attn_work_floats((size_t)rows, (size_t)D)), *pl = pm + rows, *pacc = pl + rows;
    float *qbuf = pm + round16((size_t)rows * (size_t)(D + 2)), *kbuf = qbuf + round16((size_t)rows * (size_t)D);
    float *vbuf = kbuf + buf;
    int32_t *bt = (int32_t *)(vbuf + buf);
    memset(bt, 0, (size_t)p->max_blocks * sizeof *bt);
    const vt_tq_cache sc = {.dtype = p->kv_dtype, .num_blocks = p->num_blocks, .block_size = bs,
                            .num_kv_heads = p->num_kv_heads, .head_size = D, .data = (uint8_t *)(uintptr_t)p->k,
                            .stride_block = p->k_stride_block, .stride_pos = p->k_stride_tok,
                            .stride_head = p->k_stride_head, .centroids = p->slot_centroids,
                            .rope_dim = p->slot_rope_dim, .k_scale = p->k_descale ? p->k_descale[0] : 1.0f,
                            .v_scale = p->v_descale ? p->v_descale[0] : 1.0f};
    /* the chunk as a float32 paged cache: page i of the chunk at kbuf + i * bs * ng rows */
    vt_attn_params cp = *p;
    cp.kv_dtype = VT_DTYPE_F32;
    cp.k = kbuf, cp.v = vbuf;
    cp.k_stride_head = cp.v_stride_head = D * (int64_t)sizeof(float);
    cp.k_stride_tok = cp.v_stride_tok = ng * cp.k_stride_head;
    cp.k_stride_block = cp.v_stride_block = bs * cp.k_stride_tok;
    cp.num_blocks = ck / bs;
    cp.block_table = bt, cp.bt_stride = 0;
    cp.k_descale = cp.v_descale = NULL;
    cp.k_scale_cache = cp.v_scale_cache = NULL;
    const vt_attn_tile_fn tile = vt_kernels_active()->attn_tile[VT_DTYPE_F32];
    void (*const read)(const vt_tq_cache *, const vt_dtype_info *, const uint8_t *, float *, float *) =
        t->slot->attn_read ? t->slot->attn_read : t->slot->read;
    const int32_t *table = p->block_table + (int64_t)it->b * p->bt_stride;
    vt_attn_item sub = *it;
    query_rows(p, it, t, qbuf, &cp, &sub);
    int64_t c0 = it->kb;
    do {
        const int64_t page0 = c0 / bs;
        const int64_t c1 = page0 * bs + ck < it->ke ? page0 * bs + ck : it->ke;
        for (int64_t j = c0; j < c1; j++) {
            const int64_t pi = j / bs, off = j % bs;
            const uint8_t *src = sc.data + table[pi] * sc.stride_block + off * sc.stride_pos;
            const int64_t row = ((pi - page0) * bs + off) * ng;
            bt[pi] = (int32_t)(pi - page0);
            for (int64_t g = it->g; g < it->g + ng; g++)
                read(&sc, t, src + g * sc.stride_head, kbuf + (row + g) * D, vbuf + (row + g) * D);
        }
        sub.kb = c0, sub.ke = c1;
        if (c0 == it->kb) {
            tile(&cp, &sub, work, m, l, acc);
        } else {
            tile(&cp, &sub, work, pm, pl, pacc);
            merge(rows, D, m, l, acc, pm, pl, pacc);
        }
        for (int64_t pi = page0; pi * bs < c1; pi++) bt[pi] = 0;
        c0 = c1;
    } while (c0 < it->ke);
    if (t->slot->attn_output)
        for (int64_t r = 0; r < rows; r++) t->slot->attn_output(t, acc + r * D, D);
}
