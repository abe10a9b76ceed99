/* Device helpers shared by the CUDA kernels: element loads and the
 * bit-exact conversions of the CPU codec (csrc/core/codec_scalar.c), so
 * that a value stored on the device has the CPU's bytes. Internal. */
#ifndef VTINFER_CUDA_COMMON_CUH
#define VTINFER_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "vt_cuda.h"
#include "vtinfer/dtype.h"

/* Fill err from a CUDA error; returns VT_CUDA_ERR_RUNTIME. */
int vt_cuda_fail(cudaError_t e, const char *fn, vt_error *err);

#define VT_CUDA_TRY(call, fn, err)                                 \
    do {                                                           \
        cudaError_t vt_e_ = (call);                                \
        if (vt_e_ != cudaSuccess) return vt_cuda_fail(vt_e_, fn, err); \
    } while (0)


/* float32 -> bfloat16 bits: nearest even; NaN keeps sign and payload, made
 * quiet (as vt_bf16_from_f32). */
__device__ __forceinline__ uint16_t vt_cu_bf16_from_f32(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* float32 -> float16 bits: nearest even, overflow to inf, NaN quiet with
 * sign and top payload bits (as vt_f16_from_f32). */
__device__ __forceinline__ uint16_t vt_cu_f16_from_f32(float x) {
    uint32_t u = __float_as_uint(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x477FE000u) return (uint16_t)(sign | 0x7BFFu);
    int e = (int)(a >> 23) - 127;
    if (e >= -14) {
        uint32_t r = (a + 0xFFFu + ((a >> 13) & 1u)) >> 13;
        uint32_t code = r - ((uint32_t)(127 - 15) << 10);
        return (uint16_t)(sign | (code > 0x7BFFu ? 0x7BFFu : code));
    }
    if ((a >> 23) == 0) return (uint16_t)sign;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    int shift = 23 - 14 - 10 - e;
    if (shift > 24) return (uint16_t)sign;
    return (uint16_t)(sign | ((m + ((1u << (shift - 1)) - 1u) + ((m >> shift) & 1u)) >> shift));
}

/* Element `i` of a row of dtype DT as float32 (exact for every code). */
template <int DT>
__device__ __forceinline__ float vt_cu_load(const uint8_t *row, int64_t i) {
    if (DT == VT_DTYPE_F32) return reinterpret_cast<const float *>(row)[i];
    if (DT == VT_DTYPE_F16) return __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(row)[i]));
    if (DT == VT_DTYPE_BF16) return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(row)[i] << 16);
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)row[i], DT == VT_DTYPE_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}

/* Run-time dtype version of vt_cu_load (for q and one-off loads). */
__device__ __forceinline__ float vt_cu_load_rt(int dt, const uint8_t *row, int64_t i) {
    switch (dt) {
    case VT_DTYPE_F32: return vt_cu_load<VT_DTYPE_F32>(row, i);
    case VT_DTYPE_F16: return vt_cu_load<VT_DTYPE_F16>(row, i);
    case VT_DTYPE_BF16: return vt_cu_load<VT_DTYPE_BF16>(row, i);
    case VT_DTYPE_FP8_E4M3: return vt_cu_load<VT_DTYPE_FP8_E4M3>(row, i);
    default: return vt_cu_load<VT_DTYPE_FP8_E5M2>(row, i);
    }
}

/* Store x as element i of a row of plain dtype dt (F32, F16, BF16). */
__device__ __forceinline__ void vt_cu_store_plain(int dt, uint8_t *row, int64_t i, float x) {
    if (dt == VT_DTYPE_F32) reinterpret_cast<float *>(row)[i] = x;
    else if (dt == VT_DTYPE_F16) reinterpret_cast<uint16_t *>(row)[i] = vt_cu_f16_from_f32(x);
    else reinterpret_cast<uint16_t *>(row)[i] = vt_cu_bf16_from_f32(x);
}

#endif /* VTINFER_CUDA_COMMON_CUH */
