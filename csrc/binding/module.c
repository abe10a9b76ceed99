/* vtinfer._C: module definition, multi-phase init, module state.
 *
 * The exec slot imports NumPy's C API and ml_dtypes, creates the
 * exceptions, selects the CPU kernels (VTINFER_ISA may lower the choice)
 * and then runs each binding file's exec hook. */
#define VT_NUMPY_IMPORT
#include "vt_binding.h"

#include <stdlib.h>

vt_module_state *vt_state(PyObject *module) { return (vt_module_state *)PyModule_GetState(module); }

vt_module_state *vt_state_from_type(PyTypeObject *type) {
    PyObject *m = PyType_GetModuleByDef(type, &vt_module_def);
    return m ? vt_state(m) : NULL;
}

static int load_ml_dtype(PyObject *mld, const char *name, PyArray_Descr **descr, int *typenum) {
    PyObject *t = PyObject_GetAttrString(mld, name);
    if (!t) return -1;
    PyArray_Descr *d = NULL;
    int ok = PyArray_DescrConverter(t, &d);
    Py_DECREF(t);
    if (!ok) return -1;
    *descr = d;
    *typenum = d->type_num;
    return 0;
}

static int create_exceptions(PyObject *m, vt_module_state *st) {
    st->VtinferError = PyErr_NewExceptionWithDoc("vtinfer.VtinferError", "Base class of vtinfer's own errors.",
                                                 PyExc_Exception, NULL);
    if (!st->VtinferError || PyModule_AddObjectRef(m, "VtinferError", st->VtinferError) < 0) return -1;
    PyObject *bases = PyTuple_Pack(2, st->VtinferError, PyExc_ValueError);
    if (!bases) return -1;
    st->ConfigError = PyErr_NewExceptionWithDoc(
        "vtinfer.ConfigError", "A configuration document (JSON, safetensors header) is malformed.", bases, NULL);
    Py_DECREF(bases);
    if (!st->ConfigError || PyModule_AddObjectRef(m, "ConfigError", st->ConfigError) < 0) return -1;
    return 0;
}

static int vt_exec(PyObject *m) {
    vt_module_state *st = vt_state(m);
    if (PyArray_ImportNumPyAPI() < 0) return -1;
    PyObject *mld = PyImport_ImportModule("ml_dtypes");
    if (!mld) return -1;
    int rc = load_ml_dtype(mld, "bfloat16", &st->descr_bf16, &st->typenum_bf16);
    if (rc == 0) rc = load_ml_dtype(mld, "float8_e4m3fn", &st->descr_e4m3, &st->typenum_e4m3);
    if (rc == 0) rc = load_ml_dtype(mld, "float8_e5m2", &st->descr_e5m2, &st->typenum_e5m2);
    Py_DECREF(mld);
    if (rc < 0) return -1;
    if (create_exceptions(m, st) < 0) return -1;

    vt_error err;
    vt_error_clear(&err);
    const char *isa = getenv("VTINFER_ISA");
    if (vt_runtime_init(isa, &err) != VT_OK) {
        vt_raise(st, &err);
        return -1;
    }
    if (vt_info_exec(m, st) < 0) return -1;
    if (vt_codec_exec(m, st) < 0) return -1;
    if (vt_attention_exec(m, st) < 0) return -1;
    if (vt_kvcache_exec(m, st) < 0 || vt_store_exec(m, st) < 0) return -1;
    if (vt_resolver_exec(m, st) < 0) return -1;
    if (vt_cacheops_exec(m, st) < 0) return -1;
    if (vt_tq_exec(m, st) < 0) return -1;
    return 0;
}

static int vt_traverse(PyObject *m, visitproc visit, void *arg) {
    vt_module_state *st = vt_state(m);
    Py_VISIT(st->VtinferError);
    Py_VISIT(st->ConfigError);
    Py_VISIT((PyObject *)st->descr_bf16);
    Py_VISIT((PyObject *)st->descr_e4m3);
    Py_VISIT((PyObject *)st->descr_e5m2);
    for (int i = 0; i < VT_SLOT_COUNT; i++) Py_VISIT(st->slots[i]);
    return 0;
}

static int vt_clear(PyObject *m) {
    vt_module_state *st = vt_state(m);
    Py_CLEAR(st->VtinferError);
    Py_CLEAR(st->ConfigError);
    Py_CLEAR(st->descr_bf16);
    Py_CLEAR(st->descr_e4m3);
    Py_CLEAR(st->descr_e5m2);
    for (int i = 0; i < VT_SLOT_COUNT; i++) Py_CLEAR(st->slots[i]);
    PyMem_RawFree(st->attn_scratch);
    st->attn_scratch = NULL, st->attn_scratch_bytes = 0;
    return 0;
}

static void vt_free(void *m) { (void)vt_clear((PyObject *)m); }

static PyModuleDef_Slot vt_slots[] = {
    {Py_mod_exec, (void *)vt_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyModuleDef vt_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "vtinfer._C",
    .m_doc = "vtinfer's C core: codecs, KV cache, attention, resolver. Use the vtinfer package, not this module.",
    .m_size = sizeof(vt_module_state),
    .m_methods = NULL,
    .m_slots = vt_slots,
    .m_traverse = vt_traverse,
    .m_clear = vt_clear,
    .m_free = vt_free,
};

PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&vt_module_def); }
