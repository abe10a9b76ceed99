/* vt_tensor without an interpreter: DLPack validation, byte extents,
 * contiguity and the exact shared-element test (vt_tensor.h). C11, no
 * Python.h: tests/fuzz/fuzz_dlpack.c drives vt_dl_describe directly. */
#include "vt_tensor.h"

#include <stdio.h>
#include <string.h>

const char *vt_elem_name(vt_elem e) {
    /* the elements up to e5m2 are dtype rows; the others (U8, I32, ..) are not, whatever the table's length */
    const vt_dtype_info *d = (int)e >= 0 && e <= VT_ELEM_E5M2 ? vt_dtype_get((int)e) : NULL;
    if (d) return d->numpy_name;
    switch (e) {
    case VT_ELEM_U8: return "uint8";
    case VT_ELEM_I8: return "int8";
    case VT_ELEM_I32: return "int32";
    case VT_ELEM_I64: return "int64";
    case VT_ELEM_F64: return "float64";
    default: return "other";
    }
}

int vt_elem_holds_codes(int dtype, vt_elem e, char *what, size_t cap) {
    const vt_dtype_info *di = vt_dtype_get(dtype);
    if (di->elem_bits < 8) { /* 2, 4 or 8 codes per byte */
        static const char *const count[] = {"", "", "two", "", "four", "", "", "", "eight"};
        snprintf(what, cap, "uint8 (%s %d-bit)", count[8 / di->elem_bits], di->elem_bits);
        return e == VT_ELEM_U8;
    }
    if (di->is_int) {
        snprintf(what, cap, "int8");
        return e == VT_ELEM_I8;
    }
    if (di->code_dtype < 0) { /* codes with no float type of their own: bytes */
        snprintf(what, cap, "uint8");
        return e == VT_ELEM_U8;
    }
    snprintf(what, cap, "uint8 or %s", vt_dtype_get(di->code_dtype)->numpy_name);
    return e == VT_ELEM_U8 || (int)e == di->code_dtype;
}

int64_t vt_cache_row_elems(int dtype, int64_t head_size) {
    if (dtype < 0) return head_size;
    const vt_dtype_info *di = vt_dtype_get(dtype);
    return (int64_t)vt_dtype_row_bytes(dtype, (size_t)head_size) / (int64_t)di->elem_bytes;
}

const char *vt_cache_row_words(int dtype, char *d, size_t cap) {
    const int bits = dtype < 0 ? 8 : vt_dtype_get(dtype)->elem_bits;
    if (bits < 8) snprintf(d, cap, "D / %d", 8 / bits);
    else snprintf(d, cap, "D");
    return d;
}

vt_elem vt_elem_from_dl(vt_dl_dtype d) {
    if (d.lanes != 1) return VT_ELEM_OTHER;
    switch (d.code * 256 + d.bits) {
    case VT_DL_FLOAT * 256 + 32: return VT_ELEM_F32;
    case VT_DL_FLOAT * 256 + 16: return VT_ELEM_F16;
    case VT_DL_FLOAT * 256 + 64: return VT_ELEM_F64;
    case VT_DL_BFLOAT * 256 + 16: return VT_ELEM_BF16;
    case VT_DL_UINT * 256 + 8: return VT_ELEM_U8;
    case VT_DL_INT * 256 + 8: return VT_ELEM_I8;
    case VT_DL_INT * 256 + 32: return VT_ELEM_I32;
    case VT_DL_INT * 256 + 64: return VT_ELEM_I64;
    case VT_DL_FLOAT8_E4M3FN * 256 + 8: return VT_ELEM_E4M3;
    case VT_DL_FLOAT8_E5M2 * 256 + 8: return VT_ELEM_E5M2;
    default: return VT_ELEM_OTHER;
    }
}

/* Highest user-space address any 64-bit platform vtinfer runs on hands
 * out (x86-64 with 5-level paging: 2^56; arm64: 2^52); an end beyond it
 * comes from a corrupt byte_offset or pointer, not from memory. */
#if UINTPTR_MAX > 0xffffffffu
#define VT_ADDRESS_LIMIT ((uintptr_t)1 << 57)
#else
#define VT_ADDRESS_LIMIT UINTPTR_MAX
#endif

#define FAIL(...) (snprintf(msg, msg_size, __VA_ARGS__), -1)

/* Byte strides, element count and byte extent [lo, hi) of dl's shape
 * relative to the first element; 0 or -1 (msg). */
static int dl_geometry(const vt_dl_tensor *dl, vt_tensor *t, int *empty, int64_t *lo_out, int64_t *hi_out, char *msg,
                       size_t msg_size) {
    const int64_t es = (int64_t)t->itemsize;
    int64_t compact = 1, count = 1, lo = 0, hi = 0;
    *empty = 0;
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] < 0) return FAIL("must have sizes >= 0; got shape[%d] = %lld", i, (long long)dl->shape[i]);
        if (dl->shape[i] == 0) *empty = 1;
    }
    for (int i = dl->ndim - 1; i >= 0; i--) {
        const int64_t dim = dl->shape[i];
        int64_t stride = dl->strides ? dl->strides[i] : compact, bytes, span;
        if (__builtin_mul_overflow(stride, es, &bytes) ||
            (!dl->strides && __builtin_mul_overflow(compact, dim > 0 ? dim : 1, &compact)) ||
            __builtin_mul_overflow(count, dim, &count))
            return FAIL("must have a shape and strides whose byte sizes fit in 64 bits");
        t->shape[i] = dim;
        t->strides[i] = bytes;
        if (*empty) continue;
        if (__builtin_mul_overflow(dim - 1, bytes, &span) ||
            (span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi)))
            return FAIL("must have a shape and strides whose byte sizes fit in 64 bits");
    }
    if (!*empty && (__builtin_add_overflow(hi, es, &hi) || __builtin_mul_overflow(count, es, &count)))
        return FAIL("must have a shape and strides whose byte sizes fit in 64 bits");
    *lo_out = *empty ? 0 : lo;
    *hi_out = *empty ? 0 : hi;
    return 0;
}

int vt_dl_describe(const vt_dl_tensor *dl, int readonly, vt_tensor *t, char *msg, size_t msg_size) {
    memset(t, 0, sizeof *t);
    if (dl->ndim < 0 || dl->ndim > VT_MAX_DIMS)
        return FAIL("must have at most %d dimensions; got %d", VT_MAX_DIMS, (int)dl->ndim);
    if (dl->ndim > 0 && !dl->shape) return FAIL("must describe its shape; got a NULL shape pointer");
    if (dl->dtype.lanes != 1) return FAIL("must have one lane per element; got lanes = %u", (unsigned)dl->dtype.lanes);
    if (dl->dtype.bits == 0 || dl->dtype.bits % 8)
        return FAIL("must have whole bytes per element; got %u bits", (unsigned)dl->dtype.bits);
    if (dl->byte_offset > (uint64_t)INT64_MAX)
        return FAIL("must have a byte_offset below 2^63; got %llu", (unsigned long long)dl->byte_offset);
    t->itemsize = dl->dtype.bits / 8u;
    t->elem = vt_elem_from_dl(dl->dtype);
    t->ndim = dl->ndim;
    int empty;
    int64_t lo, hi;
    if (dl_geometry(dl, t, &empty, &lo, &hi, msg, msg_size) < 0) return -1;
    if (!empty) {
        /* data + byte_offset + [lo, hi) must lie inside the address space. */
        const uintptr_t base = (uintptr_t)dl->data;
        uintptr_t first;
        if (!dl->data) return FAIL("must have a data pointer; got NULL for a tensor with elements");
        if (__builtin_add_overflow(base, (uintptr_t)dl->byte_offset, &first) || (uintptr_t)0 - (uintptr_t)lo > first ||
            (uintptr_t)hi > VT_ADDRESS_LIMIT || first > VT_ADDRESS_LIMIT - (uintptr_t)hi)
            return FAIL("must lie inside the address space (below 2^57); got data %p + byte_offset %llu beyond it", dl->data,
                        (unsigned long long)dl->byte_offset);
        t->data = (void *)first;
    } else {
        t->data = dl->data; /* no element is ever read: the offset does not matter */
    }
    t->readonly = readonly;
    t->device_type = dl->device.device_type;
    t->device_id = dl->device.device_id;
    if (t->elem == VT_ELEM_OTHER)
        snprintf(t->dtype_name, sizeof t->dtype_name, "DLPack(code=%u, bits=%u, lanes=%u)", dl->dtype.code,
                 dl->dtype.bits, dl->dtype.lanes);
    else
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", vt_elem_name(t->elem));
    return 0;
}

/* 1 when some dimension is 0: then the other sizes may be anything a
 * DLPack producer claims, and no product over them is formed. */
static int has_no_element(const vt_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return 1;
    return 0;
}

int64_t vt_tensor_count(const vt_tensor *t) {
    if (has_no_element(t)) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i]; /* import bounded it */
    return n;
}

void vt_tensor_extent(const vt_tensor *t, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = (int64_t)t->itemsize;
    if (has_no_element(t)) {
        *lo = *hi = 0;
        return;
    }
    for (int i = 0; i < t->ndim; i++) {
        int64_t span = (t->shape[i] - 1) * t->strides[i];
        if (span < 0) *lo += span;
        else *hi += span;
    }
}



int vt_tensor_self_overlaps(const vt_tensor *t) {
    if (has_no_element(t)) return 0;
    int64_t st[VT_MAX_DIMS], sz[VT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] <= 1) continue;
        int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        int j = n++;
        while (j > 0 && st[j - 1] > s) { /* insertion sort by |stride| */
            st[j] = st[j - 1];
            sz[j] = sz[j - 1];
            j--;
        }
        st[j] = s;
        sz[j] = t->shape[i];
    }
    int64_t span = (int64_t)t->itemsize; /* bytes covered by the dimensions taken so far */
    for (int i = 0; i < n; i++) {
        if (st[i] < span) return 1;
        span = st[i] * (sz[i] - 1) + span; /* within the extent checked at import */
    }
    return 0;
}

int vt_tensor_is_contiguous(const vt_tensor *t) {
    if (has_no_element(t)) return 1;
    int64_t expect = (int64_t)t->itemsize;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return 0;
        expect *= t->shape[i];
    }
    return 1;
}

int vt_tensor_last_dim_contiguous(const vt_tensor *t) {
    if (vt_tensor_count(t) == 0) return 1; /* no element: any stride is fine (NumPy/DLPack may report 0) */
    return t->ndim == 0 || t->shape[t->ndim - 1] <= 1 || t->strides[t->ndim - 1] == (int64_t)t->itemsize;
}

/* ---- shared elements ----
 *
 * A box is a strided set of elements: base + sum_k i_k * stride_k for
 * 0 <= i_k < n_k, each element `itemsize` bytes, with strides made
 * positive and size-1 / stride-0 dims dropped. Two boxes share a byte iff
 * their extents intersect and, after splitting the wider one in two along
 * its widest dim, one of the halves shares a byte with the other box; two
 * single elements share a byte iff their extents intersect. */
typedef struct box {
    int64_t base, itemsize;
    int nd;
    int64_t n[VT_MAX_DIMS], s[VT_MAX_DIMS];
} box;

static int64_t box_hi(const box *b) {
    int64_t hi = b->base + b->itemsize;
    for (int i = 0; i < b->nd; i++) hi += (b->n[i] - 1) * b->s[i];
    return hi;
}

/* 0: disjoint, 1: share a byte, 2: budget exhausted (treated as 1). */
static int box_share(const box *a, const box *b, int64_t *budget) {
    const int64_t ahi = box_hi(a), bhi = box_hi(b);
    if (ahi <= b->base || bhi <= a->base) return 0;
    if (a->nd == 0 && b->nd == 0) return 1;
    if (--*budget < 0) return 2;
    /* split the box with the wider extent (one with dims left) along its widest dim */
    const box *w = (b->nd == 0 || (a->nd > 0 && ahi - a->base >= bhi - b->base)) ? a : b;
    const box *other = w == a ? b : a;
    int k = 0;
    for (int i = 1; i < w->nd; i++)
        if ((w->n[i] - 1) * w->s[i] > (w->n[k] - 1) * w->s[k]) k = i;
    box lo = *w, hi = *w;
    const int64_t half = w->n[k] / 2;
    lo.n[k] = half;
    hi.n[k] = w->n[k] - half;
    hi.base += half * w->s[k];
    box *parts[2] = {&lo, &hi};
    for (int p = 0; p < 2; p++) {
        box *x = parts[p];
        if (x->n[k] == 1) { /* drop the dim */
            x->n[k] = x->n[x->nd - 1];
            x->s[k] = x->s[x->nd - 1];
            x->nd--;
        }
        int r = box_share(x, other, budget);
        if (r) return r;
    }
    return 0;
}

static void box_from(const vt_tensor *t, int64_t base, box *b) {
    b->base = base;
    b->itemsize = (int64_t)t->itemsize;
    b->nd = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t n = t->shape[i], s = t->strides[i];
        if (n <= 1 || s == 0) continue;
        if (s < 0) {
            b->base += (n - 1) * s;
            s = -s;
        }
        b->n[b->nd] = n;
        b->s[b->nd++] = s;
    }
}

/* Exact answer for two views whose coarsest dims are one layout (the same
 * sizes and strides, sorted by stride) and nest: each shared stride S_i is at
 * least R_i + max(T_a, T_b), where R_i = sum over the finer shared dims of
 * (n_j - 1) S_j and T_x is the byte extent of view x's remaining (tail)
 * dims. kv[:, 0] / kv[:, 1] are such views (empty tails), and so are vLLM's
 * per-token-head code rows (tail: the head_size bytes) and their float32
 * scales (tail: one element) in one page. With d = b.base - a.base, a's
 * elements are sum i_j S_j + tail_a and b's d + sum i'_j S_j + tail_b; they
 * share a byte iff for some c_j = i_j - i'_j (|c_j| < n_j) tail_a and tail_b
 * moved by d - sum c_j S_j share one. Coarsest dim first, nesting leaves at
 * most two c_j per dim, so the search is O(2^dims) tail tests whatever the
 * sizes (the box splitting below is O(rows) for interleaved views). Returns
 * 0 disjoint, 1 shared, -1 when the views' coarsest dims are not one nested
 * layout (the caller falls back). */
static int64_t div_floor(int64_t x, int64_t y) { return x / y - (x % y != 0 && x < 0); }

typedef struct nest {
    int k;                                      /* shared dims, coarsest first */
    int64_t S[VT_MAX_DIMS], m[VT_MAX_DIMS], R[VT_MAX_DIMS];
    box ta, tb;                                 /* the tails, based at 0 */
    int64_t Ta, Tb;                             /* their byte extents */
    int64_t budget;
} nest;

static int nested_share(nest *q, int i, int64_t d) {
    if (i == q->k) {
        box b = q->tb;
        b.base = d;
        return box_share(&q->ta, &b, &q->budget) != 0;
    }
    const int64_t S = q->S[i], m = q->m[i];
    /* c S in the open interval (d - T_a - R_i, d + T_b + R_i) */
    int64_t lo = div_floor(d - q->Ta - q->R[i], S) + 1, hi = -div_floor(-(d + q->Tb + q->R[i]), S) - 1;
    if (lo < -m) lo = -m;
    if (hi > m) hi = m;
    for (int64_t c = lo; c <= hi; c++)
        if (nested_share(q, i + 1, d - c * S)) return 1;
    return 0;
}

static void box_sort(box *b) { /* dims by stride, largest first */
    for (int i = 1; i < b->nd; i++)
        for (int j = i; j > 0 && b->s[j - 1] < b->s[j]; j--) {
            int64_t t = b->s[j]; b->s[j] = b->s[j - 1]; b->s[j - 1] = t;
            t = b->n[j]; b->n[j] = b->n[j - 1]; b->n[j - 1] = t;
        }
}

static void box_tail(const box *x, int k, box *t) { /* dims k.. of x, based at 0 */
    t->base = 0;
    t->itemsize = x->itemsize;
    t->nd = x->nd - k;
    for (int i = 0; i < t->nd; i++) {
        t->n[i] = x->n[k + i];
        t->s[i] = x->s[k + i];
    }
}

static int nested_layout_share(box a, box b) {
    box_sort(&a);
    box_sort(&b);
    nest q;
    q.k = 0;
    while (q.k < a.nd && q.k < b.nd && a.n[q.k] == b.n[q.k] && a.s[q.k] == b.s[q.k]) q.k++;
    if (q.k == 0) return -1;
    box_tail(&a, q.k, &q.ta);
    box_tail(&b, q.k, &q.tb);
    q.Ta = box_hi(&q.ta);
    q.Tb = box_hi(&q.tb);
    const int64_t T = q.Ta > q.Tb ? q.Ta : q.Tb;
    int64_t span = 0; /* sum over the finer shared dims of (n_j - 1) S_j */
    for (int i = q.k - 1; i >= 0; i--) {
        q.S[i] = a.s[i];
        q.m[i] = a.n[i] - 1;
        q.R[i] = span;
        if (q.S[i] < span + T) return -1; /* not nested */
        span += q.m[i] * q.S[i];
    }
    q.budget = (int64_t)1 << 22;
    return nested_share(&q, 0, b.base - a.base);
}

int vt_tensor_share_elements(const vt_tensor *a, const vt_tensor *b) {
    if (vt_tensor_count(a) == 0 || vt_tensor_count(b) == 0) return 0;
    if (!a->data || !b->data) return 0;
    box x, y;
    box_from(a, 0, &x);
    box_from(b, (int64_t)((uintptr_t)b->data - (uintptr_t)a->data), &y);
    if (box_hi(&x) <= y.base || box_hi(&y) <= x.base) return 0; /* disjoint extents: the common case */
    const int nested = nested_layout_share(x, y);
    if (nested >= 0) return nested;
    int64_t budget = (int64_t)1 << 22;
    return box_share(&x, &y, &budget) != 0;
}
