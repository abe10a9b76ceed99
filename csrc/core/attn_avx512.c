/* AVX-512 attention tile (F+BW+VL+DQ; per-function target attributes).
 *
 * Keys are taken in blocks of up to 16: each K/V row of the block is read
 * once and decoded to float32 in an L1 buffer (fp8 by the exact fp8->fp16
 * bit map: e5m2 is fp16's top byte; e4m3 maps to fp16 at 2^-8 of its value,
 * the 2^8 folded into the logit multiplier and the final V factor, which
 * keeps power-of-two scales exact), then every row of the tile (all heads
 * of the KV-head group, all queries of the tile) takes its logits from the
 * buffer, so K/V bytes are read once per group. The online softmax runs on
 * 16 logits at a time (vector exp/tanh, cephes-style polynomials). */
#include "attn_internal.h"

#if VT_X86
#include <immintrin.h>

#define T VT_TARGET_AVX512
#define KB 16

T static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-88.3762626647949f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

T static inline __m512 tanh16(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745E-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954E-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531E-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036E-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422E-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    __m512 e = exp16(_mm512_add_ps(ax, ax));
    __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                               _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    big = _mm512_or_ps(big, _mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u))));
    __mmask16 use_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
    return _mm512_mask_mov_ps(big, use_small, small);
}

/* Decode one row of n elements (16-lane chunks, tail masked) to float32.
 * fp8 rows come out at 2^-8 (e4m3) or 1 (e5m2) times their value. */
T static void decode_row(vt_dtype dt, const uint8_t *src, float *dst, int n) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x;
        if (dt == VT_DTYPE_F32) {
            x = _mm512_maskz_loadu_ps(m, src + 4 * i);
        } else if (dt == VT_DTYPE_F16) {
            x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + 2 * i));
        } else if (dt == VT_DTYPE_BF16) {
            x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + 2 * i)), 16));
        } else {
            __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, src + i));
            if (dt == VT_DTYPE_FP8_E5M2) {
                w = _mm256_slli_epi16(w, 8);
            } else {
                __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
                __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                                            _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
                __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
                w = _mm256_mask_mov_epi16(h, nan, _mm256_set1_epi16(0x7E00));
            }
            x = _mm512_cvtph_ps(w);
        }
        _mm512_storeu_ps(dst + i, x);
    }
}

T static inline float dot_row(const float *a, const float *b, int D) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int d = 0;
    for (; d + 32 <= D; d += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + d + 16), _mm512_loadu_ps(b + d + 16), s1);
    }
    for (; d < D; d += 16) {
        __mmask16 m = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1u);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

T void vt_attn_tile_avx512(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                           float *acc) {
    const int D = p->head_size, G = p->num_heads / p->num_kv_heads;
    const int Dp = (D + 15) & ~15;
    const int64_t rows = it->nq * G;
    const int fp8_e4m3 = p->kv_dtype == VT_DTYPE_FP8_E4M3;
    const float kf = fp8_e4m3 ? 256.0f : 1.0f;
    float *qf = work;                       /* rows * D */
    float *sb = qf + rows * D;              /* rows * 16 probabilities */
    float *kbuf = sb + rows * 16;           /* KB * Dp (the work size allows 4*D + rows*48 + 256) */
    float *vbuf = kbuf + KB * Dp;
    for (int64_t r = 0; r < rows; r++) {
        int h = it->g * G + (int)(r % G);
        const uint8_t *src = (const uint8_t *)p->q + (it->q_tok0 + it->q0 + r / G) * p->q_stride_tok +
                             (int64_t)h * p->q_stride_head;
        decode_row(p->q_dtype, src, qf + r * D, D);
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc + r * D, 0, (size_t)D * 4);
    }
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = it->k_len - it->q_len;
    for (int64_t qi = 0; qi < it->nq; qi++) vt_attn_key_range(p, base + it->q0 + qi, it->k_len, &lo[qi], &hi[qi]);
    const __m512 mul = _mm512_set1_ps(it->logit_mul * kf);
    const float cap = p->softcap;
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        for (int jj = 0; jj < nk; jj++) {
            decode_row(p->kv_dtype,
                       vt_attn_row(p, p->k, p->k_stride_block, p->k_stride_tok, p->k_stride_head, it->b, it->g, j0 + jj),
                       kbuf + jj * Dp, D);
            decode_row(p->kv_dtype,
                       vt_attn_row(p, p->v, p->v_stride_block, p->v_stride_tok, p->v_stride_head, it->b, it->g, j0 + jj),
                       vbuf + jj * Dp, D);
        }
        for (int64_t r = 0; r < rows; r++) {
            int64_t qi = r / G;
            float *pr = sb + r * 16;
            if (hi[qi] <= j0 || lo[qi] >= j0 + nk) {
                memset(pr, 0, 64);
                continue;
            }
            float sv[16];
            for (int jj = 0; jj < nk; jj++) sv[jj] = dot_row(qf + r * D, kbuf + jj * Dp, D);
            __mmask16 valid = (__mmask16)((1u << nk) - 1u);
            __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, sv), mul);
            if (cap > 0.0f)
                s = _mm512_mul_ps(_mm512_set1_ps(cap), tanh16(_mm512_div_ps(s, _mm512_set1_ps(cap))));
            __m512 jpos = _mm512_add_ps(lane, _mm512_set1_ps((float)(j0 - lo[qi])));
            __mmask16 vis = valid & _mm512_cmp_ps_mask(jpos, _mm512_setzero_ps(), _CMP_GE_OQ) &
                            _mm512_cmp_ps_mask(jpos, _mm512_set1_ps((float)(hi[qi] - lo[qi])), _CMP_LT_OQ);
            if (p->alibi_slopes) {
                float slope = p->alibi_slopes[it->g * G + (int)(r % G)];
                __m512 dist = _mm512_add_ps(lane, _mm512_set1_ps((float)(j0 - (base + it->q0 + qi))));
                s = _mm512_fnmadd_ps(_mm512_set1_ps(slope), _mm512_abs_ps(dist), s);
            }
            float bm = _mm512_mask_reduce_max_ps(vis, s);
            if (vis == 0) {
                memset(pr, 0, 64);
                continue;
            }
            float mn = bm > m[r] ? bm : m[r];
            float alpha = m[r] - mn < -60.0f ? 0.0f : expf(m[r] - mn); /* m = -inf: 0 */
            /* Weights below e^-60 are flushed to 0: their share of the sum is
             * < 1e-21 of it, and their products with V would be subnormal
             * (a microcode assist on every FMA). */
            __m512 x = _mm512_sub_ps(s, _mm512_set1_ps(mn));
            vis &= _mm512_cmp_ps_mask(x, _mm512_set1_ps(-60.0f), _CMP_GE_OQ);
            __m512 e = _mm512_maskz_mov_ps(vis, exp16(x));
            l[r] = l[r] * alpha + _mm512_reduce_add_ps(e);
            m[r] = mn;
            _mm512_storeu_ps(pr, e);
            if (alpha != 1.0f) {
                __m512 a = _mm512_set1_ps(alpha);
                float *ar = acc + r * D;
                for (int d = 0; d < D; d += 16) {
                    __mmask16 mk = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1u);
                    _mm512_mask_storeu_ps(ar + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, ar + d), a));
                }
            }
        }
        /* P V: each V chunk loaded once per row from L1, accumulators in registers */
        for (int d = 0; d < D; d += 16) {
            __mmask16 mk = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1u);
            for (int64_t r = 0; r < rows; r++) {
                const float *pr = sb + r * 16;
                float *ar = acc + r * D + d;
                __m512 a = _mm512_maskz_loadu_ps(mk, ar);
                for (int jj = 0; jj < nk; jj++)
                    a = _mm512_fmadd_ps(_mm512_set1_ps(pr[jj]), _mm512_loadu_ps(vbuf + jj * Dp + d), a);
                _mm512_mask_storeu_ps(ar, mk, a);
            }
        }
    }
    if (fp8_e4m3) {
        const __m512 f = _mm512_set1_ps(256.0f);
        for (int64_t r = 0; r < rows; r++)
            for (int d = 0; d < D; d += 16) {
                __mmask16 mk = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1u);
                _mm512_mask_storeu_ps(acc + r * D + d, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, acc + r * D + d), f));
            }
    }
}

#endif /* VT_X86 */
