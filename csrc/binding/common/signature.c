/* Signatures from the X-macro tables of vt_signature.h (shared by
 * vtinfer._C and vtinfer._cuda). */
#include "vt_signature.h"

#include <stdio.h>
#include <string.h>

#define VT_X_NAME(name, dflt) #name,
#define VT_X_DEFAULT(name, dflt) dflt,
#define VT_X_ADDR(name, dflt) , &a->name

static char *attn_kwlist[] = {VT_ATTN_ARGS(VT_X_NAME) NULL};
static const char *const attn_defaults[] = {VT_ATTN_ARGS(VT_X_DEFAULT) NULL};
static char *attn_cuda_kwlist[] = {VT_ATTN_CUDA_ARGS(VT_X_NAME) NULL};
static const char *const attn_cuda_defaults[] = {VT_ATTN_CUDA_ARGS(VT_X_DEFAULT) NULL};

static char *store_flash_kwlist[] = {VT_STORE_FLASH_ARGS(VT_X_NAME) NULL};
static const char *const store_flash_defaults[] = {VT_STORE_FLASH_ARGS(VT_X_DEFAULT) NULL};
static char *store_x_kwlist[] = {VT_STORE_X_ARGS(VT_X_NAME) NULL};
static const char *const store_x_defaults[] = {VT_STORE_X_ARGS(VT_X_DEFAULT) NULL};

static void fill_format(vt_signature *s) {
    size_t n = 0;
    for (int i = 0; i < s->nargs && n + 4 < sizeof s->format; i++) {
        if (i == s->npos) {
            s->format[n++] = '|';
            s->format[n++] = '$';
        }
        s->format[n++] = 'O';
    }
    snprintf(s->format + n, sizeof s->format - n, ":%s", s->name);
}

const vt_signature *vt_attn_signature(int cuda) {
    static vt_signature sig = {"flash_attn_varlen_func", VT_ATTN_NPOS,
                               (int)(sizeof attn_kwlist / sizeof attn_kwlist[0]) - 1, attn_kwlist, attn_defaults, ""};
    static vt_signature cuda_sig = {"flash_attn_varlen_func", VT_ATTN_NPOS,
                                    (int)(sizeof attn_cuda_kwlist / sizeof attn_cuda_kwlist[0]) - 1,
                                    attn_cuda_kwlist, attn_cuda_defaults, ""};
    vt_signature *s = cuda ? &cuda_sig : &sig;
    if (!s->format[0]) fill_format(s); /* idempotent: the same bytes whoever writes them */
    return s;
}

const vt_signature *vt_store_flash_signature(void) {
    static vt_signature sig = {"reshape_and_cache_flash", VT_STORE_NPOS,
                               (int)(sizeof store_flash_kwlist / sizeof store_flash_kwlist[0]) - 1,
                               store_flash_kwlist, store_flash_defaults, ""};
    if (!sig.format[0]) fill_format(&sig);
    return &sig;
}

const vt_signature *vt_store_x_signature(void) {
    static vt_signature sig = {"reshape_and_cache", VT_STORE_NPOS,
                               (int)(sizeof store_x_kwlist / sizeof store_x_kwlist[0]) - 1, store_x_kwlist,
                               store_x_defaults, ""};
    if (!sig.format[0]) fill_format(&sig);
    return &sig;
}

int vt_store_pyargs_parse(PyObject *args, PyObject *kw, int xsplit, vt_store_pyargs *a) {
    memset(a, 0, sizeof *a);
    if (xsplit) {
        const vt_signature *sig = vt_store_x_signature();
#define VT_X_ADDR_X(name, dflt) , &a->name
        return PyArg_ParseTupleAndKeywords(args, kw, sig->format, (char **)sig->kwlist VT_STORE_X_ARGS(VT_X_ADDR_X))
                   ? 0
                   : -1;
#undef VT_X_ADDR_X
    }
    const vt_signature *sig = vt_store_flash_signature();
    return PyArg_ParseTupleAndKeywords(args, kw, sig->format, (char **)sig->kwlist VT_STORE_FLASH_ARGS(VT_X_ADDR))
               ? 0
               : -1;
}

int vt_attn_pyargs_parse(PyObject *args, PyObject *kw, int cuda, vt_attn_pyargs *a) {
    const vt_signature *sig = vt_attn_signature(cuda);
    memset(a, 0, sizeof *a);
    /* the CPU's format has one O fewer: validate's address is never written */
    if (!PyArg_ParseTupleAndKeywords(args, kw, sig->format, (char **)sig->kwlist VT_ATTN_CUDA_ARGS(VT_X_ADDR)))
        return -1;
    PyObject **field = (PyObject **)a;
    for (int i = sig->npos; i < sig->nargs; i++)
        if (!sig->defaults[i] && !field[i]) {
            PyErr_Format(PyExc_TypeError, "%s: %s is required", sig->name, sig->kwlist[i]);
            return -1;
        }
    return 0;
}

void vt_signature_doc(const vt_signature *sig, const char *summary, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "%s($module, /", sig->name);
    for (int i = 0; i < sig->nargs && n < size; i++) {
        const char *star = i == sig->npos && sig->npos < sig->nargs ? ", *" : "";
        n += (size_t)snprintf(buf + n, size - n, "%s, %s%s%s", star, sig->kwlist[i], sig->defaults[i] ? "=" : "",
                              sig->defaults[i] ? sig->defaults[i] : "");
    }
    if (n < size) snprintf(buf + n, size - n, ")\n--\n\n%s", summary);
}
