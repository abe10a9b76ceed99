/* vtinfer public C API umbrella header (C11 + libc). */
#ifndef VTINFER_VTINFER_H
#define VTINFER_VTINFER_H

#include "vtinfer/codec.h"
#include "vtinfer/dtype.h"
#include "vtinfer/runtime.h"
#include "vtinfer/status.h"

#define VTINFER_VERSION_MAJOR 0
#define VTINFER_VERSION_MINOR 1
#define VTINFER_VERSION_PATCH 0
#define VTINFER_VERSION_STRING "0.1.0"

#endif /* VTINFER_VTINFER_H */
