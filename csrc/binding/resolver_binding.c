/* Python surface of the JSON reader and the resolver:
 *
 *   _C.json_loads(text: bytes, name: str | None = None, *, max_depth=0, max_bytes=0) -> object
 *   _C.resolve_kv_cache_dtype(kv_cache_dtype: str, config: bytes | str,
 *                             hf_quant_config: bytes | str | None = None, *, layers=True) -> dict
 *   _C.vllm_kv_cache_dtypes() -> tuple[str, ...]
 *   _C.vllm_kv_cache_dtypes_unstored() -> dict[str, str]
 *
 * `config` / `hf_quant_config` are document text (bytes) or a file path
 * (str); a path for hf_quant_config is read only when vLLM would read it
 * (config.json's quantization_config missing or null). */
#include "vt_binding.h"
#include "vt_signature.h"

#include <string.h>

#include "vtinfer/json.h"
#include "vtinfer/resolver.h"

VT_SIGNATURE(json_loads_sig, "json_loads", VT_JSON_LOADS_NPOS, VT_JSON_LOADS_ARGS);
VT_SIGNATURE(resolve_sig, "resolve_kv_cache_dtype", VT_RESOLVE_NPOS, VT_RESOLVE_ARGS);

/* A big JSON integer as a Python int. Python refuses to convert integers
 * longer than sys.get_int_max_str_digits() (as json.loads does); the
 * refusal becomes a ConfigError naming the document. */
static PyObject *big_int(const vt_json *v, const char *doc, vt_module_state *st) {
    PyObject *r = PyLong_FromString(v->str, NULL, 10);
    if (r || !PyErr_ExceptionMatches(PyExc_ValueError)) return r;
    PyErr_Clear();
    PyErr_Format(st && st->ConfigError ? st->ConfigError : PyExc_ValueError,
                 "%s: an integer must have at most sys.get_int_max_str_digits() digits to become a Python int (as "
                 "json.loads requires); got one of %zu characters starting %.20s",
                 doc ? doc : "<document>", strlen(v->str), v->str);
    return NULL;
}

static PyObject *to_py(const vt_json *v, const char *doc, vt_module_state *st) {
    switch (v->kind) {
    case VT_JSON_NULL: Py_RETURN_NONE;
    case VT_JSON_FALSE: Py_RETURN_FALSE;
    case VT_JSON_TRUE: Py_RETURN_TRUE;
    case VT_JSON_INT:
        if (v->big) return big_int(v, doc, st);
        return PyLong_FromLongLong((long long)v->i);
    case VT_JSON_FLOAT: return PyFloat_FromDouble(v->f);
    case VT_JSON_STRING: return PyUnicode_DecodeUTF8(v->str, (Py_ssize_t)v->len, "surrogatepass");
    case VT_JSON_ARRAY: {
        PyObject *l = PyList_New((Py_ssize_t)v->count);
        if (!l) return NULL;
        for (size_t i = 0; i < v->count; i++) {
            PyObject *x = to_py(v->items[i], doc, st);
            if (!x) {
                Py_DECREF(l);
                return NULL;
            }
            PyList_SET_ITEM(l, (Py_ssize_t)i, x);
        }
        return l;
    }
    case VT_JSON_OBJECT: {
        PyObject *d = PyDict_New();
        if (!d) return NULL;
        for (size_t i = 0; i < v->count; i++) {
            PyObject *k = PyUnicode_DecodeUTF8(v->members[i].key, (Py_ssize_t)v->members[i].key_len, "surrogatepass");
            PyObject *x = k ? to_py(v->members[i].value, doc, st) : NULL;
            if (!x || PyDict_SetItem(d, k, x) < 0) {
                Py_XDECREF(k);
                Py_XDECREF(x);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(x);
        }
        return d;
    }
    }
    PyErr_SetString(PyExc_SystemError, "vtinfer: unknown JSON kind");
    return NULL;
}

/* Parse `obj` (bytes: text; str / os.PathLike: a path). */
static int load_doc(vt_module_state *st, PyObject *obj, const char *fn, const char *arg, const char *name,
                    const vt_json_limits *lim, vt_json_doc **out) {
    vt_error err;
    vt_error_clear(&err);
    vt_status s;
    *out = NULL;
    if (PyBytes_Check(obj)) {
        const char *buf = PyBytes_AS_STRING(obj);
        size_t n = (size_t)PyBytes_GET_SIZE(obj);
        Py_BEGIN_ALLOW_THREADS s = vt_json_parse(buf, n, name, lim, out, &err);
        Py_END_ALLOW_THREADS
    } else {
        PyObject *path = NULL;
        if (!PyUnicode_FSConverter(obj, &path)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s: %s must be bytes (document text) or a path; got %s", fn, arg,
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
        const char *p = PyBytes_AS_STRING(path);
        Py_BEGIN_ALLOW_THREADS s = vt_json_parse_file(p, lim, out, &err);
        Py_END_ALLOW_THREADS
        Py_DECREF(path);
    }
    if (s != VT_OK) {
        vt_raise(st, &err);
        return -1;
    }
    return 0;
}

static PyObject *py_json_loads(PyObject *m, PyObject *args, PyObject *kw) {
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&json_loads_sig, args, kw, a) < 0) return NULL;
    PyObject *text = a[0];
    const char *name = NULL;
    int64_t max_depth = 0, max_bytes = 0;
    if (a[1] && a[1] != Py_None) {
        if (!PyUnicode_Check(a[1])) {
            PyErr_Format(PyExc_TypeError, "json_loads: name must be a str or None; got %s", Py_TYPE(a[1])->tp_name);
            return NULL;
        }
        if (!(name = PyUnicode_AsUTF8(a[1]))) return NULL;
    }
    if ((a[2] && vt_int_arg(a[2], "json_loads", "max_depth", 0, INT_MAX, &max_depth) < 0) ||
        (a[3] && vt_int_arg(a[3], "json_loads", "max_bytes", 0, PY_SSIZE_T_MAX, &max_bytes) < 0))
        return NULL;
    if (!PyBytes_Check(text)) {
        PyErr_Format(PyExc_TypeError, "json_loads: text must be bytes; got %s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    vt_json_limits lim = {(size_t)max_bytes, (int)max_depth};
    vt_json_doc *doc;
    if (load_doc(vt_state(m), text, "json_loads", "text", name, &lim, &doc) < 0) return NULL;
    PyObject *r = to_py(vt_json_root(doc), name, vt_state(m));
    vt_json_free(doc);
    return r;
}

static int set_item(PyObject *d, const char *k, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, k, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *py_resolve(PyObject *m, PyObject *args, PyObject *kw) {
    const char *fn = "resolve_kv_cache_dtype";
    PyObject *a[VT_SIG_MAX_ARGS];
    if (vt_sig_parse(&resolve_sig, args, kw, a) < 0) return NULL;
    PyObject *flag = a[0], *config = a[1], *hq = vt_arg_or_none(a[2]);
    int layers = a[3] ? PyObject_IsTrue(a[3]) : 1;
    if (layers < 0) return NULL;
    if (!PyUnicode_Check(flag)) {
        PyErr_Format(PyExc_TypeError, "%s: kv_cache_dtype must be a str; got %s", fn, Py_TYPE(flag)->tp_name);
        return NULL;
    }
    Py_ssize_t flen;
    const char *fl = PyUnicode_AsUTF8AndSize(flag, &flen);
    if (!fl) return NULL;
    if ((size_t)flen != strlen(fl)) {
        PyErr_Format(PyExc_ValueError, "%s: kv_cache_dtype must not contain NUL; got %R", fn, flag);
        return NULL;
    }
    vt_module_state *st = vt_state(m);
    vt_json_doc *cfg = NULL, *hqd = NULL;
    if (load_doc(st, config, fn, "config", PyBytes_Check(config) ? "config.json" : NULL, NULL, &cfg) < 0)
        return NULL;
    if (hq != Py_None && vt_resolver_wants_hf_quant_config(cfg) &&
        load_doc(st, hq, fn, "hf_quant_config", PyBytes_Check(hq) ? "hf_quant_config.json" : NULL, NULL, &hqd) <
            0) {
        vt_json_free(cfg);
        return NULL;
    }
    vt_resolution r;
    vt_error err;
    vt_error_clear(&err);
    vt_status s = layers ? vt_resolve_kv_cache_dtype(fl, cfg, hqd, &r, &err)
                         : vt_resolve_kv_cache_dtype_string(fl, cfg, hqd, &r, &err);
    PyObject *d = NULL;
    if (s != VT_OK) {
        vt_raise(st, &err);
        goto done;
    }
    d = PyDict_New();
    if (!d) goto done;
    const vt_dtype_info *info = r.dtype >= 0 ? vt_dtype_get(r.dtype) : NULL;
    vt_json *qc = vt_resolver_quant_config(cfg, hqd);
    static const char *files[] = {NULL, "config.json", "hf_quant_config.json"};
    PyObject *msgs = PyList_New(0);
    if (!msgs) goto fail;
    for (size_t i = 0; i < r.n_messages; i++) {
        PyObject *x = PyUnicode_DecodeUTF8(r.messages[i], (Py_ssize_t)strlen(r.messages[i]), "replace");
        if (!x || PyList_Append(msgs, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(msgs);
            goto fail;
        }
        Py_DECREF(x);
    }
    if (set_item(d, "messages", msgs) < 0 ||
        set_item(d, "vllm_cache_dtype", PyUnicode_FromString(r.vllm_cache_dtype)) < 0 ||
        set_item(d, "cache_dtype", PyUnicode_FromString(r.cache_dtype)) < 0 ||
        set_item(d, "dtype", info ? PyUnicode_FromString(info->name)
                                  : PyUnicode_FromString(r.dtype == VT_DTYPE_AUTO ? "auto" : "unsupported")) < 0 ||
        set_item(d, "source", PyUnicode_FromString(vt_kv_source_name(r.source))) < 0 ||
        set_item(d, "declared_by_checkpoint", PyBool_FromLong(r.declared_by_checkpoint)) < 0 ||
        set_item(d, "per_head_scales", PyBool_FromLong(r.per_head_scales)) < 0 ||
        set_item(d, "fp8_checkpoint", PyBool_FromLong(r.fp8_checkpoint)) < 0 ||
        set_item(d, "quant_config_file",
                 files[r.quant_file] ? PyUnicode_FromString(files[r.quant_file]) : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "quant_method", r.has_quant_config ? PyUnicode_DecodeUTF8(r.quant_method,
                 (Py_ssize_t)strlen(r.quant_method), "surrogatepass") : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "rule", PyUnicode_DecodeUTF8(r.rule, (Py_ssize_t)strlen(r.rule), "replace")) < 0 ||
        set_item(d, "quant_config", qc ? to_py(qc, files[r.quant_file], st) : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "hf_quant_config_read", PyBool_FromLong(hqd != NULL)) < 0)
        goto fail;
    goto done;
fail:
    Py_CLEAR(d);
done:
    vt_json_free(cfg);
    vt_json_free(hqd);
    return d;
}

static PyObject *py_vllm_dtypes(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    size_t n = vt_vllm_kv_cache_dtype_count();
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (!t) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(vt_vllm_kv_cache_dtype(i));
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, s);
    }
    return t;
}

static PyObject *py_vllm_unstored(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < vt_vllm_kv_cache_dtype_count(); i++) {
        const char *name = vt_vllm_kv_cache_dtype(i), *what = vt_vllm_kv_cache_dtype_unstored(name);
        if (!what) continue;
        PyObject *v = PyUnicode_FromString(what);
        if (!v || PyDict_SetItemString(d, name, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(v);
    }
    return d;
}

static char json_loads_doc[256], resolve_doc[512];

static PyMethodDef resolver_methods[] = {
    {"json_loads", (PyCFunction)(void (*)(void))py_json_loads, METH_VARARGS | METH_KEYWORDS, json_loads_doc},
    {"resolve_kv_cache_dtype", (PyCFunction)(void (*)(void))py_resolve, METH_VARARGS | METH_KEYWORDS, resolve_doc},
    {"vllm_kv_cache_dtypes", py_vllm_dtypes, METH_NOARGS,
     "vllm_kv_cache_dtypes()\n--\n\nvLLM's accepted --kv-cache-dtype values (pinned release)."},
    {"vllm_kv_cache_dtypes_unstored", py_vllm_unstored, METH_NOARGS,
     "vllm_kv_cache_dtypes_unstored()\n--\n\nvLLM's values vtinfer does not store: name -> what the format is."},
    {NULL, NULL, 0, NULL},
};

int vt_resolver_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(&json_loads_sig, "Parse JSON bytes with vtinfer's C reader.", json_loads_doc,
                     sizeof json_loads_doc);
    vt_signature_doc(&resolve_sig, "Resolve a --kv-cache-dtype flag against config.json (bytes or path) as vLLM "
                     "does.", resolve_doc, sizeof resolve_doc);
    return PyModule_AddFunctions(m, resolver_methods);
}
