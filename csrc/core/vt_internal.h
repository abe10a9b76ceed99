/* Internal declarations shared by csrc/core files; not part of the public
 * API and never installed. */
#ifndef VTINFER_CORE_INTERNAL_H
#define VTINFER_CORE_INTERNAL_H

#include <string.h>

#include "vtinfer/codec.h"
#include "vtinfer/runtime.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define VT_X86 1
#define VT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VT_TARGET_AVX512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define VT_X86 0
#endif

/* Fill a kernel table with each ISA's row kernels. The AVX variants exist
 * only on x86; they leave entries they do not provide untouched, so the
 * caller fills the scalar twins first. */
void vt_codec_fill_scalar(vt_codec_kernels *k);
#if VT_X86
void vt_codec_fill_avx2(vt_codec_kernels *k);
void vt_codec_fill_avx512(vt_codec_kernels *k);
#endif

/* Called by vt_isa_set after the ISA changed, so each kernel family can
 * re-select its pointers. */
void vt_codec_select(vt_isa isa);

/* Index of a float dtype in the [3] dimensions of vt_codec_kernels, or -1. */
static inline int vt_float_index(int dtype) {
    return (dtype == VT_DTYPE_F32 || dtype == VT_DTYPE_F16 || dtype == VT_DTYPE_BF16) ? dtype : -1;
}

/* Index of an fp8 dtype in the [2] dimensions of vt_codec_kernels, or -1. */
static inline int vt_fp8_index(int dtype) {
    return dtype == VT_DTYPE_FP8_E4M3 ? 0 : (dtype == VT_DTYPE_FP8_E5M2 ? 1 : -1);
}

static inline uint32_t vt_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float vt_bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* 1 when x is finite and > 0 (the rule for every scale). */
static inline int vt_scale_ok(float x) {
    return x > 0.0f && x <= 3.4028234663852886e38f;
}

#endif /* VTINFER_CORE_INTERNAL_H */
