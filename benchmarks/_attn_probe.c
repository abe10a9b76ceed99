/* Machine probes for bench_attention.py, built with the system compiler
 * (cc -O2 -shared -fPIC -pthread). Each runs on nth threads at once
 * (pthreads) and returns the wall seconds of the slowest thread:
 *   read_bw(buf, bytes, nth, reps) -> seconds for nth threads each summing
 *                                     its 1/nth of buf, reps times (AVX-512 loads)
 *   fma_peak(iters, nth)           -> seconds for iters x 16 independent 16-lane
 *                                     fp32 FMAs per thread (2 flops per lane)
 *   bf16dot_peak(iters, nth)       -> seconds for iters x 16 independent
 *                                     vdpbf16ps per thread (32 bf16 products
 *                                     = 64 flops per instruction); -1 when the
 *                                     CPU lacks AVX512-BF16 */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct job {
    const float *buf;
    size_t n;
    long iters;
    int reps, kind;
    double sink;
} job;

__attribute__((target("avx512f"))) static double sum_range(const float *buf, size_t n, int reps) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int r = 0; r < reps; r++)
        for (size_t i = 0; i + 64 <= n; i += 64) {
            a0 = _mm512_add_ps(a0, _mm512_loadu_ps(buf + i));
            a1 = _mm512_add_ps(a1, _mm512_loadu_ps(buf + i + 16));
            a2 = _mm512_add_ps(a2, _mm512_loadu_ps(buf + i + 32));
            a3 = _mm512_add_ps(a3, _mm512_loadu_ps(buf + i + 48));
        }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* The body of a peak loop: 16 independent accumulators a[i], each stepped iters times by STEP (an expression
 * of a[i]), then summed. Unrolled, so the 16 accumulators live in registers (a loop over a[] at -O2 kept them
 * in memory and measured the store-to-load latency, not the FMA ports). */
#define PEAK_LOOP(iters, STEP)                                                                                         \
    __m512 a[16];                                                                                                      \
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);                                                      \
    for (long it = 0; it < (iters); it++) {                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) a[i] = (STEP);                                          \
    }                                                                                                                  \
    __m512 s = a[0];                                                                                                   \
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);                                                           \
    return _mm512_reduce_add_ps(s)

__attribute__((target("avx512f,fma"))) static double fma_loop(long iters) {
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    PEAK_LOOP(iters, _mm512_fmadd_ps(a[i], x, y));
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_loop(long iters) {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3F80), y = (__m512bh)_mm512_set1_epi16(0x3380);
    PEAK_LOOP(iters, _mm512_dpbf16_ps(a[i], x, y));
}

static void *run(void *arg) {
    job *j = arg;
    if (j->kind == 0) j->sink = sum_range(j->buf, j->n, j->reps);
    else if (j->kind == 1) j->sink = fma_loop(j->iters);
    else j->sink = bf16_loop(j->iters);
    return NULL;
}

static double on_threads(job *base, int nth) {
    pthread_t t[64];
    job jobs[64];
    if (nth < 1) nth = 1;
    if (nth > 64) nth = 64;
    size_t per = base->n / (size_t)nth / 64 * 64;
    for (int i = 0; i < nth; i++) {
        jobs[i] = *base;
        jobs[i].buf = base->buf ? base->buf + (size_t)i * per : NULL;
        jobs[i].n = per;
    }
    double t0 = now();
    for (int i = 1; i < nth; i++) pthread_create(&t[i], NULL, run, &jobs[i]);
    run(&jobs[0]);
    for (int i = 1; i < nth; i++) pthread_join(t[i], NULL);
    return now() - t0;
}

double read_bw(const float *buf, size_t bytes, int nth, int reps);
double read_bw(const float *buf, size_t bytes, int nth, int reps) {
    job j = {buf, bytes / 4, 0, reps, 0, 0};
    return on_threads(&j, nth);
}

double fma_peak(long iters, int nth);
double fma_peak(long iters, int nth) {
    job j = {NULL, 0, iters, 0, 1, 0};
    return on_threads(&j, nth);
}

double bf16dot_peak(long iters, int nth);
double bf16dot_peak(long iters, int nth) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return -1.0;
    job j = {NULL, 0, iters, 0, 2, 0};
    return on_threads(&j, nth);
}
