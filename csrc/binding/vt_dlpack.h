/* DLPack ABI (v1.x) as the binding needs it: the structs and enum values of
 * the DLPack specification, written out here so that the build needs no
 * external header. Only csrc/binding and csrc/cuda use it. */
#ifndef VTINFER_BINDING_DLPACK_H
#define VTINFER_BINDING_DLPACK_H

#include <stdint.h>

enum { VT_DL_CPU = 1, VT_DL_CUDA = 2, VT_DL_CUDA_HOST = 3, VT_DL_CUDA_MANAGED = 13 };

enum {
    VT_DL_INT = 0,
    VT_DL_UINT = 1,
    VT_DL_FLOAT = 2,
    VT_DL_BFLOAT = 4,
    VT_DL_BOOL = 6,
    VT_DL_FLOAT8_E4M3FN = 10,
    VT_DL_FLOAT8_E5M2 = 12
};

typedef struct vt_dl_device { int32_t device_type, device_id; } vt_dl_device;
typedef struct vt_dl_dtype { uint8_t code, bits; uint16_t lanes; } vt_dl_dtype;

typedef struct vt_dl_tensor {
    void *data;
    vt_dl_device device;
    int32_t ndim;
    vt_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} vt_dl_tensor;

typedef struct vt_dl_managed {
    vt_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct vt_dl_managed *self);
} vt_dl_managed;

typedef struct vt_dl_version { uint32_t major, minor; } vt_dl_version;

#define VT_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)

typedef struct vt_dl_managed_versioned {
    vt_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct vt_dl_managed_versioned *self);
    uint64_t flags;
    vt_dl_tensor dl_tensor;
} vt_dl_managed_versioned;

#endif /* VTINFER_BINDING_DLPACK_H */
