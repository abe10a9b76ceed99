/* Signatures from the X-macro tables of vt_signature.h (shared by
 * vtinfer._C and vtinfer._cuda). */
#include "vt_signature.h"

#include <stdio.h>
#include <string.h>

static char *attn_kwlist[] = {VT_ATTN_ARGS(VT_X_NAME) NULL};
static const char *const attn_defaults[] = {VT_ATTN_ARGS(VT_X_DEFAULT) NULL};
static char *attn_cuda_kwlist[] = {VT_ATTN_CUDA_ARGS(VT_X_NAME) NULL};
static const char *const attn_cuda_defaults[] = {VT_ATTN_CUDA_ARGS(VT_X_DEFAULT) NULL};

static char *store_flash_kwlist[] = {VT_STORE_FLASH_ARGS(VT_X_NAME) NULL};
static const char *const store_flash_defaults[] = {VT_STORE_FLASH_ARGS(VT_X_DEFAULT) NULL};
static char *store_x_kwlist[] = {VT_STORE_X_ARGS(VT_X_NAME) NULL};
static const char *const store_x_defaults[] = {VT_STORE_X_ARGS(VT_X_DEFAULT) NULL};
_Static_assert(sizeof attn_cuda_kwlist / sizeof attn_cuda_kwlist[0] <= VT_SIG_MAX_ARGS, "VT_SIG_MAX_ARGS");
_Static_assert(sizeof store_flash_kwlist / sizeof store_flash_kwlist[0] <= VT_SIG_MAX_ARGS, "VT_SIG_MAX_ARGS");
_Static_assert(sizeof(vt_attn_pyargs) == sizeof attn_cuda_kwlist - sizeof(char *), "fields in table order");
_Static_assert(sizeof(vt_store_pyargs) == sizeof store_flash_kwlist - sizeof(char *), "fields in table order");

/* The keyword names as interned str objects, made once under the GIL (the
 * Python side's keyword names are interned as a rule, so a lookup is a
 * pointer compare; other equal strings fall back to a comparison). */
static int intern_names(vt_signature *s) {
    if (s->interned[s->nargs - 1]) return 0;
    for (int i = 0; i < s->nargs; i++)
        if (!s->interned[i] && !(s->interned[i] = PyUnicode_InternFromString(s->kwlist[i]))) return -1;
    return 0;
}

/* The index of keyword `key` in s's table, or -1 (an exception set when the
 * comparison itself failed: -2). */
static int keyword_index(const vt_signature *s, PyObject *key) {
    for (int i = 0; i < s->nargs; i++)
        if (s->interned[i] == key) return i;
    if (!PyUnicode_Check(key)) return -1;
    for (int i = 0; i < s->nargs; i++) {
        int eq = PyUnicode_Compare(key, s->interned[i]);
        if (eq == 0) return i;
        if (eq == -1 && PyErr_Occurred()) return -2;
    }
    return -1;
}

/* args / kw by sig's table into field[0 .. nargs) (borrowed; NULL where not
 * given). The errors are CPython's own wording for such calls. */
int vt_sig_parse(vt_signature *s, PyObject *args, PyObject *kw, PyObject **field) {
    if (intern_names(s) < 0) return -1;
    memset(field, 0, sizeof *field * (size_t)s->nargs);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n > s->npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", s->name, s->npos, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) field[i] = PyTuple_GET_ITEM(args, i);
    if (kw) {
        Py_ssize_t pos = 0;
        PyObject *key, *val;
        while (PyDict_Next(kw, &pos, &key, &val)) {
            int i = keyword_index(s, key);
            if (i == -2) return -1;
            if (i < 0) {
                if (PyUnicode_Check(key))
                    PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %s()", key, s->name);
                else
                    PyErr_Format(PyExc_TypeError, "keywords must be strings");
                return -1;
            }
            if (field[i]) {
                PyErr_Format(PyExc_TypeError, "argument for %s() given by name ('%s') and position (%d)", s->name,
                             s->kwlist[i], i + 1);
                return -1;
            }
            field[i] = val;
        }
    }
    for (int i = 0; i < s->nargs; i++)
        if (!s->defaults[i] && !field[i]) {
            if (i < s->npos)
                PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)", s->name, s->kwlist[i],
                             i + 1);
            else
                PyErr_Format(PyExc_TypeError, "%s: %s is required", s->name, s->kwlist[i]);
            return -1;
        }
    return 0;
}

static vt_signature attn_sig = {"flash_attn_varlen_func", VT_ATTN_NPOS,
                                (int)(sizeof attn_kwlist / sizeof attn_kwlist[0]) - 1, attn_kwlist, attn_defaults,
                                {NULL}};
static vt_signature attn_cuda_sig = {"flash_attn_varlen_func", VT_ATTN_NPOS,
                                     (int)(sizeof attn_cuda_kwlist / sizeof attn_cuda_kwlist[0]) - 1, attn_cuda_kwlist,
                                     attn_cuda_defaults, {NULL}};
static vt_signature store_flash_sig = {"reshape_and_cache_flash", VT_STORE_NPOS,
                                       (int)(sizeof store_flash_kwlist / sizeof store_flash_kwlist[0]) - 1,
                                       store_flash_kwlist, store_flash_defaults, {NULL}};
static vt_signature store_x_sig = {"reshape_and_cache", VT_STORE_NPOS,
                                   (int)(sizeof store_x_kwlist / sizeof store_x_kwlist[0]) - 1, store_x_kwlist,
                                   store_x_defaults, {NULL}};

const vt_signature *vt_attn_signature(int cuda) { return cuda ? &attn_cuda_sig : &attn_sig; }
const vt_signature *vt_store_flash_signature(void) { return &store_flash_sig; }
const vt_signature *vt_store_x_signature(void) { return &store_x_sig; }

int vt_store_pyargs_parse(PyObject *args, PyObject *kw, int xsplit, vt_store_pyargs *a) {
    PyObject *field[VT_SIG_MAX_ARGS];
    memset(a, 0, sizeof *a);
    if (xsplit) { /* reshape_and_cache's table: the common arguments, then num_threads */
        if (vt_sig_parse(&store_x_sig, args, kw, field) < 0) return -1;
        PyObject **dst = (PyObject **)a;
        for (int i = 0; i < VT_STORE_NPOS; i++) dst[i] = field[i];
        a->num_threads = field[VT_STORE_NPOS];
        return 0;
    }
    return vt_sig_parse(&store_flash_sig, args, kw, (PyObject **)a);
}

int vt_attn_pyargs_parse(PyObject *args, PyObject *kw, int cuda, vt_attn_pyargs *a) {
    memset(a, 0, sizeof *a);
    return vt_sig_parse(cuda ? &attn_cuda_sig : &attn_sig, args, kw, (PyObject **)a);
}

void vt_signature_doc_as(const vt_signature *sig, const char *first, const char *summary, char *buf, size_t size) {
    size_t n = first ? (size_t)snprintf(buf, size, "%s(%s, /", sig->name, first)
                     : (size_t)snprintf(buf, size, "%s(", sig->name);
    for (int i = 0; i < sig->nargs && n < size; i++) {
        const char *star = i == sig->npos && sig->npos < sig->nargs ? "*, " : "";
        const char *sep = first || i > 0 ? ", " : "";
        n += (size_t)snprintf(buf + n, size - n, "%s%s%s%s%s", sep, star, sig->kwlist[i], sig->defaults[i] ? "=" : "",
                              sig->defaults[i] ? sig->defaults[i] : "");
    }
    if (n < size) snprintf(buf + n, size - n, ")\n--\n\n%s", summary);
}

void vt_signature_doc(const vt_signature *sig, const char *summary, char *buf, size_t size) {
    vt_signature_doc_as(sig, "$module", summary, buf, size);
}
