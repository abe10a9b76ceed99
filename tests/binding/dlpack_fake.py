"""A minimal DLPack producer written with ctypes, for tests that need
tensors NumPy cannot describe (byte sizes that overflow 64 bits, odd
dtypes). It hands out a legacy "dltensor" capsule over a small real buffer;
the deleter is a ctypes callback that records that it ran."""

from __future__ import annotations

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", DELETER_V), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_MAX_BUFFER = 1 << 20


def _buffer_bytes(shape, strides, bits, lanes):
    """Bytes that cover the view's extent, at least 64, so two fakes never
    overlap (the ops refuse caches and inputs that share memory). A hostile
    shape (negative, or past `_MAX_BUFFER`) gets 64: the op refuses it first."""
    if any(n < 0 for n in shape) or (strides is not None and len(strides) != len(shape)):
        return 64
    if any(n == 0 for n in shape):
        return 64
    if strides is None:
        elems = 1
        for n in shape:
            elems *= n
    else:
        elems = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))
    size = elems * max(1, (bits * max(lanes, 1) + 7) // 8)
    return 64 if size > _MAX_BUFFER else max(64, size)


class FakeTensor:
    """Exports `shape` (and optional element `strides`) of a DLPack dtype
    over a buffer that covers the view (at least 64 bytes). `deleted` counts deleter calls. Hostile fields
    on request: `lanes`, `byte_offset`, `null_data`, `ndim` (overrides
    len(shape)), `null_shape`; `versioned` exports a DLPack 1.x capsule
    ("dltensor_versioned", `read_only` sets its flag, `major` its version);
    `device_type` / `device_id` name the device it claims."""

    def __init__(self, shape, code=2, bits=32, strides=None, device_type=1, *, lanes=1, byte_offset=0,
                 null_data=False, ndim=None, null_shape=False, versioned=False, read_only=False, major=1,
                 device_id=0):
        self.buffer = ctypes.create_string_buffer(_buffer_bytes(shape, strides, bits, lanes))
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides is not None else None
        self.deleted = 0
        self._deleter = DELETER(self._on_delete)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = None if null_data else ctypes.cast(self.buffer, ctypes.c_void_p)
        t.device = DLDevice(device_type, device_id)
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = None if null_shape else self.shape
        t.strides = self.strides if self.strides is not None else None
        t.byte_offset = byte_offset
        self.managed.deleter = self._deleter
        self.versioned = versioned
        if versioned:
            self._deleter_v = DELETER_V(self._on_delete)
            self.managed_v = DLManagedTensorVersioned()
            self.managed_v.version = DLVersion(major, 0)
            self.managed_v.deleter = self._deleter_v
            self.managed_v.flags = 1 if read_only else 0
            self.managed_v.dl_tensor = t

    def _on_delete(self, _ptr):
        self.deleted += 1

    def __dlpack__(self, *, stream=None, max_version=None):
        if self.versioned:
            return _PyCapsule_New(ctypes.addressof(self.managed_v), b"dltensor_versioned", None)
        return _PyCapsule_New(ctypes.addressof(self.managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device.device_type, self.managed.dl_tensor.device.device_id)
