/* Status names, the error record and overflow-checked size arithmetic. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "vtinfer/status.h"

void vt_error_clear(vt_error *err) {
    if (err) {
        err->status = VT_OK;
        err->message[0] = '\0';
    }
}

vt_status vt_error_set(vt_error *err, vt_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = status;
        if (vsnprintf(err->message, sizeof err->message, fmt, ap) < 0) err->message[0] = '\0';
        va_end(ap);
    }
    return status;
}

const char *vt_status_name(vt_status status) {
    switch (status) {
    case VT_OK: return "VT_OK";
    case VT_ERR_VALUE: return "VT_ERR_VALUE";
    case VT_ERR_TYPE: return "VT_ERR_TYPE";
    case VT_ERR_INDEX: return "VT_ERR_INDEX";
    case VT_ERR_NOMEM: return "VT_ERR_NOMEM";
    case VT_ERR_UNSUPPORTED: return "VT_ERR_UNSUPPORTED";
    case VT_ERR_OVERFLOW: return "VT_ERR_OVERFLOW";
    case VT_ERR_IO: return "VT_ERR_IO";
    case VT_ERR_PARSE: return "VT_ERR_PARSE";
    case VT_ERR_BUFFER: return "VT_ERR_BUFFER";
    case VT_ERR_INTERNAL: return "VT_ERR_INTERNAL";
    }
    return "VT_UNKNOWN";
}

int vt_size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return -1;
    *out = a * b;
    return 0;
}

int vt_size_add(size_t a, size_t b, size_t *out) {
    if (b > SIZE_MAX - a) return -1;
    *out = a + b;
    return 0;
}
