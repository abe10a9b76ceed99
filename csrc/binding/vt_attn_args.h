/* The attention argument layer, shared by vtinfer._C and vtinfer._cuda
 * (Python.h, no NumPy): flash_attn_varlen_func's arguments (the table
 * VT_ATTN_ARGS of vt_signature.h) -> vt_attn_params, with every type,
 * rank, shape, dtype, contiguity and overlap rule in one place, checked in
 * STYLE.md's order (type, rank, shape, dtype, contiguity, device: the
 * device with each pin). The extensions differ only in their front door
 * (pin: the device check; contig: a copy or a refusal of a non-contiguous
 * small array), in who allocates `out`/`lse`, and in where the index
 * arrays' values are judged (host copies on CUDA). */
#ifndef VTINFER_BINDING_ATTN_ARGS_H
#define VTINFER_BINDING_ATTN_ARGS_H

#include "vt_import.h"
#include "vt_signature.h"
#include "vtinfer/attention.h"

/* A small input that must be C-contiguous: make it so (the CPU's NumPy
 * copy) or refuse it (vt_refuse_noncontiguous, vt_import.h). 0 or -1 with an exception. */
typedef int (*vt_contig_fn)(void *ctx, vt_tensor *t, const char *fn, const char *arg);

/* One call's state: the Python arguments by name, the pinned tensors, the
 * parsed scalars. A tensor that was not given has owner == NULL. */
typedef struct vt_attn_call {
    const char *fn;          /* "flash_attn_varlen_func" */
    vt_memory mem;           /* the extension's memory (the device check) */
    vt_pin_fn pin;           /* the extension's front door ... */
    vt_contig_fn contig;
    void *ctx;               /* ... and its context (module state) */
    vt_attn_pyargs a;
    vt_tensor q, k, v, cu_seqlens_q, seqused_k, block_table, alibi_slopes, s_aux, k_descale, v_descale, out, lse;
    vt_tensor k_scale_cache, v_scale_cache; /* per-token-head caches: float32 [num_blocks, block_size, H_kv] */
    double softmax_scale, softcap;          /* softmax_scale: when not given, 1/sqrt(D) */
    int causal, return_lse, window_left, window_right, kv_flag, kv_dtype;
    long long max_seqlen_q, max_seqlen_k;   /* -1: not given */
    int64_t k_descale_sb, k_descale_sh, v_descale_sb, v_descale_sh; /* element strides (batch, KV head) */
    const char *kv_name;                    /* kv_cache_dtype as given (borrowed from the argument) */
    int64_t slot_rope_dim;                  /* slot formats: the rotary dims k's slot width names */
    PyObject *out_obj, *lse_obj;            /* owned: what the call returns */
} vt_attn_call;

/* The scalars (causal, return_lse, max_seqlen_*, softmax_scale,
 * window_size, softcap, kv_cache_dtype); nothing is pinned. num_threads is
 * the CPU's (vt_num_threads_arg). */
int vt_attn_parse_scalars(vt_attn_call *c);
/* Pin q, k, v, the index arrays and the optional small arrays, checking
 * rank, dtype and device (c->mem). */
int vt_attn_pin_inputs(vt_attn_call *c);
/* Shapes against q and k, the cache's dtype against kv_cache_dtype (sets
 * c->kv_dtype), contiguity (c->contig for the small arrays and q). */
int vt_attn_check_inputs(vt_attn_call *c);
/* `out` when given: pinned writable, q's dtype and shape, contiguous head
 * dimension, sharing no element with q, k, v or itself. Sets c->out_obj.
 * Not given: returns 0 with c->out_obj NULL (the extension allocates). */
int vt_attn_pin_given_out(vt_attn_call *c);
/* The params of the pinned tensors (index and small-array pointers as
 * pinned: device memory on CUDA). */
void vt_attn_fill_params(const vt_attn_call *c, vt_attn_params *p);
/* max_seqlen_q / max_seqlen_k given below the real maxima of the index
 * arrays `p` points at (host memory) are refused (FlashAttention sizes its
 * grid from them); *mq / *mk (either may be NULL) receive the maxima. */
int vt_attn_check_max_seqlen(const vt_attn_call *c, const vt_attn_params *p, long long *mq, long long *mk);
void vt_attn_release(vt_attn_call *c);

#endif /* VTINFER_BINDING_ATTN_ARGS_H */
