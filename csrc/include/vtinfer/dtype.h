/* vtinfer public C API: the one table that describes every storage dtype.
 *
 * Python derives KV_CACHE_DTYPES and every other dtype list from this table;
 * there is no second hand-kept list. Enum values are only ever appended. */
#ifndef VTINFER_DTYPE_H
#define VTINFER_DTYPE_H

#include <stddef.h>

#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vt_dtype {
    VT_DTYPE_F32 = 0,
    VT_DTYPE_F16 = 1,
    VT_DTYPE_BF16 = 2,
    VT_DTYPE_FP8_E4M3 = 3, /* float8 e4m3fn: no infinities, NaN 0x7F/0xFF, max 448 */
    VT_DTYPE_FP8_E5M2 = 4, /* float8 e5m2: IEEE-like, max finite 57344 */
    VT_DTYPE_INT8_PTH = 5, /* int8 codes + one float32 scale per (token, KV head) (vLLM int8_per_token_head) */
    VT_DTYPE_FP8_PTH = 6,  /* e4m3fn codes + one float32 scale per (token, KV head) (vLLM fp8_per_token_head) */
    VT_DTYPE_INT4_PTH = 7, /* rotated (RHT) rows as unsigned 4-bit codes, two per byte, + one float32 scale
                            * whose low 4 bits hold the zero point, per (token, KV head) (vLLM int4_per_token_head) */
    /* vLLM 0.33 TurboQuant: one packed uint8 slot per (token, KV head) holding the key part, the value codes and
     * the value's fp16 scale and zero (vtinfer/turboquant.h; the table's key_bits / value_bits / norm_correction) */
    VT_DTYPE_TQ_K8V4 = 8,     /* turboquant_k8v4: fp8 e4m3 keys, 4-bit values */
    VT_DTYPE_TQ_4BIT_NC = 9,  /* turboquant_4bit_nc: 4-bit Lloyd-Max keys (rotated, norm correction), 4-bit values */
    VT_DTYPE_TQ_K3V4_NC = 10, /* turboquant_k3v4_nc: 3-bit keys, 4-bit values */
    VT_DTYPE_TQ_3BIT_NC = 11, /* turboquant_3bit_nc: 3-bit keys, 3-bit values */
    /* vLLM 0.33 UltraQuant: one uint8 slot per (token, KV head) of FP4 E2M1 codes with a UE8M0 scale per group
     * of 32, keys Hadamard-rotated (csrc/core/kv_store_uq.c) */
    VT_DTYPE_UQ_4BIT = 12,    /* ultraquant_4bit */
    /* vLLM 0.33 Octave: one uint8 slot per (token, KV head) of Lloyd-Max codes of sign-flipped, Walsh-Hadamard
     * rotated rows with fp16 scales (csrc/core/kv_store_octave.c); the K layout depends on the rotary dims */
    VT_DTYPE_OCT_K3V4 = 13,         /* octave_k3v4: K 4-bit on the rotary dims, 3-bit on the rest; V 4-bit */
    VT_DTYPE_OCT_K3V3 = 14,         /* octave_k3v3: as k3v4 with 3-bit V */
    VT_DTYPE_OCT_K3V3_COMPACT = 15, /* octave_k3v3_compact: K 3-bit rotated whole (one scale), V 3-bit */
    /* vLLM 0.33 NVFP4: FP4 E2M1 codes, an e4m3 scale per 16 elements and a global scale per layer (the layer's
     * k_scale / v_scale); PagedKVCache keeps one slot per (token, KV head) [K codes | K scales | V codes | V scales],
     * the bytes of vLLM's page (csrc/core/nvfp4.c) */
    VT_DTYPE_NVFP4 = 16,         /* nvfp4: the scale per 16 elements is max / 6 */
    VT_DTYPE_NVFP4_4OVER6 = 17,  /* nvfp4_4over6: max / 6 or max / 4, the one with the smaller squared error */
    VT_DTYPE_COUNT = 18
} vt_dtype;

/* How a dtype's values are scaled. */
typedef enum vt_scale_kind {
    VT_SCALE_NONE = 0,       /* plain values (float32/16, bfloat16) */
    VT_SCALE_TENSOR = 1,     /* codes times a given scale (per tensor, layer or KV head): fp8 */
    VT_SCALE_TOKEN_HEAD = 2, /* codes times a float32 scale computed at store, one per (token, KV head) */
    VT_SCALE_SLOT = 3        /* slot formats: scales inside each packed slot (TurboQuant's fp16 value scale / zero and
                              * key norm; UltraQuant's UE8M0 byte per group of 32) */
} vt_scale_kind;

/* How one layer's page of a vt_kv_cache is laid out. */
typedef enum vt_page_layout {
    VT_PAGE_DENSE = 0,       /* K and V planes of elements, nothing else */
    VT_PAGE_SCALE_PLANES = 1, /* K and V planes of codes plus a float32 [num_blocks, block_size, num_kv_heads]
                              * scale plane for each of K and V (vLLM keeps the same bytes inline, after
                              * each head's codes: page bytes are equal) */
    VT_PAGE_SLOTS = 2        /* one uint8 [num_blocks, block_size, num_kv_heads, slot_bytes] cache, K and V together
                              * (TurboQuant, UltraQuant, Octave, NVFP4; vt_dtype_slot_bytes) */
} vt_page_layout;

/* Which attention tile family reads a dtype's pages (each ISA has one tile per family; the kernel table maps
 * every dtype to its family's tile at init). */
typedef enum vt_read_family {
    VT_READ_NONE = 0,         /* not read by the paged attention */
    VT_READ_ELEMENTS = 1,     /* element rows decoded per element (plain, fp8, 8-bit per-token-head codes) */
    VT_READ_INT4_ROTATED = 2, /* packed int4 rows of the rotated basis: q rotated, the output rotated back */
    VT_READ_SLOTS = 3,        /* one slot per (token, KV head) holding K and V, read by its codec (vt_slot_codec) */
    VT_READ_FAMILY_COUNT = 4
} vt_read_family;
/* The basis a slot format's read returns K in (and so the basis the query must be in for its dot products). */
typedef enum vt_key_basis {
    VT_KEY_BASIS_MODEL = 0,   /* the model's own basis: the query as given */
    VT_KEY_BASIS_HADAMARD = 1 /* rotated by the orthonormal Sylvester Hadamard H (D a power of two): the query is
                               * read as q H (TurboQuant's MSE presets, UltraQuant) */
} vt_key_basis;

/* Value of a flag that names no dtype by itself ("auto": the model's dtype). */
#define VT_DTYPE_AUTO (-1)

/* A slot format's behaviour (its slot bytes, the store and the read of one slot): defined by the format's file
 * in csrc/core, opaque here. */
struct vt_slot_codec;
/* How the paged store of K and V rows (vt_kv_store) writes a format: its own checks and its row writer; defined
 * by the format family's file in csrc/core, opaque here. */
struct vt_store_kernel;

typedef struct vt_dtype_info {
    vt_dtype id;
    const char *name;          /* canonical vtinfer name: "float32", "fp8_e4m3", ... */
    const char *numpy_name;    /* NumPy / ml_dtypes name: "float32", "bfloat16", "float8_e4m3fn" */
    const char *const *flags;  /* vLLM --kv-cache-dtype spellings naming this dtype, NULL-terminated */
    const char *const *aliases; /* the codec functions' short names ("e4m3", "e4m3fn"), NULL-terminated; NULL: none */
    size_t elem_bytes;         /* bytes per element (1 for int4_per_token_head: a byte holds two, see elem_bits) */
    int is_fp8;                /* 1 for the float8 formats */
    double max_finite;         /* largest finite value */
    int exponent_bits;         /* IEEE-style field widths */
    int mantissa_bits;
    int elem_bits;             /* bits of one stored element (8; 4 for packed formats) */
    int is_int;                /* elements are two's-complement integer codes */
    int code_dtype;            /* the dtype whose codes are stored: itself, FP8_E4M3 for fp8_per_token_head,
                                * -1 for integer codes */
    vt_scale_kind scale_kind;
    float quant_max, quant_min; /* per-token-head: code range the scaled values are clamped to */
    vt_page_layout page_layout;
    int key_bits;              /* TurboQuant (page_layout VT_PAGE_SLOTS) only, else 0: 8 = fp8 e4m3 keys, 3 / 4 =
                                * Lloyd-Max indices of the rotated key */
    int value_bits;            /* TurboQuant: bits of a value code (3 or 4), else 0 */
    int norm_correction;       /* TurboQuant: the read renormalises the key's centroids (the _nc presets) */
    vt_dtype query_dtype;      /* slot formats: the dtype the read rounds the (rotated) query to before its dots
                                * (UltraQuant: FP8_E4M3); F32 (0, the default): the query as given, in float32 */
    /* The head sizes the format can take (vt_dtype_check_head_size states them in one message): */
    int head_multiple;         /* head_size % head_multiple == 0 (2: two codes per byte, or the slot's pairs) */
    long long head_max;        /* largest head_size, 0 for no limit (rows rotated whole on the stack) */
    int head_pow2;             /* head_size must be a power of two (one Hadamard transform of the row) */
    int rht_block_max;         /* largest power-of-two divisor of head_size (int4's rotation block), 0: any */
    vt_read_family read_family; /* the attention tile family that reads the pages */
    int pair_dot;              /* 1: every value a code decodes to (int4: minus its zero point) is a bfloat16 value,
                                * so the AVX512-BF16 pair-dot tile reads the pages as bf16 pairs (bf16, the fp8
                                * formats, int8 / fp8 / int4 per-token-head); 0: float32, float16, slot formats */
    int causal_only;           /* 1: vLLM reads the format under a causal mask only (int4_per_token_head) */
    const char *family;        /* the format family, one file each in csrc/core: "plain", "fp8", "per_token_head",
                                * "int4_per_token_head", "turboquant", "ultraquant", "octave" */
    const struct vt_slot_codec *slot; /* page_layout VT_PAGE_SLOTS: the format's slot codec; NULL otherwise */
    const struct vt_store_kernel *store; /* vt_kv_store's writer of the format; NULL for the slot formats (their
                                          * codec stores whole K+V slots) */
    int rope_block;            /* > 0: the slot layout depends on the model's rotary dims (rope_dim), a multiple of
                                * rope_block in [0, head_size] (Octave: 64); 0: it does not */
    vt_key_basis key_basis;    /* slot formats: the basis the read returns K in */
    int boundary_layers;       /* vLLM keeps the first and last min(boundary_layers, num_layers / 2) attention
                                * layers of a dense model at the model dtype with this format (EngineArgs'
                                * packed-KV rule: TurboQuant, UltraQuant); 0: none */
    int global_scale;          /* 1: a slot format whose codes are also scaled by the layer's K / V scale (NVFP4's
                                * global scale, the checkpoint's k_scale / v_scale: one per tensor or layer, finite
                                * and > 0; vt_tq_cache.k_scale / v_scale); 0: the slot holds every scale */
} vt_dtype_info;

/* Bytes of one stored head row of head_size elements (head_size * elem_bits / 8). */
VT_API size_t vt_dtype_row_bytes(int dtype, size_t head_size);

/* Slot formats: bytes of one (token, KV head) slot for head_size elements, as vLLM sizes it (TurboQuant's
 * slot_size_aligned, UltraQuant's slot_size, Octave's OctaveFormat.slot_bytes with rope_dim = head_size, vLLM's
 * rotary dims without a partial_rotary_factor); 0 for other dtypes. */
VT_API size_t vt_dtype_slot_bytes(int dtype, size_t head_size);
/* As vt_dtype_slot_bytes for a model whose rotary dims are rope_dim (read only by rows with rope_block > 0);
 * 0 when rope_dim is not a multiple of the row's rope_block in [0, head_size]. */
VT_API size_t vt_dtype_slot_bytes_rope(int dtype, size_t head_size, size_t rope_dim);
/* The rotary dims a slot of `width` bytes names for the slot format `dtype` at head_size (each rope_block of
 * rotary dims widens the slot, so the width names them; the fewest when two agree); 0 for rows without a
 * rope_block whose slot is `width` bytes; -1 when no rope_dim gives that width or dtype is no slot format. */
VT_API int64_t vt_dtype_rope_of_slot_width(int dtype, size_t head_size, size_t width);

/* 1 when the slot format `dtype` indexes a caller-given codebook (TurboQuant's MSE key presets), else 0. */
VT_API int vt_dtype_needs_codebook(int dtype);

/* 1 when `dtype` stores one scale per (token, KV head) (the table's scale_kind), else 0. */
VT_API int vt_dtype_per_token_head(int dtype);

/* VT_OK when `dtype` can store head rows of `head_size` elements; else VT_ERR_VALUE with the format's one
 * message "<fn>: <what> must be <rule> for <dtype_arg> '<name>'; got <head_size>" (`what` names the head size as
 * the caller does, e.g. "head_size" or "q's head size"; `dtype_arg` the dtype argument, NULL: "kv_cache_dtype").
 * An out-of-range `dtype` is VT_OK here (callers check the id first). */
VT_API vt_status vt_dtype_check_head_size(int dtype, long long head_size, const char *fn, const char *what,
                                          const char *dtype_arg, vt_error *err);
/* The dtype whose element decoder reads `dtype`'s codes: code_dtype where it names one (fp8_per_token_head:
 * fp8_e4m3), else `dtype` itself (the integer formats have decoders of their own). */
VT_API int vt_dtype_decoder(int dtype);
/* The table entry of `dtype`, or NULL when `dtype` is out of range. */
VT_API const vt_dtype_info *vt_dtype_get(int dtype);

/* Look up a dtype by canonical name, NumPy name or vLLM flag spelling
 * (exact, case-sensitive, as vLLM compares). Writes the id to *out, or
 * VT_DTYPE_AUTO for "auto". Returns VT_ERR_VALUE with the accepted names
 * listed in `err` when nothing matches; `argname` names the argument in
 * that message (e.g. "kv_cache_dtype"). */
VT_API vt_status vt_dtype_from_name(const char *name, const char *argname, int *out, vt_error *err);

/* The dtype whose `aliases` hold `name` (the codec functions' short names), or -1. */
VT_API int vt_dtype_from_alias(const char *name);

/* The kv-cache-dtype flag values in table order, "auto" first; index i in
 * [0, vt_kv_cache_flag_count()). Returns NULL past the end. */
VT_API size_t vt_kv_cache_flag_count(void);
VT_API const char *vt_kv_cache_flag(size_t i);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_DTYPE_H */
