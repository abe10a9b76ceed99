/* A byte reader over the fuzz input for the libFuzzer harnesses: every
 * read succeeds (zeros past the end), so any input maps to one call. */
#ifndef VT_FUZZ_COMMON_H
#define VT_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n, at;
} fz;

static inline uint64_t fz_bits(fz *f, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)(f->at < f->n ? f->p[f->at++] : 0) << (8 * i);
    return v;
}
static inline int64_t fz_range(fz *f, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(fz_bits(f, 2) % (uint64_t)(hi - lo + 1));
}
/* A hostile int: mostly small in-range values, sometimes extremes. */
static inline int64_t fz_index(fz *f, int64_t limit) {
    uint8_t k = (uint8_t)fz_bits(f, 1);
    switch (k & 7) {
    case 0: return -1;
    case 1: return limit;
    case 2: return (int64_t)fz_bits(f, 8);
    case 3: return -(int64_t)fz_bits(f, 2) - 1;
    default: return limit > 0 ? (int64_t)(fz_bits(f, 2) % (uint64_t)limit) : 0;
    }
}
static inline float fz_float(fz *f) { /* raw bits 1/4 of the time (NaN, Inf, 0, subnormal, negative) */
    uint8_t k = (uint8_t)fz_bits(f, 1);
    if ((k & 3) == 0) {
        uint32_t b = (uint32_t)fz_bits(f, 4);
        float x;
        memcpy(&x, &b, 4);
        return x;
    }
    return (float)(1 + (k >> 2)) * 0.125f;
}
#endif
