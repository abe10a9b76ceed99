/* The tensor importer both extensions share (Python.h, no NumPy):
 * __dlpack__ producers -> vt_tensor, and the checks every argument goes
 * through (rank, dtype, device) in STYLE.md's order. vtinfer._C adds its
 * NumPy front door on top (vt_binding.h: vt_tensor_from_object). */
#ifndef VTINFER_BINDING_IMPORT_H
#define VTINFER_BINDING_IMPORT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "vt_tensor.h"

/* Flags of the importers. */
#define VT_TENSOR_WRITABLE 1   /* a destination: refuse read-only and non-native byte order */
#define VT_TENSOR_NO_CONVERT 2 /* refuse objects that are not arrays or DLPack producers */

/* Pin `obj` through obj.__dlpack__(max_version=(1, 0)) (a legacy capsule
 * from an older producer is read too). The capsule is consumed and the
 * producer's deleter runs exactly once, at vt_tensor_release. A torch
 * tensor that requires grad is exported through .detach() when it is an
 * input (same memory) and refused as a destination; a lazy negative or
 * conjugate view (torch's is_neg() / is_conj()) is refused; an exporter
 * that raises is reported as
 * "<fn>: <arg> must ...; got <its message>". Every DLPack field is
 * validated by vt_dl_describe. Returns 0, or -1 with an exception set. */
int vt_tensor_from_dlpack(PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t);

/* Unpin (no-op on a zeroed or released tensor). */
void vt_tensor_release(vt_tensor *t);

/* An extension's front door: pin obj as argument `arg` (flags above);
 * the argument layers then check rank, dtype and memory (vt_tensor_check). */
typedef int (*vt_pin_fn)(void *ctx, PyObject *obj, const char *fn, const char *arg, int flags, vt_tensor *t);

/* Which memory an extension's kernels read: checked by vt_tensor_check. */
typedef enum vt_memory { VT_MEMORY_CPU = 0, VT_MEMORY_CUDA = 1 } vt_memory;

/* Check rank (ndim >= 0: exactly that many dimensions), dtype (one of
 * elem_mask) and device, in that order. Returns 0, or -1 with
 * ValueError/TypeError "<fn>: <arg> must ...; got ..." set. */
int vt_tensor_check(const vt_tensor *t, const char *fn, const char *arg, unsigned elem_mask, int ndim, vt_memory mem);

/* The refusal of a shape: "<fn>: <arg> must have shape <want>; got [a, b]". Returns -1. */
int vt_shape_error(const char *fn, const char *arg, const char *want, const vt_tensor *t);

/* Refuse when `input` shares an element with `dst` ("<fn>: <in_name> must
 * not share memory with <dst_name>"). Returns 0 or -1 (ValueError). */
int vt_refuse_shared(const char *fn, const vt_tensor *input, const char *in_name, const vt_tensor *dst,
                     const char *dst_name);

/* Refuse a destination two of whose elements could share memory
 * (vt_tensor_self_overlaps: e.g. blocks made to alias with as_strided):
 * "<fn>: <name> must not alias itself". Returns 0 or -1 (ValueError). */
int vt_refuse_self_alias(const char *fn, const vt_tensor *dst, const char *name);

/* Refuse a tensor that is not C-contiguous: "<fn>: <arg> must be
 * C-contiguous when passed through DLPack; got byte strides [...]" (the
 * DLPack arm of _C's vt_tensor_contiguous_input, and _cuda's whole rule;
 * ctx unused: the shape of vt_contig_fn). Returns 0 or -1 (ValueError). */
int vt_refuse_noncontiguous(void *ctx, vt_tensor *t, const char *fn, const char *arg);

/* An integer argument in [lo, hi]: a Python int or any object with
 * __index__ (NumPy integers); bool and float are TypeError. A value out of
 * range, one beyond 64 bits included, is ValueError
 * "<fn>: <arg> must be in [lo, hi]; got <value>" (">= lo" / "<= hi" when
 * an end is the 64-bit limit), never a bare OverflowError. Every integer
 * the binding reads from Python goes through this. 0, or -1 with an
 * exception set. */
int vt_int_arg(PyObject *obj, const char *fn, const char *arg, int64_t lo, int64_t hi, int64_t *out);

#endif /* VTINFER_BINDING_IMPORT_H */
