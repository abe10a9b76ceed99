"""Helpers of the torch tests: NumPy test data as torch tensors and back,
written with torch's own casts (never with vtinfer's conversion layer)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

TORCH_REASON = "torch not installed: pip install torch==2.13.0 (CI installs it, so there these tests run)"


def as_torch(torch, a: np.ndarray):
    """A NumPy array (float32/float16/bfloat16/uint8/int) as a torch tensor of the same values, strides kept."""
    if not a.flags.c_contiguous:
        return _strided(torch, a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)  # exact: every bfloat16 is a float32
    return torch.from_numpy(a.copy())


def _strided(torch, a: np.ndarray):
    """A permuted view of a contiguous base, as vLLM's HND caches are."""
    order = np.argsort([-s for s in a.strides], kind="stable")
    base = np.ascontiguousarray(a.transpose(order))
    inv = np.argsort(order)
    return as_torch(torch, base).permute(*[int(i) for i in inv])


def as_numpy(t) -> np.ndarray:
    """A torch tensor's values as NumPy (bfloat16 -> ml_dtypes, float8 -> uint8 codes)."""
    import torch

    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().copy()
    return t.numpy().copy()
