/* vtinfer's CUDA arm: the C ABI of the device kernels.
 *
 * The kernels take the same plain params structs as the CPU core
 * (vt_kv_store_params, vt_attn_params) with every array pointer a device
 * pointer. The launchers validate nothing that needs the arrays' contents:
 * the caller (csrc/binding/cuda_module.c) checks them first, on host copies,
 * with the core's own vt_kv_store_check / vt_attn_scratch_size, so that a
 * refused call writes nothing and raises the same exception as on the CPU.
 *
 * Launches go to `stream` (a cudaStream_t; NULL = the legacy default
 * stream) and return without synchronising. Failures of the CUDA runtime
 * return VT_CUDA_ERR_RUNTIME with "<function>: CUDA error <name>: <text>"
 * in err. C ABI: C11 callers include this header without any CUDA header.
 * No Python, no NumPy. */
#ifndef VTINFER_CUDA_H
#define VTINFER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/attention.h"
#include "vtinfer/kvcache.h"
#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A status of the CUDA arm only (outside the core's enum on purpose: the
 * core never returns it): the CUDA runtime reported an error. */
#define VT_CUDA_ERR_RUNTIME (-100)

/* Number of CUDA devices in *count (0 when the runtime reports none, which
 * is not an error); the runtime's answer ("no CUDA-capable device is
 * detected", a driver mismatch, ...) in msg (cap bytes, always
 * NUL-terminated). Returns VT_OK or VT_CUDA_ERR_RUNTIME for other errors
 * (count is then 0 and msg says why). Never raises, never aborts. */
int vt_cuda_device_count(int *count, char *msg, size_t cap);

/* Runtime and driver versions (CUDA's encoding, 13000 = 13.0); 0 when
 * unknown. */
int vt_cuda_runtime_version(void);
int vt_cuda_driver_version(void);

/* Memory helpers of the binding (which includes no CUDA header). Each
 * returns VT_OK or VT_CUDA_ERR_RUNTIME with err filled; `fn` names the
 * caller in messages. vt_cuda_free(NULL) is fine. */
int vt_cuda_set_device(int device, const char *fn, vt_error *err);
int vt_cuda_malloc(void **ptr, size_t bytes, const char *fn, vt_error *err);
int vt_cuda_free(void *ptr, const char *fn, vt_error *err);
int vt_cuda_to_host(void *dst, const void *src, size_t bytes, const char *fn, vt_error *err);
int vt_cuda_to_device(void *dst, const void *src, size_t bytes, const char *fn, vt_error *err);
int vt_cuda_copy_async(void *dst, const void *src, size_t bytes, void *stream, const char *fn, vt_error *err);
int vt_cuda_synchronize(const char *fn, vt_error *err);
/* Any error left by an earlier asynchronous launch (cudaGetLastError). */
int vt_cuda_last_error(const char *fn, vt_error *err);

/* ---- the store (vLLM's reshape_and_cache_flash) ----
 * p: as vt_kv_store_params, every pointer a device pointer (k_scale and
 * v_scale device float32 arrays of 1 or num_kv_heads elements), already
 * checked with vt_kv_store_check on host copies. Token t with
 * slot_mapping[t] < 0 is skipped. Bytes equal the CPU store's for every
 * input (fp8: __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), SATFINITE);
 * bf16/f16: the CPU codec's bit-exact rounding). When two tokens name the
 * same slot, the caller must have cleared the earlier ones (the device has
 * no order between tokens). Status: VT_OK, VT_ERR_VALUE (a geometry too
 * large for one launch), VT_CUDA_ERR_RUNTIME. */
int vt_cuda_kv_store(const vt_kv_store_params *p, void *stream, vt_error *err);

/* The arm's duplicate-slot policy, on a host copy of slot_mapping [n]:
 * every token whose slot a later token names is set to -1 (the later
 * token's values are kept, as on the CPU). Returns the number cleared, or
 * -1 when out of memory (slots unchanged). */
int64_t vt_cuda_clear_repeated_slots(int64_t *slots, int64_t n);

/* ---- paged attention (flash_attn_varlen_func) ----
 * p: as vt_attn_params (same meaning, same outputs), every array pointer a
 * device pointer, already checked with vt_attn_scratch_size on host
 * copies. max_seqlen_q / max_seqlen_k: at least the real maxima (the grid
 * is sized from them, as FlashAttention does).
 *
 * vt_cuda_attn_workspace: bytes of device workspace the launch needs
 * (0 when no split-KV is used) and the number of KV splits it will use.
 * Status: VT_OK, VT_ERR_OVERFLOW, VT_ERR_UNSUPPORTED (head_size > 512 or
 * a grid dimension past the device's limits), VT_CUDA_ERR_RUNTIME. */
int vt_cuda_attn_workspace(const vt_attn_params *p, int64_t max_seqlen_q, int64_t max_seqlen_k, size_t *bytes,
                           int *num_splits, vt_error *err);
int vt_cuda_attn(const vt_attn_params *p, int64_t max_seqlen_q, int64_t max_seqlen_k, void *workspace,
                 size_t workspace_bytes, void *stream, vt_error *err);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_CUDA_H */
