/* Machine probes for bench_attention.py and bench_kv_formats.py, built with the system compiler
 * (cc -O2 -shared -fPIC -pthread). Each runs on nth threads at once (pthreads) and returns the wall
 * seconds of the slowest thread. The vector width follows the kernels': probe_lanes(want) picks 16-lane
 * AVX-512 or 8-lane AVX2 + FMA code (want 16 where the kernels run AVX-512 and the CPU has it), and
 * returns the lanes it took, 0 where the CPU has neither (every probe then returns -1):
 *   read_bw(buf, bytes, nth, reps) -> seconds for nth threads each summing
 *                                     its 1/nth of buf, reps times
 *   read_pages(k, v, page_bytes, order, n, npages, nth)
 *                                  -> seconds for nth threads each summing the K and the V
 *                                     page (page_bytes each, at k + order[i] * page_bytes
 *                                     and v + ...) of its 1/nth of the n entries of order,
 *                                     a contiguous share, as the attention splits a sequence
 *                                     over threads: the read of a paged cache in its
 *                                     block-table order, nothing else; -1 where an entry
 *                                     is outside the npages pages of k and of v
 *   fma_peak(iters, nth)           -> seconds for iters x probe_fmas_per_iter() independent
 *                                     fp32 FMAs of probe_lanes lanes per thread (2 flops
 *                                     per lane): ACC512 with AVX-512, ACC256 with AVX2
 *   bf16dot_peak(iters, nth)       -> seconds for iters x 16 independent
 *                                     vdpbf16ps per thread (32 bf16 products
 *                                     = 64 flops per instruction); -1 when the
 *                                     CPU lacks AVX512-BF16
 *   probe_last_sum()               -> what the threads of the last probe summed, added up
 *                                     (a read's checksum: the probes' own test reads it) */
#include <immintrin.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int lanes;       /* 16: AVX-512, 8: AVX2 + FMA, 0: neither (probe_lanes) */
static double last_sum; /* probe_last_sum */

int probe_lanes(int want);
int probe_lanes(int want) {
    __builtin_cpu_init();
    if (want >= 16 && __builtin_cpu_supports("avx512f")) lanes = 16;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) lanes = 8;
    else lanes = 0;
    return lanes;
}

typedef struct job {
    const float *buf;
    size_t n;
    long iters;
    int reps, kind;
    double sink;
    /* read_pages */
    const char *k, *v;
    size_t page;
    const int32_t *order;
} job;

/* NAME(base, order, cnt, stride, n, reps): the sum of the n floats (a multiple of 4 W) of each of the cnt ranges
 * at base + order[i] * stride (order NULL: range i), reps times, in four accumulators of type V (W lanes). */
#define SUM_RANGES(NAME, TARGET, V, W, ZERO, LOAD, ADD)                                                                \
    __attribute__((target(TARGET))) static double NAME(const char *base, const int32_t *order, size_t cnt,            \
                                                       size_t stride, size_t n, int reps) {                            \
        V a[4] = {ZERO(), ZERO(), ZERO(), ZERO()};                                                                     \
        for (int r = 0; r < reps; r++)                                                                                 \
            for (size_t i = 0; i < cnt; i++) {                                                                         \
                const float *p = (const float *)(base + (size_t)(order ? order[i] : (int32_t)i) * stride);             \
                for (size_t e = 0; e + 4 * (W) <= n; e += 4 * (W))                                                     \
                    _Pragma("GCC unroll 4")                                                                            \
                    for (int u = 0; u < 4; u++) a[u] = ADD(a[u], LOAD(p + e + (size_t)u * (W)));                       \
            }                                                                                                          \
        float o[4 * (W)];                                                                                              \
        __builtin_memcpy(o, a, sizeof o);                                                                              \
        double s = 0;                                                                                                  \
        for (int e = 0; e < 4 * (W); e++) s += o[e];                                                                   \
        return s;                                                                                                      \
    }

SUM_RANGES(sum_ranges512, "avx512f", __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_add_ps)
SUM_RANGES(sum_ranges256, "avx2", __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_add_ps)

static double sum_ranges(const char *base, const int32_t *order, size_t cnt, size_t stride, size_t n, int reps) {
    return lanes == 16 ? sum_ranges512(base, order, cnt, stride, n, reps) : sum_ranges256(base, order, cnt, stride, n, reps);
}

/* The body of a peak loop: N independent accumulators a[i] of type V, each stepped iters times by STEP (an
 * expression of a[i]), then summed into the double s. Unrolled, so the accumulators live in registers (a loop
 * over a[] at -O2 kept them in memory and measured the store-to-load latency, not the FMA ports): N = 16 of the
 * 32 AVX-512 registers, 12 of AVX2's 16 (16 there spill beside the two constants: measured 0.57 of the peak). */
#define ACC512 16
#define ACC256 12
#define PEAK_LOOP(V, SET1, N, iters, STEP)                                                                             \
    V a[N];                                                                                                            \
    for (int i = 0; i < (N); i++) a[i] = SET1((float)i);                                                               \
    for (long it = 0; it < (iters); it++) {                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < (N); i++) a[i] = (STEP);                                         \
    }                                                                                                                  \
    float o[16 * 16];                                                                                                  \
    __builtin_memcpy(o, a, sizeof a);                                                                                  \
    double s = 0;                                                                                                      \
    const size_t nf = sizeof a / 4; /* floats in a */                                                                 \
    for (size_t i = 0; i < nf; i++) s += o[i];                                                                         \
    return s

__attribute__((target("avx512f,fma"))) static double fma_loop512(long iters) {
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    PEAK_LOOP(__m512, _mm512_set1_ps, ACC512, iters, _mm512_fmadd_ps(a[i], x, y));
}

__attribute__((target("avx2,fma"))) static double fma_loop256(long iters) {
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    PEAK_LOOP(__m256, _mm256_set1_ps, ACC256, iters, _mm256_fmadd_ps(a[i], x, y));
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_loop(long iters) {
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3F80), y = (__m512bh)_mm512_set1_epi16(0x3380);
    PEAK_LOOP(__m512, _mm512_set1_ps, ACC512, iters, _mm512_dpbf16_ps(a[i], x, y));
}

static void *run(void *arg) {
    job *j = arg;
    if (j->kind == 0) j->sink = sum_ranges((const char *)j->buf, NULL, 1, 0, j->n, j->reps);
    else if (j->kind == 1) j->sink = lanes == 16 ? fma_loop512(j->iters) : fma_loop256(j->iters);
    else if (j->kind == 2) j->sink = bf16_loop(j->iters);
    else j->sink = sum_ranges(j->k, j->order, j->n, j->page, j->page / 4, 1) +
                   sum_ranges(j->v, j->order, j->n, j->page, j->page / 4, 1);
    return NULL;
}

/* Runs base on nth threads, each on its 1/nth of base->n (floats, a multiple of 64; pages for read_pages). */
static double on_threads(job *base, int nth) {
    pthread_t t[64];
    job jobs[64];
    if (nth < 1) nth = 1;
    if (nth > 64) nth = 64;
    const int pages = base->kind == 3;
    size_t per = pages ? base->n / (size_t)nth : base->n / (size_t)nth / 64 * 64;
    for (int i = 0; i < nth; i++) {
        jobs[i] = *base;
        jobs[i].buf = base->buf ? base->buf + (size_t)i * per : NULL;
        jobs[i].order = base->order ? base->order + (size_t)i * per : NULL;
        jobs[i].n = pages && i == nth - 1 ? base->n - (size_t)i * per : per;
    }
    double t0 = now();
    for (int i = 1; i < nth; i++) pthread_create(&t[i], NULL, run, &jobs[i]);
    run(&jobs[0]);
    for (int i = 1; i < nth; i++) pthread_join(t[i], NULL);
    const double dt = now() - t0;
    last_sum = 0;
    for (int i = 0; i < nth; i++) last_sum += jobs[i].sink;
    return dt;
}

double probe_last_sum(void);
double probe_last_sum(void) { return last_sum; }

double read_bw(const float *buf, size_t bytes, int nth, int reps);
double read_bw(const float *buf, size_t bytes, int nth, int reps) {
    if (!lanes) return -1.0;
    job j = {.buf = buf, .n = bytes / 4, .reps = reps, .kind = 0};
    return on_threads(&j, nth);
}

double read_pages(const char *k, const char *v, size_t page_bytes, const int32_t *order, long n, long npages, int nth);
double read_pages(const char *k, const char *v, size_t page_bytes, const int32_t *order, long n, long npages, int nth) {
    if (!lanes || page_bytes % 256 || n < 1) return -1.0; /* whole 64-float steps of the sums */
    for (long i = 0; i < n; i++)
        if (order[i] < 0 || order[i] >= npages) return -1.0; /* a page the buffers do not hold */
    job j = {.n = (size_t)n, .kind = 3, .k = k, .v = v, .page = page_bytes, .order = order};
    return on_threads(&j, nth);
}

int probe_fmas_per_iter(void);
int probe_fmas_per_iter(void) { return lanes == 16 ? ACC512 : ACC256; }

double fma_peak(long iters, int nth);
double fma_peak(long iters, int nth) {
    if (!lanes) return -1.0;
    job j = {.iters = iters, .kind = 1};
    return on_threads(&j, nth);
}

double bf16dot_peak(long iters, int nth);
double bf16dot_peak(long iters, int nth) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return -1.0;
    job j = {.iters = iters, .kind = 2};
    return on_threads(&j, nth);
}
