/* Machine probes for bench_attention.py, built with the system compiler:
 *   read_bw(buf, n, reps) -> seconds to sum n floats reps times (AVX-512 loads)
 *   fma_peak(iters)       -> seconds for iters x 16 independent 16-lane FMAs */
#include <immintrin.h>
#include <stddef.h>

__attribute__((target("avx512f"))) double read_sum(const float *buf, size_t n, int reps);
__attribute__((target("avx512f"))) double read_sum(const float *buf, size_t n, int reps) {
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

__attribute__((target("avx512f,fma"))) double fma_run(long iters);
__attribute__((target("avx512f,fma"))) double fma_run(long iters) {
    __m512 a[16];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
