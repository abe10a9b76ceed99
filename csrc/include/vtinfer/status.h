/* vtinfer public C API: status codes and the caller-owned error record.
 *
 * Every fallible vtinfer function returns a vt_status (VT_OK == 0, errors
 * negative) and, when given a non-NULL vt_error, fills it with a message of
 * the form "<function>: <argument> must <expectation>; got <actual>".
 * Values are stable and only ever appended. C11 + libc only. */
#ifndef VTINFER_STATUS_H
#define VTINFER_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define VT_API
#else
#define VT_API __attribute__((visibility("default")))
#endif

typedef enum vt_status {
    VT_OK = 0,
    VT_ERR_VALUE = -1,       /* bad value or shape          -> ValueError */
    VT_ERR_TYPE = -2,        /* bad dtype or kind           -> TypeError */
    VT_ERR_INDEX = -3,       /* slot/block/layer range      -> IndexError */
    VT_ERR_NOMEM = -4,       /* allocation failed           -> MemoryError */
    VT_ERR_UNSUPPORTED = -5, /* build/CPU lacks a feature   -> NotImplementedError */
    VT_ERR_OVERFLOW = -6,    /* a size overflows 64 bits    -> ValueError */
    VT_ERR_IO = -7,          /* a file could not be read    -> OSError */
    VT_ERR_PARSE = -8,       /* malformed document          -> vtinfer.ConfigError */
    VT_ERR_BUFFER = -9,      /* storage pinned by a view    -> BufferError */
    VT_ERR_INTERNAL = -10    /* a vtinfer bug               -> vtinfer.VtinferError */
} vt_status;

#define VT_ERROR_MESSAGE_MAX 512

/* Caller-owned error record. `status` mirrors the returned status. */
typedef struct vt_error {
    vt_status status;
    char message[VT_ERROR_MESSAGE_MAX];
} vt_error;

/* Reset `err` (may be NULL) to VT_OK with an empty message. */
VT_API void vt_error_clear(vt_error *err);

/* Record `status` and a printf-style message in `err` (may be NULL: then
 * only the status is returned). Returns `status` so that callers can write
 * `return vt_error_set(err, VT_ERR_VALUE, "...")`. The message is truncated
 * to VT_ERROR_MESSAGE_MAX - 1 bytes. */
VT_API vt_status vt_error_set(vt_error *err, vt_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Stable name of a status ("VT_ERR_VALUE"); "VT_UNKNOWN" for other values. */
VT_API const char *vt_status_name(vt_status status);

/* a * b and a + b on sizes; return 0 and store the result, or return -1 on
 * overflow (nothing stored). */
VT_API int vt_size_mul(size_t a, size_t b, size_t *out);
VT_API int vt_size_add(size_t a, size_t b, size_t *out);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_STATUS_H */
