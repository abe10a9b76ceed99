/* vtinfer public C API: a small JSON reader (RFC 8259) with Python's `json`
 * semantics where the RFC is silent.
 *
 * - Input must be valid UTF-8 (no BOM); invalid bytes are errors.
 * - A repeated key keeps its first position and its last value (a Python
 *   dict built by json.loads).
 * - Numbers keep int vs float: "8" is VT_JSON_INT, "8.0" and "8e0" are
 *   VT_JSON_FLOAT; vt_json_num_eq compares them as Python's == does.
 *   Integers beyond int64 are kept as VT_JSON_INT with `big` set (their
 *   text in `str`); they equal no small integer.
 * - NaN, Infinity and -Infinity are accepted, as Python's json.loads does;
 *   floats that overflow become +-inf (as float() does).
 * - \u escapes of lone surrogates are kept as 3-byte sequences (as Python
 *   keeps lone surrogates in str).
 * - Limits: documents over max_bytes and nesting over max_depth are
 *   errors, never crashes. Errors carry the file name, line and column.
 * C11 + libc only. */
#ifndef VTINFER_JSON_H
#define VTINFER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "vtinfer/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vt_json_kind {
    VT_JSON_NULL = 0,
    VT_JSON_FALSE = 1,
    VT_JSON_TRUE = 2,
    VT_JSON_INT = 3,
    VT_JSON_FLOAT = 4,
    VT_JSON_STRING = 5,
    VT_JSON_ARRAY = 6,
    VT_JSON_OBJECT = 7
} vt_json_kind;

typedef struct vt_json vt_json;

typedef struct vt_json_member {
    const char *key; /* UTF-8, NUL-terminated (may contain NUL: use key_len) */
    size_t key_len;
    vt_json *value;
} vt_json_member;

struct vt_json {
    vt_json_kind kind;
    int big;           /* VT_JSON_INT beyond int64: the value is only in str */
    int64_t i;         /* VT_JSON_INT */
    double f;          /* VT_JSON_FLOAT */
    const char *str;   /* VT_JSON_STRING (NUL-terminated, may hold NUL), or a number's text */
    size_t len;        /* bytes of str */
    vt_json **items;   /* VT_JSON_ARRAY: count items */
    vt_json_member *members; /* VT_JSON_OBJECT: count members, keys unique */
    size_t count;
};

typedef struct vt_json_doc vt_json_doc;

/* Limits; zero fields take the defaults. */
typedef struct vt_json_limits {
    size_t max_bytes; /* default 64 MiB */
    int max_depth;    /* default 512 (Python's json raises RecursionError near 1000) */
} vt_json_limits;

#define VT_JSON_DEFAULT_MAX_BYTES ((size_t)64 << 20)
#define VT_JSON_DEFAULT_MAX_DEPTH 512

/* Parse `len` bytes of `text` (need not be NUL-terminated). `name` (may be
 * NULL: "<string>") names the document in error messages. `limits` may be
 * NULL. On success *out owns the tree (free with vt_json_free).
 * Returns VT_OK; VT_ERR_PARSE with "<name>:<line>:<col>: ..." for malformed
 * text, bad UTF-8, nesting over max_depth or a document over max_bytes;
 * VT_ERR_NOMEM; VT_ERR_VALUE for NULL arguments. Nothing is stored in *out
 * on failure (it is set to NULL). */
VT_API vt_status vt_json_parse(const char *text, size_t len, const char *name, const vt_json_limits *limits,
                               vt_json_doc **out, vt_error *err);

/* Read and parse the file at `path` (VT_ERR_IO when it cannot be read,
 * VT_ERR_PARSE when it is larger than max_bytes or malformed). */
VT_API vt_status vt_json_parse_file(const char *path, const vt_json_limits *limits, vt_json_doc **out,
                                    vt_error *err);

/* Free a document (NULL is fine). Every vt_json of it becomes invalid. */
VT_API void vt_json_free(vt_json_doc *doc);

/* The root value (never NULL for a parsed document). */
VT_API vt_json *vt_json_root(const vt_json_doc *doc);

/* Member `key` of an object, or NULL when obj is not an object or has no
 * such key (Python's dict.get). */
VT_API vt_json *vt_json_get(const vt_json *obj, const char *key);

/* Set member `key` of object `obj` (owned by `doc`) to a new string value
 * (copied into the document), replacing an existing member in place or
 * appending one (as a Python dict assignment). Returns VT_OK, VT_ERR_TYPE
 * when obj is not an object, VT_ERR_NOMEM. */
VT_API vt_status vt_json_set_string(vt_json_doc *doc, vt_json *obj, const char *key, const char *value,
                                    size_t value_len, vt_error *err);

/* Python truthiness: null, false, 0, 0.0, "", [] and {} are false. */
VT_API int vt_json_truthy(const vt_json *v);

/* 1 when v is a number (int or float, never a bool) equal to `x` as
 * Python's == compares them (8.0 == 8). */
VT_API int vt_json_num_eq(const vt_json *v, int64_t x);

/* 1 when v is a string equal to the NUL-terminated `s`. */
VT_API int vt_json_str_eq(const vt_json *v, const char *s);

/* Write Python's repr() of v (str(dict) as logged by vLLM) into buf of
 * cap bytes, NUL-terminated, truncated with "..." when it does not fit.
 * Returns the bytes written (without the NUL). */
VT_API size_t vt_json_repr(const vt_json *v, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* VTINFER_JSON_H */
