/* Scalar reference twin of the attention tile kernel: one key at a time,
 * online softmax in float32, K/V decoded exactly (fp8 by the 256-entry
 * table, bf16 by a shift). Always compiled; the SIMD tiles are tested
 * against it and against the float64 oracle in tests/numerics. */
#include "attn_internal.h"

/* Decode n elements of a cache row to float32 (exact). */
static void load_row(vt_dtype dt, const uint8_t *src, float *dst, int n) {
    switch (dt) {
    case VT_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case VT_DTYPE_F16:
    case VT_DTYPE_BF16:
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = dt == VT_DTYPE_F16 ? vt_f16_to_f32(h) : vt_bf16_to_f32(h);
        }
        break;
    case VT_DTYPE_INT8_PTH:
        for (int i = 0; i < n; i++) dst[i] = (float)(int8_t)src[i];
        break;
    case VT_DTYPE_FP8_PTH: {
        const float *t = vt_fp8_decode_table(VT_DTYPE_FP8_E4M3);
        for (int i = 0; i < n; i++) dst[i] = t[src[i]];
        break;
    }
    default: {
        const float *t = vt_fp8_decode_table(dt);
        for (int i = 0; i < n; i++) dst[i] = t[src[i]];
    }
    }
}

/* int4_per_token_head: a row's codes minus the zero point (the scale is folded in by the caller), and the
 * stored scale split into (masked scale, zero point). */
static void load_int4_row(const uint8_t *src, float zp, float *dst, int n) {
    for (int i = 0; i < n; i += 2) {
        dst[i] = (float)(src[i / 2] & 0xFu) - zp;
        dst[i + 1] = (float)(src[i / 2] >> 4) - zp;
    }
}

void vt_attn_int4_rotate_q(const vt_attn_params *p, float *q, int D) {
    vt_int4_rht(q, D, 0);
    if (p->q_dtype != VT_DTYPE_F32) {
        uint16_t tmp[VT_INT4_RHT_MAX];
        const vt_codec_kernels *k = vt_kernels_active()->codec;
        for (int o = 0; o < D; o += VT_INT4_RHT_MAX) {
            int n = D - o < VT_INT4_RHT_MAX ? D - o : VT_INT4_RHT_MAX;
            k->convert[VT_DTYPE_F32][p->q_dtype](q + o, tmp, (size_t)n);
            k->convert[p->q_dtype][VT_DTYPE_F32](tmp, q + o, (size_t)n);
        }
    }
}

/* The rows of KV-head group g (one group of the tile). */
static void tile_group(const vt_attn_params *p, const vt_attn_item *it, int g, float *work, float *m, float *l,
                       float *acc) {
    const int D = p->head_size, G = p->num_heads / p->num_kv_heads;
    const int int4 = vt_dtype_get(p->kv_dtype)->read_family == VT_READ_INT4_ROTATED;
    const float b4 = int4 ? (float)vt_int4_rht_block(D) : 1.0f; /* the rotation's norm (H H = b I) */
    const float logit_mul = vt_attn_logit_mul(p, it->b, g) / b4;
    const int64_t rows = it->nq * G;
    float *qf = work, *kf = work + rows * D, *vf = kf + D;
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX]; /* per query of the tile */
    for (int64_t r = 0; r < rows; r++) {
        int64_t qi = r / G;
        int h = g * G + (int)(r % G);
        const uint8_t *src = (const uint8_t *)p->q + (it->q_tok0 + it->q0 + qi) * p->q_stride_tok +
                             (int64_t)h * p->q_stride_head;
        load_row(p->q_dtype, src, qf + r * D, D);
        if (int4) vt_attn_int4_rotate_q(p, qf + r * D, D);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int d = 0; d < D; d++) acc[r * D + d] = 0.0f;
    }
    const int64_t base = it->k_len - it->q_len;
    for (int64_t qi = 0; qi < it->nq; qi++) vt_attn_key_range(p, base + it->q0 + qi, it->k_len, &lo[qi], &hi[qi]);
    const float cap = p->softcap;
    const int pth = vt_dtype_per_token_head(p->kv_dtype);
    for (int64_t j = it->kb; j < it->ke; j++) {
        float ks = 1.0f, vs = 1.0f; /* per-token-head: this key's K and V scales */
        if (pth) {
            const uint8_t *a = vt_attn_row(p, p->k_scale_cache, p->ks_stride_block, p->ks_stride_tok,
                                           p->ks_stride_head, it->b, g, j);
            const uint8_t *c = vt_attn_row(p, p->v_scale_cache, p->vs_stride_block, p->vs_stride_tok,
                                           p->vs_stride_head, it->b, g, j);
            memcpy(&ks, a, sizeof ks);
            memcpy(&vs, c, sizeof vs);
        }
        const uint8_t *krow = vt_attn_row(p, p->k, p->k_stride_block, p->k_stride_tok, p->k_stride_head, it->b, g, j);
        const uint8_t *vrow = vt_attn_row(p, p->v, p->v_stride_block, p->v_stride_tok, p->v_stride_head, it->b, g, j);
        if (int4) { /* keys (code - zp) * scale: the zero point off the codes, the masked scale on the logit */
            float kz, vz;
            ks = vt_attn_int4_split(ks, &kz);
            vs = vt_attn_int4_split(vs, &vz);
            load_int4_row(krow, kz, kf, D);
            load_int4_row(vrow, vz, vf, D);
        } else {
            load_row(p->kv_dtype, krow, kf, D);
            load_row(p->kv_dtype, vrow, vf, D);
        }
        const float key_mul = pth ? logit_mul * ks : logit_mul;
        for (int64_t r = 0; r < rows; r++) {
            int64_t qi = r / G;
            if (j < lo[qi] || j >= hi[qi]) continue;
            const float *qr = qf + r * D;
            double dot = 0.0; /* the products exact, the sum in double: no D-long float32 chain */
            for (int d = 0; d < D; d++) dot += (double)qr[d] * (double)kf[d];
            float s = (float)dot * key_mul;
            if (cap > 0.0f) s = cap * tanhf(s / cap);
            if (p->alibi_slopes) {
                int64_t dist = j - (base + it->q0 + qi);
                s -= p->alibi_slopes[g * G + (int)(r % G)] * (float)(dist < 0 ? -dist : dist);
            }
            s = vt_attn_sat(s);
            float pj;
            if (s > m[r]) {
                float alpha = expf(m[r] - s);
                l[r] *= alpha;
                for (int d = 0; d < D; d++) acc[r * D + d] *= alpha;
                m[r] = s;
                pj = 1.0f;
            } else {
                pj = expf(s - m[r]);
            }
            l[r] += pj;
            const float pv = pj * vs; /* V's per-token scale on the weight (1 for other dtypes) */
            for (int d = 0; d < D; d++) acc[r * D + d] += pv * vf[d];
        }
    }
    if (int4) /* back from the rotated space (linear, so before the merge of partials) */
        for (int64_t r = 0; r < rows; r++) vt_int4_rht_back(acc + r * D, D);
}

void vt_attn_tile_scalar(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                         float *acc) {
    const int64_t rg = it->nq * (p->num_heads / p->num_kv_heads); /* rows per group */
    for (int gi = 0; gi < it->ng; gi++)
        tile_group(p, it, it->g + gi, work, m + gi * rg, l + gi * rg, acc + gi * rg * p->head_size);
}
