/* The store on the device: vLLM's reshape_and_cache_flash over the same
 * vt_kv_store_params as the CPU core (see vt_cuda.h).
 *
 * One CTA per (token, K or V); threads walk the token's num_kv_heads *
 * head_size elements. fp8 codes come from __nv_cvt_float_to_fp8 on a true
 * float32 division (__fdiv_rn: correct rounding even if the file were ever
 * built with fast math) with SATFINITE: round to nearest even, saturate to
 * +-max finite, NaN -> 0x7F, -0 kept, as the CPU codec. */
#include "cuda_common.cuh"

namespace {

struct store_side {
    const uint8_t *src;
    int64_t src_stride_token, src_stride_head;
    vt_kv_dst dst;
    const float *scale;
};

template <int SRC>
__global__ void store_kernel(vt_kv_store_params p, int64_t slots_total) {
    const int64_t t = blockIdx.x;
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0 || slot >= slots_total) return; /* negative: skipped; past the end: refused by the caller */
    store_side s;
    if (blockIdx.y == 0) {
        s = {static_cast<const uint8_t *>(p.key), p.key_stride_token, p.key_stride_head, p.key_cache, p.k_scale};
    } else {
        s = {static_cast<const uint8_t *>(p.value), p.value_stride_token, p.value_stride_head, p.value_cache,
             p.v_scale};
    }
    const int64_t blk = slot / p.block_size, off = slot % p.block_size;
    const int64_t D = p.head_size, n = p.num_kv_heads * D;
    const int cache = p.cache_dtype;
    const int64_t ces = cache == VT_DTYPE_F32 ? 4 : (cache == VT_DTYPE_F16 || cache == VT_DTYPE_BF16) ? 2 : 1;
    const int64_t ses = SRC == VT_DTYPE_F32 ? 4 : 2;
    uint8_t *base = static_cast<uint8_t *>(s.dst.base) + blk * s.dst.stride_block + off * s.dst.stride_slot;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
        const int64_t h = e / D, d = e % D;
        const uint8_t *srow = s.src + t * s.src_stride_token + h * s.src_stride_head;
        uint8_t *dp = base + h * s.dst.stride_head + (d / s.dst.chunk) * s.dst.stride_chunk + (d % s.dst.chunk) * ces;
        if (cache == SRC) { /* same dtype: the bits, NaN payloads included */
            if (ses == 4) *reinterpret_cast<uint32_t *>(dp) = reinterpret_cast<const uint32_t *>(srow)[d];
            else *reinterpret_cast<uint16_t *>(dp) = reinterpret_cast<const uint16_t *>(srow)[d];
            continue;
        }
        const float x = vt_cu_load<SRC>(srow, d);
        if (cache == VT_DTYPE_FP8_E4M3 || cache == VT_DTYPE_FP8_E5M2) {
            const float sc = s.scale[p.scale_per_head ? h : 0];
            *dp = (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(x, sc), __NV_SATFINITE,
                                                 cache == VT_DTYPE_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
        } else {
            vt_cu_store_plain(cache, dp, 0, x);
        }
    }
}

} // namespace

extern "C" int vt_cuda_kv_store(const vt_kv_store_params *p, void *stream, vt_error *err) {
    const char *fn = p->fn ? p->fn : "vt_kv_store";
    if (p->num_tokens == 0) return VT_OK;
    if (p->num_tokens > 0x7FFFFFFF)
        return vt_error_set(err, VT_ERR_VALUE, "%s: slot_mapping must have at most 2^31 - 1 tokens on CUDA; got %lld",
                            fn, (long long)p->num_tokens);
    const dim3 grid((unsigned)p->num_tokens, 2);
    const int64_t n = p->num_kv_heads * p->head_size;
    const unsigned threads = n >= 256 ? 256u : (unsigned)((n + 31) / 32 * 32);
    const int64_t slots_total = p->num_blocks * p->block_size;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (p->src_dtype) {
    case VT_DTYPE_F32: store_kernel<VT_DTYPE_F32><<<grid, threads, 0, s>>>(*p, slots_total); break;
    case VT_DTYPE_F16: store_kernel<VT_DTYPE_F16><<<grid, threads, 0, s>>>(*p, slots_total); break;
    case VT_DTYPE_BF16: store_kernel<VT_DTYPE_BF16><<<grid, threads, 0, s>>>(*p, slots_total); break;
    default:
        return vt_error_set(err, VT_ERR_TYPE, "%s: key must be float32, float16 or bfloat16; got dtype id %d", fn,
                            (int)p->src_dtype);
    }
    VT_CUDA_TRY(cudaGetLastError(), fn, err);
    return VT_OK;
}
