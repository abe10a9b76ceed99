/* The AVX2 tile's lanes form, for groups of 16 or more rows, a multiple of 8 (prefill tiles, GQA >= 16 decode;
 * the tile's LANES_MIN_ROWS): the rows of a group in the lanes of a vector, so that a key's logits are one
 * vector per 8 rows and the online softmax runs down the lanes, with no horizontal sums. Per block of keys and
 * KV head (the tile decodes the block's K and V rows once into float32 buffers, chunk_pos order, Dp floats each):
 *   - logits: S[k][r] = q_r . K_k over the transposed queries (q^T, [Dp][rg]), each K element broadcast against
 *     one or two vectors of rows; each 16 elements summed in registers, and those partial sums added into S in
 *     element order (the row form's lane sums have the same reach; one float32 chain over D errs more);
 *   - the softmax of the block's keys for 8 rows as vectors, under the row form's rules (saturation, softcap,
 *     ALiBi, the e^-60 flush, a visible NaN logit a NaN weight); alpha by the vector exp;
 *   - P V into the transposed accumulators (acc^T, [Dp][rg]), each V element broadcast against the weights of
 *     one or two vectors of rows; a block whose decoded V holds an inf or a NaN adds only the products of
 *     nonzero weights (0 . inf is NaN where the row form skips a zero weight's key).
 * The functions take decoded floats, so one copy serves every format. Included by attn_avx2.c after exp8,
 * tanh8 and its CH / KB / T / AI / VT_UNROLL macros. */
#ifndef VTINFER_ATTN_LANES_AVX2_H
#define VTINFER_ATTN_LANES_AVX2_H

/* S[(k0 + k) * rg + r0 + 8 v + lane] = q . K_{k0 + k} for RV vectors of rows and NK keys (RV * NK <= 8). */
T static AI void qk_lanes(const int RV, const int NK, const float *qt, int rg, int r0, const float *kbuf, int Dp,
                          int k0, float *S) {
    for (int c = 0; c < Dp; c += CH) {
        __m256 t[2][8];
        VT_UNROLL
        for (int v = 0; v < RV; v++)
            VT_UNROLL
            for (int k = 0; k < NK; k++) t[v][k] = _mm256_setzero_ps();
        VT_UNROLL
        for (int d = c; d < c + CH; d++) {
            const float *qd = qt + (size_t)d * rg + r0;
            const __m256 q0 = _mm256_loadu_ps(qd), q1 = RV > 1 ? _mm256_loadu_ps(qd + 8) : q0;
            VT_UNROLL
            for (int k = 0; k < NK; k++) {
                const __m256 kb = _mm256_broadcast_ss(kbuf + (size_t)(k0 + k) * Dp + d);
                t[0][k] = _mm256_fmadd_ps(q0, kb, t[0][k]);
                if (RV > 1) t[1][k] = _mm256_fmadd_ps(q1, kb, t[1][k]);
            }
        }
        VT_UNROLL
        for (int v = 0; v < RV; v++)
            VT_UNROLL
            for (int k = 0; k < NK; k++) {
                float *s = S + (size_t)(k0 + k) * rg + r0 + 8 * v;
                _mm256_storeu_ps(s, c ? _mm256_add_ps(_mm256_loadu_ps(s), t[v][k]) : t[v][k]);
            }
    }
}

/* The logits of the block's KB keys (kbuf holds KB rows; past the block's keys zero) for every row of the group. */
T static void qk_lanes_block(const float *qt, int rg, const float *kbuf, int Dp, float *S) {
    int r0 = 0;
    for (; rg - r0 >= 16; r0 += 16) {
        qk_lanes(2, 4, qt, rg, r0, kbuf, Dp, 0, S);
        qk_lanes(2, 4, qt, rg, r0, kbuf, Dp, 4, S);
    }
    if (r0 < rg) qk_lanes(1, KB, qt, rg, r0, kbuf, Dp, 0, S);
}

/* What the softmax of one block needs beside the logits: per key k < nk its logit multiplier mk[k] (softmax scale,
 * k_descale, a per-token-head K scale) and V scale vk[k] (NULL: none); the decoded unit; the softcap; per row the
 * visible keys [a, b) of the block (ints, relative to its first key), and with ALiBi its slope and j0 - position. */
typedef struct lanes_soft {
    const float *mk, *vk;
    float unit, cap;
    int nk;
    const int32_t *a, *b;
    const float *slope, *dist0; /* NULL without ALiBi */
} lanes_soft;

/* The online softmax of rows [r0, r0 + 8) of the group over the block (weights into P, [KB][rg]; m, l: the
 * group's); returns alpha, and in *live whether the rows' accumulators change (a nonzero or NaN weight, or
 * alpha != 1). */
T static __m256 soft_lanes(const lanes_soft *sp, int rg, int r0, const float *S, float *P, float *m, float *l,
                           int *live) {
    const __m256i A = _mm256_loadu_si256((const __m256i *)(sp->a + r0));
    const __m256i B = _mm256_loadu_si256((const __m256i *)(sp->b + r0));
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 sc[KB], vis[KB], bm = ninf;
    for (int k = 0; k < sp->nk; k++) {
        __m256 s = _mm256_loadu_ps(S + (size_t)k * rg + r0);
        if (sp->unit != 1.0f) s = _mm256_mul_ps(s, _mm256_set1_ps(sp->unit));
        s = _mm256_mul_ps(s, _mm256_set1_ps(sp->mk[k]));
        if (sp->cap > 0.0f)
            s = _mm256_mul_ps(_mm256_set1_ps(sp->cap), tanh8(_mm256_div_ps(s, _mm256_set1_ps(sp->cap))));
        const __m256i kk = _mm256_set1_epi32(k);
        vis[k] = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(A, kk), _mm256_cmpgt_epi32(B, kk)));
        if (sp->slope) {
            __m256 dist = _mm256_add_ps(_mm256_loadu_ps(sp->dist0 + r0), _mm256_set1_ps((float)k));
            dist = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), dist);
            s = _mm256_fnmadd_ps(_mm256_loadu_ps(sp->slope + r0), dist, s);
        }
        /* logits beyond float32's range saturate (vt_attn_sat; min/max keep a NaN) */
        sc[k] = _mm256_max_ps(_mm256_set1_ps(-FLT_MAX), _mm256_min_ps(_mm256_set1_ps(FLT_MAX), s));
        bm = _mm256_max_ps(_mm256_blendv_ps(ninf, sc[k], vis[k]), bm); /* a NaN logit leaves bm */
    }
    const __m256 mo = _mm256_loadu_ps(m + r0), mn = _mm256_max_ps(bm, mo);
    const __m256 dm = _mm256_sub_ps(mo, mn);
    __m256 alpha = _mm256_andnot_ps(_mm256_cmp_ps(dm, _mm256_set1_ps(-60.0f), _CMP_LT_OQ),
                                    exp8(_mm256_max_ps(dm, _mm256_set1_ps(-80.0f))));
    alpha = _mm256_blendv_ps(alpha, _mm256_set1_ps(1.0f), _mm256_cmp_ps(mo, mn, _CMP_EQ_OQ));
    __m256 sum = _mm256_setzero_ps(), any = _mm256_setzero_ps();
    for (int k = 0; k < sp->nk; k++) {
        const __m256 x = _mm256_sub_ps(sc[k], mn);
        const __m256 v = _mm256_and_ps(vis[k], _mm256_cmp_ps(x, _mm256_set1_ps(-60.0f), _CMP_NLT_UQ));
        const __m256 nan = _mm256_and_ps(v, _mm256_cmp_ps(sc[k], sc[k], _CMP_UNORD_Q));
        const __m256 e = _mm256_or_ps(nan, _mm256_and_ps(v, exp8(_mm256_max_ps(x, _mm256_set1_ps(-80.0f)))));
        sum = _mm256_add_ps(sum, e);
        const __m256 w = sp->vk ? _mm256_mul_ps(e, _mm256_set1_ps(sp->vk[k])) : e;
        any = _mm256_or_ps(any, w);
        _mm256_storeu_ps(P + (size_t)k * rg + r0, w);
    }
    _mm256_storeu_ps(l + r0, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(l + r0), alpha), sum));
    _mm256_storeu_ps(m + r0, mn);
    *live = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(any, _mm256_setzero_ps(), _CMP_NEQ_UQ),
                                            _mm256_cmp_ps(alpha, _mm256_set1_ps(1.0f), _CMP_NEQ_UQ))) != 0;
    return alpha;
}

/* acc^T of RV vectors of rows from r0: acc = acc * alpha + sum over keys k < nk of P[k] V_k, every element d < Dp;
 * SAFE: only the products of nonzero weights are added. */
T static AI void pv_lanes(const int RV, const int SAFE, float *at, int rg, int r0, const __m256 *alpha,
                          const float *P, const float *vbuf, int Dp, int nk) {
    const int ND = 8 / RV;
    for (int d0 = 0; d0 < Dp; d0 += ND) {
        __m256 a[2][8];
        VT_UNROLL
        for (int v = 0; v < RV; v++)
            VT_UNROLL
            for (int n = 0; n < ND; n++)
                a[v][n] = _mm256_mul_ps(_mm256_loadu_ps(at + (size_t)(d0 + n) * rg + r0 + 8 * v), alpha[v]);
        for (int k = 0; k < nk; k++) {
            const float *pk = P + (size_t)k * rg + r0;
            const __m256 p0 = _mm256_loadu_ps(pk), p1 = RV > 1 ? _mm256_loadu_ps(pk + 8) : p0;
            const __m256 z0 = _mm256_cmp_ps(p0, _mm256_setzero_ps(), _CMP_NEQ_UQ);
            const __m256 z1 = _mm256_cmp_ps(p1, _mm256_setzero_ps(), _CMP_NEQ_UQ);
            VT_UNROLL
            for (int n = 0; n < ND; n++) {
                const __m256 vb = _mm256_broadcast_ss(vbuf + (size_t)k * Dp + d0 + n);
                if (SAFE) {
                    a[0][n] = _mm256_add_ps(a[0][n], _mm256_and_ps(z0, _mm256_mul_ps(p0, vb)));
                    if (RV > 1) a[1][n] = _mm256_add_ps(a[1][n], _mm256_and_ps(z1, _mm256_mul_ps(p1, vb)));
                } else {
                    a[0][n] = _mm256_fmadd_ps(p0, vb, a[0][n]);
                    if (RV > 1) a[1][n] = _mm256_fmadd_ps(p1, vb, a[1][n]);
                }
            }
        }
        VT_UNROLL
        for (int v = 0; v < RV; v++)
            VT_UNROLL
            for (int n = 0; n < ND; n++) _mm256_storeu_ps(at + (size_t)(d0 + n) * rg + r0 + 8 * v, a[v][n]);
    }
}

/* 1 when a decoded row of vbuf (nk rows of Dp floats) holds an inf or a NaN (x * 0 is NaN exactly then). */
T static AI int lanes_nonfinite(const float *vbuf, int nk, int Dp) {
    __m256 z = _mm256_setzero_ps();
    for (size_t i = 0; i < (size_t)nk * Dp; i += 8) z = _mm256_or_ps(z, _mm256_mul_ps(_mm256_loadu_ps(vbuf + i), _mm256_setzero_ps()));
    return _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q)) != 0;
}

/* One block of one KV head in the lanes form: logits, softmax and P V for every row of the group. */
T static void lanes_block(const lanes_soft *sp, const float *qt, float *at, int rg, float *m, float *l, float *S,
                          float *P, const float *kbuf, const float *vbuf, int Dp) {
    qk_lanes_block(qt, rg, kbuf, Dp, S);
    const int safe = lanes_nonfinite(vbuf, sp->nk, Dp);
    for (int r0 = 0; r0 < rg; r0 += 16) {
        const int RV = rg - r0 >= 16 ? 2 : 1;
        __m256 alpha[2];
        int live0 = 0, live1 = 0;
        alpha[0] = soft_lanes(sp, rg, r0, S, P, m, l, &live0);
        alpha[1] = RV > 1 ? soft_lanes(sp, rg, r0 + 8, S, P, m, l, &live1) : alpha[0];
        if (!live0 && !live1) continue;
        if (RV > 1 && safe) pv_lanes(2, 1, at, rg, r0, alpha, P, vbuf, Dp, sp->nk);
        else if (RV > 1) pv_lanes(2, 0, at, rg, r0, alpha, P, vbuf, Dp, sp->nk);
        else if (safe) pv_lanes(1, 1, at, rg, r0, alpha, P, vbuf, Dp, sp->nk);
        else pv_lanes(1, 0, at, rg, r0, alpha, P, vbuf, Dp, sp->nk);
    }
}

#endif /* VTINFER_ATTN_LANES_AVX2_H */
