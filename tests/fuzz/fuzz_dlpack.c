/* libFuzzer harness: the binding's DLPack validation and overlap test
 * (csrc/binding/common/tensor_desc.c), which need no interpreter. Every
 * DLTensor field comes from the fuzz bytes: ndim, shape, strides, dtype
 * code/bits/lanes, byte_offset and a data pointer that is a real 256-byte
 * buffer, NULL, or an arbitrary address. Accepted tensors over the real
 * buffer whose extent fits it are read byte by byte (ASan judges), and
 * two such tensors' vt_tensor_share_elements is compared with a brute
 * force over their bytes. Any status is fine; a crash, UB or a wrong
 * overlap answer (abort) is not. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "vt_tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned char buf[256];

static void make(fz *f, vt_dl_tensor *dl, int64_t *shape, int64_t *strides) {
    memset(dl, 0, sizeof *dl);
    dl->ndim = (int32_t)fz_range(f, -2, 10);
    for (int i = 0; i < 10; i++) {
        const int hostile = (fz_bits(f, 1) & 7) == 0;
        shape[i] = hostile ? (int64_t)fz_bits(f, 8) : fz_range(f, 0, 6);
        strides[i] = hostile ? (int64_t)fz_bits(f, 8) : fz_range(f, -8, 40);
    }
    dl->shape = (fz_bits(f, 1) & 15) ? shape : NULL;
    dl->strides = (fz_bits(f, 1) & 3) ? strides : NULL;
    dl->dtype.code = (uint8_t)fz_range(f, 0, 13);
    dl->dtype.bits = (fz_bits(f, 1) & 3) ? (uint8_t)(8 << fz_range(f, 0, 3)) : (uint8_t)fz_bits(f, 1);
    dl->dtype.lanes = (fz_bits(f, 1) & 7) ? 1 : (uint16_t)fz_bits(f, 2);
    const uint8_t k = (uint8_t)fz_bits(f, 1);
    dl->byte_offset = (k & 3) ? (uint64_t)fz_range(f, 0, 64) : fz_bits(f, 8);
    dl->data = (k & 12) == 0 ? NULL : (k & 12) == 4 ? (void *)(uintptr_t)fz_bits(f, 8) : (void *)buf;
    dl->device.device_type = (int32_t)fz_range(f, 0, 14);
}

/* Byte offsets (relative to buf) touched by t, or -1 when outside buf. */
static int in_buf(const vt_tensor *t, int64_t *lo, int64_t *hi) {
    vt_tensor_extent(t, lo, hi);
    if (*lo == *hi) return 0;
    const intptr_t at = (intptr_t)t->data - (intptr_t)buf;
    if (at + *lo < 0 || at + *hi > (intptr_t)sizeof buf) return -1;
    *lo += at, *hi += at;
    return 1;
}

static void mark(const vt_tensor *t, unsigned char *bytes) {
    int64_t idx[VT_MAX_DIMS] = {0};
    const int64_t n = vt_tensor_count(t);
    for (int64_t e = 0; e < n; e++) {
        int64_t off = (int64_t)((intptr_t)t->data - (intptr_t)buf);
        for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
        for (size_t b = 0; b < t->itemsize; b++) bytes[off + (int64_t)b] = 1;
        for (int i = t->ndim - 1; i >= 0 && ++idx[i] == t->shape[i]; i--) idx[i] = 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size, 0};
    vt_dl_tensor dl[2];
    int64_t shape[2][10], strides[2][10];
    vt_tensor t[2];
    char msg[200];
    int ok[2];
    for (int j = 0; j < 2; j++) {
        make(&f, &dl[j], shape[j], strides[j]);
        ok[j] = vt_dl_describe(&dl[j], 0, &t[j], msg, sizeof msg) == 0;
    }
    int64_t lo, hi;
    for (int j = 0; j < 2; j++)
        if (ok[j] && in_buf(&t[j], &lo, &hi) == 1 && vt_tensor_count(&t[j]) <= 4096) {
            volatile unsigned char sink = 0;
            for (int64_t b = lo; b < hi; b++) sink ^= buf[b];
            (void)sink;
        } else {
            ok[j] = 0;
        }
    if (ok[0] && ok[1]) {
        unsigned char a[sizeof buf] = {0}, b[sizeof buf] = {0};
        mark(&t[0], a);
        mark(&t[1], b);
        int brute = 0;
        for (size_t i = 0; i < sizeof buf; i++) brute |= a[i] & b[i];
        if (vt_tensor_share_elements(&t[0], &t[1]) != brute) abort();
    }
    return 0;
}
