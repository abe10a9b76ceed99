/* Pieces shared by the two AVX-512 attention tiles (attn_avx512.c: fp32
 * FMA, every dtype; attn_avx512bf16.c: the AVX512-BF16 pair-dot tile for
 * grouped rows): vector exp/tanh, the block-table walk, prefetch and one
 * row's online-softmax step over a block of 16 keys. Include only from x86
 * files; every function is always inlined into its (AVX-512 or wider) caller. */
#ifndef VTINFER_ATTN_AVX512_H
#define VTINFER_ATTN_AVX512_H

#include <string.h>

#include "attn_internal.h"
#include "attn_vec.h"
#include "simd_avx512.h"

#if VT_X86

#ifndef PF_BLOCKS
#define PF_BLOCKS 4 /* prefetch distance in key blocks */
#endif
#ifndef PF_HINT
/* into L2: a block's K and V rows for all groups of a tile (up to 64 KB at H_kv 8, D 128, bf16)
 * times the distance overflow L1 (measured, fp32 tile, GQA-1 32K keys from DRAM, C harness best of
 * 6: T0 59-61 ns per key-head at 1 thread, T1 51-59; fp8 at 2 threads T0 50.8-56.3, T1 32.5-43.9) */
#define PF_HINT _MM_HINT_T1
#endif

/* Lanes of the c-th 32-element chunk of a D-element row that hold elements. */
static inline __mmask32 vt512_chunk_mask(int D, int c) {
    int left = D - c * 32;
    return left >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
}

VT512 __m512 vt512_exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-88.3762626647949f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = VT_EXP_REDUCE(_mm512_fnmadd_ps, _mm512_set1_ps, n, x);
    const __m512 y = VT_EXP_POLY(_mm512_fmadd_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_set1_ps, r);
    return _mm512_scalef_ps(y, n);
}

VT512 __m512 vt512_tanh16(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 z = _mm512_mul_ps(x, x);
    const __m512 small = VT_TANH_POLY(_mm512_fmadd_ps, _mm512_mul_ps, _mm512_set1_ps, x, z);
    __m512 e1 = _mm512_add_ps(vt512_exp16(_mm512_add_ps(ax, ax)), _mm512_set1_ps(1.0f));
    /* 2 / e1 by a 14-bit reciprocal and one Newton step (~2^-27 relative;
     * a division here cost ~30% of GQA-1 fp8 decode with softcap on) */
    __m512 rc = _mm512_rcp14_ps(e1);
    rc = _mm512_mul_ps(rc, _mm512_fnmadd_ps(e1, rc, _mm512_set1_ps(2.0f)));
    __m512 big = _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), rc, _mm512_set1_ps(1.0f));
    big = _mm512_or_ps(big, _mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u))));
    __mmask16 use_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(big, use_small, small);
}

/* Fold the 16 vectors x[j] = s[16 j .. 16 j + 16) into one whose lane j is the sum of x[j]'s lanes
 * (4 levels of permute + add). */
VT512 __m512 vt512_reduce16(const float *s) {
    __m512 y[8], z[4], w[2];
    _Pragma("GCC unroll 8")
    for (int k = 0; k < 8; k++) {
        __m512 x0 = _mm512_loadu_ps(s + 32 * k), x1 = _mm512_loadu_ps(s + 32 * k + 16);
        __m512 p = _mm512_mask_permute_ps(x0, 0xAAAA, x1, _MM_SHUFFLE(2, 3, 0, 1));
        __m512 q = _mm512_mask_permute_ps(x1, 0x5555, x0, _MM_SHUFFLE(2, 3, 0, 1));
        y[k] = _mm512_add_ps(p, q);
    }
    for (int k = 0; k < 4; k++) {
        __m512 p = _mm512_mask_permute_ps(y[2 * k], 0xCCCC, y[2 * k + 1], _MM_SHUFFLE(1, 0, 3, 2));
        __m512 q = _mm512_mask_permute_ps(y[2 * k + 1], 0x3333, y[2 * k], _MM_SHUFFLE(1, 0, 3, 2));
        z[k] = _mm512_add_ps(p, q);
    }
    for (int k = 0; k < 2; k++) {
        __m512 p = _mm512_mask_shuffle_f32x4(z[2 * k], 0xF0F0, z[2 * k + 1], z[2 * k + 1], _MM_SHUFFLE(2, 3, 0, 1));
        __m512 q = _mm512_mask_shuffle_f32x4(z[2 * k + 1], 0x0F0F, z[2 * k], z[2 * k], _MM_SHUFFLE(2, 3, 0, 1));
        w[k] = _mm512_add_ps(p, q);
    }
    __m512 p = _mm512_mask_shuffle_f32x4(w[0], 0xFF00, w[1], w[1], _MM_SHUFFLE(1, 0, 3, 2));
    __m512 q = _mm512_mask_shuffle_f32x4(w[1], 0x00FF, w[0], w[0], _MM_SHUFFLE(1, 0, 3, 2));
    return _mm512_add_ps(p, q);
}

/* Prefetch the K and V rows (row_bytes each) of the keys at offsets ko/vo for the heads [g, g + ng),
 * into L1 (PF_HINT) or, with to_l2 (a constant after inlining), into L2 only. */
VT512 void vt512_prefetch_rows(const vt_attn_params *p, int g, int ng, const int64_t *ko, const int64_t *vo, int n,
                               int row_bytes, const int to_l2) {
    const char *kb = (const char *)p->k + (int64_t)g * p->k_stride_head;
    const char *vb = (const char *)p->v + (int64_t)g * p->v_stride_head;
    for (int i = 0; i < n; i++)
        for (int gi = 0; gi < ng; gi++)
            for (int o = 0; o < row_bytes; o += 64) {
                if (to_l2) {
                    _mm_prefetch(kb + ko[i] + gi * p->k_stride_head + o, _MM_HINT_T1);
                    _mm_prefetch(vb + vo[i] + gi * p->v_stride_head + o, _MM_HINT_T1);
                } else {
                    _mm_prefetch(kb + ko[i] + gi * p->k_stride_head + o, PF_HINT);
                    _mm_prefetch(vb + vo[i] + gi * p->v_stride_head + o, PF_HINT);
                }
            }
}

/* Per-token-head caches: prefetch into L2 the K and V scales of heads [g, g + ng) of the n keys at
 * the scale offsets kso / vso (vt_attn_scale_offsets): one float per (key, head), on lines of
 * their own beside the rows (vLLM's page puts each after its head's codes). */
VT512 void vt512_prefetch_scales(const vt_attn_params *p, int g, int ng, const int64_t *kso, const int64_t *vso,
                                 int n) {
    const char *kb = (const char *)p->k_scale_cache + (int64_t)g * p->ks_stride_head;
    const char *vb = (const char *)p->v_scale_cache + (int64_t)g * p->vs_stride_head;
    for (int i = 0; i < n; i++)
        for (int gi = 0; gi < ng; gi++) {
            _mm_prefetch(kb + kso[i] + gi * p->ks_stride_head, _MM_HINT_T1);
            _mm_prefetch(vb + vso[i] + gi * p->vs_stride_head, _MM_HINT_T1);
        }
}

/* What one row's softmax step needs besides its dot products. */
typedef struct vt512_row_step {
    __m512 mul;          /* logit multiplier, per key lane (softmax_scale * k_descale [* per-key K scale]) */
    float cap, inv_cap;  /* softcap and 1 / softcap (cap 0: none) */
    const float *slope;  /* the row's ALiBi slope, or NULL */
    int64_t j0, pos;     /* first key of the block; the row's query position */
    int64_t lo, hi;      /* the row's visible keys [lo, hi) */
    __mmask16 valid;     /* lanes that hold a key of the block */
} vt512_row_step;

/* One row's online-softmax step over a block of 16 keys whose raw dot
 * products q . k_j are the lanes of `dots`: the logits (multiplier, softcap,
 * ALiBi, saturation at +-FLT_MAX), the new running max *m, *alpha =
 * e^{m_old - m_new}; returns e^{s_j - m_new} per lane, 0 where the key is
 * not visible or the weight is below e^-60 (flushed: its share of the sum
 * is < 1e-21, and its products with V would be subnormal, a microcode
 * assist on every FMA). A row that sees no key of the block gets e = 0,
 * alpha 1, m unchanged. The caller adds the weights to the row's sum. */
VT512 __m512 vt512_row_weights(const vt512_row_step *st, __m512 dots, float *m, float *alpha) {
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 sc = _mm512_mul_ps(dots, st->mul);
    *alpha = 1.0f;
    if (st->cap > 0.0f)
        sc = _mm512_mul_ps(_mm512_set1_ps(st->cap), vt512_tanh16(_mm512_mul_ps(sc, _mm512_set1_ps(st->inv_cap))));
    __m512 jpos = _mm512_add_ps(lane, _mm512_set1_ps((float)(st->j0 - st->lo)));
    __mmask16 vis = st->valid & _mm512_cmp_ps_mask(jpos, _mm512_setzero_ps(), _CMP_GE_OQ) &
                    _mm512_cmp_ps_mask(jpos, _mm512_set1_ps((float)(st->hi - st->lo)), _CMP_LT_OQ);
    if (st->slope) {
        __m512 dist = _mm512_add_ps(lane, _mm512_set1_ps((float)(st->j0 - st->pos)));
        sc = _mm512_fnmadd_ps(_mm512_set1_ps(*st->slope), _mm512_abs_ps(dist), sc);
    }
    /* logits beyond float32's range saturate (vt_attn_sat; min/max keep a NaN) */
    sc = _mm512_max_ps(_mm512_set1_ps(-FLT_MAX), _mm512_min_ps(_mm512_set1_ps(FLT_MAX), sc));
    if (vis == 0) return _mm512_setzero_ps();
    float bm = _mm512_mask_reduce_max_ps(vis, sc);
    float mo = *m, mn = bm > mo ? bm : mo;
    /* m = -inf gives alpha 0 */
    *alpha = mo == mn ? 1.0f : (mo - mn < -60.0f ? 0.0f : expf(mo - mn));
    __m512 x = _mm512_sub_ps(sc, _mm512_set1_ps(mn));
    /* a visible NaN logit (a NaN code in K) stays a NaN weight, as in the scalar twin; the clamps of the
     * exp would make it finite */
    const __mmask16 nan = vis & _mm512_cmp_ps_mask(sc, sc, _CMP_UNORD_Q);
    vis &= _mm512_cmp_ps_mask(x, _mm512_set1_ps(-60.0f), _CMP_NLT_UQ);
    *m = mn;
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(vis, vt512_exp16(x)), nan, _mm512_set1_ps(NAN));
}

/* The softmax step of one block of 16 keys for the rg rows of a group
 * (row r: query r / G of the item, head offset r % G): row r's dots are the
 * 16 x 16 partial sums at S + r * 256 (vt512_reduce16), its weights go to
 * P + r * 16, its
 * running max m[r] and sum l[r] are updated, and alpha[r] is the rescale of
 * its accumulator (1 for a row that sees no key of the block, whose weights
 * are 0). st carries the block's multiplier, softcap, first key and valid
 * lanes; slopes is the group's first ALiBi slope or NULL; lo / hi each
 * query's visible keys, pos0 the first query's position. */
VT512 void vt512_block_weights(vt512_row_step *st, const float *slopes, int G, int rg, int nk, const int64_t *lo,
                               const int64_t *hi, int64_t pos0, const float *S, float *P, float *m, float *l,
                               float *alpha) {
    for (int r = 0; r < rg; r++) {
        const int64_t qi = r / G;
        float *pr = P + (size_t)r * 16;
        alpha[r] = 1.0f;
        if (hi[qi] <= st->j0 || lo[qi] >= st->j0 + nk) {
            memset(pr, 0, 16 * 4);
            continue;
        }
        st->lo = lo[qi], st->hi = hi[qi], st->pos = pos0 + qi;
        st->slope = slopes ? &slopes[r % G] : NULL;
        __m512 e = vt512_row_weights(st, vt512_reduce16(S + (size_t)r * 256), &m[r], &alpha[r]);
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(e);
        _mm512_storeu_ps(pr, e);
    }
}

#endif /* VT_X86 */
#endif /* VTINFER_ATTN_AVX512_H */
