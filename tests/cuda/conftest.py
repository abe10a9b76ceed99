"""tests/cuda: the CUDA arm. Device tests skip, with the reason, where there is no device."""

import pytest


def _device_reason():
    try:
        from vtinfer import _cuda
    except ImportError:
        return "vtinfer._cuda not built (setup.py builds it where a GPU is present, or with VTINFER_CUDA=1)"
    if _cuda.device_count() == 0:
        # cudaErrorInsufficientDriver is what the runtime says where no NVIDIA
        # driver is loaded at all, as on a machine without a GPU: lead with that.
        return f"no CUDA device (the CUDA runtime reports: {_cuda.device_status()})"
    try:
        import torch
    except ImportError:
        return "torch is needed to make CUDA tensors (pip install torch with CUDA)"
    if not torch.cuda.is_available():
        return "torch has no CUDA (a CPU build of torch)"
    return None


DEVICE_REASON = _device_reason()
needs_device = pytest.mark.skipif(DEVICE_REASON is not None, reason=str(DEVICE_REASON))
