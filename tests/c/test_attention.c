/* Paged attention tests in plain C (no Python), run under ASan/UBSan by
 * `make -C tests/c asan ubsan`.
 *
 *  1. vt_attn_varlen under every ISA the CPU has (scalar twin, AVX2,
 *     AVX-512) and 1 or 3 threads against a float64 reference written here
 *     from the semantics in attention.h (its own fp8/bf16/f16 decoders,
 *     a plain loop over (token, head, key)), for every KV dtype, GQA 1/3/4,
 *     head sizes 64/72/80/160 (partial SIMD chunks), block sizes 5/16, mixed batches (decode and
 *     prefill rows, k_len across page boundaries, long enough to split),
 *     and the options (causal, window, softcap, ALiBi, sinks, per-head
 *     descales). Every cache slot no sequence uses holds NaN, so a read
 *     through a wrong block or past seqused_k shows;
 *  2. refusals write nothing: a block id out of range, a descale <= 0, a
 *     scratch buffer one byte short. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vtinfer/attention.h"
#include "vtinfer/vtinfer.h"
#include "../../csrc/core/attn_internal.h" /* the per-ISA kernel tables (internal) */

#include "check.h"

static uint32_t rng_state = 2024u;
static double urand(void) { /* [0, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (double)(rng_state >> 8) / 16777216.0;
}
static float nrand(void) { /* roughly normal */
    return (float)((urand() + urand() + urand() + urand() - 2.0) * 1.7);
}

/* ---- decoders written here, independent of the library's codecs ---- */

static double dec_fp8(int fmt_e4m3, unsigned c) {
    int s = c >> 7, mag = c & 0x7F;
    double v;
    if (fmt_e4m3) {
        int e = mag >> 3, m = mag & 7;
        if (mag == 0x7F) return NAN;
        v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    } else {
        int e = mag >> 2, m = mag & 3;
        if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
        v = e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17);
    }
    return s ? -v : v;
}

static double dec_f16(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : (e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25));
    return s ? -v : v;
}

static double dec_elem(vt_dtype dt, const unsigned char *p) {
    uint16_t h;
    uint32_t u;
    float f;
    switch (dt) {
    case VT_DTYPE_F32: memcpy(&f, p, 4); return f;
    case VT_DTYPE_F16: memcpy(&h, p, 2); return dec_f16(h);
    case VT_DTYPE_BF16:
        memcpy(&h, p, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case VT_DTYPE_INT8_PTH: return (int8_t)*p; /* the code; the per-token-head scale is applied by the caller */
    default: return dec_fp8(dt == VT_DTYPE_FP8_E4M3 || dt == VT_DTYPE_FP8_PTH, *p);
    }
}

/* Encode x (already on the dtype's grid, or close) for storage. */
static void enc_elem(vt_dtype dt, float x, unsigned char *p) {
    uint16_t h;
    switch (dt) {
    case VT_DTYPE_F32: memcpy(p, &x, 4); break;
    case VT_DTYPE_F16: h = vt_f16_from_f32(x); memcpy(p, &h, 2); break;
    case VT_DTYPE_BF16: h = vt_bf16_from_f32(x); memcpy(p, &h, 2); break;
    case VT_DTYPE_FP8_E4M3:
    case VT_DTYPE_FP8_PTH: *p = vt_fp8_e4m3_from_f32(x); break;
    case VT_DTYPE_INT8_PTH: *p = (unsigned char)(int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, x))); break;
    default: *p = vt_fp8_e5m2_from_f32(x); break;
    }
}

static void put_nan(vt_dtype dt, unsigned char *p) {
    float n = NAN;
    uint16_t h = dt == VT_DTYPE_F16 ? 0x7E00 : 0x7FC0;
    if (dt == VT_DTYPE_F32) memcpy(p, &n, 4);
    else if (dt == VT_DTYPE_F16 || dt == VT_DTYPE_BF16) memcpy(p, &h, 2);
    else *p = 0x7F;
}

/* int4_per_token_head, written here from vLLM's rules: element d of a packed row (even d: the low
 * nibble of byte d / 2), the stored scale's zero point (low 4 bits) and its scale (those bits cleared). */
static double dec_int4(const unsigned char *row, int d) { return (row[d / 2] >> (4 * (d & 1))) & 0xF; }
static float with_zp(float s, unsigned zp) {
    uint32_t u;
    memcpy(&u, &s, 4);
    u = (u & ~0xFu) | (zp & 0xFu);
    memcpy(&s, &u, 4);
    return s;
}
static double zero_point(float s) {
    uint32_t u;
    memcpy(&u, &s, 4);
    return (double)(u & 0xFu);
}
static double masked_scale(float s) { return with_zp(s, 0); }

/* The rotation's signs s_i: the library's table, read through its own rotation of unit vectors (H's
 * first row is all ones, so element 0 of H (s ⊙ e_i) is s_i); a sign is a draw from torch, not arithmetic. */
static double rht_sign(int i, int b) {
    float x[VT_INT4_RHT_MAX];
    memset(x, 0, sizeof(float) * (size_t)b);
    x[i] = 1.0f;
    vt_int4_rht(x, b, 0);
    return x[0];
}

/* x[0, D) in place, per block of b: forward H_b (s ⊙ x), inverse s ⊙ (H_b x) / b; H_b Sylvester's
 * unnormalized Hadamard matrix, H[i][j] = (-1)^popcount(i & j), as an explicit float64 product. */
static void rotate_f64(double *x, int D, int b, int inverse) {
    double y[VT_INT4_RHT_MAX], sg[VT_INT4_RHT_MAX];
    for (int i = 0; i < b; i++) sg[i] = rht_sign(i, b);
    for (int o = 0; o < D; o += b) {
        for (int i = 0; i < b; i++) {
            double t = 0;
            for (int j = 0; j < b; j++) {
                double xj = inverse ? x[o + j] : sg[j] * x[o + j];
                t += (__builtin_popcount((unsigned)(i & j)) & 1) ? -xj : xj;
            }
            y[i] = inverse ? sg[i] * t / b : t;
        }
        memcpy(x + o, y, sizeof(double) * (size_t)b);
    }
}

/* ---- one problem: a mixed batch over a paged NHD cache ---- */

enum { BATCH = 4, MAXB = 160 };

typedef struct problem {
    vt_dtype kv;
    int H, Hkv, D, bs, nb;
    int causal, wl, wr;
    float softcap;
    int alibi, sink, descale;
    int q_bf16; /* q values on the bf16 grid (the pair-dot tile's input) */
    size_t es, rb; /* bytes per element (int4: 1, two codes) and per head row (int4: D / 2) */
    unsigned char *k, *v;
    float *ks, *vs; /* per-token-head caches: scales [nb, bs, Hkv] (NaN in slots no sequence uses); else NULL */
    float *q;
    int32_t cu[BATCH + 1], su[BATCH], bt[BATCH * MAXB];
    float slopes[16], sinks[16], kd[BATCH * 4], vd[BATCH * 4];
    double *ref, *ref_lse;
} problem;

static const int QL[BATCH] = {1, 7, 1, 20};
static const int KL[BATCH] = {1, 33, 700, 41};

/* The four option sets of the grids: 0 plain (head size d0, block 16); 1 D 80, block 5, softcap +
 * ALiBi; 2 D 72, left window + sink, descales; 3 D 160, block 5, non-causal window, descales. */
static void problem_options(problem *pb, int opt, int d0) {
    pb->D = opt == 1 ? 80 : (opt == 2 ? 72 : (opt == 3 ? 160 : d0));
    pb->bs = opt & 1 ? 5 : 16;
    pb->causal = opt != 3;
    pb->wl = opt == 2 ? 9 : -1, pb->wr = opt == 3 ? 4 : -1;
    pb->softcap = opt == 1 ? 5.0f : 0.0f;
    pb->alibi = opt == 1, pb->sink = opt == 2, pb->descale = opt >= 2;
}

static void problem_make(problem *pb) {
    const int H = pb->H, Hkv = pb->Hkv, D = pb->D, bs = pb->bs;
    const int int4 = pb->kv == VT_DTYPE_INT4_PTH;
    pb->es = vt_dtype_get(pb->kv)->elem_bytes;
    pb->rb = int4 ? (size_t)D / 2 : (size_t)D * pb->es;
    int need = 0;
    for (int b = 0; b < BATCH; b++) need += (KL[b] + bs - 1) / bs;
    pb->nb = need + 3;
    size_t cb = (size_t)pb->nb * bs * Hkv * pb->rb;
    pb->k = malloc(cb);
    pb->v = malloc(cb);
    if (int4) memset(pb->k, 0xFF, cb), memset(pb->v, 0xFF, cb); /* (no NaN code: the unused slots' scales are NaN) */
    else
        for (size_t i = 0; i < cb / pb->es; i++) put_nan(pb->kv, pb->k + i * pb->es), put_nan(pb->kv, pb->v + i * pb->es);
    const int pth = vt_dtype_per_token_head(pb->kv);
    const size_t ns = (size_t)pb->nb * bs * Hkv;
    if (pth) {
        pb->descale = 0; /* the scales are per token (vLLM refuses a descale with these formats) */
        pb->ks = malloc(sizeof(float) * ns), pb->vs = malloc(sizeof(float) * ns);
        for (size_t i = 0; i < ns; i++) pb->ks[i] = pb->vs[i] = NAN;
    }
    /* block ids: a shuffled permutation, so neighbours in a sequence are not neighbours in memory */
    int *perm = malloc(sizeof(int) * (size_t)pb->nb);
    for (int i = 0; i < pb->nb; i++) perm[i] = i;
    for (int i = pb->nb - 1; i > 0; i--) {
        int j = (int)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int used = 0;
    pb->cu[0] = 0;
    for (int b = 0; b < BATCH; b++) {
        pb->cu[b + 1] = pb->cu[b] + QL[b];
        pb->su[b] = KL[b];
        for (int i = 0; i < MAXB; i++) pb->bt[b * MAXB + i] = i < (KL[b] + bs - 1) / bs ? perm[used + i] : 0;
        used += (KL[b] + bs - 1) / bs;
        for (int j = 0; j < KL[b]; j++) {
            int page = pb->bt[b * MAXB + j / bs], off = j % bs;
            for (int g = 0; g < Hkv && pth; g++) { /* scales over a 16x range, distinct per (token, head) */
                size_t so = ((size_t)page * bs + off) * Hkv + g;
                pb->ks[so] = 0.05f * (0.5f + (float)urand()) * (float)(1 << (int)(urand() * 4));
                pb->vs[so] = 0.05f * (0.5f + (float)urand()) * (float)(1 << (int)(urand() * 4));
                if (int4) { /* the zero point (0..15) in the stored scale's low 4 bits */
                    pb->ks[so] = with_zp(pb->ks[so], (unsigned)(urand() * 16));
                    pb->vs[so] = with_zp(pb->vs[so], (unsigned)(urand() * 16));
                }
            }
            if (int4) { /* random nibbles */
                for (int g = 0; g < Hkv; g++)
                    for (size_t i = 0; i < pb->rb; i++) {
                        size_t o = (((size_t)page * bs + off) * Hkv + g) * pb->rb + i;
                        pb->k[o] = (unsigned char)(urand() * 256), pb->v[o] = (unsigned char)(urand() * 256);
                    }
                continue;
            }
            for (int g = 0; g < Hkv; g++)
                for (int d = 0; d < D; d++) {
                    size_t o = (((size_t)page * bs + off) * Hkv + g) * pb->rb + (size_t)d * pb->es;
                    float kx = nrand(), vx = nrand();
                    if (vt_dtype_get(pb->kv)->elem_bytes == 1) kx *= 20.0f, vx *= 20.0f; /* spread over the fp8 grid */
                    enc_elem(pb->kv, kx, pb->k + o);
                    enc_elem(pb->kv, vx, pb->v + o);
                }
        }
    }
    free(perm);
    int T = pb->cu[BATCH];
    pb->q = malloc(sizeof(float) * (size_t)T * H * D);
    for (int i = 0; i < T * H * D; i++) pb->q[i] = nrand();
    if (pb->q_bf16)
        for (int i = 0; i < T * H * D; i++) pb->q[i] = vt_bf16_to_f32(vt_bf16_from_f32(pb->q[i]));
    /* int4: the reference reads with q rotated (vLLM's single_rht: H_b (s ⊙ q) per block of b, in float64 here,
     * rounded to q's bf16 grid), softmax_scale / b, keys and values (code - zp) * masked scale, and rotates
     * the output back (s ⊙ (H_b o) / b) */
    const int b4 = int4 ? D & -D : 1;
    double *qref = malloc(sizeof(double) * (size_t)T * H * D);
    for (int i = 0; i < T * H * D; i++) qref[i] = pb->q[i];
    if (int4)
        for (int i = 0; i < T * H; i++) {
            rotate_f64(qref + (size_t)i * D, D, b4, 0);
            for (int d = 0; d < D; d++) qref[(size_t)i * D + d] = vt_bf16_to_f32(vt_bf16_from_f32((float)qref[(size_t)i * D + d]));
        }
    for (int h = 0; h < H; h++) pb->slopes[h] = 0.05f * (float)(h + 1), pb->sinks[h] = 0.5f * (float)h - 1.0f;
    for (int i = 0; i < BATCH * Hkv; i++) pb->kd[i] = 0.5f + (float)urand(), pb->vd[i] = 0.5f + (float)urand();
    /* float64 reference */
    pb->ref = calloc((size_t)T * H * D, sizeof(double));
    pb->ref_lse = calloc((size_t)T * H, sizeof(double));
    const double scale = 1.0 / sqrt((double)D) / b4;
    const int G = H / Hkv;
    double *s = malloc(sizeof(double) * 1024);
    for (int b = 0; b < BATCH; b++)
        for (int i = 0; i < QL[b]; i++) {
            int tok = pb->cu[b] + i;
            long pos = KL[b] - QL[b] + i;
            for (int h = 0; h < H; h++) {
                int g = h / G;
                double kd = pb->descale ? pb->kd[b * Hkv + g] : 1.0, vd = pb->descale ? pb->vd[b * Hkv + g] : 1.0;
                double mx = pb->sink ? pb->sinks[h] : -INFINITY;
                for (int j = 0; j < KL[b]; j++) {
                    int vis = (!pb->causal || j <= pos) && (pb->wl < 0 || j >= pos - pb->wl) &&
                              (pb->wr < 0 || j <= pos + pb->wr);
                    if (!vis) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    int page = pb->bt[b * MAXB + j / bs], off = j % bs;
                    const unsigned char *kr = pb->k + (((size_t)page * bs + off) * Hkv + g) * pb->rb;
                    const float kst = pth ? pb->ks[((size_t)page * bs + off) * Hkv + g] : 1.0f;
                    double dot = 0, ksj = int4 ? masked_scale(kst) : kst, kz = int4 ? zero_point(kst) : 0;
                    for (int d = 0; d < D; d++)
                        dot += qref[((size_t)tok * H + h) * D + d] *
                               (int4 ? dec_int4(kr, d) - kz : dec_elem(pb->kv, kr + d * pb->es));
                    double x = dot * ksj * scale * kd;
                    if (pb->softcap > 0) x = pb->softcap * tanh(x / pb->softcap);
                    if (pb->alibi) x -= pb->slopes[h] * fabs((double)(j - pos));
                    s[j] = x;
                    if (x > mx) mx = x;
                }
                double L = pb->sink ? exp(pb->sinks[h] - mx) : 0.0;
                double *o = pb->ref + ((size_t)tok * H + h) * D;
                for (int j = 0; j < KL[b]; j++) {
                    if (s[j] == -INFINITY) continue;
                    double w = exp(s[j] - mx);
                    L += w;
                    int page = pb->bt[b * MAXB + j / bs], off = j % bs;
                    const unsigned char *vr = pb->v + (((size_t)page * bs + off) * Hkv + g) * pb->rb;
                    const float vst = pth ? pb->vs[((size_t)page * bs + off) * Hkv + g] : 1.0f;
                    const double vsj = int4 ? masked_scale(vst) : vst, vz = int4 ? zero_point(vst) : 0;
                    for (int d = 0; d < D; d++)
                        o[d] += w * vsj * (int4 ? dec_int4(vr, d) - vz : dec_elem(pb->kv, vr + d * pb->es));
                }
                for (int d = 0; d < D; d++) o[d] = L > 0 ? o[d] * vd / L : 0.0;
                if (int4) rotate_f64(o, D, b4, 1);
                pb->ref_lse[(size_t)h * T + tok] = L > 0 ? mx + log(L) : -INFINITY;
            }
        }
    free(s), free(qref);
}

static void problem_free(problem *pb) {
    free(pb->k), free(pb->v), free(pb->q), free(pb->ref), free(pb->ref_lse), free(pb->ks), free(pb->vs);
}

static void params_for(const problem *pb, float *out, float *lse, vt_attn_params *p) {
    const int H = pb->H, Hkv = pb->Hkv, D = pb->D;
    const int64_t rb = (int64_t)pb->rb;
    memset(p, 0, sizeof *p);
    p->q = pb->q, p->q_dtype = VT_DTYPE_F32, p->total_q = pb->cu[BATCH];
    p->q_stride_tok = (int64_t)H * D * 4, p->q_stride_head = (int64_t)D * 4;
    p->k = pb->k, p->v = pb->v, p->kv_dtype = pb->kv, p->num_blocks = pb->nb, p->block_size = pb->bs;
    p->k_stride_block = p->v_stride_block = (int64_t)pb->bs * Hkv * rb;
    p->k_stride_tok = p->v_stride_tok = (int64_t)Hkv * rb;
    p->k_stride_head = p->v_stride_head = rb;
    p->num_heads = H, p->num_kv_heads = Hkv, p->head_size = D;
    p->batch = BATCH, p->cu_seqlens_q = pb->cu, p->seqused_k = pb->su, p->block_table = pb->bt;
    p->max_blocks = MAXB, p->bt_stride = MAXB;
    p->softmax_scale = (float)(1.0 / sqrt((double)D));
    p->causal = pb->causal, p->window_left = pb->wl, p->window_right = pb->wr, p->softcap = pb->softcap;
    p->alibi_slopes = pb->alibi ? pb->slopes : NULL;
    if (pb->ks) {
        p->k_scale_cache = pb->ks, p->v_scale_cache = pb->vs;
        p->ks_stride_block = p->vs_stride_block = (int64_t)pb->bs * Hkv * 4;
        p->ks_stride_tok = p->vs_stride_tok = (int64_t)Hkv * 4;
        p->ks_stride_head = p->vs_stride_head = 4;
    }
    p->s_aux = pb->sink ? pb->sinks : NULL;
    if (pb->descale) {
        p->k_descale = pb->kd, p->v_descale = pb->vd;
        p->k_descale_stride_b = p->v_descale_stride_b = Hkv;
        p->k_descale_stride_h = p->v_descale_stride_h = 1;
    }
    p->out = out, p->out_stride_tok = (int64_t)H * D * 4, p->out_stride_head = (int64_t)D * 4;
    p->lse = lse, p->lse_stride_head = pb->cu[BATCH], p->lse_stride_tok = 1;
}

static const char *isa_names[] = {"scalar", "avx2", "avx512"};

static void run_and_compare(const problem *pb, const char *what) {
    const int T = pb->cu[BATCH], H = pb->H, D = pb->D;
    double vmax = 0;
    for (int i = 0; i < T * H * D; i++) vmax = fmax(vmax, fabs(pb->ref[i]));
    float *out = malloc(sizeof(float) * (size_t)T * H * D), *lse = malloc(sizeof(float) * (size_t)T * H);
    for (int isa = VT_ISA_SCALAR; isa <= (int)vt_isa_best(); isa++) {
        if (vt_isa_set((vt_isa)isa, NULL) != VT_OK) continue;
        for (int nth = 1; nth <= 3; nth += 2) {
            vt_attn_params p;
            params_for(pb, out, lse, &p);
            size_t sb = 0;
            vt_error err;
            CHECK(vt_attn_scratch_size(&p, nth, &sb, &err) == VT_OK, "%s: scratch size: %s", what, err.message);
            void *scr = malloc(sb);
            vt_status st = vt_attn_varlen(&p, scr, sb, nth, &err);
            CHECK(st == VT_OK, "%s %s: %s", what, isa_names[isa], err.message);
            double worst = 0, worst_lse = 0;
            for (int i = 0; i < T * H * D; i++) {
                double d = fabs((double)out[i] - pb->ref[i]);
                if (!(d <= worst)) worst = d; /* NaN sticks */
            }
            for (int i = 0; i < T * H; i++) {
                double r = pb->ref_lse[i], d = r == -INFINITY ? (lse[i] == -INFINITY ? 0 : INFINITY) : fabs(lse[i] - r);
                if (!(d <= worst_lse)) worst_lse = d;
            }
            /* float32 accumulation over <= 700 keys and D <= 160 terms: a few
             * hundred float32 units of the largest output at most */
            CHECK(worst <= 2e-5 * vmax + 1e-30, "%s %s nth=%d: max |out - ref| %g (max |ref| %g)", what,
                  isa_names[isa], nth, worst, vmax);
            CHECK(worst_lse <= 2e-5 * 30, "%s %s nth=%d: max |lse - ref| %g", what, isa_names[isa], nth, worst_lse);
            free(scr);
        }
    }
    vt_isa_set(vt_isa_best(), NULL);
    free(out), free(lse);
}

static void test_against_reference(void) {
    static const vt_dtype kvs[] = {VT_DTYPE_F32,      VT_DTYPE_F16,      VT_DTYPE_BF16,
                                   VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_INT8_PTH, VT_DTYPE_FP8_PTH};
    static const int heads[][2] = {{2, 2}, {12, 3}, {8, 2}}; /* (H, Hkv): GQA 1, 4, 4 */
    for (size_t di = 0; di < sizeof kvs / sizeof kvs[0]; di++)
        for (int hi = 0; hi < 3; hi++)
            for (int opt = 0; opt < 4; opt++) {
                problem pb;
                memset(&pb, 0, sizeof pb);
                pb.kv = kvs[di];
                pb.H = heads[hi][0], pb.Hkv = heads[hi][1];
                problem_options(&pb, opt, 64);
                problem_make(&pb);
                char what[96];
                snprintf(what, sizeof what, "kv=%s H=%d Hkv=%d D=%d bs=%d opt=%d", vt_dtype_get(pb.kv)->name, pb.H,
                         pb.Hkv, pb.D, pb.bs, opt);
                run_and_compare(&pb, what);
                problem_free(&pb);
            }
}

/* ---- the pair-dot tile (AVX512-BF16) against its scalar twin and the reference ----
 * Tile level: each (sequence, query tile) of a problem with bf16 q runs as
 * one item over all KV heads through the format's vt_attn_tiles_avx512bf16 instance (where the CPU
 * has AVX512-BF16) and vt_attn_tile_bf16dot_scalar (GQA 4/8/6 and 1/3); the partials (m, l,
 * acc) are finished as finish_tile does for one split (sink, v_descale) and
 * compared with the float64 reference (twin: 4e-3 x max |ref|, as P V takes
 * its weights in bf16, relative error 2^-9 per weight; measured <= 1.5e-3)
 * and with each other (SIMD vs twin: 1e-3 x max |ref|; measured <= 2.3e-6 in
 * 59 of 60 cases, the twin models the kernel's order of operations, and
 * 2.5e-4 in one, GQA 3 with a 5-key window: the vector exp and expf differ
 * by an ulp and one weight rounds to the other bf16 neighbour).
 * The planted defects (a wrong key column, a wrong transpose or interleave,
 * a dropped scale) miss both by far more.
 * int8 / fp8 per-token-head caches (scales over a 16x range per (token, head); P V's weights
 * split into bf16 hi + lo): twin vs reference 1e-4 x max |ref| (measured <= 7e-6; with one bf16
 * weight, as for bf16 / fp8 caches, 3.3e-3), SIMD vs twin 5e-5 (measured <= 4.6e-6). */

typedef void (*tile_fn)(const vt_attn_params *, const vt_attn_item *, float *, float *, float *, float *);

/* Run `tile` on every item of pb (q tiles of <= 16 queries, all groups) and write finished outputs to o. */
static void run_tile(const problem *pb, const vt_attn_params *p, tile_fn tile, double *o) {
    const int H = pb->H, Hkv = pb->Hkv, D = pb->D, G = H / Hkv;
    size_t rows_max = (size_t)VT_ATTN_QT_MAX * H;
    float *work = malloc(sizeof(float) * vt_attn_work_floats(rows_max, (size_t)D));
    float *m = malloc(sizeof(float) * rows_max), *l = malloc(sizeof(float) * rows_max);
    float *acc = malloc(sizeof(float) * rows_max * (size_t)D);
    for (int b = 0; b < BATCH; b++)
        for (int q0 = 0; q0 < QL[b]; q0 += VT_ATTN_QT_MAX) {
            vt_attn_item it = {.b = b, .g = 0, .ng = Hkv, .q0 = q0, .q_len = QL[b], .k_len = KL[b], .q_tok0 = pb->cu[b]};
            it.nq = QL[b] - q0 < VT_ATTN_QT_MAX ? QL[b] - q0 : VT_ATTN_QT_MAX;
            int64_t lo0, hi0, lo1, hi1;
            vt_attn_key_range(p, KL[b] - QL[b] + q0, KL[b], &lo0, &hi0);
            vt_attn_key_range(p, KL[b] - QL[b] + q0 + it.nq - 1, KL[b], &lo1, &hi1);
            it.kb = lo0 < lo1 ? lo0 : lo1, it.ke = hi0 > hi1 ? hi0 : hi1;
            if (it.ke < it.kb) it.ke = it.kb;
            tile(p, &it, work, m, l, acc);
            const int rg = (int)it.nq * G;
            for (int r = 0; r < rg * Hkv; r++) {
                int g = r / rg, lr = r % rg, h = g * G + lr % G, tok = pb->cu[b] + q0 + lr / G;
                double vd = pb->descale ? pb->vd[b * Hkv + g] : 1.0, sink = pb->sink ? pb->sinks[h] : -INFINITY;
                double M = m[r] > sink ? m[r] : sink, L = 0, w = 0;
                if (m[r] != -INFINITY) w = exp(m[r] - M), L = l[r] * w;
                if (pb->sink) L += exp(sink - M);
                for (int d = 0; d < D; d++)
                    o[((size_t)tok * H + h) * D + d] = L > 0 ? acc[(size_t)r * D + d] * w * vd / L : 0.0;
            }
        }
    free(work), free(m), free(l), free(acc);
}

static double max_diff(const double *a, const double *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= w)) w = d; /* NaN sticks */
    }
    return w;
}

static void test_bf16dot_tile(void) {
    static const vt_dtype kvs[] = {VT_DTYPE_BF16, VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_INT8_PTH,
                                   VT_DTYPE_FP8_PTH, VT_DTYPE_INT4_PTH};
    /* GQA 4, 8, 6; GQA 1 and 3, where two rows of one P V pass can belong to different queries
     * (prefill tiles of >= 4 rows take the tile at any GQA) */
    static const int heads[][2] = {{8, 2}, {16, 2}, {12, 2}, {4, 4}, {6, 2}};
    const int simd = VT_X86 && vt_cpu_get()->avx512bf16;
    for (size_t di = 0; di < sizeof kvs / sizeof kvs[0]; di++)
        for (int hi = 0; hi < 5; hi++)
            for (int opt = 0; opt < 4; opt++) {
                problem pb;
                memset(&pb, 0, sizeof pb);
                pb.kv = kvs[di], pb.q_bf16 = 1;
                pb.H = heads[hi][0], pb.Hkv = heads[hi][1];
                problem_options(&pb, opt, 128);
                problem_make(&pb);
                const int T = pb.cu[BATCH];
                const size_t n = (size_t)T * pb.H * pb.D;
                uint16_t *qb = malloc(2 * n);
                for (size_t i = 0; i < n; i++) qb[i] = vt_bf16_from_f32(pb.q[i]);
                vt_attn_params p;
                params_for(&pb, NULL, NULL, &p);
                p.q = qb, p.q_dtype = VT_DTYPE_BF16;
                p.q_stride_tok = (int64_t)pb.H * pb.D * 2, p.q_stride_head = (int64_t)pb.D * 2;
                double vmax = 0;
                for (size_t i = 0; i < n; i++) vmax = fmax(vmax, fabs(pb.ref[i]));
                double *twin = calloc(n, sizeof(double)), *fast = calloc(n, sizeof(double));
                run_tile(&pb, &p, vt_attn_tile_bf16dot_scalar, twin);
                /* per-token-head caches: P V's weights split into bf16 hi + lo (~16 bits): tighter bounds */
                const int split = vt_dtype_per_token_head(pb.kv);
                const double tol_twin = split ? 1e-4 : 4e-3, tol_simd = split ? 5e-5 : 1e-3;
                double et = max_diff(twin, pb.ref, n);
                CHECK(et <= tol_twin * vmax, "bf16dot twin kv=%s H=%d D=%d opt=%d: max |twin - ref| %g (max |ref| %g)",
                      vt_dtype_get(pb.kv)->name, pb.H, pb.D, opt, et, vmax);
#if VT_X86
                if (simd) {
                    run_tile(&pb, &p, vt_attn_tiles_avx512bf16[pb.kv], fast);
                    double ef = max_diff(fast, twin, n);
                    CHECK(ef <= tol_simd * vmax, "bf16dot avx512 kv=%s H=%d D=%d opt=%d: max |simd - twin| %g (max |ref| %g)",
                          vt_dtype_get(pb.kv)->name, pb.H, pb.D, opt, ef, vmax);
                }
#endif
                if (getenv("VT_TEST_VERBOSE"))
                    printf("bf16dot kv=%s H=%d D=%d opt=%d: twin-ref %.3g simd-twin %.3g (x max|ref|)\n",
                           vt_dtype_get(pb.kv)->name, pb.H, pb.D, opt, et / vmax, simd ? max_diff(fast, twin, n) / vmax : 0.0);
                free(twin), free(fast), free(qb);
                problem_free(&pb);
            }
    (void)simd;
}

/* ---- the AVX-512 tile's two fp8 instances ----
 * The AVX-512 table holds one of them (the VBMI one where the CPU has VBMI), so the reference
 * comparison above reaches only that one: here both run on the tile level over e4m3 and e5m2
 * caches (codes over the whole grid, subnormals included; fp8_per_token_head, which the plain
 * AVX-512 table reads with the AVX2 instance, against that one), GQA 1 (V decoded straight into the
 * FMAs) and 3 (V decoded into the L1 buffer), head sizes 64, 128, 256 and the options' 80, 72
 * and 160 (a partial last unit), each against the float64 reference (the bound of the reference
 * comparison) and against each other (the same products, summed in another lane order: 1e-5 x
 * max |ref|; measured <= 3.4e-6, as each is within 2.7e-6 of the reference). */
static void test_avx512_fp8_instances(void) {
#if VT_X86
    if (vt_isa_best() < VT_ISA_AVX512) return;
    const int vbmi = vt_cpu_get()->avx512vbmi;
    static const vt_dtype kvs[] = {VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_FP8_PTH};
    static const int heads[][2] = {{4, 4}, {6, 2}}; /* GQA 1, 3 */
    static const int d0s[] = {64, 128, 256};
    for (size_t di = 0; di < 3; di++)
        for (int hi = 0; hi < 2; hi++)
            for (int o = 0; o < 6; o++) {
                problem pb;
                memset(&pb, 0, sizeof pb);
                pb.kv = kvs[di], pb.H = heads[hi][0], pb.Hkv = heads[hi][1];
                problem_options(&pb, o < 3 ? 0 : o - 2, o < 3 ? d0s[o] : 64);
                problem_make(&pb);
                vt_attn_params p;
                params_for(&pb, NULL, NULL, &p);
                const size_t n = (size_t)pb.cu[BATCH] * pb.H * pb.D;
                double vmax = 0;
                for (size_t i = 0; i < n; i++) vmax = fmax(vmax, fabs(pb.ref[i]));
                double *plain = calloc(n, sizeof(double)), *bytes = calloc(n, sizeof(double));
                run_tile(&pb, &p, pb.kv == VT_DTYPE_FP8_PTH ? vt_attn_tiles_avx2[VT_DTYPE_FP8_PTH] : vt_attn_tiles_avx512[pb.kv],
                         plain);
                double ep = max_diff(plain, pb.ref, n), eb = 0, epb = 0;
                CHECK(ep <= 2e-5 * vmax, "avx512 fp8 kv=%s H=%d D=%d: max |plain - ref| %g (max |ref| %g)",
                      vt_dtype_get(pb.kv)->name, pb.H, pb.D, ep, vmax);
                if (vbmi) {
                    run_tile(&pb, &p, vt_attn_tiles_avx512vbmi[pb.kv], bytes);
                    eb = max_diff(bytes, pb.ref, n), epb = max_diff(bytes, plain, n);
                    CHECK(eb <= 2e-5 * vmax, "avx512 vbmi fp8 kv=%s H=%d D=%d: max |vbmi - ref| %g (max |ref| %g)",
                          vt_dtype_get(pb.kv)->name, pb.H, pb.D, eb, vmax);
                    CHECK(epb <= 1e-5 * vmax, "avx512 fp8 kv=%s H=%d D=%d: max |vbmi - plain| %g (max |ref| %g)",
                          vt_dtype_get(pb.kv)->name, pb.H, pb.D, epb, vmax);
                }
                if (getenv("VT_TEST_VERBOSE"))
                    printf("avx512 fp8 kv=%s H=%d D=%d: plain-ref %.3g vbmi-ref %.3g vbmi-plain %.3g (x max|ref|)\n",
                           vt_dtype_get(pb.kv)->name, pb.H, pb.D, ep / vmax, eb / vmax, epb / vmax);
                free(plain), free(bytes);
                problem_free(&pb);
            }
#endif
}

/* ---- refusals write nothing ---- */

static void test_refusals(void) {
    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.kv = VT_DTYPE_BF16, pb.H = 4, pb.Hkv = 2, pb.D = 64, pb.bs = 16, pb.causal = 1, pb.wl = pb.wr = -1;
    pb.descale = 1;
    problem_make(&pb);
    const int T = pb.cu[BATCH], n = T * pb.H * pb.D;
    float *out = malloc(sizeof(float) * (size_t)n), *lse = malloc(sizeof(float) * (size_t)T * pb.H);
    vt_attn_params p;
    size_t sb;
    vt_error err;
    params_for(&pb, out, lse, &p);
    CHECK(vt_attn_scratch_size(&p, 2, &sb, &err) == VT_OK, "scratch size: %s", err.message);
    void *scr = malloc(sb);
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < n; i++) out[i] = 12345.0f;
        for (int i = 0; i < T * pb.H; i++) lse[i] = 12345.0f;
        params_for(&pb, out, lse, &p);
        vt_status want;
        size_t give = sb;
        int32_t saved = pb.bt[3 * MAXB + 2];
        float saved_vd = pb.vd[1];
        if (c == 0) pb.bt[3 * MAXB + 2] = pb.nb, want = VT_ERR_INDEX; /* last sequence: earlier ones are fine */
        else if (c == 1) pb.vd[1] = 0.0f, want = VT_ERR_VALUE;
        else give = sb - 1, want = VT_ERR_VALUE;
        vt_status st = vt_attn_varlen(&p, scr, give, 2, &err);
        CHECK(st == want, "refusal %d: status %d, want %d (%s)", c, (int)st, (int)want, err.message);
        CHECK(strstr(err.message, "flash_attn_varlen_func: ") == err.message, "refusal %d: message '%s'", c,
              err.message);
        int touched = 0;
        for (int i = 0; i < n; i++) touched |= out[i] != 12345.0f;
        for (int i = 0; i < T * pb.H; i++) touched |= lse[i] != 12345.0f;
        CHECK(!touched, "refusal %d wrote to out or lse", c);
        pb.bt[3 * MAXB + 2] = saved, pb.vd[1] = saved_vd;
    }
    free(scr), free(out), free(lse);
    problem_free(&pb);
}

/* A slot format's own refusals (Octave: rotary dims out of range or off its 64-dim grid, v not k, a descale):
 * each names its argument and the rule, and writes nothing. */
static void test_slot_refusals(void) {
    problem pb;
    memset(&pb, 0, sizeof pb);
    pb.kv = VT_DTYPE_BF16, pb.H = 4, pb.Hkv = 2, pb.D = 128, pb.bs = 16, pb.causal = 1, pb.wl = pb.wr = -1;
    problem_make(&pb);
    const int T = pb.cu[BATCH], n = T * pb.H * pb.D;
    float *out = malloc(sizeof(float) * (size_t)n), *lse = malloc(sizeof(float) * (size_t)T * pb.H);
    static const struct { int64_t rope; int v_other, descale; const char *says; } cases[] = {
        {65, 0, 0, "rotary dims (rope_dim) of kv_cache_dtype 'octave_k3v4' must be a multiple of 64 in [0, 128]; got 65"},
        {192, 0, 0, "must be a multiple of 64 in [0, 128]; got 192"},
        {-64, 0, 0, "must be a multiple of 64 in [0, 128]; got -64"},
        {64, 1, 0, "v must be k for kv_cache_dtype 'octave_k3v4'"},
        {64, 0, 1, "k_descale, v_descale, k_scale_cache and v_scale_cache must be None"},
    };
    float kd[BATCH * 2] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < n; i++) out[i] = 12345.0f;
        for (int i = 0; i < T * pb.H; i++) lse[i] = 12345.0f;
        vt_attn_params p;
        vt_error err;
        params_for(&pb, out, lse, &p);
        p.kv_dtype = VT_DTYPE_OCT_K3V4, p.v = cases[c].v_other ? pb.v : pb.k, p.slot_rope_dim = cases[c].rope;
        if (cases[c].descale) p.k_descale = kd, p.k_descale_stride_b = 2, p.k_descale_stride_h = 1;
        size_t sb = 0;
        vt_status st = vt_attn_scratch_size(&p, 2, &sb, &err);
        if (st == VT_OK) {
            void *scr = malloc(sb ? sb : 1);
            st = vt_attn_varlen(&p, scr, sb, 2, &err);
            free(scr);
        }
        CHECK(st == VT_ERR_VALUE, "slot refusal %zu: status %d (%s)", c, (int)st, err.message);
        CHECK(strstr(err.message, "flash_attn_varlen_func: ") == err.message && strstr(err.message, cases[c].says),
              "slot refusal %zu: message '%s'", c, err.message);
        int touched = 0;
        for (int i = 0; i < n; i++) touched |= out[i] != 12345.0f;
        for (int i = 0; i < T * pb.H; i++) touched |= lse[i] != 12345.0f;
        CHECK(!touched, "slot refusal %zu wrote to out or lse", c);
    }
    free(out), free(lse);
    problem_free(&pb);
}

#if VT_X86
/* No two formats of an ISA's instance array share an instance: the decoder is each one's constant. */
static void check_distinct(const vt_attn_tile_fn *tiles, const char *what) {
    for (int d = 0; d < VT_DTYPE_COUNT; d++)
        for (int e = 0; e < d && tiles[d]; e++)
            CHECK(tiles[e] != tiles[d], "%s: %s and %s share a tile instance", what, vt_dtype_get(e)->name,
                  vt_dtype_get(d)->name);
}
#endif

/* The attention tiles of table k (ISA isa; bf16dot: the table of a CPU with AVX512-BF16): every format holds its
 * ISA's instance for it (SIMD ISAs: one for every format attention reads as elements or rotated int4) or its
 * read family's tile, none for the formats attention cannot read. */
static void check_tiles(const vt_kernels *k, int isa, int bf16dot) {
    for (int d = 0; d < VT_DTYPE_COUNT; d++) {
        vt_read_family f = vt_dtype_get(d)->read_family;
        vt_attn_tile_fn w = f == VT_READ_NONE ? NULL : f == VT_READ_SLOTS ? vt_attn_tile_slots : vt_attn_tile_scalar;
#if VT_X86
        const int simd = f == VT_READ_ELEMENTS || f == VT_READ_INT4_ROTATED;
        if (isa == VT_ISA_AVX2 && simd) w = vt_attn_tiles_avx2[d];
        if (isa == VT_ISA_AVX512 && simd) {
            /* the pair-dot instances stand over the VBMI ones, those over the AVX2 per-token-head ones (faster
             * there than the AVX-512 fp32 tile), those over the plain AVX-512 ones */
            const int dec = vt_dtype_decoder(d), pth = vt_dtype_per_token_head(d);
            const int fp8 = f == VT_READ_ELEMENTS && (dec == VT_DTYPE_FP8_E4M3 || dec == VT_DTYPE_FP8_E5M2);
            const int dot = dec == VT_DTYPE_BF16 || fp8 || pth;
            if (bf16dot && dot) w = vt_attn_tiles_avx512bf16[d];
            else if (vt_cpu_get()->avx512vbmi && fp8) w = vt_attn_tiles_avx512vbmi[d];
            else if (pth) w = vt_attn_tiles_avx2[d];
            else w = vt_attn_tiles_avx512[d];
        }
        if (simd && isa != VT_ISA_SCALAR)
            CHECK(w != NULL, "%s has no tile instance for %s", isa_names[isa], vt_dtype_get(d)->name);
#endif
        CHECK(k->attn_tile[d] == w, "table of %s%s: %s holds another tile", isa_names[isa],
              bf16dot ? " (AVX512-BF16)" : "", vt_dtype_get(d)->name);
    }
#if VT_X86
    check_distinct(vt_attn_tiles_avx2, "AVX2");
    check_distinct(vt_attn_tiles_avx512, "AVX-512");
    check_distinct(vt_attn_tiles_avx512vbmi, "AVX-512 VBMI");
    check_distinct(vt_attn_tiles_avx512bf16, "AVX-512 BF16");
#endif
}

/* Each ISA's table holds that ISA's own kernels: forcing an ISA must run its
 * codec row kernels and its attention tile, not another ISA's (the reference
 * comparison above would pass with any correct tile). */
static void test_dispatch_tables(void) {
    static const vt_codec_kernels *codecs[] = {
        &vt_codec_scalar,
#if VT_X86
        &vt_codec_avx2, &vt_codec_avx512,
#endif
    };
    for (int isa = VT_ISA_SCALAR; isa <= (int)vt_isa_best(); isa++) {
        CHECK(vt_isa_set((vt_isa)isa, NULL) == VT_OK, "set isa %d", isa);
        const vt_kernels *k = vt_kernels_active();
        CHECK(k->isa == (vt_isa)isa && vt_isa_active() == (vt_isa)isa, "table of %s says isa %d", isa_names[isa],
              (int)k->isa);
        const int bf16dot = isa == VT_ISA_AVX512 && vt_cpu_get()->avx512bf16;
        check_tiles(k, isa, bf16dot);
        /* a CPU with AVX512-BF16 also runs the table without it: the pair-dot tile hands it the items it leaves */
        if (bf16dot) check_tiles(vt_kernels_table(VT_ISA_AVX512, 0), isa, 0);
        CHECK(k->codec == codecs[isa] && vt_codec_active() == codecs[isa], "table of %s holds another ISA's codec",
              isa_names[isa]);
        for (int s = 0; s < 3; s++)
            for (int d = 0; d < 3; d++) CHECK(k->codec->convert[s][d] != NULL, "%s convert[%d][%d] NULL", isa_names[isa], s, d);
        for (int f = 0; f < 2; f++)
            for (int d = 0; d < 3; d++)
                CHECK(k->codec->quant[d][f] && k->codec->dequant[f][d], "%s fp8 kernel NULL", isa_names[isa]);
    }
    /* every table by its own ISA, whichever AVX-512 table this CPU selects */
    for (int bf16 = 0; bf16 < 2; bf16++) {
        CHECK(vt_kernels_table(VT_ISA_SCALAR, bf16)->attn_tile[VT_DTYPE_F32] == vt_attn_tile_scalar, "scalar table's tile");
#if VT_X86
        const vt_kernels *a2 = vt_kernels_table(VT_ISA_AVX2, bf16), *a5 = vt_kernels_table(VT_ISA_AVX512, bf16);
        CHECK(a2->attn_tile[VT_DTYPE_FP8_E4M3] == vt_attn_tiles_avx2[VT_DTYPE_FP8_E4M3] && a2->codec == &vt_codec_avx2 &&
                  a2->attn_tile[VT_DTYPE_INT4_PTH] == vt_attn_tiles_avx2[VT_DTYPE_INT4_PTH],
              "AVX2 table (bf16 %d)", bf16);
        const int vbmi = vt_cpu_get()->avx512vbmi;
        CHECK(a5->attn_tile[VT_DTYPE_FP8_PTH] ==
                      (bf16 ? vt_attn_tiles_avx512bf16[VT_DTYPE_FP8_PTH]
                            : vbmi ? vt_attn_tiles_avx512vbmi[VT_DTYPE_FP8_PTH] : vt_attn_tiles_avx2[VT_DTYPE_FP8_PTH]) &&
                  a5->codec == &vt_codec_avx512 &&
                  a5->attn_tile[VT_DTYPE_INT4_PTH] ==
                      (bf16 ? vt_attn_tiles_avx512bf16[VT_DTYPE_INT4_PTH] : vt_attn_tiles_avx2[VT_DTYPE_INT4_PTH]) &&
                  a5->attn_tile[VT_DTYPE_INT8_PTH] ==
                      (bf16 ? vt_attn_tiles_avx512bf16[VT_DTYPE_INT8_PTH] : vt_attn_tiles_avx2[VT_DTYPE_INT8_PTH]) &&
                  a5->attn_tile[VT_DTYPE_FP8_E4M3] ==
                      (bf16 ? vt_attn_tiles_avx512bf16[VT_DTYPE_FP8_E4M3]
                            : vbmi ? vt_attn_tiles_avx512vbmi[VT_DTYPE_FP8_E4M3] : vt_attn_tiles_avx512[VT_DTYPE_FP8_E4M3]) &&
                  a5->attn_tile[VT_DTYPE_FP8_E5M2] ==
                      (bf16 ? vt_attn_tiles_avx512bf16[VT_DTYPE_FP8_E5M2]
                            : vbmi ? vt_attn_tiles_avx512vbmi[VT_DTYPE_FP8_E5M2] : vt_attn_tiles_avx512[VT_DTYPE_FP8_E5M2]) &&
                  a5->attn_tile[VT_DTYPE_F32] == vt_attn_tiles_avx512[VT_DTYPE_F32] &&
                  a5->isa == VT_ISA_AVX512,
              "AVX-512 table (bf16 %d) holds another tile", bf16);
#endif
    }
    CHECK(vt_kernels_table((vt_isa)99, 0) == NULL, "no table for an unknown isa");
    /* the pair-dot tile's reach within that table's tile: bf16 q with >= 4 rows per group over a
     * bf16 cache, an fp8 cache or an int8 / fp8 / int4 per-token-head cache; the fp32 tile otherwise */
    static const vt_dtype dot_kv[] = {VT_DTYPE_BF16, VT_DTYPE_FP8_E4M3, VT_DTYPE_FP8_E5M2, VT_DTYPE_INT8_PTH,
                                      VT_DTYPE_FP8_PTH, VT_DTYPE_INT4_PTH};
    static const vt_dtype fp32_kv[] = {VT_DTYPE_F32, VT_DTYPE_F16};
    vt_attn_params pd;
    memset(&pd, 0, sizeof pd);
    for (size_t i = 0; i < sizeof dot_kv / sizeof dot_kv[0]; i++) {
        pd.kv_dtype = dot_kv[i], pd.q_dtype = VT_DTYPE_BF16;
        CHECK(vt_attn_bf16dot_applies(&pd, 4) && vt_attn_bf16dot_applies(&pd, 64) && !vt_attn_bf16dot_applies(&pd, 3),
              "pair-dot tile's reach for kv=%s (bf16 q): 4 rows or more", vt_dtype_get(dot_kv[i])->name);
        pd.q_dtype = VT_DTYPE_F32;
        CHECK(!vt_attn_bf16dot_applies(&pd, 8), "pair-dot tile for float32 q over kv=%s", vt_dtype_get(dot_kv[i])->name);
    }
    for (size_t i = 0; i < sizeof fp32_kv / sizeof fp32_kv[0]; i++) {
        pd.kv_dtype = fp32_kv[i], pd.q_dtype = VT_DTYPE_BF16;
        CHECK(!vt_attn_bf16dot_applies(&pd, 8), "pair-dot tile for kv=%s", vt_dtype_get(fp32_kv[i])->name);
    }
    if ((int)vt_isa_best() < VT_ISA_AVX512)
        CHECK(vt_isa_set(VT_ISA_AVX512, NULL) == VT_ERR_UNSUPPORTED && vt_isa_active() == vt_isa_best(),
              "an unsupported ISA is refused and the active one kept");
    vt_isa_set(vt_isa_best(), NULL);
}

int main(void) {
    if (vt_runtime_init(NULL, NULL) != VT_OK) return 2;
    test_dispatch_tables();
    /* on wrong tables the runs below mean nothing, and a tile handing items to itself never returns */
    if (__atomic_load_n(&failures, __ATOMIC_RELAXED)) return finish("test_attention", "");
    test_against_reference();
    test_bf16dot_tile();
    test_avx512_fp8_instances();
    test_refusals();
    test_slot_refusals();
    char ok[64];
    snprintf(ok, sizeof ok, "OK (isa up to %s)", vt_isa_name(vt_isa_best()));
    return finish("test_attention", ok);
}
