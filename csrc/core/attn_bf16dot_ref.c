/* Scalar twin of the pair-dot attention tile (attn_avx512bf16.c): the same
 * arithmetic in plain C, one key at a time within each block of 16 keys,
 * as stated in attn_internal.h "vt_attn_bf16dot_applies". Always compiled;
 * tests/c/test_attention.c runs the SIMD tile against it. Where the pair
 * dot product does not apply it runs the fp32 twin (vt_attn_tile_scalar). */
#include "attn_internal.h"

#define KB 16

/* vdpbf16ps's DAZ/FTZ: a value below FLT_MIN in magnitude becomes (signed) 0. */
static float ftz(float x) { return fabsf(x) < FLT_MIN ? x * 0.0f : x; }

static float bf16_value(const uint8_t *src) {
    uint16_t h;
    memcpy(&h, src, 2);
    return ftz(vt_bf16_to_f32(h));
}

/* n elements of a bf16 / fp8 / int8 / int4 row as float32 (exact; FTZ as the hardware's input); int4:
 * the codes minus the zero point zp (byte i: element 2i in the low nibble, 2i + 1 in the high one). */
static void load_row(vt_dtype dt, const uint8_t *src, float *dst, int n, float zp) {
    if (dt == VT_DTYPE_INT4_PTH) {
        for (int i = 0; i < n; i += 2) {
            dst[i] = (float)(src[i / 2] & 0xFu) - zp;
            dst[i + 1] = (float)(src[i / 2] >> 4) - zp;
        }
        return;
    }
    if (dt == VT_DTYPE_INT8_PTH) {
        for (int i = 0; i < n; i++) dst[i] = (float)(int8_t)src[i];
        return;
    }
    const float *t = dt == VT_DTYPE_BF16 ? NULL : vt_fp8_decode_table(dt);
    for (int i = 0; i < n; i++) dst[i] = t ? ftz(t[src[i]]) : bf16_value(src + 2 * i);
}

/* acc + a1 * b1 + a0 * b0 as one vdpbf16ps lane does it (odd product first). */
static float dot_pair(float acc, float a0, float a1, float b0, float b1) {
    acc = ftz(acc + ftz(a1 * b1));
    return ftz(acc + ftz(a0 * b0));
}

/* The rows of KV-head group g (one group of the tile). */
static void tile_group(const vt_attn_params *p, const vt_attn_item *it, int g, float *work, float *m, float *l,
                       float *acc) {
    const int D = p->head_size, Dq = (D + 1) & ~1, G = p->num_heads / p->num_kv_heads;
    const int64_t rows = it->nq * G;
    const int pth = vt_dtype_per_token_head(p->kv_dtype), int4 = p->kv_dtype == VT_DTYPE_INT4_PTH;
    const float b4 = int4 ? (float)vt_int4_rht_block(D) : 1.0f; /* int4: the rotation's norm (H H = b I) */
    float kz[KB], vz[KB];                /* int4: the block's zero points */
    const vt_dtype dt = (vt_dtype)vt_dtype_decoder(p->kv_dtype); /* the codes' decoder */
    float ks[KB], vs[KB];                /* the block's per-token-head scales (1: other dtypes) */
    int64_t kso[KB], vso[KB];
    float *qf = work;                    /* rows x Dq, zero-padded to pairs */
    float *kf = qf + rows * Dq;          /* KB x Dq */
    float *vf = kf + KB * Dq;            /* KB x D */
    float *s = vf + KB * D, *e = s + KB, *el = e + KB; /* one row's logits, weights and their low parts */
    const int split = vt_attn_bf16dot_split(p);
    for (int64_t r = 0; r < rows; r++) {
        int h = g * G + (int)(r % G);
        const uint8_t *src = (const uint8_t *)p->q + (it->q_tok0 + it->q0 + r / G) * p->q_stride_tok +
                             (int64_t)h * p->q_stride_head;
        for (int d = 0; d < Dq; d++) qf[r * Dq + d] = d < D ? bf16_value(src + 2 * d) : 0.0f;
        if (int4) { /* rotated (from the unflushed bf16 values) and rounded to bf16, then the hardware's DAZ */
            for (int d = 0; d < D; d++) {
                uint16_t u;
                memcpy(&u, src + 2 * d, 2);
                qf[r * Dq + d] = vt_bf16_to_f32(u);
            }
            vt_attn_int4_rotate_q(p, qf + r * Dq, D);
            for (int d = 0; d < D; d++) qf[r * Dq + d] = ftz(qf[r * Dq + d]);
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int d = 0; d < D; d++) acc[r * D + d] = 0.0f;
    }
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = it->k_len - it->q_len;
    for (int64_t qi = 0; qi < it->nq; qi++) vt_attn_key_range(p, base + it->q0 + qi, it->k_len, &lo[qi], &hi[qi]);
    const float mul = vt_attn_logit_mul(p, it->b, g) / b4, cap = p->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        const int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        for (int jj = 0; jj < KB; jj++) ks[jj] = vs[jj] = 1.0f;
        if (pth) {
            vt_attn_scale_offsets(p, it->b, j0, nk, kso, vso);
            vt_attn_key_scales(p, g, kso, vso, nk, KB, ks, vs);
        }
        for (int jj = 0; jj < KB; jj++) { /* int4: stored scale -> (masked scale, zero point) */
            kz[jj] = vz[jj] = 0.0f;
            if (int4) ks[jj] = vt_attn_int4_split(ks[jj], &kz[jj]), vs[jj] = vt_attn_int4_split(vs[jj], &vz[jj]);
        }
        for (int jj = 0; jj < nk; jj++) {
            float *kr = kf + jj * Dq;
            load_row(dt, vt_attn_row(p, p->k, p->k_stride_block, p->k_stride_tok, p->k_stride_head, it->b, g, j0 + jj),
                     kr, D, kz[jj]);
            if (Dq > D) kr[D] = 0.0f;
            load_row(dt, vt_attn_row(p, p->v, p->v_stride_block, p->v_stride_tok, p->v_stride_head, it->b, g, j0 + jj),
                     vf + jj * D, D, vz[jj]);
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t qi = r / G, pos = base + it->q0 + qi;
            const float *qr = qf + r * Dq;
            float bm = -INFINITY;
            int any = 0;
            for (int jj = 0; jj < nk; jj++) {
                const int64_t j = j0 + jj;
                if (j < lo[qi] || j >= hi[qi]) {
                    s[jj] = NAN; /* not visible: no weight */
                    continue;
                }
                const float *kr = kf + jj * Dq;
                float even = 0.0f, odd = 0.0f; /* the two chains: pair indices 0, 2, .. and 1, 3, .. */
                for (int i = 0; 2 * i < Dq; i++) {
                    float *c = (i & 1) ? &odd : &even;
                    *c = dot_pair(*c, qr[2 * i], qr[2 * i + 1], kr[2 * i], kr[2 * i + 1]);
                }
                float x = (even + odd) * (pth ? mul * ks[jj] : mul); /* the multiplier rounded first */
                if (cap > 0.0f) x = cap * tanhf(x * inv_cap);
                if (p->alibi_slopes) {
                    int64_t dist = j - pos;
                    x -= p->alibi_slopes[g * G + (int)(r % G)] * (float)(dist < 0 ? -dist : dist);
                }
                s[jj] = vt_attn_sat(x);
                if (s[jj] > bm) bm = s[jj];
                any = 1;
            }
            if (!any) continue;
            const float mo = m[r], mn = bm > mo ? bm : mo;
            const float alpha = mo == mn ? 1.0f : (mo - mn < -60.0f ? 0.0f : expf(mo - mn));
            float sum = 0.0f;
            for (int jj = 0; jj < KB; jj++) {
                const int64_t j = j0 + jj;
                float w = 0.0f;
                if (jj < nk && j >= lo[qi] && j < hi[qi]) {
                    const float x = s[jj] - mn;
                    w = x < -60.0f ? 0.0f : expf(x);
                }
                const float wv = w * vs[jj]; /* V's scale on the weight */
                e[jj] = vt_bf16_to_f32(vt_bf16_from_f32(wv)); /* P V's weight */
                el[jj] = split ? ftz(vt_bf16_to_f32(vt_bf16_from_f32(ftz(wv - e[jj])))) : 0.0f; /* its low part */
                sum += w;
            }
            m[r] = mn;
            l[r] = l[r] * alpha + sum;
            float *ar = acc + r * D;
            for (int d = 0; d < D; d++) ar[d] *= alpha;
            for (int k = 0; 2 * k < nk; k++) {
                const float p0 = e[2 * k], p1 = e[2 * k + 1];
                if (p0 == 0.0f && p1 == 0.0f) continue; /* the kernel skips a pair with no weight */
                const float *v0 = vf + 2 * k * D, *v1 = v0 + D;
                for (int d = 0; d < D; d++) {
                    const float v1d = 2 * k + 1 < nk ? v1[d] : 0.0f;
                    ar[d] = dot_pair(ar[d], p0, p1, v0[d], v1d);
                    if (split) ar[d] = dot_pair(ar[d], el[2 * k], el[2 * k + 1], v0[d], v1d);
                }
            }
        }
    }
    if (int4) /* back from the rotated space (linear, so before the merge of partials) */
        for (int64_t r = 0; r < rows; r++) vt_int4_rht_back(acc + r * D, D);
}

void vt_attn_tile_bf16dot_scalar(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                                 float *acc) {
    const int64_t rg = it->nq * (p->num_heads / p->num_kv_heads); /* rows per group */
    if (!vt_attn_bf16dot_applies(p, rg)) { /* (int4 too: the scalar table's int4 tile is this one) */
        vt_attn_tile_scalar(p, it, work, m, l, acc);
        return;
    }
    for (int gi = 0; gi < it->ng; gi++)
        tile_group(p, it, it->g + gi, work, m + gi * rg, l + gi * rg, acc + gi * rg * p->head_size);
}
