/* Internal declarations of the attention kernels (csrc/core/attention.c,
 * attn_ref.c, attn_avx512.c, attn_avx2.c); not installed. */
#ifndef VTINFER_ATTN_INTERNAL_H
#define VTINFER_ATTN_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vt_internal.h"
#include "vtinfer/attention.h"

/* Most queries in one tile; a tile holds at most max(VT_ATTN_ROWS_MAX, G) rows. */
#define VT_ATTN_QT_MAX 16
#define VT_ATTN_ROWS_MAX 64

/* One unit of work: the rows (query x head) of a query tile and of the
 * KV-head groups [g, g + ng) against the keys [kb, ke) of one sequence.
 * Row r belongs to group g + r / (nq * G); within its group, local row
 * lr = r % (nq * G) is query q0 + lr / G (within the sequence) and head
 * (its group) * G + lr % G. Several groups share a tile so that a kernel
 * can walk each page of the cache once for all of them (NHD pages hold
 * every head of a token together). */
typedef struct vt_attn_item {
    int b, g, ng;
    int64_t q0, nq;    /* queries [q0, q0 + nq) of the sequence */
    int64_t kb, ke;    /* keys [kb, ke) */
    int64_t q_len, k_len, q_tok0; /* q_tok0: cu_seqlens_q[b] */
} vt_attn_item;

/* x clamped to [-FLT_MAX, FLT_MAX]; a NaN stays NaN. Logits and the logit
 * multiplier saturate so that an overflow (softmax_scale or k_descale near
 * float32's range) never makes inf - inf = NaN of a finite result. */
static inline float vt_attn_sat(float x) {
    return x > FLT_MAX ? FLT_MAX : (x < -FLT_MAX ? -FLT_MAX : x);
}

/* Logit multiplier of KV head g of sequence b: softmax_scale * k_descale[b, g], saturated. */
static inline float vt_attn_logit_mul(const vt_attn_params *p, int b, int g) {
    float kd = p->k_descale ? p->k_descale[b * p->k_descale_stride_b + g * p->k_descale_stride_h] : 1.0f;
    return vt_attn_sat(p->softmax_scale * kd);
}

/* A tile kernel writes, for each of the it->ng * it->nq * G rows, the running max m,
 * the sum l of e^{s - m} and acc = sum e^{s - m} V (true decoded units, no
 * v_descale), over the visible keys of [kb, ke); a row with no visible key
 * gets m = -inf, l = 0, acc = 0. `work` holds vt_attn_work_floats floats. */
/* (vt_attn_tile_fn, in vt_internal.h, is the type of such a kernel; one per ISA table.) */

/* The head sizes a tile instance is compiled for as constants (its chunk loops unrolled); any other runs the
 * instance with the head size a runtime value. VT_ATTN_RUNTIME_HEAD_ONLY (the libFuzzer build, where each
 * constant instance costs minutes of instrumented compile) leaves only that one. */
#ifdef VT_ATTN_RUNTIME_HEAD_ONLY
#define VT_ATTN_HEAD_CASE(D, ...)
#else
#define VT_ATTN_HEAD_CASE(D, ...)                                                                               \
    case D: __VA_ARGS__; break;
#endif

/* The instance `name` of a SIMD tile file's tile(dec, pth, DC, p, it, work, m, l, acc) for the decoder dec
 * (a row of the file's decoder table; pth: per-token-head scales), with the head sizes above as constants DC
 * and any other at runtime (DC 0); T is the file's target attribute. */
#define VT_ATTN_TILE_INSTANCE(name, dec, pth)                                                                   \
    T static void name(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,        \
                       float *acc) {                                                                            \
        switch (p->head_size) {                                                                                 \
        VT_ATTN_HEAD_CASE(64, tile(dec, pth, 64, p, it, work, m, l, acc))                                       \
        VT_ATTN_HEAD_CASE(128, tile(dec, pth, 128, p, it, work, m, l, acc))                                     \
        VT_ATTN_HEAD_CASE(256, tile(dec, pth, 256, p, it, work, m, l, acc))                                     \
        default: tile(dec, pth, 0, p, it, work, m, l, acc); break;                                              \
        }                                                                                                       \
    }

/* Floats of per-thread work any tile kernel may use for `rows` rows. */
static inline size_t vt_attn_work_floats(size_t rows, size_t head_size) {
    size_t dp = (head_size + 63) & ~(size_t)63; /* head_size padded to 64 (the VBMI fp8 tile's unit) */
    return 2 * rows * dp + rows * 320 + 17 * dp + 256;
}

void vt_attn_tile_scalar(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                         float *acc);
/* The slot formats' tile (attn_slots.c, every ISA): chunks of keys decoded by the format's codec, read by the
 * active ISA's float32 tile, merged. Its work is vt_attn_slot_work_floats(p, rows, max_groups) floats, for
 * items of up to `rows` rows and `max_groups` KV heads. */
void vt_attn_tile_slots(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                        float *acc);
size_t vt_attn_slot_work_floats(const vt_attn_params *p, size_t rows, int max_groups);
/* 1 when the query row at src (q's dtype), put in the key basis and rounded as the slot row says (as the slot
 * tile reads it), holds a NaN: the row's output is then NaN, as for a NaN in any other format's query. */
int vt_attn_slot_q_has_nan(const vt_attn_params *p, const uint8_t *src);

/* The pair-dot (bf16 dot product) tile: grouped rows against a key tile held
 * once per block, for bf16 queries over bf16, fp8 (e4m3fn, e5m2) or int8 /
 * fp8 / int4 per-token-head caches when a group has at least 4 rows (GQA >= 4
 * decode, or a prefill tile);
 * everything else runs the fp32 tile of the same ISA. Arithmetic (the SIMD
 * kernel, attn_avx512bf16.c, and its scalar twin, attn_bf16dot_ref.c):
 * - logits: q . k over element pairs, products of bf16 values exact in
 *   float32, accumulated in float32 in two chains (even and odd pair
 *   indices, each pair adding its odd product, then its even one), the
 *   chains summed; inputs, products and sums below FLT_MIN flushed to 0
 *   (vdpbf16ps's DAZ/FTZ);
 * - online softmax per block of 16 keys (max over the block's visible
 *   keys, weights below e^-60 flushed), l summed from the float32 weights;
 *   P V takes the weights rounded to bf16 (round to nearest even);
 * - P V: for each pair of keys (2k, 2k + 1) with a nonzero weight, the
 *   accumulator adds the odd key's product, then the even key's, in float32
 *   (FTZ as above). (The SIMD tile runs two rows per pass over the pairs
 *   either row weighs; a pair that the other row weighs adds 0 . V, the same
 *   sum for finite V.)
 * Per-token-head caches (int8 / e4m3 codes, every code exact in bf16): key
 * j's K scale ks_j multiplies its logit multiplier (the logit is
 * dot * (mul * ks_j), mul * ks_j rounded to float32 first), and its V
 * scale vs_j its weight: w_j = e_j * vs_j in float32 (l sums e_j), which
 * P V takes split (vt_attn_bf16dot_split) as hi = bf16(w_j) and
 * lo = bf16(w_j - hi) (the difference exact; FTZ), each key pair adding
 * its hi pair dot, then its lo pair dot. One bf16 weight errs by up to
 * 2^-9 of it, up to ~1 bf16 unit of a sharp row's output: on caches whose
 * magnitude varies per token that failed the 2x rule (1.04x at GQA 4-16,
 * k_len 600, bf16 caches alike); the split is as exact as float32 weights
 * (0.50x, the fp32 tile's). The scales are read once per block of 16 keys
 * (the block table walked once for all KV heads) and KV head.
 * int4_per_token_head (codes 0..15 minus the key's zero point, -15..15, exact in bf16): each
 * query row is rotated once (vt_attn_int4_rotate_q: vLLM's single_rht, rounded to bf16) before
 * its pairs are formed; the nibbles unpack in natural order (byte i: element 2i low, 2i + 1
 * high) minus the zero point (the stored scale's low 4 bits, vt_attn_int4_split) into the key
 * tile and the V pairs; ks_j / vs_j are the masked scales and the logit multiplier is
 * (mul / b) * ks_j (b the rotation block); the split weights as above; each tile's accumulator
 * is rotated back (s ⊙ (H acc) / b, linear, so before the split-KV merge), as the fp32 int4
 * tile and its twin do. Elsewhere (float32 / float16 q, < 4 rows) int4 runs the int4 fp32 tile. */
static inline int vt_attn_bf16dot_applies(const vt_attn_params *p, int64_t rows_per_group) {
    return p->q_dtype == VT_DTYPE_BF16 && rows_per_group >= 4 && vt_dtype_get(p->kv_dtype)->pair_dot;
}
/* Whether the pair-dot tile splits each P V weight w into bf16 hi = bf16(w) and lo = bf16(w - hi)
 * (two pair dots per key pair, ~16 significant bits; see vt_attn_bf16dot_applies): for the
 * per-token-head caches, whose magnitudes vary per token by design. */
static inline int vt_attn_bf16dot_split(const vt_attn_params *p) {
#ifdef VT_BF16DOT_SPLIT_ALL /* experiments only */
    (void)p;
    return 1;
#else
    return vt_dtype_per_token_head(p->kv_dtype);
#endif
}
void vt_attn_tile_bf16dot_scalar(const vt_attn_params *p, const vt_attn_item *it, float *work, float *m, float *l,
                                 float *acc);
/* Prefetch into L2 the rows (row_bytes each) of head g of the n keys at byte offsets off in the cache c (K or V,
 * heads stride_head bytes apart): the SIMD tiles' read-ahead (prefetcht1). */
static inline void vt_attn_prefetch_head(const void *c, int64_t stride_head, int g, const int64_t *off, int n,
                                         int row_bytes) {
    const char *b = (const char *)c + (int64_t)g * stride_head;
    for (int i = 0; i < n; i++)
        for (int o = 0; o < row_bytes; o += 64) __builtin_prefetch(b + off[i] + o, 0, 2);
}

#if VT_X86
/* Each SIMD ISA's tile instances, one per format it reads fast (the decoder a compile-time constant in each),
 * indexed by dtype, NULL elsewhere; cpu.c fills the (ISA x format) kernel tables from them.
 * AVX2 (attn_avx2.c): every element format and int4_per_token_head. */
extern const vt_attn_tile_fn vt_attn_tiles_avx2[VT_DTYPE_COUNT];
/* The AVX2 instances the AVX-512 tables take: the per-token-head formats (int8, fp8, int4), which they
 * read faster than the AVX-512 fp32 tile on every CPU measured (speed.md); NULL for the other formats. */
extern const vt_attn_tile_fn vt_attn_tiles_avx2_for_avx512[VT_DTYPE_COUNT];
/* AVX-512 (attn_avx512_tile.h): the float and per-tensor fp8 formats. */
extern const vt_attn_tile_fn vt_attn_tiles_avx512[VT_DTYPE_COUNT];
/* The same tile's fp8 instances (e4m3fn, e5m2 and fp8_per_token_head, whose codes decode as e4m3fn) on a
 * CPU with AVX512-VBMI: 64 codes per decode by byte lookups; the AVX-512 table's entries for them there. */
extern const vt_attn_tile_fn vt_attn_tiles_avx512vbmi[VT_DTYPE_COUNT];
/* The pair-dot tile's instances on a CPU with AVX512-BF16 (attn_avx512bf16.c: bf16, fp8 and the int8 / fp8 /
 * int4 per-token-head formats): each runs the pair-dot tile where vt_attn_bf16dot_applies, otherwise the
 * AVX-512 table's entry for its format without AVX512-BF16. */
extern const vt_attn_tile_fn vt_attn_tiles_avx512bf16[VT_DTYPE_COUNT];
#endif

/* Address of the K (or V) row of key j (sequence position) of KV head g. */
static inline const uint8_t *vt_attn_row(const vt_attn_params *p, const void *base, int64_t sb, int64_t st,
                                         int64_t sh, int b, int g, int64_t j) {
    int64_t page = p->block_table[(int64_t)b * p->bt_stride + j / p->block_size];
    int64_t off = j % p->block_size;
    return (const uint8_t *)base + page * sb + off * st + (int64_t)g * sh;
}

/* Byte offsets (page and in-page, no head) of the keys [j, j + n) of
 * sequence b in K and V, walking the block table without a division per key. */
static inline void vt_attn_key_offsets(const vt_attn_params *p, const vt_attn_item *it, int64_t j, int n,
                                       int64_t *ko, int64_t *vo) {
    const int32_t *bt = p->block_table + (int64_t)it->b * p->bt_stride;
    int64_t pi = j / p->block_size, off = j % p->block_size;
    for (int i = 0; i < n; i++) {
        int64_t page = bt[pi];
        ko[i] = page * p->k_stride_block + off * p->k_stride_tok;
        vo[i] = page * p->v_stride_block + off * p->v_stride_tok;
        if (++off == p->block_size) off = 0, pi++;
    }
}

/* A query row of n float32, float16 or bfloat16 elements at src, as float32 (exact). */
static inline void vt_attn_load_q(const vt_attn_params *p, const uint8_t *src, float *dst, int n) {
    for (int i = 0; i < n; i++) {
        uint16_t h;
        switch (p->q_dtype) {
        case VT_DTYPE_F32: memcpy(&dst[i], src + 4 * i, 4); break;
        case VT_DTYPE_F16: memcpy(&h, src + 2 * i, 2), dst[i] = vt_f16_to_f32(h); break;
        default: memcpy(&h, src + 2 * i, 2), dst[i] = vt_bf16_to_f32(h); break;
        }
    }
}

/* Per-token-head caches: byte offsets (page and slot, no head) of the K and V scales of the keys
 * [j0, j0 + n) of sequence b, in one walk of the block table per block of keys (no division per
 * key, shared by every KV head of the block). */
static inline void vt_attn_scale_offsets(const vt_attn_params *p, int b, int64_t j0, int n, int64_t *kso,
                                         int64_t *vso) {
    const int32_t *bt = p->block_table + (int64_t)b * p->bt_stride;
    int64_t pi = j0 / p->block_size, off = j0 % p->block_size;
    for (int i = 0; i < n; i++) {
        const int64_t page = bt[pi];
        kso[i] = page * p->ks_stride_block + off * p->ks_stride_tok;
        vso[i] = page * p->vs_stride_block + off * p->vs_stride_tok;
        if (++off == p->block_size) off = 0, pi++;
    }
}

/* The float32 K and V scales of KV head g at the nk offsets kso / vso (vt_attn_scale_offsets) into
 * ks[0, n) / vs[0, n), 0 past nk (n >= nk; a tile's key block). */
static inline void vt_attn_key_scales(const vt_attn_params *p, int g, const int64_t *kso, const int64_t *vso, int nk,
                                      int n, float *ks, float *vs) {
    const uint8_t *kb = (const uint8_t *)p->k_scale_cache + (int64_t)g * p->ks_stride_head;
    const uint8_t *vb = (const uint8_t *)p->v_scale_cache + (int64_t)g * p->vs_stride_head;
    for (int jj = 0; jj < n; jj++) {
        ks[jj] = vs[jj] = 0.0f;
        if (jj >= nk) continue;
        memcpy(&ks[jj], kb + kso[jj], 4);
        memcpy(&vs[jj], vb + vso[jj], 4);
    }
}

/* int4_per_token_head: a stored scale split into (masked scale, returned; zero point, its low 4 bits). */
static inline float vt_attn_int4_split(float stored, float *zp) {
    uint32_t bits;
    memcpy(&bits, &stored, 4);
    *zp = (float)(bits & 0xFu);
    bits &= ~0xFu;
    float s;
    memcpy(&s, &bits, 4);
    return s;
}

/* int4: vLLM rotates each query row (single_rht, rounded to q's dtype) and reads with softmax_scale / b;
 * q[0, D) in place (attn_ref.c). */
void vt_attn_int4_rotate_q(const vt_attn_params *p, float *q, int D);

/* Visible key range [*lo, *hi) of the query at key position pos. */
static inline void vt_attn_key_range(const vt_attn_params *p, int64_t pos, int64_t k_len, int64_t *lo,
                                     int64_t *hi) {
    int64_t a = 0, z = k_len;
    if (p->window_left >= 0 && pos - p->window_left > a) a = pos - p->window_left;
    if (p->causal && pos + 1 < z) z = pos + 1;
    if (p->window_right >= 0 && pos + p->window_right + 1 < z) z = pos + p->window_right + 1;
    *lo = a;
    *hi = z > a ? z : a;
}

/* The visible key range [lo[qi], hi[qi]) of each query qi of the item; returns base = k_len - q_len (query qi
 * sits at key position base + it->q0 + qi). */
static inline int64_t vt_attn_item_ranges(const vt_attn_params *p, const vt_attn_item *it, int64_t *lo, int64_t *hi) {
    const int64_t base = it->k_len - it->q_len;
    for (int64_t qi = 0; qi < it->nq; qi++) vt_attn_key_range(p, base + it->q0 + qi, it->k_len, &lo[qi], &hi[qi]);
    return base;
}

/* The q row of row r of an item whose KV-head groups hold rg rows each (query r % rg / G of the item, head
 * offset r % rg % G in group it->g + r / rg). */
static inline const uint8_t *vt_attn_q_row(const vt_attn_params *p, const vt_attn_item *it, int r, int rg, int G) {
    const int g = it->g + r / rg, lr = r % rg, h = g * G + lr % G;
    return (const uint8_t *)p->q + (it->q_tok0 + it->q0 + lr / G) * p->q_stride_tok + (int64_t)h * p->q_stride_head;
}

/* Index of element pd of row r in a SIMD tile's rows of Dp floats each, rg rows per KV-head group: row-major
 * (r * Dp + pd), or with tr each group's rows transposed, the rows in lanes ((r / rg) * rg * Dp + pd * rg + r % rg). */
static inline size_t vt_attn_row_at(int r, int rg, int Dp, int tr, size_t pd) {
    return tr ? (size_t)(r / rg) * rg * Dp + pd * (size_t)rg + (size_t)(r % rg) : (size_t)r * Dp + pd;
}

/* A SIMD tile's rows set up for its key loop: row r's query (vt_attn_q_row, as float32 through tmp, D floats;
 * rotated by vt_attn_int4_rotate_q when i4) in the tile's element order (element d at pd = (d / unit) * unit +
 * pos[d % unit]), zero in the padding, at qp[vt_attn_row_at(r, rg, Dp, tr, pd)]; the accumulators (rows * Dp at
 * ap) zeroed; m = -inf, l = 0. */
static inline void vt_attn_rows_init(const vt_attn_params *p, const vt_attn_item *it, int rows, int rg, int D, int Dp,
                                     int i4, int unit, const int *pos, int tr, float *qp, float *ap, float *tmp,
                                     float *m, float *l) {
    const int G = p->num_heads / p->num_kv_heads;
    memset(qp, 0, (size_t)rows * Dp * 4);
    memset(ap, 0, (size_t)rows * Dp * 4);
    for (int r = 0; r < rows; r++) {
        vt_attn_load_q(p, vt_attn_q_row(p, it, r, rg, G), tmp, D);
        if (i4) vt_attn_int4_rotate_q(p, tmp, D);
        for (int d = 0; d < D; d++) qp[vt_attn_row_at(r, rg, Dp, tr, (size_t)(d / unit) * unit + pos[d % unit])] = tmp[d];
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
}

#endif /* VTINFER_ATTN_INTERNAL_H */
