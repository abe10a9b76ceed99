/* AVX512-BF16 attention tile for grouped rows (bf16 q; bf16, fp8 or int8 /
 * fp8 / int4 per-token-head cache (int4: q rotated, nibbles minus the zero point, the output
 * rotated back); >= 4 rows per KV-head group): the rows of a group against a block of 16
 * keys as a small matrix product on the pair dot product vdpbf16ps.
 *
 * Per block and KV head, the 16 K rows are decoded to bf16 once (fp8 by
 * the 128-entry table of simd_avx512.h) and transposed in 32-bit units
 * into Kt[i][j] = (k_j[2i], k_j[2i + 1]) (D/2 pairs x 16 keys, in L1), so
 * one vdpbf16ps of Kt[i] with the row's broadcast pair (q[2i], q[2i + 1])
 * adds pair i to the 16 logits of the row at once: no horizontal
 * reduction, and every Kt load serves all rows of the group. The V rows of
 * each key pair (2k, 2k + 1) are interleaved 16 bits at a time into
 * Vt[k] = (v_2k[e], v_2k+1[e]) per element e, and P V is one vdpbf16ps per
 * 16 elements with the broadcast weight pair (p_2k, p_2k+1) rounded to
 * bf16. Per-token-head caches decode their codes the same way (int8 through
 * float32, each code exact in bf16; e4m3 by the table) with no dequantized
 * copy: the block's 16 K scales multiply the logit multiplier per key lane
 * and its 16 V scales the weights before their bf16 rounding. The arithmetic (and its scalar twin, attn_bf16dot_ref.c) is stated
 * in attn_internal.h "vt_attn_bf16dot_applies". */
#include "attn_avx512.h"

#if VT_X86

#define TB VT_TARGET_AVX512BF16
#define AI __attribute__((always_inline)) inline
#define VT_PRAGMA(x) _Pragma(#x)
#define VT_UNROLL VT_PRAGMA(GCC unroll 16)
#define KB 16
#ifndef BF_PF_BLOCKS
#define BF_PF_BLOCKS 2 /* prefetch distance in key blocks */
#endif

/* Position, within its 32-element chunk, that element e of the chunk takes
 * in the P V accumulator: unpacklo/hi_epi16 of two rows put elements
 * 8L + m (m < 4) of 128-bit lane L in the low vector's dwords 4L + m and
 * elements 8L + 4 + m in the high one's. */
static inline int pv_pos(int e) { return ((e >> 2) & 1) * 16 + (e >> 3) * 4 + (e & 3); }

/* The pair-dot tile's decoder table: one row per format it reads. A row's ld32 reads 32 elements (lanes
 * outside m read 0) of a row's chunk at src as 32 bf16 values, in order; each tile instance takes its row as
 * a compile-time constant, so the row's fields fold into the instance. A new format read by this tile: its
 * ld32, its row and its line in VT_BF16DOT_DECODERS. */
typedef struct decbf {
    __m512i (*ld32)(const uint8_t *src, __mmask32 m, const vt512_fp8tab *tb, __m512i zt);
    int bits;       /* bits per element */
    vt_dtype fp8;   /* the fp8 format whose decode table ld32 reads; else float32 (no table) */
    int zero_point; /* codes minus a per-key zero point, which the key's stored scale carries (zt: int4_table) */
    int rotated;    /* keys in a rotated space: q rotated once, accumulators rotated back */
} decbf;

TB static AI __m512i ld_bf16(const uint8_t *src, __mmask32 m, const vt512_fp8tab *tb, __m512i zt) {
    (void)tb, (void)zt;
    return _mm512_maskz_loadu_epi16(m, src);
}

/* int4: the 16 bytes at src, element 2i the low nibble of byte i, minus the key's zero point: looked up in
 * zt, int4_table's */
TB static AI __m512i ld_int4(const uint8_t *src, __mmask32 m, const vt512_fp8tab *tb, __m512i zt) {
    (void)tb;
    const int nb = __builtin_popcount((unsigned)m) / 2; /* m: the chunk's first elements; 2 per byte */
    const __mmask16 mb = nb >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nb) - 1u);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mb, src)); /* byte i in dword i */
    /* dword i: the low nibble in its low 16 bits, the high nibble in its high 16: (b | b << 12) & 0x000F000F */
    const __m512i c = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
    return _mm512_maskz_permutexvar_epi16(m, c, zt); /* past D: 0, not -zp */
}

/* |code| <= 128: exact in float32 and in bf16 */
TB static AI __m512i ld_int8(const uint8_t *src, __mmask32 m, const vt512_fp8tab *tb, __m512i zt) {
    (void)tb, (void)zt;
    const __m256i x = _mm256_maskz_loadu_epi8(m, src);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(x, 1)));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

TB static AI __m512i ld_fp8(const uint8_t *src, __mmask32 m, const vt512_fp8tab *tb, __m512i zt) {
    (void)zt;
    return vt512_fp8_to_bf16(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, src)), tb);
}

static const decbf DEC_BF16 = {.ld32 = ld_bf16, .bits = 16};
static const decbf DEC_E4M3 = {.ld32 = ld_fp8, .bits = 8, .fp8 = VT_DTYPE_FP8_E4M3};
static const decbf DEC_E5M2 = {.ld32 = ld_fp8, .bits = 8, .fp8 = VT_DTYPE_FP8_E5M2};
static const decbf DEC_INT8 = {.ld32 = ld_int8, .bits = 8};
static const decbf DEC_INT4 = {.ld32 = ld_int4, .bits = 4, .zero_point = 1, .rotated = 1};

/* X(format, its decoder row, per-token-head scales): one instance per line, and the table below. */
#define VT_BF16DOT_DECODERS(X)                                                                                  \
    X(BF16, DEC_BF16, 0)                                                                                        \
    X(FP8_E4M3, DEC_E4M3, 0)                                                                                    \
    X(FP8_E5M2, DEC_E5M2, 0)                                                                                    \
    X(INT8_PTH, DEC_INT8, 1)                                                                                    \
    X(FP8_PTH, DEC_E4M3, 1)                                                                                     \
    X(INT4_PTH, DEC_INT4, 1)

/* Transpose 16 x 16 dwords in place: afterwards r[i] holds dword i of every
 * input r[j] in lane j (unpack 32, unpack 64, then two 128-bit levels). */
TB static AI void tr16x16(__m512i r[16]) {
    __m512i t[16];
    VT_UNROLL
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    /* t[2k] lane block L: (r2k, r2k+1) at dwords 4L, 4L + 1; t[2k + 1]: at 4L + 2, 4L + 3 */
    VT_UNROLL
    for (int k = 0; k < 4; k++) {
        r[4 * k + 0] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    /* r[4k + m] lane block L: rows 4k .. 4k + 3 at dword 4L + m; now transpose the blocks */
    VT_UNROLL
    for (int m = 0; m < 4; m++) {
        __m512i a = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x44), b = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xEE);
        __m512i c = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x44), d = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xEE);
        t[m] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[4 + m] = _mm512_shuffle_i32x4(a, c, 0xDD);
        t[8 + m] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + m] = _mm512_shuffle_i32x4(b, d, 0xDD);
    }
    VT_UNROLL
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* The bf16 values code - zp of the 16 int4 codes (words 0-15), for ld_int4: integers in -15..15, exact. */
TB static AI __m512i int4_table(float zp) {
    const __m512 c = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_zextsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(c, _mm512_set1_ps(zp))));
}

/* Kt[c * 16 + i] (i < 16) = pair c * 16 + i of the nk keys at kp[] (keys past nk, elements past D: 0);
 * cb bytes per 32-element chunk; zp the keys' zero points (0 where the row has none). */
TB static void build_kt(const decbf *dc, const vt512_fp8tab *tb, const uint8_t *const *kp, int nk, int D, int cb,
                        const float *zp, int NC, __m512i *Kt) {
    __m512i zt[KB];
    for (int jj = 0; jj < KB; jj++) zt[jj] = dc->zero_point ? int4_table(zp[jj]) : _mm512_setzero_si512();
    for (int c = 0; c < NC; c++) {
        __m512i r[16];
        const __mmask32 mk = vt512_chunk_mask(D, c);
        for (int jj = 0; jj < KB; jj++)
            r[jj] = jj < nk ? dc->ld32(kp[jj] + (size_t)c * cb, mk, tb, zt[jj]) : _mm512_setzero_si512();
        tr16x16(r);
        VT_UNROLL
        for (int i = 0; i < 16; i++) _mm512_storeu_si512(Kt + c * 16 + i, r[i]);
    }
}

/* Vt[k * NVt + 2c (+1)] = keys 2k and 2k + 1 of vp[] interleaved, chunk c (low / high halves, pv_pos order). */
TB static void build_vt(const decbf *dc, const vt512_fp8tab *tb, const uint8_t *const *vp, int nk, int D, int cb,
                        const float *zp, int NC, __m512i *Vt) {
    const int NVt = 2 * NC;
    __m512i zt[KB];
    for (int jj = 0; jj < KB; jj++) zt[jj] = dc->zero_point ? int4_table(zp[jj]) : _mm512_setzero_si512();
    for (int k = 0; 2 * k < nk; k++)
        for (int c = 0; c < NC; c++) {
            const __mmask32 mk = vt512_chunk_mask(D, c);
            __m512i x = dc->ld32(vp[2 * k] + (size_t)c * cb, mk, tb, zt[2 * k]);
            __m512i y = 2 * k + 1 < nk ? dc->ld32(vp[2 * k + 1] + (size_t)c * cb, mk, tb, zt[2 * k + 1])
                                       : _mm512_setzero_si512();
            _mm512_storeu_si512(Vt + k * NVt + 2 * c, _mm512_unpacklo_epi16(x, y));
            _mm512_storeu_si512(Vt + k * NVt + 2 * c + 1, _mm512_unpackhi_epi16(x, y));
        }
}

/* S[r * 16 + j] = q_r . k_j for R rows (R a constant after inlining) of Dh pairs each at qb. */
TB static AI void qk_rows(const int R, const uint32_t *qb, int Dh, const __m512i *Kt, float *S) {
    __m512 a[8], b[8];
    VT_UNROLL
    for (int r = 0; r < R; r++) a[r] = b[r] = _mm512_setzero_ps();
    for (int i = 0; i < Dh; i += 2) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(Kt + i), k1 = (__m512bh)_mm512_loadu_si512(Kt + i + 1);
        VT_UNROLL
        for (int r = 0; r < R; r++) {
            a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_set1_epi32((int)qb[(size_t)r * Dh + i]), k0);
            b[r] = _mm512_dpbf16_ps(b[r], (__m512bh)_mm512_set1_epi32((int)qb[(size_t)r * Dh + i + 1]), k1);
        }
    }
    VT_UNROLL
    for (int r = 0; r < R; r++) _mm512_storeu_ps(S + r * 16, _mm512_add_ps(a[r], b[r]));
}

TB static void qk_group(int R, const uint32_t *qb, int Dh, const __m512i *Kt, float *S) {
    switch (R) {
    case 1: qk_rows(1, qb, Dh, Kt, S); break;
    case 2: qk_rows(2, qb, Dh, Kt, S); break;
    case 3: qk_rows(3, qb, Dh, Kt, S); break;
    case 4: qk_rows(4, qb, Dh, Kt, S); break;
    case 5: qk_rows(5, qb, Dh, Kt, S); break;
    case 6: qk_rows(6, qb, Dh, Kt, S); break;
    case 7: qk_rows(7, qb, Dh, Kt, S); break;
    default: qk_rows(8, qb, Dh, Kt, S); break;
    }
}

/* For R rows (R 1 or 2, NV <= 8, LO 0 or 1; constants after inlining): acc_r[0 .. 16 NV) =
 * acc_r * alpha_r + sum over the key pairs k in mask pm of (p_2k, p_2k+1)_r . Vt[k] (pp_r: row
 * r's 8 weight pairs), with LO then + (q_2k, q_2k+1)_r . Vt[k] (pl_r: the pairs' low parts).
 * Two rows share each Vt load; pm is the union of their masks (a pair with no weight in one
 * row adds 0 . V to it). */
TB static AI void pv_vecs(const int R, const int NV, const int LO, float *const *acc, const float *alpha,
                          const uint32_t *const *pp, const uint32_t *const *pl, unsigned pm, const __m512i *Vt,
                          int NVt) {
    __m512 a[2][8];
    VT_UNROLL
    for (int r = 0; r < R; r++) {
        const __m512 al = _mm512_set1_ps(alpha[r]);
        VT_UNROLL
        for (int v = 0; v < NV; v++) a[r][v] = _mm512_mul_ps(_mm512_loadu_ps(acc[r] + 16 * v), al);
    }
    for (; pm; pm &= pm - 1) {
        const int k = __builtin_ctz(pm);
        __m512bh pb[2], pc[2];
        VT_UNROLL
        for (int r = 0; r < R; r++) {
            pb[r] = (__m512bh)_mm512_set1_epi32((int)pp[r][k]);
            if (LO) pc[r] = (__m512bh)_mm512_set1_epi32((int)pl[r][k]);
        }
        const __m512i *vr = Vt + (size_t)k * NVt;
        VT_UNROLL
        for (int v = 0; v < NV; v++) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(vr + v);
            VT_UNROLL
            for (int r = 0; r < R; r++) {
                a[r][v] = _mm512_dpbf16_ps(a[r][v], pb[r], x);
                if (LO) a[r][v] = _mm512_dpbf16_ps(a[r][v], pc[r], x);
            }
        }
    }
    VT_UNROLL
    for (int r = 0; r < R; r++) {
        VT_UNROLL
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(acc[r] + 16 * v, a[r][v]);
    }
}

/* P V of R (1 or 2) rows over the NVt vectors of a row, in slabs of 8, 4 and 2 vectors. */
TB static AI void pv_slabs(const int R, const int LO, float *const *acc, const float *alpha, const uint32_t *const *pp,
                           const uint32_t *const *pl, unsigned pm, const __m512i *Vt, int NVt) {
    for (int v = 0; v < NVt;) {
        float *ac[2] = {acc[0] + 16 * v, acc[R - 1] + 16 * v};
        if (NVt - v >= 8) {
            pv_vecs(R, 8, LO, ac, alpha, pp, pl, pm, Vt + v, NVt);
            v += 8;
        } else if (NVt - v >= 4) {
            pv_vecs(R, 4, LO, ac, alpha, pp, pl, pm, Vt + v, NVt);
            v += 4;
        } else {
            pv_vecs(R, 2, LO, ac, alpha, pp, pl, pm, Vt + v, NVt);
            v += 2;
        }
    }
}

TB static void pv_rows(int R, int LO, float *const *acc, const float *alpha, const uint32_t *const *pp,
                       const uint32_t *const *pl, unsigned pm, const __m512i *Vt, int NVt) {
    if (R == 2 && LO) pv_slabs(2, 1, acc, alpha, pp, pl, pm, Vt, NVt);
    else if (R == 2) pv_slabs(2, 0, acc, alpha, pp, pl, pm, Vt, NVt);
    else if (LO) pv_slabs(1, 1, acc, alpha, pp, pl, pm, Vt, NVt);
    else pv_slabs(1, 0, acc, alpha, pp, pl, pm, Vt, NVt);
}

/* The tile of one format: dc (its decoder row) and pth (per-token-head scales) are constants in each instance
 * below, so the row's fields fold into it. */
TB static AI void tile(const decbf *dc, const int pth, const vt_attn_params *p, const vt_attn_item *it, float *work,
                       float *m, float *l, float *acc) {
    const int D = p->head_size, G = p->num_heads / p->num_kv_heads;
    const int rg = (int)(it->nq * G); /* rows per group */
    const int int4 = dc->rotated;
    if (!vt_attn_bf16dot_applies(p, rg)) { /* the plain AVX-512 table's tile for the format */
        vt_kernels_table(VT_ISA_AVX512, 0)->attn_tile[p->kv_dtype](p, it, work, m, l, acc);
        return;
    }
    const int rows = rg * it->ng;
    const float b4 = int4 ? (float)vt_int4_rht_block(D) : 1.0f; /* int4: the rotation's norm (H H = b I) */
    const int split = vt_attn_bf16dot_split(p);
    const int cb = 32 * dc->bits / 8, row_bytes = D * dc->bits / 8; /* bytes per chunk / row */
    const int Dp = (D + 31) / 32 * 32, Dh = Dp / 2, NC = Dp / 32, NVt = Dp / 16;
    /* work (fits vt_attn_work_floats): Kt and Vt first (64-byte multiples), then q pairs, accumulators, logits */
    __m512i *Kt = (__m512i *)(void *)work;                 /* Dh x 16 dwords */
    __m512i *Vt = Kt + Dh;                                 /* 8 key pairs x Dp dwords */
    uint32_t *qb = (uint32_t *)(void *)(Vt + 8 * NVt);     /* rows x Dh q pairs */
    float *ap = (float *)(void *)(qb + (size_t)rows * Dh); /* rows x Dp, pv_pos order */
    float *S = ap + (size_t)rows * Dp;                     /* rg x 16 dot products */
    uint32_t *pp = (uint32_t *)(void *)(S + (size_t)rg * KB); /* rg x 8 bf16 weight pairs */
    uint32_t *pl = pp + (size_t)rg * 8;                       /* rg x 8 low parts (split weights) */
    float *alpha = (float *)(void *)(pl + (size_t)rg * 8);    /* rg */
    unsigned *pm = (unsigned *)(void *)(alpha + rg);          /* rg */
    const vt512_fp8tab tb = vt512_fp8_table(dc->fp8);
    for (int r = 0; r < rows; r++) {
        const uint8_t *src = vt_attn_q_row(p, it, r, rg, G);
        uint32_t *qr = qb + (size_t)r * Dh;
        memset(qr, 0, (size_t)Dh * 4);
        if (int4) { /* rotated once per row, rounded to bf16 (exact back to bf16 bits); acc as scratch */
            float *t = acc + (size_t)r * D;
            for (int d = 0; d < D; d++) {
                uint16_t u;
                memcpy(&u, src + 2 * d, 2);
                t[d] = vt_bf16_to_f32(u);
            }
            vt_attn_int4_rotate_q(p, t, D);
            uint16_t *qh = (uint16_t *)(void *)qr;
            for (int d = 0; d < D; d++) qh[d] = vt_bf16_from_f32(t[d]);
        } else {
            memcpy(qr, src, (size_t)D * 2);
        }
        memset(ap + (size_t)r * Dp, 0, (size_t)Dp * 4);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = vt_attn_item_ranges(p, it, lo, hi);
    const float cap = p->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    int64_t ko[KB], vo[KB], pko[KB], pvo[KB], kso[KB], vso[KB];
    _Alignas(64) float kscale[KB], vscale[KB], kz[KB] = {0}, vz[KB] = {0};
    __m512 vmul = _mm512_set1_ps(1.0f);
    const uint8_t *kp[KB], *vp[KB];
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        /* the rows of a later block into L2, one group at a time as the groups are computed
         * (measured, 32K keys GQA 8, 1 thread: a whole block's rows into L1 at once, as the fp32
         * tile does, 90 ns per key-head; per group into L1 108-120; per group into L2 76-83); 2-byte rows
         * (memory-bound) take K's at the group's start and V's after its logits, 1-byte and int4 rows (bound
         * by their decode) both at the start (measured: speed.md, Results) */
        const int pf_split = dc->bits >= 16;
        const int64_t jp = j0 + BF_PF_BLOCKS * KB;
        const int np = jp < it->ke ? (it->ke - jp < KB ? (int)(it->ke - jp) : KB) : 0;
        if (np) vt_attn_key_offsets(p, it, jp, np, pko, pvo);
        if (np && pth) { /* the later block's scales, for all groups (the offsets array reused) */
            vt_attn_scale_offsets(p, it->b, jp, np, kso, vso);
            vt512_prefetch_scales(p, it->g, it->ng, kso, vso, np);
        }
        vt_attn_key_offsets(p, it, j0, nk, ko, vo);
        if (pth) vt_attn_scale_offsets(p, it->b, j0, nk, kso, vso); /* once per block, all heads */
        const __mmask16 valid = (__mmask16)((1u << nk) - 1u);
        for (int gi = 0; gi < it->ng; gi++) {
            const int g = it->g + gi;
            if (np && !pf_split) vt512_prefetch_rows(p, g, 1, pko, pvo, np, row_bytes, 1);
            if (np && pf_split) vt_attn_prefetch_head(p->k, p->k_stride_head, g, pko, np, row_bytes);
            const uint8_t *kb = (const uint8_t *)p->k + (int64_t)g * p->k_stride_head;
            const uint8_t *vb = (const uint8_t *)p->v + (int64_t)g * p->v_stride_head;
            for (int jj = 0; jj < nk; jj++) kp[jj] = kb + ko[jj], vp[jj] = vb + vo[jj];
            float *ag = ap + (size_t)gi * rg * Dp, *mg = m + gi * rg, *lg = l + gi * rg;
            const uint32_t *qg = qb + (size_t)gi * rg * Dh;
            vt512_row_step st = {.mul = _mm512_set1_ps(vt_attn_logit_mul(p, it->b, g) / b4), .cap = cap,
                                 .inv_cap = inv_cap, .j0 = j0, .valid = valid};
            if (pth) {
                vt_attn_key_scales(p, g, kso, vso, nk, KB, kscale, vscale);
                if (dc->zero_point) /* stored scale -> (masked scale, zero point) */
                    for (int jj = 0; jj < KB; jj++)
                        kscale[jj] = vt_attn_int4_split(kscale[jj], &kz[jj]), vscale[jj] = vt_attn_int4_split(vscale[jj], &vz[jj]);
                st.mul = _mm512_mul_ps(st.mul, _mm512_load_ps(kscale)); /* mul * ks_j, per key lane */
                vmul = _mm512_load_ps(vscale);
            }
            build_kt(dc, &tb, kp, nk, D, cb, kz, NC, Kt);
            for (int r0 = 0; r0 < rg; r0 += 8)
                qk_group(rg - r0 < 8 ? rg - r0 : 8, qg + (size_t)r0 * Dh, Dh, Kt, S + (size_t)r0 * KB);
            if (np && pf_split) vt_attn_prefetch_head(p->v, p->v_stride_head, g, pvo, np, row_bytes);
            build_vt(dc, &tb, vp, nk, D, cb, vz, NC, Vt);
            for (int r = 0; r < rg; r++) {
                int64_t qi = r / G;
                alpha[r] = 1.0f;
                pm[r] = 0;
                if (hi[qi] <= j0 || lo[qi] >= j0 + nk) {
                    /* no weight: P V's other row of the pass may still read these pairs */
                    _mm256_storeu_si256((__m256i *)(void *)(pp + (size_t)r * 8), _mm256_setzero_si256());
                    _mm256_storeu_si256((__m256i *)(void *)(pl + (size_t)r * 8), _mm256_setzero_si256());
                    continue;
                }
                st.lo = lo[qi], st.hi = hi[qi], st.pos = base + it->q0 + qi;
                st.slope = p->alibi_slopes ? &p->alibi_slopes[g * G + r % G] : NULL;
                __m512 e = vt512_row_weights(&st, _mm512_loadu_ps(S + (size_t)r * KB), &mg[r], &alpha[r]);
                /* l sums the float32 weights (the LSE stays float32-exact); P V takes them as bf16 pairs */
                lg[r] = lg[r] * alpha[r] + _mm512_reduce_add_ps(e);
                /* V's per-key scale on the weight, before its bf16 rounding (1 for other dtypes) */
                const __m512 w = _mm512_mul_ps(e, vmul);
                __m256i eb = (__m256i)_mm512_cvtneps_pbh(w);
                _mm256_storeu_si256((__m256i *)(void *)(pp + (size_t)r * 8), eb);
                if (split) { /* the low part: w - bf16(w) (exact in float32), rounded to bf16 */
                    const __m512 wh = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(eb), 16));
                    _mm256_storeu_si256((__m256i *)(void *)(pl + (size_t)r * 8),
                                        (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(w, wh)));
                }
                pm[r] = _mm256_test_epi32_mask(eb, eb);
            }
            for (int r = 0; r < rg; r += 2) {
                const int two = r + 1 < rg && !(alpha[r + 1] == 1.0f && pm[r + 1] == 0);
                if (!two && alpha[r] == 1.0f && pm[r] == 0) continue;
                float *ac[2] = {ag + (size_t)r * Dp, ag + (size_t)(r + two) * Dp};
                const uint32_t *pr[2] = {pp + (size_t)r * 8, pp + (size_t)(r + two) * 8};
                const uint32_t *pq[2] = {pl + (size_t)r * 8, pl + (size_t)(r + two) * 8};
                pv_rows(1 + two, split, ac, alpha + r, pr, pq, two ? pm[r] | pm[r + 1] : pm[r], Vt, NVt);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float *o = acc + (size_t)r * D;
        for (int d = 0; d < D; d++) o[d] = ap[(size_t)r * Dp + (d / 32) * 32 + pv_pos(d % 32)];
        if (int4) vt_int4_rht_back(o, D); /* linear, so before the merge of partials */
    }
}

#define INSTANCE(fmt, row, pth)                                                                                 \
    TB static void tile_##fmt(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l, \
                              float *acc) {                                                                     \
        tile(&row, pth, p, it, work, m, l, acc);                                                                \
    }
VT_BF16DOT_DECODERS(INSTANCE)
#undef INSTANCE

/* The AVX-512 table's entries on a CPU with AVX512-BF16 (cpu.c takes them over every other AVX-512 instance):
 * one per format the pair-dot tile reads, each handing the items vt_attn_bf16dot_applies leaves to the table
 * without AVX512-BF16. */
#define ENTRY(fmt, row, pth) [VT_DTYPE_##fmt] = tile_##fmt,
const vt_attn_tile_fn vt_attn_tiles_avx512bf16[VT_DTYPE_COUNT] = {VT_BF16DOT_DECODERS(ENTRY)};
#undef ENTRY

#endif /* VT_X86 */
