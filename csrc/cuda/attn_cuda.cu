/* Paged attention on the device (flash_attn_varlen_func): the same
 * vt_attn_params and the same meaning as the CPU core (see
 * vtinfer/attention.h), decode and prefill in one kernel.
 *
 * Grid: x = (sequence b, KV head g), y = a chunk of ROWS rows of the
 * sequence's (query, head-of-the-group) pairs (GQA: the group's heads share
 * every K/V tile read), z = a split of the key range (flash-decoding when
 * the (b, g, chunk) CTAs alone would leave the SMs idle). Each CTA walks
 * its keys in tiles of TILE tokens through shared memory, decoded to
 * float32 exactly (fp8 via the fp8 -> half conversion), with an online
 * softmax in float32. Scales are folded as on the CPU: s = (q . K) *
 * softmax_scale * k_descale; out = (sum p V) * v_descale / denominator.
 * With one split the CTA writes out (and lse) itself; otherwise it writes
 * an unnormalised partial (acc, m, l) and merge_kernel combines them. */
#include <math.h>

#include "cuda_common.cuh"

namespace {

constexpr int ROWS = 16;    /* (query, head) rows per CTA */
constexpr int TILE = 32;    /* keys per shared-memory tile (= warp size) */
constexpr int THREADS = 256;
constexpr int MAX_HEAD = 512;

struct launch {
    int G;            /* heads per KV head */
    int splits;       /* KV splits (z) */
    int64_t split_len;/* keys per split, a multiple of TILE */
    float *part_acc;  /* [splits][total_q][H][D] when splits > 1 */
    float *part_ml;   /* [splits][total_q][H][2] */
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Visible keys [lo, hi) of the query at key position pos (vt_attn_key_range). */
__device__ __forceinline__ void key_range(const vt_attn_params &p, int64_t pos, int64_t k_len, int64_t *lo,
                                          int64_t *hi) {
    int64_t a = 0, z = k_len;
    if (p.window_left >= 0 && pos - p.window_left > a) a = pos - p.window_left;
    if (p.causal && pos + 1 < z) z = pos + 1;
    if (p.window_right >= 0 && pos + p.window_right + 1 < z) z = pos + p.window_right + 1;
    *lo = a;
    *hi = z > a ? z : a;
}

__device__ __forceinline__ float descale(const float *d, int64_t sb, int64_t sh, int b, int g) {
    return d ? d[(int64_t)b * sb + (int64_t)g * sh] : 1.0f;
}

__device__ __forceinline__ void store_out(const vt_attn_params &p, int64_t tok, int h, int64_t d, float x) {
    uint8_t *row = static_cast<uint8_t *>(p.out) + tok * p.out_stride_tok + (int64_t)h * p.out_stride_head;
    vt_cu_store_plain(p.q_dtype, row, d, x);
}

template <int KV>
__global__ void __launch_bounds__(THREADS) attn_kernel(vt_attn_params p, launch L) {
    extern __shared__ float smem[];
    const int D = p.head_size, DK = D + 1; /* K rows padded: conflict-free column reads */
    float *q_s = smem;                      /* [ROWS][D] */
    float *k_s = q_s + ROWS * D;            /* [TILE][D + 1] */
    float *v_s = k_s + TILE * DK;           /* [TILE][D] */
    float *acc = v_s + TILE * D;            /* [ROWS][D] */
    float *s_s = acc + ROWS * D;            /* [ROWS][TILE] */
    float *m_s = s_s + ROWS * TILE;         /* [ROWS] */
    float *l_s = m_s + ROWS;                /* [ROWS] */
    float *a_s = l_s + ROWS;                /* [ROWS] rescale factors */

    const int b = blockIdx.x / p.num_kv_heads, g = blockIdx.x % p.num_kv_heads;
    const int64_t q0 = p.cu_seqlens_q[b], q_len = p.cu_seqlens_q[b + 1] - q0, k_len = p.seqused_k[b];
    const int64_t row0 = (int64_t)blockIdx.y * ROWS;
    const int64_t total_rows = q_len * L.G;
    if (row0 >= total_rows) return;
    const int nrows = (int)imin(ROWS, total_rows - row0);
    const int split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* Keys this CTA may need: its split, narrowed to the union of its rows' windows. */
    const int64_t i_first = row0 / L.G, i_last = (row0 + nrows - 1) / L.G;
    int64_t lo_a, hi_a, lo_b, hi_b;
    key_range(p, k_len - q_len + i_first, k_len, &lo_a, &hi_a);
    key_range(p, k_len - q_len + i_last, k_len, &lo_b, &hi_b);
    const int64_t s_lo = (int64_t)split * L.split_len, s_hi = imin(k_len, s_lo + L.split_len);
    const int64_t k_lo = imax(s_lo, imin(lo_a, lo_b)), k_hi = imin(s_hi, imax(hi_a, hi_b));

    const float kd = descale(p.k_descale, p.k_descale_stride_b, p.k_descale_stride_h, b, g) * p.softmax_scale;
    for (int e = tid; e < nrows * D; e += THREADS) {
        const int r = e / D, d = e % D;
        const int64_t rr = row0 + r, tok = q0 + rr / L.G;
        const int h = g * L.G + (int)(rr % L.G);
        const uint8_t *qrow = static_cast<const uint8_t *>(p.q) + tok * p.q_stride_tok + (int64_t)h * p.q_stride_head;
        q_s[r * D + d] = vt_cu_load_rt(p.q_dtype, qrow, d);
        acc[r * D + d] = 0.0f;
    }
    if (tid < ROWS) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    const uint8_t *kb = static_cast<const uint8_t *>(p.k), *vb = static_cast<const uint8_t *>(p.v);
    const int32_t *bt = p.block_table + (int64_t)b * p.bt_stride;

    for (int64_t j0 = k_lo - (k_lo % TILE); j0 < k_hi; j0 += TILE) {
        __syncthreads(); /* the previous tile's readers are done */
        for (int e = tid; e < TILE * D; e += THREADS) {
            const int t = e / D, d = e % D;
            const int64_t j = j0 + t;
            float kx = 0.0f, vx = 0.0f;
            if (j >= k_lo && j < k_hi) {
                const int64_t page = bt[j / p.block_size], off = j % p.block_size;
                kx = vt_cu_load<KV>(kb + page * p.k_stride_block + off * p.k_stride_tok + (int64_t)g * p.k_stride_head, d);
                vx = vt_cu_load<KV>(vb + page * p.v_stride_block + off * p.v_stride_tok + (int64_t)g * p.v_stride_head, d);
            }
            k_s[t * DK + d] = kx;
            v_s[t * D + d] = vx;
        }
        __syncthreads();
        /* Logits: one thread per (row, key). */
        for (int e = tid; e < nrows * TILE; e += THREADS) {
            const int r = e / TILE, t = e % TILE;
            const int64_t rr = row0 + r, pos = k_len - q_len + rr / L.G, j = j0 + t;
            const int h = g * L.G + (int)(rr % L.G);
            int64_t lo, hi;
            key_range(p, pos, k_len, &lo, &hi);
            float s = -INFINITY;
            if (j >= lo && j < hi && j >= k_lo && j < k_hi) {
                const float *qr = q_s + r * D, *kr = k_s + t * DK;
                float dot = 0.0f;
                for (int d = 0; d < D; d++) dot = fmaf(qr[d], kr[d], dot);
                s = dot * kd;
                if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
                if (p.alibi_slopes) s -= p.alibi_slopes[h] * (float)(j > pos ? j - pos : pos - j);
            }
            s_s[r * TILE + t] = s;
        }
        __syncthreads();
        /* Online softmax: one warp per row, one lane per key of the tile. */
        for (int r = warp; r < nrows; r += THREADS / 32) {
            const float s = s_s[r * TILE + lane];
            float mx = s;
            for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
            const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
            const float pe = m_new == -INFINITY ? 0.0f : expf(s - m_new);
            float sum = pe;
            for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
            s_s[r * TILE + lane] = pe;
            __syncwarp();
            if (lane == 0) {
                const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                a_s[r] = alpha;
                l_s[r] = l_s[r] * alpha + sum;
                m_s[r] = m_new;
            }
        }
        __syncthreads();
        for (int e = tid; e < nrows * D; e += THREADS) {
            const int r = e / D, d = e % D;
            const float *pr = s_s + r * TILE;
            float a = acc[e] * a_s[r];
            for (int t = 0; t < TILE; t++) a = fmaf(pr[t], v_s[t * D + d], a);
            acc[e] = a;
        }
    }
    __syncthreads();

    const float vd = descale(p.v_descale, p.v_descale_stride_b, p.v_descale_stride_h, b, g);
    for (int e = tid; e < nrows * D; e += THREADS) {
        const int r = e / D, d = e % D;
        const int64_t rr = row0 + r, tok = q0 + rr / L.G;
        const int h = g * L.G + (int)(rr % L.G);
        const float m = m_s[r], l = l_s[r];
        if (L.splits > 1) {
            const int64_t idx = ((int64_t)split * p.total_q + tok) * p.num_heads + h;
            L.part_acc[idx * D + d] = acc[e];
            if (d == 0) {
                L.part_ml[idx * 2] = m;
                L.part_ml[idx * 2 + 1] = l;
            }
            continue;
        }
        const float sink = p.s_aux ? p.s_aux[h] : -INFINITY;
        const float M = fmaxf(m, sink);
        const float wm = m == -INFINITY ? 0.0f : expf(m - M);
        const float den = l * wm + (sink == -INFINITY ? 0.0f : expf(sink - M));
        store_out(p, tok, h, d, den > 0.0f ? acc[e] * wm / den * vd : 0.0f);
        if (d == 0 && p.lse)
            p.lse[(int64_t)h * p.lse_stride_head + tok * p.lse_stride_tok] = den > 0.0f ? M + logf(den) : -INFINITY;
    }
}

/* Combine the splits of one (token, head) row: one CTA per row. */
__global__ void merge_kernel(vt_attn_params p, launch L) {
    const int64_t tok = blockIdx.x;
    const int h = blockIdx.y;
    if (tok < p.cu_seqlens_q[0] || tok >= p.cu_seqlens_q[p.batch]) return; /* rows outside the sequences */
    int b = 0; /* the sequence of tok: the last b with cu_seqlens_q[b] <= tok */
    for (int lo = 0, hi = p.batch - 1; lo <= hi;) {
        const int mid = (lo + hi) / 2;
        if (p.cu_seqlens_q[mid] <= tok) {
            b = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    const int g = h / L.G, D = p.head_size;
    const float sink = p.s_aux ? p.s_aux[h] : -INFINITY;
    float M = sink;
    for (int s = 0; s < L.splits; s++) M = fmaxf(M, L.part_ml[(((int64_t)s * p.total_q + tok) * p.num_heads + h) * 2]);
    float den = 0.0f;
    if (M != -INFINITY) {
        den = sink == -INFINITY ? 0.0f : expf(sink - M);
        for (int s = 0; s < L.splits; s++) {
            const float *ml = L.part_ml + (((int64_t)s * p.total_q + tok) * p.num_heads + h) * 2;
            if (ml[0] != -INFINITY) den += ml[1] * expf(ml[0] - M);
        }
    }
    const float vd = descale(p.v_descale, p.v_descale_stride_b, p.v_descale_stride_h, b, g);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.0f;
        if (den > 0.0f) {
            for (int s = 0; s < L.splits; s++) {
                const int64_t idx = ((int64_t)s * p.total_q + tok) * p.num_heads + h;
                const float m = L.part_ml[idx * 2];
                if (m != -INFINITY) a += L.part_acc[idx * D + d] * expf(m - M);
            }
            a = a / den * vd;
        }
        store_out(p, tok, h, d, a);
    }
    if (threadIdx.x == 0 && p.lse)
        p.lse[(int64_t)h * p.lse_stride_head + tok * p.lse_stride_tok] = den > 0.0f ? M + logf(den) : -INFINITY;
}

size_t smem_bytes(int D) {
    return sizeof(float) * ((size_t)ROWS * D * 2 + (size_t)TILE * (D + 1) + (size_t)TILE * D + ROWS * TILE + 3 * ROWS);
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Grid and splits of a call; the same answer for the size query and the launch. */
int plan(const vt_attn_params *p, int64_t max_q, int64_t max_k, dim3 *grid, launch *L, size_t *ws_bytes,
         vt_error *err) {
    const char *fn = "flash_attn_varlen_func";
    if (p->head_size > MAX_HEAD)
        return vt_error_set(err, VT_ERR_UNSUPPORTED, "%s: q must have head_size <= %d on CUDA; got %d", fn, MAX_HEAD,
                            p->head_size);
    int dev = 0, sms = 0, max_y = 65535, max_smem = 0;
    VT_CUDA_TRY(cudaGetDevice(&dev), fn, err);
    VT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), fn, err);
    VT_CUDA_TRY(cudaDeviceGetAttribute(&max_y, cudaDevAttrMaxGridDimY, dev), fn, err);
    VT_CUDA_TRY(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), fn, err);
    if (smem_bytes(p->head_size) > (size_t)max_smem)
        return vt_error_set(err, VT_ERR_UNSUPPORTED, "%s: q's head_size must fit this device's shared memory (%d "
                            "bytes); got %d", fn, max_smem, p->head_size);
    L->G = p->num_heads / p->num_kv_heads;
    const int64_t chunks = cdiv(max_q * L->G, ROWS), xs = (int64_t)p->batch * p->num_kv_heads;
    if (chunks > max_y || xs > 0x7FFFFFFF)
        return vt_error_set(err, VT_ERR_UNSUPPORTED, "%s: max_seqlen_q * heads per KV head must be <= %lld on CUDA; "
                            "got %lld", fn, (long long)max_y * ROWS, (long long)(max_q * L->G));
    const int64_t ctas = xs * (chunks > 0 ? chunks : 1);
    int64_t splits = 1;
    if (ctas < 2 * sms && max_k >= 4 * TILE * 2) {
        splits = cdiv(4 * (int64_t)sms, ctas);
        const int64_t most = max_k / (4 * TILE);
        if (splits > most) splits = most;
        if (splits > 128) splits = 128;
        if (splits < 1) splits = 1;
    }
    L->split_len = cdiv(cdiv(max_k > 0 ? max_k : 1, splits), TILE) * TILE;
    L->splits = (int)cdiv(max_k > 0 ? max_k : 1, L->split_len);
    *grid = dim3((unsigned)xs, (unsigned)(chunks > 0 ? chunks : 1), (unsigned)L->splits);
    size_t bytes = 0;
    if (L->splits > 1) {
        size_t rows, a, m;
        if (vt_size_mul((size_t)L->splits * (size_t)p->total_q, (size_t)p->num_heads, &rows) ||
            vt_size_mul(rows, (size_t)p->head_size * sizeof(float), &a) || vt_size_mul(rows, 2 * sizeof(float), &m) ||
            vt_size_add(a, m, &bytes))
            return vt_error_set(err, VT_ERR_OVERFLOW, "%s: the split-KV workspace must fit in 64 bits", fn);
        bytes += 256;
    }
    *ws_bytes = bytes;
    return VT_OK;
}

template <int KV>
int launch_kv(const vt_attn_params *p, dim3 grid, const launch &L, cudaStream_t s, const char *fn, vt_error *err) {
    const size_t sm = smem_bytes(p->head_size);
    VT_CUDA_TRY(cudaFuncSetAttribute(attn_kernel<KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm), fn, err);
    attn_kernel<KV><<<grid, THREADS, sm, s>>>(*p, L);
    VT_CUDA_TRY(cudaGetLastError(), fn, err);
    return VT_OK;
}

} // namespace

extern "C" int vt_cuda_attn_workspace(const vt_attn_params *p, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      size_t *bytes, int *num_splits, vt_error *err) {
    dim3 grid;
    launch L{};
    int st = plan(p, max_seqlen_q, max_seqlen_k, &grid, &L, bytes, err);
    if (st == VT_OK && num_splits) *num_splits = L.splits;
    return st;
}

extern "C" int vt_cuda_attn(const vt_attn_params *p, int64_t max_seqlen_q, int64_t max_seqlen_k, void *workspace,
                            size_t workspace_bytes, void *stream, vt_error *err) {
    const char *fn = "flash_attn_varlen_func";
    if (p->batch == 0 || p->total_q == 0 || max_seqlen_q == 0) return VT_OK;
    dim3 grid;
    launch L{};
    size_t need = 0;
    int st = plan(p, max_seqlen_q, max_seqlen_k, &grid, &L, &need, err);
    if (st != VT_OK) return st;
    if (workspace_bytes < need)
        return vt_error_set(err, VT_ERR_VALUE, "%s: workspace must hold %zu bytes; got %zu", fn, need,
                            workspace_bytes);
    if (L.splits > 1) {
        const uintptr_t a = ((uintptr_t)workspace + 255) & ~(uintptr_t)255;
        L.part_acc = reinterpret_cast<float *>(a);
        L.part_ml = L.part_acc + (size_t)L.splits * (size_t)p->total_q * (size_t)p->num_heads * (size_t)p->head_size;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (p->kv_dtype) {
    case VT_DTYPE_F32: st = launch_kv<VT_DTYPE_F32>(p, grid, L, s, fn, err); break;
    case VT_DTYPE_F16: st = launch_kv<VT_DTYPE_F16>(p, grid, L, s, fn, err); break;
    case VT_DTYPE_BF16: st = launch_kv<VT_DTYPE_BF16>(p, grid, L, s, fn, err); break;
    case VT_DTYPE_FP8_E4M3: st = launch_kv<VT_DTYPE_FP8_E4M3>(p, grid, L, s, fn, err); break;
    case VT_DTYPE_FP8_E5M2: st = launch_kv<VT_DTYPE_FP8_E5M2>(p, grid, L, s, fn, err); break;
    default: return vt_error_set(err, VT_ERR_TYPE, "%s: k must be a KV-cache dtype; got dtype id %d", fn, (int)p->kv_dtype);
    }
    if (st != VT_OK || L.splits == 1) return st;
    merge_kernel<<<dim3((unsigned)p->total_q, (unsigned)p->num_heads), 128, 0, s>>>(*p, L);
    VT_CUDA_TRY(cudaGetLastError(), fn, err);
    return VT_OK;
}
