/* ggml's CPU flash attention (ggml_flash_attn_ext) on the benchmark's shapes, for same-run figures
 * beside vtinfer's. Built by bench_attention.py against a ggml build the user names (--ggml); never
 * part of vtinfer. K / V are contiguous [n_kv, H_kv, D] rows in ggml's layout (ggml has no pages),
 * filled from the caller's float32 values, quantized by ggml itself for q8_0 / q4_0. The query is
 * float32 [n_q, H_q, D]; prefill gets the causal mask (query i sees keys <= n_kv - n_q + i).
 *
 *   h = ggml_fa_new(type, D, n_kv, H_kv, gqa, n_q, causal, k, v, q);  ms = ggml_fa_run(h, threads);
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

typedef struct {
    struct ggml_context *ctx;
    struct ggml_cgraph *graph;
} fa_handle;

static int type_of(const char *name, enum ggml_type *t) {
    if (!strcmp(name, "f16")) *t = GGML_TYPE_F16;
    else if (!strcmp(name, "q8_0")) *t = GGML_TYPE_Q8_0;
    else if (!strcmp(name, "q4_0")) *t = GGML_TYPE_Q4_0;
    else return 0;
    return 1;
}

/* src [n_kv, hkv, d] float32 -> ggml tensor [d, n_kv, hkv] of its type (rows of d). */
static void fill_kv(struct ggml_tensor *t, const float *src, long d, long n_kv, long hkv) {
    float *row = malloc(sizeof(float) * (size_t)d * (size_t)n_kv);
    for (long h = 0; h < hkv; h++) {
        for (long j = 0; j < n_kv; j++) memcpy(row + j * d, src + (j * hkv + h) * d, sizeof(float) * (size_t)d);
        char *dst = (char *)t->data + h * t->nb[2];
        if (t->type == GGML_TYPE_F16) ggml_fp32_to_fp16_row(row, (ggml_fp16_t *)dst, d * n_kv);
        else ggml_quantize_chunk(t->type, row, dst, 0, n_kv, d, NULL);
    }
    free(row);
}

void *ggml_fa_new(const char *type_name, long d, long n_kv, long hkv, long gqa, long n_q, int causal,
                  const float *k, const float *v, const float *q) {
    enum ggml_type type;
    if (!type_of(type_name, &type)) return NULL;
    const long hq = hkv * gqa;
    size_t bytes = 2 * ggml_row_size(type, d) * (size_t)(n_kv * hkv) + sizeof(float) * (size_t)(n_q * hq * d) * 2 +
                   sizeof(ggml_fp16_t) * (size_t)(n_kv * n_q) + ((size_t)256 << 20);
    struct ggml_init_params ip = {.mem_size = bytes, .mem_buffer = NULL, .no_alloc = false};
    fa_handle *h = calloc(1, sizeof(*h));
    h->ctx = ggml_init(ip);
    if (!h->ctx) {
        free(h);
        return NULL;
    }
    struct ggml_tensor *tq = ggml_new_tensor_3d(h->ctx, GGML_TYPE_F32, d, n_q, hq);
    struct ggml_tensor *tk = ggml_new_tensor_3d(h->ctx, type, d, n_kv, hkv);
    struct ggml_tensor *tv = ggml_new_tensor_3d(h->ctx, type, d, n_kv, hkv);
    for (long i = 0; i < n_q; i++)
        for (long hh = 0; hh < hq; hh++)
            memcpy((char *)tq->data + i * tq->nb[1] + hh * tq->nb[2], q + (i * hq + hh) * d, sizeof(float) * (size_t)d);
    fill_kv(tk, k, d, n_kv, hkv);
    fill_kv(tv, v, d, n_kv, hkv);
    struct ggml_tensor *mask = NULL;
    if (causal) {
        mask = ggml_new_tensor_2d(h->ctx, GGML_TYPE_F16, n_kv, n_q);
        ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        for (long i = 0; i < n_q; i++) {
            ggml_fp16_t *m = (ggml_fp16_t *)((char *)mask->data + i * mask->nb[1]);
            for (long j = 0; j < n_kv; j++) m[j] = j <= n_kv - n_q + i ? zero : ninf;
        }
    }
    struct ggml_tensor *out = ggml_flash_attn_ext(h->ctx, tq, tk, tv, mask, 1.0f / sqrtf((float)d), 0.0f, 0.0f);
    h->graph = ggml_new_graph(h->ctx);
    ggml_build_forward_expand(h->graph, out);
    return h;
}

double ggml_fa_run(void *p, int threads) {
    fa_handle *h = p;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (ggml_graph_compute_with_ctx(h->ctx, h->graph, threads) != GGML_STATUS_SUCCESS) return -1.0;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
}

void ggml_fa_free(void *p) {
    fa_handle *h = p;
    if (!h) return;
    ggml_free(h->ctx);
    free(h);
}
