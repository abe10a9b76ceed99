"""The public functions route CUDA tensors (DLPack device type 2) to the
CUDA arm and everything else to the CPU kernels. Runs without a device:
a fake DLPack producer claims device type 2, so the CPU path would refuse
it as "not in CPU memory" while the CUDA arm reaches the CUDA runtime."""

from __future__ import annotations

import pytest

import vtinfer as vt
from tests.binding.dlpack_fake import FakeTensor


def cuda_fakes():
    key = FakeTensor([2, 1, 8], device_type=2)
    cache = FakeTensor([4, 2, 1, 8], device_type=2)
    slots = FakeTensor([2], code=0, bits=64, device_type=2)
    return key, cache, slots


def cuda_caches():
    """Two caches: one passed as both K and V would share every element (refused)."""
    return FakeTensor([4, 2, 1, 8], device_type=2), FakeTensor([4, 2, 1, 8], device_type=2)


def test_store_of_cuda_tensors_goes_to_the_cuda_arm():
    key, _, slots = cuda_fakes()
    kc, vc = cuda_caches()
    with pytest.raises((vt.VtinferError, NotImplementedError)) as e:
        vt.reshape_and_cache_flash(key, key, kc, vc, slots, "auto", 1.0, 1.0)
    assert "CPU memory" not in str(e.value)
    assert "CUDA" in str(e.value)


def test_cpu_path_refuses_device_memory_when_called_directly():
    key, cache, slots = cuda_fakes()
    with pytest.raises(ValueError, match="must be in CPU memory"):
        vt._C.reshape_and_cache_flash(key, key, cache, cache, slots, "auto", 1.0, 1.0)
