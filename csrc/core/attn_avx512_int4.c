/* AVX-512 attention tile for int4_per_token_head caches (F+BW+VL+DQ).
 *
 * The same arithmetic as the scalar twin's int4 path (attn_ref.c, kept as
 * the reference): each query row rotated once (vt_attn_int4_rotate_q: the
 * row's Hadamard rotation, rounded to q's dtype), the logit multiplier
 * softmax_scale / b times key j's masked K scale, keys (code - zero point),
 * key j's masked V scale on its weight, and the accumulator rotated back
 * (s ⊙ (H acc) / b) at the end. Only the order of the float32 sums differs.
 *
 * Keys go in blocks of 16, as in the fp32 tile (attn_avx512.c): a K row's
 * 32-element chunk is 16 bytes, widened to 16 int32 lanes, its low nibbles
 * (the even elements) and high nibbles (the odd ones) converted to float32
 * minus the key's zero point, so q and the accumulators are held in the
 * even/odd order of the bf16 chunks (lanes 0-15 evens, 16-31 odds). Each
 * row's 16 partial vectors per block fold into 16 logits (vt512_reduce16),
 * and the online-softmax step is the fp32 tile's (vt512_row_weights). V rows
 * are decoded once per block into an L1 buffer (no copy of the page). */
#include "attn_avx512.h"

#if VT_X86

#define T VT_TARGET_AVX512
#define KB 16
#define CH 32 /* elements per chunk: 16 bytes of codes */

/* Position of element e of a 32-element chunk in the decoded order (evens, then odds). */
static inline int i4_pos(int e) { return (e & 1) * 16 + (e >> 1); }

/* Chunk c of the int4 row at src (D elements, D/2 bytes) minus the zero point zp, as evens / odds
 * (bytes past the row read 0, so those lanes hold -zp: q is 0 there and the caller drops them). */
T static inline void dec_chunk(const uint8_t *src, int c, int D, __m512 zp, __m512 *ev, __m512 *od) {
    const int left = D / 2 - c * 16;
    const __mmask16 mb = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    const __m512i x = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mb, src + (size_t)c * 16));
    *ev = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(0xF))), zp);
    *od = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4)), zp);
}

T void vt_attn_tile_avx512_int4(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                                float *acc) {
    const int D = p->head_size, G = p->num_heads / p->num_kv_heads;
    const int Dp = (D + CH - 1) / CH * CH, NC = Dp / CH;
    const int rg = (int)(it->nq * G); /* rows per group */
    const int rows = rg * it->ng;
    const float b4 = (float)vt_int4_rht_block(D); /* the rotation's norm (H H = b I) */
    float *qp = work;                    /* rows * Dp, rotated, even/odd order */
    float *ap = qp + (size_t)rows * Dp;  /* rows * Dp accumulators, even/odd order */
    float *S = ap + (size_t)rows * Dp;   /* rg * 16 * 16 partial dots (one group at a time) */
    float *P = S + (size_t)rg * KB * 16; /* rg * 16 weights */
    float *vbuf = P + (size_t)rg * KB;   /* KB * Dp decoded V rows */
    float *tmp = vbuf + (size_t)KB * Dp; /* Dp */
    float *alpha = tmp + Dp;             /* rg */
    _Alignas(64) float ks[KB], vs[KB], kz[KB], vz[KB];
    for (int r = 0; r < rows; r++) {
        const uint8_t *src = vt_attn_q_row(p, it, r, rg, G);
        vt_attn_load_q(p, src, tmp, D);
        vt_attn_int4_rotate_q(p, tmp, D);
        float *qr = qp + (size_t)r * Dp;
        memset(qr, 0, (size_t)Dp * 4);
        memset(ap + (size_t)r * Dp, 0, (size_t)Dp * 4);
        for (int d = 0; d < D; d++) qr[(d / CH) * CH + i4_pos(d % CH)] = tmp[d];
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = vt_attn_item_ranges(p, it, lo, hi);
    const float cap = p->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    int64_t ko[KB], vo[KB], kso[KB], vso[KB];
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        const int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        const int64_t jp = j0 + PF_BLOCKS * KB;
        if (jp < it->ke) {
            const int nn = it->ke - jp < KB ? (int)(it->ke - jp) : KB;
            vt_attn_key_offsets(p, it, jp, nn, ko, vo);
            vt512_prefetch_rows(p, it->g, it->ng, ko, vo, nn, D / 2, 0);
            vt_attn_scale_offsets(p, it->b, jp, nn, kso, vso);
            vt512_prefetch_scales(p, it->g, it->ng, kso, vso, nn);
        }
        vt_attn_key_offsets(p, it, j0, nk, ko, vo);
        vt_attn_scale_offsets(p, it->b, j0, nk, kso, vso); /* once per block, all heads */
        const __mmask16 valid = (__mmask16)((1u << nk) - 1u);
        for (int gi = 0; gi < it->ng; gi++) {
            const int g = it->g + gi;
            const uint8_t *kb = (const uint8_t *)p->k + (int64_t)g * p->k_stride_head;
            const uint8_t *vb = (const uint8_t *)p->v + (int64_t)g * p->v_stride_head;
            float *qg = qp + (size_t)gi * rg * Dp, *ag = ap + (size_t)gi * rg * Dp;
            float *mg = m + gi * rg, *lg = l + gi * rg;
            vt_attn_key_scales(p, g, kso, vso, nk, KB, ks, vs);
            for (int jj = 0; jj < KB; jj++) { /* stored scale -> (masked scale, zero point) */
                ks[jj] = vt_attn_int4_split(ks[jj], &kz[jj]);
                vs[jj] = vt_attn_int4_split(vs[jj], &vz[jj]);
            }
            /* softmax_scale / b * ks_j per key lane (lanes past nk: scale 0) */
            const __m512 mul = _mm512_mul_ps(_mm512_set1_ps(vt_attn_logit_mul(p, it->b, g) / b4), _mm512_load_ps(ks));
            vt512_row_step st = {.mul = mul, .cap = cap, .inv_cap = inv_cap, .j0 = j0, .valid = valid};
            /* logits: each K chunk decoded once for all rows of the group */
            for (int jj = 0; jj < nk; jj++) {
                const __m512 zp = _mm512_set1_ps(kz[jj]);
                for (int r = 0; r < rg; r++) _mm512_storeu_ps(S + ((size_t)r * KB + jj) * 16, _mm512_setzero_ps());
                for (int c = 0; c < NC; c++) {
                    __m512 ev, od;
                    dec_chunk(kb + ko[jj], c, D, zp, &ev, &od);
                    for (int r = 0; r < rg; r++) {
                        float *sr = S + ((size_t)r * KB + jj) * 16;
                        const float *qr = qg + (size_t)r * Dp + c * CH;
                        __m512 s = _mm512_fmadd_ps(_mm512_loadu_ps(qr), ev, _mm512_loadu_ps(sr));
                        _mm512_storeu_ps(sr, _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16), od, s));
                    }
                }
            }
            if (nk < KB)
                for (int r = 0; r < rg; r++) memset(S + ((size_t)r * KB + nk) * 16, 0, (size_t)(KB - nk) * 64);
            for (int jj = 0; jj < nk; jj++)
                for (int c = 0; c < NC; c++) {
                    __m512 ev, od;
                    dec_chunk(vb + vo[jj], c, D, _mm512_set1_ps(vz[jj]), &ev, &od);
                    _mm512_storeu_ps(vbuf + (size_t)jj * Dp + c * CH, ev);
                    _mm512_storeu_ps(vbuf + (size_t)jj * Dp + c * CH + 16, od);
                }
            const __m512 vmul = _mm512_load_ps(vs);
            /* V's masked scale on the weight */
            vt512_block_weights(&st, p->alibi_slopes ? p->alibi_slopes + g * G : NULL, G, rg, nk, lo, hi,
                                base + it->q0, S, P, mg, lg, alpha, 1, vmul);
            for (int r = 0; r < rg; r++) {
                const float *pr = P + (size_t)r * KB;
                float *ar = ag + (size_t)r * Dp;
                if (alpha[r] != 1.0f) {
                    const __m512 al = _mm512_set1_ps(alpha[r]);
                    for (int v = 0; v < Dp; v += 16) _mm512_storeu_ps(ar + v, _mm512_mul_ps(_mm512_loadu_ps(ar + v), al));
                }
                for (int jj = 0; jj < nk; jj++) {
                    if (pr[jj] == 0.0f) continue;
                    const __m512 w = _mm512_set1_ps(pr[jj]);
                    const float *vr = vbuf + (size_t)jj * Dp;
                    for (int v = 0; v < Dp; v += 16)
                        _mm512_storeu_ps(ar + v, _mm512_fmadd_ps(w, _mm512_loadu_ps(vr + v), _mm512_loadu_ps(ar + v)));
                }
            }
        }
    }
    /* back from the rotated space: s ⊙ (H acc) / b (linear, so before the merge of partials) */
    for (int r = 0; r < rows; r++) {
        float *o = acc + (size_t)r * D;
        for (int d = 0; d < D; d++) o[d] = ap[(size_t)r * Dp + (d / CH) * CH + i4_pos(d % CH)];
        vt_int4_rht(o, D, 1);
        for (int d = 0; d < D; d++) o[d] /= b4;
    }
}

#endif /* VT_X86 */
