/* The AVX-512 attention tile, a template: included once per instance file with
 * T (the functions' target attribute), VT_TILE_VBMI (1: fp8 codes decode by
 * byte lookups, which need AVX512-VBMI) and VT_TILE_TABLE (the exported instances,
 * indexed by dtype) defined: attn_avx512.c (F+BW+VL+DQ, the float and per-tensor
 * fp8 formats) and attn_avx512vbmi.c (the same plus VBMI, the fp8-decoded formats
 * only; cpu.c takes them in the AVX-512 table where the CPU has VBMI).
 *
 * Keys are taken in blocks of 16. Each K row is decoded in registers, 32
 * elements at a time, and multiplied into one accumulator per row of the
 * tile (all heads of the KV-head group, all queries of the tile), so every
 * K byte is read once per group; the 16 per-key partial vectors of a row
 * are then folded into one vector of 16 logits by a transpose-reduce
 * (4 levels of permute + add), and the online softmax runs on those 16
 * logits at once (vector exp/tanh, cephes-style polynomials).
 *
 * Each format's chunk decoder is in attn_dec_avx512.h. The query rows and the accumulators are kept in
 * the order its decoder emits (its row's pos) (q permuted once per tile, the accumulator un-permuted
 * once at the end), so no shuffle is spent on the data order. V rows are
 * decoded once per block into an L1 buffer; P V keeps a row's accumulator
 * in registers. The next block's K/V rows are prefetched. */
#include "attn_avx512.h"

#if VT_X86

#define AI __attribute__((always_inline)) inline
#define VT_PRAGMA(x) _Pragma(#x)
#define VT_UNROLL VT_PRAGMA(GCC unroll 16)
#define KB 16
#define CH 32 /* elements decoded per chunk: two vectors */
#define VEC __m512
#define VW 16
#define PV_MAXV 16
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VMUL _mm512_mul_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#include "attn_vec.h"

/* CALL(n) with n the constant equal to N in 1..8 (8 for anything larger): the count a loop unrolls by. */
#define CONST_1_TO_8(N, CALL)                                                                                        \
    switch (N) {                                                                                                     \
    case 1: CALL(1); break;                                                                                          \
    case 2: CALL(2); break;                                                                                          \
    case 3: CALL(3); break;                                                                                          \
    case 4: CALL(4); break;                                                                                          \
    case 5: CALL(5); break;                                                                                          \
    case 6: CALL(6); break;                                                                                          \
    case 7: CALL(7); break;                                                                                          \
    default: CALL(8); break;                                                                                         \
    }

#include "attn_dec_avx512.h"

/* Partial dot products of R rows (R a constant after inlining) with the nk
 * keys at kp[]: S[(r * 16 + jj) * 16 ...] = 16 lane partials of q_r . K_jj. */
T static AI void qk_rows(const int R, const dec512 *dc, const fp8tab *tb, const float *qp, int Dp, int D,
                         const uint8_t *const *kp, int nk, const uint8_t *const *kq, int nq, float *S) {
    const int U = dc->elems, NC = Dp / U;
    for (int jj = 0; jj < nk; jj++) {
        if (jj < nq)
            for (int o = 0; o < D * dc->bits / 8; o += 64) _mm_prefetch((const char *)kq[jj] + o, _MM_HINT_T1);
        __m512 s0[8], s1[8];
        VT_UNROLL
        for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_ps();
        for (int c = 0; c < NC; c++) {
            __m512 k[4];
            dc->unit(kp[jj], c, D, tb, k);
            VT_UNROLL
            for (int r = 0; r < R; r++) {
                const float *qc = qp + r * Dp + c * U;
                VT_UNROLL
                for (int i = 0; i < U / 16; i += 2) {
                    s0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qc + 16 * i), k[i], s0[r]);
                    s1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(qc + 16 * i + 16), k[i + 1], s1[r]);
                }
            }
        }
        VT_UNROLL
        for (int r = 0; r < R; r++) _mm512_storeu_ps(S + (r * KB + jj) * 16, _mm512_add_ps(s0[r], s1[r]));
    }
}

T static AI void qk_group(int R, const dec512 *dc, const fp8tab *tb, const float *qp, int Dp, int D,
                          const uint8_t *const *kp, int nk, const uint8_t *const *kq, int nq, float *S) {
#define QK_ROWS(n) qk_rows(n, dc, tb, qp, Dp, D, kp, nk, kq, nq, S)
    CONST_1_TO_8(R, QK_ROWS);
#undef QK_ROWS
}

/* One row, V decoded straight into the FMAs (no L1 buffer): for a group
 * of one row (GQA 1 decode) the buffer's store and reload would cost more
 * than the P V product itself. NC2 (constant after inlining) is the number
 * of decode units, <= 256 / dc->elems. */
T static AI void pv_direct(const int NC2, const dec512 *dc, const fp8tab *tb, float *acc, float alpha, const float *P,
                           const uint8_t *const *vp, int D, int nk) {
    const int NV = dc->elems / 16; /* vectors per unit */
    __m512 a[16];
    const __m512 al = _mm512_set1_ps(alpha);
    VT_UNROLL
    for (int v = 0; v < NC2 * NV; v++) a[v] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * v), al);
    for (int jj = 0; jj < nk; jj++) {
        if (P[jj] == 0.0f) continue;
        __m512 pb = _mm512_set1_ps(P[jj]);
        VT_UNROLL
        for (int c = 0; c < NC2; c++) {
            __m512 v[4];
            dc->unit(vp[jj], c, D, tb, v);
            VT_UNROLL
            for (int i = 0; i < NV; i++) a[NV * c + i] = _mm512_fmadd_ps(pb, v[i], a[NV * c + i]);
        }
    }
    VT_UNROLL
    for (int v = 0; v < NC2 * NV; v++) _mm512_storeu_ps(acc + 16 * v, a[v]);
}

T static AI void pv_row_direct(int NC, const dec512 *dc, const fp8tab *tb, float *acc, float alpha, const float *P,
                               const uint8_t *const *vp, int D, int nk) {
#define PV_DIRECT(n) pv_direct(n, dc, tb, acc, alpha, P, vp, D, nk)
    if (dc->elems == 64) { /* at most 4 units */
        switch (NC) {
        case 1: PV_DIRECT(1); break;
        case 2: PV_DIRECT(2); break;
        case 3: PV_DIRECT(3); break;
        default: PV_DIRECT(4); break;
        }
    } else {
        CONST_1_TO_8(NC, PV_DIRECT);
    }
#undef PV_DIRECT
}

/* The tile of one format and head size: dc (its decoder row), pth (per-token-head scales: key j's K scale
 * multiplies its logit multiplier, rounded to float32 first, and its V scale its weight after l has summed the
 * weights, as in the AVX2 tile and the scalar twin) and DC (the head size; 0: p->head_size) are constants in
 * each instance below, so the row's fields fold into qk_group / pv_row_direct and the chunk
 * loops unroll with constant masks. The plain instance reads no per-token-head format (cpu.c gives them the
 * AVX2 instances there); the VBMI instance reads fp8_per_token_head. */
T static AI void tile(const dec512 *dc, const int pth, const int DC, const vt_attn_params *p, const vt_attn_item *it, float *work,
                      float *m, float *l, float *acc) {
    const int D = DC ? DC : (int)p->head_size, G = p->num_heads / p->num_kv_heads;
    const int U = dc->elems, Dp = (D + U - 1) / U * U; /* <= D padded to 64: vt_attn_work_floats */
    const int rg = (int)(it->nq * G); /* rows per group */
    const int rows = rg * it->ng;
    float *qp = work;                    /* rows * Dp, permuted */
    float *ap = qp + (size_t)rows * Dp;  /* rows * Dp, permuted accumulators */
    float *S = ap + (size_t)rows * Dp;   /* rg * 16 * 16 partial dots (one group at a time) */
    float *P = S + (size_t)rg * KB * 16; /* rg * 16 weights */
    float *vbuf = P + (size_t)rg * KB;   /* KB * Dp decoded V rows */
    float *tmp = vbuf + (size_t)KB * Dp; /* Dp */
    float *alpha = tmp + Dp;             /* rg */
    const fp8tab tb = fp8_tables(dc);
    int pos[64];
    for (int e = 0; e < U; e++) pos[e] = dc->pos(e);
    vt_attn_rows_init(p, it, rows, rg, D, Dp, 0, U, pos, 0, qp, ap, tmp, m, l);
    int64_t lo[VT_ATTN_QT_MAX], hi[VT_ATTN_QT_MAX];
    const int64_t base = vt_attn_item_ranges(p, it, lo, hi);
    const float cap = p->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const int NC = Dp / U;
    int64_t ko[KB], vo[KB], kpf[KB], vpf[KB], kso[KB], vso[KB];
    float kscale[KB], vscale[KB]; /* per-token-head caches (pth): key j's K and V scales */
    const uint8_t *kp[KB], *vp[KB], *kq[KB];
    const int pf_per_key = dc->prefetch_per_key, row_bytes = D * dc->bits / 8;
    for (int64_t j0 = it->kb; j0 < it->ke; j0 += KB) {
        int nk = it->ke - j0 < KB ? (int)(it->ke - j0) : KB;
        /* block j0 + PF_BLOCKS is prefetched one head at a time, spread through this block's work on that head:
         * 2- and 4-byte rows (whose read is memory-bound) a K row beside each key's logit and the V rows before
         * the softmax; fp8 rows (whose read is bound by the decode) both at the head's start, out of the
         * decode loop (measured: speed.md, Results) */
        int64_t jp = j0 + PF_BLOCKS * KB;
        int npf = 0;
        if (jp < it->ke) {
            npf = it->ke - jp < KB ? (int)(it->ke - jp) : KB;
            vt_attn_key_offsets(p, it, jp, npf, kpf, vpf);
            if (pth) { /* one line holds a token's scales of every head */
                vt_attn_scale_offsets(p, it->b, jp, npf, kso, vso);
                vt512_prefetch_scales(p, it->g, 1, kso, vso, npf);
            }
        }
        vt_attn_key_offsets(p, it, j0, nk, ko, vo);
        if (pth) vt_attn_scale_offsets(p, it->b, j0, nk, kso, vso); /* once per block, all heads */
        const __mmask16 valid = (__mmask16)((1u << nk) - 1u);
        for (int gi = 0; gi < it->ng; gi++) {
            const int g = it->g + gi;
            const uint8_t *kb = (const uint8_t *)p->k + (int64_t)g * p->k_stride_head;
            const uint8_t *vb = (const uint8_t *)p->v + (int64_t)g * p->v_stride_head;
            for (int jj = 0; jj < nk; jj++) kp[jj] = kb + ko[jj], vp[jj] = vb + vo[jj];
            for (int jj = 0; jj < npf; jj++) kq[jj] = kb + kpf[jj];
            if (!pf_per_key) vt512_prefetch_rows(p, g, 1, kpf, vpf, npf, row_bytes, 1);
            float *qg = qp + (size_t)gi * rg * Dp, *ag = ap + (size_t)gi * rg * Dp;
            float *mg = m + gi * rg, *lg = l + gi * rg;
            __m512 mul = _mm512_set1_ps(vt_attn_logit_mul(p, it->b, g));
            if (pth) { /* key j's K scale on its logit multiplier (rounded to float32 first), V scale on its weight */
                vt_attn_key_scales(p, g, kso, vso, nk, KB, kscale, vscale);
                mul = _mm512_mul_ps(mul, _mm512_loadu_ps(kscale));
            }
            vt512_row_step st = {.mul = mul, .cap = cap, .inv_cap = inv_cap, .j0 = j0, .valid = valid};
            /* logits: K decoded once per 8 rows */
            for (int r0 = 0; r0 < rg; r0 += 8) {
                int R = rg - r0 < 8 ? rg - r0 : 8;
                qk_group(R, dc, &tb, qg + (size_t)r0 * Dp, Dp, D, kp, nk, kq, pf_per_key && !r0 ? npf : 0,
                         S + (size_t)r0 * KB * 16);
            }
            if (nk < KB)
                for (int r = 0; r < rg; r++) memset(S + ((size_t)r * KB + nk) * 16, 0, (size_t)(KB - nk) * 64);
            const int direct = rg == 1 && NC * U <= 256; /* see pv_direct */
            for (int jj = 0; jj < nk && !direct; jj++)
                for (int c = 0; c < NC; c++) {
                    __m512 v[4];
                    dc->unit(vp[jj], c, D, &tb, v);
                    for (int i = 0; i < U / 16; i++) _mm512_storeu_ps(vbuf + (size_t)jj * Dp + c * U + 16 * i, v[i]);
                }
            if (pf_per_key) vt_attn_prefetch_head(p->v, p->v_stride_head, g, vpf, npf, row_bytes);
            vt512_block_weights(&st, p->alibi_slopes ? p->alibi_slopes + g * G : NULL, G, rg, nk, lo, hi,
                                base + it->q0, S, P, mg, lg, alpha);
            if (pth) /* l sums the unscaled weights */
                for (int r = 0; r < rg; r++)
                    _mm512_storeu_ps(P + (size_t)r * KB, _mm512_mul_ps(_mm512_loadu_ps(P + (size_t)r * KB), _mm512_loadu_ps(vscale)));
            for (int r = 0; r < rg; r++) {
                const float *pr = P + (size_t)r * KB;
                if (alpha[r] == 1.0f &&
                    _mm512_cmp_ps_mask(_mm512_loadu_ps(pr), _mm512_setzero_ps(), _CMP_NEQ_UQ) == 0)
                    continue;
                if (direct) pv_row_direct(NC, dc, &tb, ag, alpha[r], pr, vp, D, nk);
                else pv_row(ag + (size_t)r * Dp, alpha[r], pr, vbuf, Dp, nk);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < D; d++) acc[(size_t)r * D + d] = ap[(size_t)r * Dp + (d / U) * U + dc->pos(d % U)];
}

/* One instance per row of the file's decoder table, and the file's entries of the (ISA x format) kernel table
 * (cpu.c): the plain instances serve every element format but the per-token-head ones (cpu.c gives those
 * the AVX2 instances); the VBMI instances the fp8-decoded formats (e4m3fn, e5m2, fp8_per_token_head), which
 * cpu.c takes over the plain ones where the CPU has VBMI. */
#define INSTANCE(fmt, row, pth) VT_ATTN_TILE_INSTANCE(tile_##fmt, &row, pth)
VT_AVX512_DECODERS(INSTANCE)
#undef INSTANCE

#define ENTRY(fmt, row, pth) [VT_DTYPE_##fmt] = tile_##fmt,
const vt_attn_tile_fn VT_TILE_TABLE[VT_DTYPE_COUNT] = {VT_AVX512_DECODERS(ENTRY)};
#undef ENTRY

#endif /* VT_X86 */
