/* Signatures written once. Each X-macro table lists a function's Python
 * parameters in order as X(name, default): default NULL is a required
 * parameter, otherwise the Python text of the default. The first `npos`
 * are positional-or-keyword, the rest keyword-only. From one table come
 * the argument struct's fields, the kwlist, the parse and the
 * docstring's signature line (so inspect.signature works);
 * tests/binding/test_signatures.py compares that line with _C.pyi and the
 * Python wrappers. Adding an argument is one line here (plus its use). */
#ifndef VTINFER_BINDING_SIGNATURE_H
#define VTINFER_BINDING_SIGNATURE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* flash_attn_varlen_func: 3 positional, then keyword-only. */
#define VT_ATTN_NPOS 3
#define VT_ATTN_ARGS(X)                                                                                              \
    X(q, NULL)                                                                                                       \
    X(k, NULL)                                                                                                       \
    X(v, NULL)                                                                                                       \
    X(cu_seqlens_q, NULL)                                                                                            \
    X(seqused_k, NULL)                                                                                               \
    X(block_table, NULL)                                                                                             \
    X(max_seqlen_q, "None")                                                                                          \
    X(max_seqlen_k, "None")                                                                                          \
    X(softmax_scale, "None")                                                                                         \
    X(causal, "True")                                                                                                \
    X(window_size, "(-1, -1)")                                                                                       \
    X(softcap, "0.0")                                                                                                \
    X(alibi_slopes, "None")                                                                                          \
    X(s_aux, "None")                                                                                                 \
    X(k_descale, "None")                                                                                             \
    X(v_descale, "None")                                                                                             \
    X(kv_cache_dtype, "'auto'")                                                                                      \
    X(out, "None")                                                                                                   \
    X(return_lse, "False")                                                                                           \
    X(num_threads, "None")                                                                                           \
    X(k_scale_cache, "None")                                                                                         \
    X(v_scale_cache, "None")
/* vtinfer._cuda's: the same, plus validate (False skips the host-side
 * checks of the index arrays' values, as vLLM does not check them). */
#define VT_ATTN_CUDA_ARGS(X)                                                                                         \
    VT_ATTN_ARGS(X)                                                                                                  \
    X(validate, "True")

/* reshape_and_cache_flash / reshape_and_cache: 8 positional, then keyword-only. */
#define VT_STORE_NPOS 8
#define VT_STORE_COMMON_ARGS(X)                                                                                      \
    X(key, NULL)                                                                                                     \
    X(value, NULL)                                                                                                   \
    X(key_cache, NULL)                                                                                               \
    X(value_cache, NULL)                                                                                             \
    X(slot_mapping, NULL)                                                                                            \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(k_scale, NULL)                                                                                                 \
    X(v_scale, NULL)
#define VT_STORE_FLASH_ARGS(X)                                                                                       \
    VT_STORE_COMMON_ARGS(X)                                                                                          \
    X(layout, "None")                                                                                                \
    X(num_threads, "None")                                                                                           \
    X(k_scale_cache, "None")                                                                                         \
    X(v_scale_cache, "None")
#define VT_STORE_X_ARGS(X)                                                                                           \
    VT_STORE_COMMON_ARGS(X)                                                                                          \
    X(num_threads, "None")

/* concat_and_cache_mla (vllm/_custom_ops.py's seven) and mask_empty_context_lse. */
#define VT_MLA_STORE_NPOS 7
#define VT_MLA_STORE_ARGS(X)                                                                                         \
    X(kv_c, NULL)                                                                                                    \
    X(k_pe, NULL)                                                                                                    \
    X(kv_cache, NULL)                                                                                                \
    X(slot_mapping, NULL)                                                                                            \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(scale, NULL)                                                                                                   \
    X(skip_scale, "False")
#define VT_MASK_LSE_NPOS 3
#define VT_MASK_LSE_ARGS(X)                                                                                          \
    X(lse, NULL)                                                                                                     \
    X(query_start_loc, NULL)                                                                                         \
    X(context_start_loc, NULL)

/* vLLM's cache ops (csrc/binding/cacheops_*.c), vllm/_custom_ops.py's order, then vtinfer's keywords. */
#define VT_SWAP_NPOS 4
#define VT_SWAP_ARGS(X)                                                                                              \
    X(src, NULL)                                                                                                     \
    X(dst, NULL)                                                                                                     \
    X(block_size_in_bytes, NULL)                                                                                     \
    X(block_mapping, NULL)                                                                                           \
    X(src_extent, "None")                                                                                            \
    X(dst_extent, "None")                                                                                            \
    X(num_threads, "None")
#define VT_CONVERT_NPOS 4
#define VT_CONVERT_ARGS(X)                                                                                           \
    X(output, NULL)                                                                                                  \
    X(input, NULL)                                                                                                   \
    X(scale, "1.0")                                                                                                  \
    X(kv_dtype, "'fp8'")                                                                                             \
    X(num_threads, "None")
#define VT_GATHER_NPOS 9
#define VT_GATHER_ARGS(X)                                                                                            \
    X(src_cache, NULL)                                                                                               \
    X(dst, NULL)                                                                                                     \
    X(block_table, NULL)                                                                                             \
    X(cu_seq_lens, NULL)                                                                                             \
    X(token_to_seq, NULL)                                                                                            \
    X(num_tokens, NULL)                                                                                              \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(scale, NULL)                                                                                                   \
    X(seq_starts, "None")                                                                                            \
    X(num_threads, "None")
#define VT_CP_GATHER_NPOS 6
#define VT_CP_GATHER_ARGS(X)                                                                                         \
    X(src_cache, NULL)                                                                                               \
    X(dst, NULL)                                                                                                     \
    X(block_table, NULL)                                                                                             \
    X(cu_seq_lens, NULL)                                                                                             \
    X(batch_size, NULL)                                                                                              \
    X(seq_starts, "None")                                                                                            \
    X(num_threads, "None")
#define VT_MERGE_NPOS 8
#define VT_MERGE_ARGS(X)                                                                                             \
    X(output, NULL)                                                                                                  \
    X(prefix_output, NULL)                                                                                           \
    X(prefix_lse, NULL)                                                                                              \
    X(suffix_output, NULL)                                                                                           \
    X(suffix_lse, NULL)                                                                                              \
    X(output_lse, "None")                                                                                            \
    X(prefill_tokens_with_context, "None")                                                                           \
    X(output_scale, "None")                                                                                          \
    X(num_threads, "None")

/* The codecs (csrc/binding/codec_binding.c). */
#define VT_QUANTIZE_NPOS 3
#define VT_QUANTIZE_ARGS(X)                                                                                          \
    X(x, NULL)                                                                                                       \
    X(scale, "1.0")                                                                                                  \
    X(fmt, "'e4m3'")                                                                                                 \
    X(out, "None")                                                                                                   \
    X(num_threads, "None")
#define VT_DEQUANTIZE_NPOS 4
#define VT_DEQUANTIZE_ARGS(X)                                                                                        \
    X(codes, NULL)                                                                                                   \
    X(scale, "1.0")                                                                                                  \
    X(fmt, "None")                                                                                                   \
    X(dtype, "None")                                                                                                 \
    X(out, "None")                                                                                                   \
    X(num_threads, "None")
#define VT_CONVERT_FLOAT_NPOS 2
#define VT_CONVERT_FLOAT_ARGS(X)                                                                                     \
    X(x, NULL)                                                                                                       \
    X(dtype, NULL)                                                                                                   \
    X(out, "None")                                                                                                   \
    X(num_threads, "None")

#define VT_NVFP4_QUANTIZE_NPOS 2
#define VT_NVFP4_QUANTIZE_ARGS(X)                                                                                    \
    X(x, NULL)                                                                                                       \
    X(scale, "1.0")                                                                                                  \
    X(four_over_six, "False")
#define VT_NVFP4_DEQUANTIZE_NPOS 3
#define VT_NVFP4_DEQUANTIZE_ARGS(X)                                                                                  \
    X(codes, NULL)                                                                                                   \
    X(block_scales, NULL)                                                                                            \
    X(scale, "1.0")

/* vLLM's NVFP4 pages (csrc/binding/tq_binding.c). */
#define VT_NVFP4_STORE_NPOS 7
#define VT_NVFP4_STORE_ARGS(X)                                                                                       \
    X(key, NULL)                                                                                                     \
    X(value, NULL)                                                                                                   \
    X(key_cache, NULL)                                                                                               \
    X(value_cache, NULL)                                                                                             \
    X(slot_mapping, NULL)                                                                                            \
    X(k_scale, NULL)                                                                                                 \
    X(v_scale, NULL)                                                                                                 \
    X(four_over_six, "False")                                                                                        \
    X(num_threads, "None")
#define VT_NVFP4_READ_NPOS 5
#define VT_NVFP4_READ_ARGS(X)                                                                                        \
    X(key_cache, NULL)                                                                                               \
    X(value_cache, NULL)                                                                                             \
    X(blocks, NULL)                                                                                                  \
    X(k_scale, NULL)                                                                                                 \
    X(v_scale, NULL)                                                                                                 \
    X(num_threads, "None")

/* The slot formats' store and read (csrc/binding/tq_binding.c). */
#define VT_SLOT_STORE_NPOS 6
#define VT_SLOT_STORE_ARGS(X)                                                                                        \
    X(key, NULL)                                                                                                     \
    X(value, NULL)                                                                                                   \
    X(kv_cache, NULL)                                                                                                \
    X(slot_mapping, NULL)                                                                                            \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(midpoints, "None")                                                                                             \
    X(k_scale, "None")                                                                                               \
    X(v_scale, "None")
#define VT_SLOT_GATHER_NPOS 6
#define VT_SLOT_GATHER_ARGS(X)                                                                                       \
    X(kv_cache, NULL)                                                                                                \
    X(slots, NULL)                                                                                                   \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(centroids, NULL)                                                                                               \
    X(k_out, NULL)                                                                                                   \
    X(v_out, NULL)                                                                                                   \
    X(num_threads, "None")                                                                                           \
    X(k_scale, "None")                                                                                               \
    X(v_scale, "None")

/* The JSON reader and the resolver (csrc/binding/resolver_binding.c). */
#define VT_JSON_LOADS_NPOS 2
#define VT_JSON_LOADS_ARGS(X)                                                                                        \
    X(text, NULL)                                                                                                    \
    X(name, "None")                                                                                                  \
    X(max_depth, "0")                                                                                                \
    X(max_bytes, "0")
#define VT_RESOLVE_NPOS 3
#define VT_RESOLVE_ARGS(X)                                                                                           \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(config, NULL)                                                                                                  \
    X(hf_quant_config, "None")                                                                                       \
    X(layers, "True")

/* PagedKVCache (csrc/binding/kvcache_binding.c, kvcache_export.c). */
#define VT_KV_NEW_NPOS 9
#define VT_KV_NEW_ARGS(X)                                                                                            \
    X(num_layers, NULL)                                                                                              \
    X(num_blocks, NULL)                                                                                              \
    X(block_size, NULL)                                                                                              \
    X(num_kv_heads, NULL)                                                                                            \
    X(head_size, NULL)                                                                                               \
    X(dtype, NULL)                                                                                                   \
    X(layout, "'NHD'")                                                                                               \
    X(k_scale, "1.0")                                                                                                \
    X(v_scale, "1.0")                                                                                                \
    X(model_dtype, "None")                                                                                           \
    X(rope_dim, "None")
#define VT_KV_STORE_NPOS 4
#define VT_KV_STORE_ARGS(X)                                                                                          \
    X(layer, NULL)                                                                                                   \
    X(key, NULL)                                                                                                     \
    X(value, NULL)                                                                                                   \
    X(slot_mapping, NULL)                                                                                            \
    X(num_threads, "None")
#define VT_KV_GATHER_NPOS 2
#define VT_KV_GATHER_ARGS(X)                                                                                         \
    X(layer, NULL)                                                                                                   \
    X(slots, NULL)                                                                                                   \
    X(rotated, "False")
#define VT_KV_DLPACK_NPOS 0
#define VT_KV_DLPACK_ARGS(X)                                                                                         \
    X(stream, "None")                                                                                                \
    X(max_version, "None")                                                                                           \
    X(dl_device, "None")                                                                                             \
    X(copy, "None")
#define VT_KV_PRIVATE_DLPACK_NPOS 3
#define VT_KV_PRIVATE_DLPACK_ARGS(X)                                                                                 \
    X(layer, "None")                                                                                                 \
    X(which, "-1")                                                                                                   \
    X(max_version, "None")

/* The module's info helpers (csrc/binding/info.c). */
#define VT_SLOT_BYTES_NPOS 3
#define VT_SLOT_BYTES_ARGS(X)                                                                                        \
    X(dtype, NULL)                                                                                                   \
    X(head_size, NULL)                                                                                               \
    X(rope_dim, "None")
#define VT_TQ_CODEBOOK_NPOS 2
#define VT_TQ_CODEBOOK_ARGS(X)                                                                                       \
    X(kv_cache_dtype, NULL)                                                                                          \
    X(head_size, NULL)
#define VT_HEAD_RULE_NPOS 2
#define VT_HEAD_RULE_ARGS(X)                                                                                         \
    X(dtype, NULL)                                                                                                   \
    X(head_size, NULL)
#define VT_BENCH_COPY_NPOS 3
#define VT_BENCH_COPY_ARGS(X)                                                                                        \
    X(dst, NULL)                                                                                                     \
    X(src, NULL)                                                                                                     \
    X(num_threads, "None")

/* An optional argument's value: the object, or None where it was not given. */
static inline PyObject *vt_arg_or_none(PyObject *x) { return x ? x : Py_None; }

/* The Python arguments of reshape_and_cache_flash (a superset of
 * reshape_and_cache's: layout and the scale caches stay NULL there). The
 * fields are in table order: the parser writes them as an array. */
typedef struct vt_store_pyargs {
#define VT_X_FIELD(name, dflt) PyObject *name;
    VT_STORE_FLASH_ARGS(VT_X_FIELD)
#undef VT_X_FIELD
} vt_store_pyargs;

/* The Python arguments of flash_attn_varlen_func by name (borrowed; NULL
 * when not given; validate only ever given to vtinfer._cuda's), in table
 * order: the parser writes them as an array. */
typedef struct vt_attn_pyargs {
#define VT_X_FIELD(name, dflt) PyObject *name;
    VT_ATTN_CUDA_ARGS(VT_X_FIELD)
#undef VT_X_FIELD
} vt_attn_pyargs;

/* The most parameters a table may have. */
#define VT_SIG_MAX_ARGS 32

/* A signature: its names, defaults, and the names as interned str objects
 * (made on the first parse, under the GIL). */
typedef struct vt_signature {
    const char *name;
    int npos, nargs;
    char *const *kwlist;
    const char *const *defaults;
    PyObject *interned[VT_SIG_MAX_ARGS];
} vt_signature;

/* The signatures. */
const vt_signature *vt_attn_signature(int cuda); /* cuda: VT_ATTN_CUDA_ARGS */
const vt_signature *vt_store_flash_signature(void);
const vt_signature *vt_store_x_signature(void);

/* Parse args/kw into `a` (fields in table order, borrowed, NULL where not
 * given) by the table: positional ones by position, keywords by name (a
 * pointer compare against the interned names first); too many positional
 * arguments, an unknown or repeated keyword and a missing required argument
 * are TypeErrors in CPython's wording. Called with the GIL. */
int vt_attn_pyargs_parse(PyObject *args, PyObject *kw, int cuda, vt_attn_pyargs *a);
/* The same for the stores (xsplit: reshape_and_cache's signature). */
int vt_store_pyargs_parse(PyObject *args, PyObject *kw, int xsplit, vt_store_pyargs *a);

/* A signature from an X-macro table, as a static object named `var` in
 * the file that uses it: its parse is vt_sig_parse(&var, ...) into an
 * array of nargs fields, its docstring line vt_signature_doc(&var, ...). */
#define VT_X_NAME(name, dflt) #name,
#define VT_X_DEFAULT(name, dflt) dflt,
#define VT_SIGNATURE(var, pyname, npos, TABLE)                                                                       \
    static char *var##_kwlist[] = {TABLE(VT_X_NAME) NULL};                                                           \
    static const char *const var##_defaults[] = {TABLE(VT_X_DEFAULT) NULL};                                         \
    static vt_signature var = {pyname, npos, (int)(sizeof var##_kwlist / sizeof var##_kwlist[0]) - 1,               \
                               var##_kwlist, var##_defaults, {NULL}}

/* Parse args / kw by s's table into field[0 .. s->nargs) (borrowed; NULL
 * where not given), with the errors described above. */
int vt_sig_parse(vt_signature *s, PyObject *args, PyObject *kw, PyObject **field);

/* Write "<name>($module, /, a, b, *, c=..., ...)\n--\n\n<summary>" into buf. */
void vt_signature_doc(const vt_signature *sig, const char *summary, char *buf, size_t size);
/* The same with `first` for "$module" ("$self" for a method; NULL for a type's constructor, no "/"). */
void vt_signature_doc_as(const vt_signature *sig, const char *first, const char *summary, char *buf, size_t size);

#endif /* VTINFER_BINDING_SIGNATURE_H */
