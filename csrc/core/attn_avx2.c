/* AVX2+FMA+F16C attention tile (per-function target attributes).
 *
 * The shape of the AVX-512 tile (attn_avx512.c) on 8-lane vectors: keys in
 * blocks of 8; each K row decoded in registers 16 elements at a time and
 * multiplied into one accumulator per row (up to 4 rows per pass, so the
 * 16 registers hold them); the 8 per-key partial vectors of a row fold
 * into 8 logits by hadd + a 128-bit lane swap; online softmax on 8 logits
 * at a time; V rows decoded once per block into an L1 buffer; P V keeps
 * the row's accumulator in registers.
 *
 * Each format's chunk decoder is in attn_dec_avx2.h (q rows and accumulators
 * are kept in the order its decoder emits, chunk_pos).
 *
 * int4_per_token_head runs the same tile with the int4 rules of the scalar
 * twin's int4 path: each query row rotated once (vt_attn_int4_rotate_q); the
 * logit multiplier is softmax_scale / b times key j's masked K scale, its
 * masked V scale goes on its weight, and the accumulator is rotated back
 * (vt_int4_rht_back) at the end. */
#include "attn_internal.h"
#include "simd_avx2.h"

#if VT_X86

#define T VT_TARGET_AVX2
#define AI __attribute__((always_inline)) inline
#define VT_PRAGMA(x) _Pragma(#x)
#define VT_UNROLL VT_PRAGMA(GCC unroll 16)
#define KB 8
#define CH 16 /* elements decoded per chunk: two vectors */
#define VEC __m256
#define VW 8
#define PV_MAXV 8
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VMUL _mm256_mul_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#include "attn_vec.h"

T static AI __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(80.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = VT_EXP_REDUCE(_mm256_fnmadd_ps, _mm256_set1_ps, n, x);
    const __m256 y = VT_EXP_POLY(_mm256_fmadd_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_set1_ps, r);
    /* 2^n by the exponent field: n in [-126, 128) after the clamp (-87 / ln 2 > -126) */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

T static AI __m256 tanh8(__m256 x) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 z = _mm256_mul_ps(x, x);
    const __m256 small = VT_TANH_POLY(_mm256_fmadd_ps, _mm256_mul_ps, _mm256_set1_ps, x, z);
    __m256 e = exp8(_mm256_min_ps(_mm256_add_ps(ax, ax), _mm256_set1_ps(80.0f)));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                               _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

#include "attn_dec_avx2.h"
#include "attn_lanes_avx2.h"

/* One vector whose lane j is the sum of the 8 lanes of s[8 j ...]. */
T static AI __m256 reduce8(const float *s) {
    __m256 t0 = _mm256_hadd_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(s + 8));
    __m256 t1 = _mm256_hadd_ps(_mm256_loadu_ps(s + 16), _mm256_loadu_ps(s + 24));
    __m256 t2 = _mm256_hadd_ps(_mm256_loadu_ps(s + 32), _mm256_loadu_ps(s + 40));
    __m256 t3 = _mm256_hadd_ps(_mm256_loadu_ps(s + 48), _mm256_loadu_ps(s + 56));
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

T static AI float hmax8(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

T static AI float hsum8(__m256 x) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* S[(r * 8 + jj) * 8 ...] = 8 lane partials of q_r . K_jj for R rows (kz: the keys' int4 zero points);
 * the NC - 1 leading chunks of a row are whole, the last one whole or padded. */
T static AI void qk_rows(const int R, const dec256 *dc, const float *qp, int Dp, int D,
                         const uint8_t *const *kp, const float *kz, int nk, const uint8_t *const *kq, int nq,
                         float *S) {
    const int NC = Dp / CH;
    for (int jj = 0; jj < nk; jj++) {
        if (jj < nq) /* a later block's K row, one per key (see tile) */
            for (int o = 0; o < D * dc->bits / 8; o += 64) _mm_prefetch((const char *)kq[jj] + o, _MM_HINT_T1);
        __m256 s0[4], s1[4];
        VT_UNROLL
        for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_ps();
        for (int c = 0; c < NC; c++) {
            __m256 ka, kb;
            if (c + 1 < NC) dec_whole(dc, kp[jj], c, kz[jj], &ka, &kb);
            else dec_chunk(dc, kp[jj], c, D, kz[jj], &ka, &kb);
            VT_UNROLL
            for (int r = 0; r < R; r++) {
                s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + r * Dp + c * CH), ka, s0[r]);
                s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qp + r * Dp + c * CH + 8), kb, s1[r]);
            }
        }
        VT_UNROLL
        for (int r = 0; r < R; r++) _mm256_storeu_ps(S + (r * KB + jj) * 8, _mm256_add_ps(s0[r], s1[r]));
    }
}

T static AI void qk_group(int R, const dec256 *dc, const float *qp, int Dp, int D,
                          const uint8_t *const *kp, const float *kz, int nk, const uint8_t *const *kq, int nq,
                          float *S) {
    switch (R) {
    case 1: qk_rows(1, dc, qp, Dp, D, kp, kz, nk, kq, nq, S); break;
    case 2: qk_rows(2, dc, qp, Dp, D, kp, kz, nk, kq, nq, S); break;
    case 3: qk_rows(3, dc, qp, Dp, D, kp, kz, nk, kq, nq, S); break;
    default: qk_rows(4, dc, qp, Dp, D, kp, kz, nk, kq, nq, S); break;
    }
}

/* P V for one row straight from the V rows (no decoded copy): chunks [c0, c0 + NCH) of the row's accumulator,
 * alpha-scaled, plus the weighted chunks of keys [0, nk). */
T static AI void pv_dec_chunks(const int NCH, const dec256 *dc, float *acc, float alpha, const float *P,
                               const uint8_t *const *vp, const float *vz, int c0, int NC, int D, int nk) {
    __m256 a[8];
    const __m256 al = _mm256_set1_ps(alpha);
    VT_UNROLL
    for (int v = 0; v < 2 * NCH; v++) a[v] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)c0 * CH + 8 * v), al);
    for (int jj = 0; jj < nk; jj++) {
        if (P[jj] == 0.0f) continue;
        const __m256 pb = _mm256_set1_ps(P[jj]);
        VT_UNROLL
        for (int cc = 0; cc < NCH; cc++) {
            __m256 va, vb;
            if (c0 + cc + 1 < NC) dec_whole(dc, vp[jj], c0 + cc, vz[jj], &va, &vb);
            else dec_chunk(dc, vp[jj], c0 + cc, D, vz[jj], &va, &vb);
            a[2 * cc] = _mm256_fmadd_ps(pb, va, a[2 * cc]);
            a[2 * cc + 1] = _mm256_fmadd_ps(pb, vb, a[2 * cc + 1]);
        }
    }
    VT_UNROLL
    for (int v = 0; v < 2 * NCH; v++) _mm256_storeu_ps(acc + (size_t)c0 * CH + 8 * v, a[v]);
}

T static AI void pv_dec_row(const dec256 *dc, float *acc, float alpha, const float *P, const uint8_t *const *vp,
                            const float *vz, int NC, int D, int nk) {
    int c0 = 0;
    for (; NC - c0 >= 4; c0 += 4) pv_dec_chunks(4, dc, acc, alpha, P, vp, vz, c0, NC, D, nk);
    if (NC - c0 >= 2) pv_dec_chunks(2, dc, acc, alpha, P, vp, vz, c0, NC, D, nk), c0 += 2;
    if (NC - c0 >= 1) pv_dec_chunks(1, dc, acc, alpha, P, vp, vz, c0, NC, D, nk);
}

/* Rows per group up to which P V decodes V in place for each row; more rows decode each V row once. */
#define PV_DIRECT_ROWS 2

/* Groups of at least this many rows, a multiple of 8, run the lanes form (attn_lanes_avx2.h): prefill tiles and
 * GQA >= 16 decode; at 8 rows (GQA 8 decode) the row form reads bf16 ~5% faster (speed.md, Results). */
#ifndef LANES_MIN_ROWS
#define LANES_MIN_ROWS 16
#endif

#ifndef PF_BLOCKS
#define PF_BLOCKS 8 /* prefetch distance in key blocks (of 8 keys), into L2 (measured: Results, AVX2 prefetch) */
#endif

/* The tile for the decoder row dc (pth: per-token-head scales) and the head size DC (0: p->head_size), all
 * constants of each instance. */
T static AI void tile(const dec256 *dc, const int pth, const int DC, const vt_attn_params *p, const vt_attn_item *it,
                      float *work, float *m, float *l, float *acc) {
    const int D = DC ? DC : (int)p->head_size, G = p->num_heads / p->num_kv_heads;
    const int Dp = (D + CH - 1) / CH * CH;
    const int rg = (int)(it->nq * G); /* rows per group */
    const int rows = rg * it->ng;
    const int lanes = rg >= LANES_MIN_ROWS && rg % 8 == 0;
    /* Per-token-head caches decode their codes (int8 here, e4m3 by the fp8 path) and fold each key's
     * K scale into its logit and its V scale into its weight, as the AVX-512 tile does. */
    const int i4 = dc->rotated;
    const float b4 = i4 ? (float)vt_int4_rht_block(D) : 1.0f; /* the rotation's norm (H H = b I) */
    float kscale[KB], vscale[KB], kz[KB] = {0}, vz[KB] = {0};
    float *qp = work;                    /* rows * Dp, permuted */
    float *ap = qp + (size_t)rows * Dp;  /* rows * Dp, permuted accumulators */
    float *S = ap + (size_t)rows * Dp;   /* rg * 8 * 8 partial dots */
    float *P = S + (size_t)rg * KB * 8;  /* rg * 8 weights */
    float *vbuf = P + (size_t)rg * KB;   /* KB * Dp decoded V rows */
    float *tmp = vbuf + (size_t)KB * Dp; /* Dp */
    float *alpha = tmp + Dp;             /* rg */
    float *kbuf = alpha + rg;            /* lanes form: KB * Dp decoded K rows */
    int32_t *la = (int32_t *)(kbuf + (size_t)KB * Dp), *lb = la + rg; /* lanes form: visible keys of the block */
    float *slopes = (float *)(lb + rg), *dist0 = slopes + rg;          /* lanes form, ALiBi */
    int pos[CH];
    for (int e = 0; e < CH; e++) pos[e] = chunk_pos(dc, e);
    vt_attn_rows_init(p, it, rows, rg, D, Dp, i4, CH, pos, lanes, qp, ap, tmp, m, l);
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = vt_attn_item_ranges(p, it, lo, hi);
    const float cap = p->softcap;
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const int NC = Dp / CH;
    int64_t ko[KB], vo[KB], kso[KB], vso[KB], kpf[KB], vpf[KB];
    const uint8_t *kp[KB], *vp[KB], *kq[KB];
    const int pf_per_key = dc->bits >= 16; /* see the block loop */
    const int row_bytes = (int)vt_dtype_row_bytes(p->kv_dtype, (size_t)D);
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        /* the K / V rows of a block ahead, one head at a time, spread through this block's work on that head:
         * 2- and 4-byte rows (whose read is memory-bound) a K row beside each key's logit and the V rows before
         * the softmax; 1-byte and int4 rows (whose read is bound by the decode) both at the head's start (measured:
         * speed.md, Results); the scales here */
        const int64_t jp = j0 + PF_BLOCKS * KB;
        int npf = 0;
        if (jp < it->ke) {
            npf = it->ke - jp < KB ? (int)(it->ke - jp) : KB;
            vt_attn_key_offsets(p, it, jp, npf, kpf, vpf);
            if (pth) {
                vt_attn_scale_offsets(p, it->b, jp, npf, kso, vso);
                for (int i = 0; i < npf; i++) {
                    _mm_prefetch((const char *)p->k_scale_cache + kso[i] + (int64_t)it->g * p->ks_stride_head, _MM_HINT_T1);
                    _mm_prefetch((const char *)p->v_scale_cache + vso[i] + (int64_t)it->g * p->vs_stride_head, _MM_HINT_T1);
                }
            }
        }
        vt_attn_key_offsets(p, it, j0, nk, ko, vo);
        if (pth) vt_attn_scale_offsets(p, it->b, j0, nk, kso, vso); /* once per block, all heads */
        const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps((float)nk), _CMP_LT_OQ);
        if (lanes) /* each row's visible keys of the block, relative to j0 and clamped to [-1, KB + 1] */
            for (int64_t qi = 0; qi < it->nq; qi++) {
                const int64_t a = lo[qi] - j0, z = hi[qi] - j0;
                for (int r = (int)qi * G; r < (int)(qi + 1) * G; r++) {
                    la[r] = (int32_t)(a < -1 ? -1 : (a > KB + 1 ? KB + 1 : a));
                    lb[r] = (int32_t)(z < -1 ? -1 : (z > KB + 1 ? KB + 1 : z));
                    if (p->alibi_slopes) dist0[r] = (float)(j0 - (base + it->q0 + qi));
                }
            }
        for (int gi = 0; gi < it->ng; gi++) {
            const int g = it->g + gi;
            for (int jj = 0; jj < npf; jj++) kq[jj] = (const uint8_t *)p->k + (int64_t)g * p->k_stride_head + kpf[jj];
            if (!pf_per_key) {
                vt_attn_prefetch_head(p->k, p->k_stride_head, g, kpf, npf, row_bytes);
                vt_attn_prefetch_head(p->v, p->v_stride_head, g, vpf, npf, row_bytes);
            }
            const uint8_t *kb = (const uint8_t *)p->k + (int64_t)g * p->k_stride_head;
            const uint8_t *vb = (const uint8_t *)p->v + (int64_t)g * p->v_stride_head;
            for (int jj = 0; jj < nk; jj++) kp[jj] = kb + ko[jj], vp[jj] = vb + vo[jj];
            float *ag = ap + (size_t)gi * rg * Dp, *mg = m + gi * rg, *lg = l + gi * rg;
            /* e4m3 rows without a NaN code (all but hostile caches) decode without the NaN test */
            const int fin = dc->rows_finite && dc->rows_finite(kp, vp, nk, D);
            __m256 mul = _mm256_set1_ps(vt_attn_logit_mul(p, it->b, g)), vmul = _mm256_set1_ps(1.0f);
            if (pth) {
                vt_attn_key_scales(p, g, kso, vso, nk, KB, kscale, vscale);
                if (dc->zero_point) { /* stored scale -> (masked scale, zero point); softmax_scale / b */
                    for (int jj = 0; jj < KB; jj++) {
                        kscale[jj] = vt_attn_int4_split(kscale[jj], &kz[jj]);
                        vscale[jj] = vt_attn_int4_split(vscale[jj], &vz[jj]);
                    }
                    mul = _mm256_set1_ps(vt_attn_logit_mul(p, it->b, g) / b4);
                }
                mul = _mm256_mul_ps(mul, _mm256_loadu_ps(kscale)); /* softmax_scale * ks_j, per key */
                vmul = _mm256_loadu_ps(vscale);
            }
            if (lanes) {
                if (pf_per_key) {
                    vt_attn_prefetch_head(p->k, p->k_stride_head, g, kpf, npf, row_bytes);
                    vt_attn_prefetch_head(p->v, p->v_stride_head, g, vpf, npf, row_bytes);
                }
                if (fin) {
                    dec_rows(dc->finite, kp, kz, nk, NC, D, Dp, kbuf);
                    dec_rows(dc->finite, vp, vz, nk, NC, D, Dp, vbuf);
                } else {
                    dec_rows(dc, kp, kz, nk, NC, D, Dp, kbuf);
                    dec_rows(dc, vp, vz, nk, NC, D, Dp, vbuf);
                }
                if (nk < KB) memset(kbuf + (size_t)nk * Dp, 0, (size_t)(KB - nk) * Dp * 4);
                float mk[KB], vk[KB];
                _mm256_storeu_ps(mk, mul);
                _mm256_storeu_ps(vk, vmul);
                if (p->alibi_slopes)
                    for (int r = 0; r < rg; r++) slopes[r] = p->alibi_slopes[g * G + r % G];
                const lanes_soft sp = {mk, pth ? vk : NULL, dc->unit, cap, nk, la, lb,
                                       p->alibi_slopes ? slopes : NULL, dist0};
                lanes_block(&sp, qp + (size_t)gi * rg * Dp, ag, rg, mg, lg, S, P, kbuf, vbuf, Dp);
                continue;
            }
            for (int r0 = 0; r0 < rg; r0 += 4) {
                int R = rg - r0 < 4 ? rg - r0 : 4;
                const float *qg = qp + ((size_t)gi * rg + r0) * Dp;
                const int nq = pf_per_key && !r0 ? npf : 0;
                float *Sr = S + (size_t)r0 * KB * 8;
                if (fin) qk_group(R, dc->finite, qg, Dp, D, kp, kz, nk, kq, nq, Sr);
                else qk_group(R, dc, qg, Dp, D, kp, kz, nk, kq, nq, Sr);
            }
            if (nk < KB)
                for (int r = 0; r < rg; r++) memset(S + ((size_t)r * KB + nk) * 8, 0, (size_t)(KB - nk) * 32);
            if (rg > PV_DIRECT_ROWS && fin) dec_rows(dc->finite, vp, vz, nk, NC, D, Dp, vbuf);
            else if (rg > PV_DIRECT_ROWS) dec_rows(dc, vp, vz, nk, NC, D, Dp, vbuf);
            if (pf_per_key) vt_attn_prefetch_head(p->v, p->v_stride_head, g, vpf, npf, row_bytes);
            for (int r = 0; r < rg; r++) {
                int64_t qi = r / G;
                float *pr = P + (size_t)r * KB;
                alpha[r] = 1.0f;
                if (hi[qi] <= j0 || lo[qi] >= j0 + nk) {
                    memset(pr, 0, KB * 4);
                    continue;
                }
                __m256 sc = reduce8(S + (size_t)r * KB * 8);
                if (dc->unit != 1.0f) sc = _mm256_mul_ps(sc, _mm256_set1_ps(dc->unit));
                sc = _mm256_mul_ps(sc, mul);
                if (cap > 0.0f)
                    sc = _mm256_mul_ps(_mm256_set1_ps(cap), tanh8(_mm256_div_ps(sc, _mm256_set1_ps(cap))));
                __m256 jpos = _mm256_add_ps(lane, _mm256_set1_ps((float)(j0 - lo[qi])));
                __m256 vis = _mm256_and_ps(valid, _mm256_and_ps(_mm256_cmp_ps(jpos, _mm256_setzero_ps(), _CMP_GE_OQ),
                                                                _mm256_cmp_ps(jpos, _mm256_set1_ps((float)(hi[qi] - lo[qi])),
                                                                              _CMP_LT_OQ)));
                if (p->alibi_slopes) {
                    float slope = p->alibi_slopes[g * G + r % G];
                    __m256 dist = _mm256_add_ps(lane, _mm256_set1_ps((float)(j0 - (base + it->q0 + qi))));
                    dist = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), dist);
                    sc = _mm256_fnmadd_ps(_mm256_set1_ps(slope), dist, sc);
                }
                /* logits beyond float32's range saturate (vt_attn_sat; min/max keep a NaN) */
                sc = _mm256_max_ps(_mm256_set1_ps(-FLT_MAX), _mm256_min_ps(_mm256_set1_ps(FLT_MAX), sc));
                if (_mm256_movemask_ps(vis) == 0) {
                    memset(pr, 0, KB * 4);
                    continue;
                }
                float bm = hmax8(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sc, vis));
                float mn = bm > mg[r] ? bm : mg[r];
                /* weights below e^-60 flushed to 0 (see attn_avx512.c) */
                alpha[r] = mg[r] == mn ? 1.0f : (mg[r] - mn < -60.0f ? 0.0f : expf(mg[r] - mn));
                __m256 x = _mm256_sub_ps(sc, _mm256_set1_ps(mn));
                vis = _mm256_and_ps(vis, _mm256_cmp_ps(x, _mm256_set1_ps(-60.0f), _CMP_NLT_UQ));
                /* a visible NaN logit (a NaN code in K) stays a NaN weight (all bits set), as in the scalar twin */
                const __m256 nan = _mm256_and_ps(vis, _mm256_cmp_ps(sc, sc, _CMP_UNORD_Q));
                __m256 e = _mm256_or_ps(nan, _mm256_and_ps(vis, exp8(_mm256_max_ps(x, _mm256_set1_ps(-80.0f)))));
                lg[r] = lg[r] * alpha[r] + hsum8(e);
                mg[r] = mn;
                _mm256_storeu_ps(pr, pth ? _mm256_mul_ps(e, vmul) : e); /* V's per-key scale on the weight */
            }
            for (int r = 0; r < rg; r++) {
                const float *pr = P + (size_t)r * KB;
                if (alpha[r] == 1.0f &&
                    _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(pr), _mm256_setzero_ps(), _CMP_NEQ_UQ)) == 0)
                    continue;
                if (rg > PV_DIRECT_ROWS) pv_row(ag + (size_t)r * Dp, alpha[r], pr, vbuf, Dp, nk);
                else if (fin) pv_dec_row(dc->finite, ag + (size_t)r * Dp, alpha[r], pr, vp, vz, NC, D, nk);
                else pv_dec_row(dc, ag + (size_t)r * Dp, alpha[r], pr, vp, vz, NC, D, nk);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *o = acc + (size_t)r * D;
        /* the accumulators: row-major, or in the lanes form transposed per group */
        for (int d = 0; d < D; d++)
            o[d] = ap[vt_attn_row_at(r, rg, Dp, lanes, (size_t)(d / CH) * CH + chunk_pos(dc, d % CH))] * dc->unit;
        if (i4) vt_int4_rht_back(o, D); /* linear, so before the merge of partials */
    }
}

/* One instance per row of the decoder table; inside it, the common head sizes are constants too (unrolled
 * chunk loops). */
#define INSTANCE(fmt, row, pth) VT_ATTN_TILE_INSTANCE(tile_##fmt, &row, pth)
VT_AVX2_DECODERS(INSTANCE)
#undef INSTANCE

/* This ISA's entries of the (ISA x format) kernel table: one instance per format it reads fast, the
 * decoder a compile-time constant in each (cpu.c takes these before any family tile). */
#define ENTRY(fmt, row, pth) [VT_DTYPE_##fmt] = tile_##fmt,
const vt_attn_tile_fn vt_attn_tiles_avx2[VT_DTYPE_COUNT] = {VT_AVX2_DECODERS(ENTRY)};
#undef ENTRY

/* The per-token-head formats' instances, which the AVX-512 tables take. */
#define ENTRY(fmt, row, pth) [VT_DTYPE_##fmt] = (pth) ? tile_##fmt : NULL,
const vt_attn_tile_fn vt_attn_tiles_avx2_for_avx512[VT_DTYPE_COUNT] = {VT_AVX2_DECODERS(ENTRY)};
#undef ENTRY

#endif /* VT_X86 */
