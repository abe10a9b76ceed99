/* libFuzzer harness: the argument validation of vt_attn_varlen
 * (csrc/core/attention.c) and the kernels behind it, the slot formats' read
 * (attn_slots.c, the codecs' row reads) among them. The harness plays the
 * binding: q, the caches, out and the index arrays have the lengths their
 * shapes say (a slot cache: its slot bytes per (token, KV head), given as k
 * and v, another v only when hostile); every value in the index arrays (cu_seqlens_q, seqused_k,
 * block_table), the descales and the options comes from the fuzz bytes.
 * Any status is fine; a crash, an out-of-bounds access or undefined
 * behaviour is not. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "vtinfer/attention.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const vt_dtype kv_dtypes[] = {VT_DTYPE_F32,       VT_DTYPE_F16,        VT_DTYPE_BF16,
                                     VT_DTYPE_FP8_E4M3,  VT_DTYPE_FP8_E5M2,   VT_DTYPE_TQ_K8V4,
                                     VT_DTYPE_TQ_4BIT_NC, VT_DTYPE_TQ_3BIT_NC, VT_DTYPE_UQ_4BIT,
                                     VT_DTYPE_OCT_K3V4,  VT_DTYPE_OCT_K3V3_COMPACT, VT_DTYPE_NVFP4};
#define N_KV ((int)(sizeof kv_dtypes / sizeof kv_dtypes[0]))
static const vt_dtype q_dtypes[] = {VT_DTYPE_F32, VT_DTYPE_F16, VT_DTYPE_BF16};

static size_t esize(vt_dtype d) { return d == VT_DTYPE_F32 ? 4 : (d == VT_DTYPE_F16 || d == VT_DTYPE_BF16) ? 2 : 1; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size, 0};
    vt_attn_params p;
    memset(&p, 0, sizeof p);
    int hkv = (int)fz_range(&f, 1, 4), G = (int)fz_range(&f, 1, 4), D = (int)fz_range(&f, 1, 8) * 8;
    if (fz_bits(&f, 1) == 0) D = (int)fz_range(&f, 1, 130); /* odd head sizes too */
    p.num_kv_heads = hkv;
    p.num_heads = hkv * G + (fz_bits(&f, 1) == 7 ? 1 : 0); /* sometimes not a multiple */
    p.head_size = D;
    p.block_size = fz_range(&f, 1, 32);
    p.num_blocks = fz_range(&f, 0, 8);
    p.batch = (int)fz_range(&f, 0, 4);
    p.total_q = fz_range(&f, 0, 24);
    /* hostile (bit 0 set): every value from the bytes; else consistent: the index
     * arrays agree with each other so the kernels run, and only options vary */
    const int hostile = (int)(fz_bits(&f, 1) & 1);
    p.max_blocks = fz_range(&f, 0, 8);
    p.bt_stride = p.max_blocks;
    p.q_dtype = q_dtypes[fz_range(&f, 0, 2)];
    p.kv_dtype = kv_dtypes[fz_range(&f, 0, N_KV - 1)];
    const int slots = vt_dtype_get(p.kv_dtype)->read_family == VT_READ_SLOTS;
    size_t qe = esize(p.q_dtype), ke = slots ? 1 : esize(p.kv_dtype);
    p.q_stride_head = D * (int64_t)qe;
    p.q_stride_tok = p.num_heads * p.q_stride_head;
    p.out_stride_head = p.q_stride_head;
    p.out_stride_tok = p.q_stride_tok;
    int hnd = fz_bits(&f, 1) & 1;
    int64_t row = D * (int64_t)ke;
    if (slots) { /* one slot per (token, KV head); the head-size rule may refuse D (then any width does) */
        const int rb = vt_dtype_get(p.kv_dtype)->rope_block;
        p.slot_rope_dim = rb > 0 ? (int64_t)fz_range(&f, 0, D / rb) * rb : 0;
        const size_t sb = vt_dtype_slot_bytes_rope(p.kv_dtype, (size_t)D, (size_t)p.slot_rope_dim);
        if (sb) row = (int64_t)sb;
        if (hostile && fz_bits(&f, 1) == 0xfc) p.slot_rope_dim = (int64_t)fz_bits(&f, 2) - 3; /* refused */
    }
    if (hnd) { /* [NB, H, BS, D] */
        p.k_stride_tok = row, p.k_stride_head = p.block_size * row, p.k_stride_block = hkv * p.block_size * row;
    } else {   /* [NB, BS, H, D] */
        p.k_stride_head = row, p.k_stride_tok = hkv * row, p.k_stride_block = p.block_size * hkv * row;
    }
    p.v_stride_tok = p.k_stride_tok, p.v_stride_head = p.k_stride_head, p.v_stride_block = p.k_stride_block;
    size_t cache_bytes = (size_t)(p.num_blocks * p.k_stride_block), q_bytes = (size_t)(p.total_q * p.q_stride_tok);
    unsigned char *q = malloc(q_bytes + 1), *k = malloc(cache_bytes + 1), *v = malloc(cache_bytes + 1);
    unsigned char *out = malloc(q_bytes + 1);
    float *lse = malloc((size_t)(p.num_heads * p.total_q) * sizeof(float) + 1);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(p.batch + 1)), *sk = malloc(sizeof(int32_t) * (size_t)(p.batch + 1));
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(p.batch * p.max_blocks + 1));
    float kd[16], vd[16], slopes[20], sinks[20];
    void *scratch = NULL;
    if (!q || !k || !v || !out || !lse || !cu || !sk || !bt) goto done;
    /* values: small ranges so the kernels run, with hostile ones mixed in */
    for (size_t i = 0; i < q_bytes; i++) q[i] = (unsigned char)(fz_bits(&f, 1) & 0x3f);
    memset(k, 0x21, cache_bytes);
    memset(v, 0x32, cache_bytes);
    cu[0] = (int32_t)(hostile && fz_bits(&f, 1) == 0xff ? -1 : 0);
    for (int b = 0; b < p.batch; b++) {
        int64_t step = hostile && fz_bits(&f, 1) == 0xfe ? (int64_t)fz_bits(&f, 4) : fz_range(&f, 0, 6);
        if (!hostile && cu[b] + step > p.total_q) step = p.total_q - cu[b];
        cu[b + 1] = (int32_t)(cu[b] + step);
        sk[b] = (int32_t)(hostile && fz_bits(&f, 1) == 0xfd ? (int32_t)fz_bits(&f, 4) : fz_range(&f, 0, 64));
        if (!hostile) {
            int64_t cap = p.max_blocks * p.block_size, need = cu[b + 1] - cu[b];
            if (sk[b] > cap) sk[b] = (int32_t)cap;
            if (sk[b] < need && need <= cap) sk[b] = (int32_t)need;
        }
    }
    for (int64_t i = 0; i < p.batch * p.max_blocks; i++)
        bt[i] = (int32_t)(hostile ? fz_index(&f, p.num_blocks) : (p.num_blocks ? fz_range(&f, 0, p.num_blocks - 1) : 0));
    p.q = q, p.k = k, p.v = slots && !(hostile && (fz_bits(&f, 1) & 1)) ? k : v, p.out = out;
    p.cu_seqlens_q = cu, p.seqused_k = sk, p.block_table = bt;
    p.lse = (fz_bits(&f, 1) & 1) ? lse : NULL;
    p.lse_stride_head = p.total_q, p.lse_stride_tok = 1;
    p.softmax_scale = hostile ? fz_float(&f) : 0.125f;
    p.causal = (int)(fz_bits(&f, 1) & 1);
    p.window_left = (int)fz_range(&f, hostile ? -2 : -1, 20);
    p.window_right = (int)fz_range(&f, hostile ? -2 : -1, 20);
    p.softcap = (fz_bits(&f, 1) & 1) ? (hostile ? fz_float(&f) : 2.5f) : 0.0f;
    for (int i = 0; i < 16; i++) kd[i] = hostile ? fz_float(&f) : 0.5f, vd[i] = hostile ? fz_float(&f) : 2.0f;
    for (int i = 0; i < 20; i++) slopes[i] = hostile ? fz_float(&f) : 0.25f, sinks[i] = hostile ? fz_float(&f) : 1.0f;
    uint8_t opt = (uint8_t)fz_bits(&f, 1);
    if (opt & 1) p.alibi_slopes = slopes;
    if (opt & 2) p.s_aux = sinks;
    int dmode = (opt >> 2) & 3; /* 0 none, 1 tensor, 2 head, 3 batch x head */
    if (dmode && p.batch * hkv <= 16 && (!slots || hostile)) { /* a slot format refuses descales */
        p.k_descale = kd, p.v_descale = vd;
        p.k_descale_stride_b = p.v_descale_stride_b = dmode == 3 ? hkv : 0;
        p.k_descale_stride_h = p.v_descale_stride_h = dmode >= 2 ? 1 : 0;
    }
    int nth = (int)fz_range(&f, 1, 2);
    size_t need = 0;
    vt_error err;
    if (vt_attn_scratch_size(&p, nth, &need, &err) != VT_OK) goto done;
    if (need > ((size_t)64 << 20)) goto done;
    scratch = malloc(need ? need : 1);
    if (!scratch) goto done;
    (void)vt_attn_varlen(&p, scratch, need, nth, &err);
    (void)vt_attn_varlen(&p, scratch, need / 2, nth, &err); /* too little scratch must be refused */
done:
    free(scratch);
    free(q), free(k), free(v), free(out), free(lse), free(cu), free(sk), free(bt);
    return 0;
}
