/* vtinfer._C's functional stores (vLLM's names and argument order):
 *
 *   _C.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
 *                              k_scale, v_scale, *, layout=None, num_threads=None,
 *                              k_scale_cache=None, v_scale_cache=None) -> None
 *   _C.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
 *                        k_scale, v_scale, *, num_threads=None) -> None
 *
 * Every rule lives in the shared argument layer (common/store_args.c);
 * this file adds the CPU front door (NumPy or DLPack, copies of
 * non-contiguous NumPy inputs), NumPy scale parsing and the threads. */
#include "vt_binding.h"
#include "vt_signature.h"

#include <string.h>

static int cpu_pin(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t) {
    return vt_tensor_from_object((vt_module_state *)ctx, obj, fn, arg, flags, t);
}

/* k_scale / v_scale as float32 values of at most one dimension. */
static PyArrayObject *scale_values(PyObject *obj, const char *fn, const char *arg) {
    PyArrayObject *a = vt_scale_array(obj, fn, arg);
    if (a && PyArray_NDIM(a) > 1) {
        PyErr_Format(PyExc_ValueError, "%s: %s must have 1 or num_kv_heads elements in at most 1 dimension; got %d "
                     "dimensions", fn, arg, PyArray_NDIM(a));
        Py_CLEAR(a);
    }
    return a;
}

static int set_scales(vt_store_call *c, PyObject *k_obj, PyObject *v_obj) {
    if (!vt_dtype_get(c->p.cache_dtype)->is_fp8) return 0;
    PyArrayObject *k = scale_values(k_obj, c->fn, "k_scale");
    PyArrayObject *v = k ? scale_values(v_obj, c->fn, "v_scale") : NULL;
    int rc = v ? vt_store_set_scales(c, PyArray_DATA(k), PyArray_SIZE(k), PyArray_DATA(v), PyArray_SIZE(v)) : -1;
    Py_XDECREF(k);
    Py_XDECREF(v);
    return rc;
}

static PyObject *store(PyObject *m, PyObject *args, PyObject *kw, int xsplit) {
    vt_module_state *st = vt_state(m);
    vt_store_pyargs a;
    vt_store_call c;
    memset(&c, 0, sizeof c);
    c.fn = xsplit ? "reshape_and_cache" : "reshape_and_cache_flash";
    c.xsplit = xsplit;
    c.mem = VT_MEMORY_CPU;
    int nth;
    if (vt_store_pyargs_parse(args, kw, xsplit, &a) < 0 ||
        vt_parse_dtype_name(a.kv_cache_dtype, c.fn, "kv_cache_dtype", &c.kv_flag) < 0 ||
        (nth = vt_num_threads_arg(a.num_threads, c.fn)) < 0 || vt_parse_layout(a.layout, c.fn, &c.hnd) < 0)
        return NULL;
    if (vt_store_pin_inputs(&c, cpu_pin, st, a.key, a.value, a.slot_mapping, -1, -1) < 0 ||
        vt_store_pin_caches(&c, cpu_pin, st, a.key_cache, a.value_cache) < 0 ||
        vt_store_pin_scale_caches(&c, cpu_pin, st, a.k_scale_cache, a.v_scale_cache) < 0 ||
        vt_copy_inputs_contiguous(st, &c) < 0 || vt_store_check(&c) < 0 || set_scales(&c, a.k_scale, a.v_scale) < 0) {
        vt_store_release(&c);
        return NULL;
    }
    vt_error err;
    vt_status s;
    Py_BEGIN_ALLOW_THREADS
    s = vt_kv_store(&c.p, nth, &err);
    Py_END_ALLOW_THREADS
    vt_store_release(&c);
    if (s != VT_OK) return vt_raise(st, &err);
    Py_RETURN_NONE;
}

static PyObject *py_reshape_and_cache_flash(PyObject *m, PyObject *args, PyObject *kw) { return store(m, args, kw, 0); }
static PyObject *py_reshape_and_cache(PyObject *m, PyObject *args, PyObject *kw) { return store(m, args, kw, 1); }

static char flash_doc[512], x_doc[512];

static PyMethodDef store_functions[] = {
    {"reshape_and_cache_flash", (PyCFunction)(void (*)(void))py_reshape_and_cache_flash, METH_VARARGS | METH_KEYWORDS,
     flash_doc},
    {"reshape_and_cache", (PyCFunction)(void (*)(void))py_reshape_and_cache, METH_VARARGS | METH_KEYWORDS, x_doc},
    {NULL, NULL, 0, NULL},
};

int vt_store_exec(PyObject *m, vt_module_state *st) {
    (void)st;
    vt_signature_doc(vt_store_flash_signature(), "vLLM's flash-layout store.", flash_doc, sizeof flash_doc);
    vt_signature_doc(vt_store_x_signature(), "vLLM's x-split paged-layout store.", x_doc, sizeof x_doc);
    return PyModule_AddFunctions(m, store_functions);
}
