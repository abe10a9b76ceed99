/* vtinfer public C API: CPU features, instruction-set dispatch, threads.
 *
 * The ISA is chosen by vt_runtime_init from CPUID + XGETBV; a request
 * ("scalar", "avx2", "avx512", from VTINFER_ISA in the Python binding) may
 * only lower it. Each ISA has one immutable kernel table (codec row kernels
 * and the attention tile together); choosing an ISA publishes a pointer to
 * its table with one atomic store, and every kernel call reads that pointer
 * once and finishes on the table it read. Every SIMD kernel has a scalar
 * twin that is always built. */
#ifndef VTINFER_RUNTIME_H
#define VTINFER_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vt_isa { VT_ISA_SCALAR = 0, VT_ISA_AVX2 = 1, VT_ISA_AVX512 = 2 } vt_isa;

/* What the CPU and the OS (XGETBV) allow. Reported by vt_build_info; the
 * kernels use what vt_isa_best lists, and avx512bf16: with it the avx512
 * kernels run grouped bf16 attention rows on the bf16 pair dot product;
 * avx512vbmi: the avx512 kernels decode fp8 keys and values by byte lookups.
 * avx512fp16 and avx512vnni are detected but no kernel uses them. */
typedef struct vt_cpu_features {
    int sse42, avx, avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512bf16, avx512vbmi, avx512fp16, avx512vnni;
} vt_cpu_features;

VT_API const vt_cpu_features *vt_cpu_get(void);

/* Best ISA this CPU supports: AVX512 needs F+BW+VL+DQ (and AVX2+FMA+F16C);
 * AVX2 needs AVX2+FMA+F16C; otherwise scalar. */
VT_API vt_isa vt_isa_best(void);

/* Detect the CPU and select kernels. `request` may be NULL or "" (best),
 * or "scalar" / "avx2" / "avx512" (a request above the CPU's best gives
 * the best). Idempotent and thread-safe: a kernel already running keeps
 * the table it started with. Kernels called before any init select the
 * best ISA. Status: VT_OK; VT_ERR_VALUE (unknown name: the best ISA is
 * selected). */
VT_API vt_status vt_runtime_init(const char *request, vt_error *err);

/* Change the active ISA (tests force each path); thread-safe as above.
 * Status: VT_OK; VT_ERR_VALUE (not an ISA); VT_ERR_UNSUPPORTED (the CPU
 * lacks it: the active ISA is kept). */
VT_API vt_status vt_isa_set(vt_isa isa, vt_error *err);
VT_API vt_isa vt_isa_active(void);
VT_API const char *vt_isa_name(vt_isa isa);

/* Run fn(ctx, ith, nth) for ith in [0, nth) on a persistent pthread pool,
 * the caller running ith == 0; returns when all are done. nth <= 1, or a
 * call made from inside a task, runs everything on the calling thread.
 * Each ith runs exactly once whatever threads are available, so results
 * may depend on nth but never on scheduling. Calls from several threads
 * are serialised. */
typedef void (*vt_task_fn)(void *ctx, int ith, int nth);
VT_API void vt_parallel_for(vt_task_fn fn, void *ctx, int nth);

/* Largest nth vt_parallel_for accepts (larger values are clamped). */
#define VT_MAX_THREADS 256

/* Split [0, n) into nth near-equal parts, each a multiple of `align`
 * elements except the last; part ith is [*begin, *end). */
VT_API void vt_split_range(size_t n, size_t align, int ith, int nth, size_t *begin, size_t *end);

/* Compiler and build description, e.g. "gcc 12.2.0". */
VT_API const char *vt_compiler_string(void);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_RUNTIME_H */
