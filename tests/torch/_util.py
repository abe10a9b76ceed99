"""Helpers of the torch tests: NumPy test data as torch tensors and back,
written with torch's own casts (never with vtinfer's conversion layer)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

TORCH_REASON = "CI installs torch, so there these tests run"  # tests/conftest.py adds the package and its pip command


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


def vllm_pth_page(torch, fmt: str, nb: int, bs: int, hkv: int, d: int, typed: bool = True):
    """vLLM's per-token-head page as its backend builds it: one uint8 tensor
    [nb, H_kv, bs, 2 * (row + 4)] (row = D, or D / 2 for int4), the K / V
    code views split from it (int8 / float8_e4m3fn / uint8), and the
    float32 scale caches as as_strided views into its 4-byte pads (they
    alias the code tensors' storage). typed=False keeps fp8 codes uint8
    (opcheck's schema check compares inputs with allclose, which torch 2.13
    lacks for float8 on the CPU)."""
    row = d // 2 if fmt == "int4_per_token_head" else d
    kv = torch.zeros((nb, hkv, bs, 2 * (row + 4)), dtype=torch.uint8)
    base = torch.tensor([], dtype=torch.float32).set_(kv.untyped_storage())
    s = kv.stride()
    ks = torch.as_strided(base, (nb, bs, hkv), (s[0] // 4, s[2] // 4, s[1] // 4), row // 4)
    vs = torch.as_strided(base, (nb, bs, hkv), (s[0] // 4, s[2] // 4, s[1] // 4), (2 * row + 4) // 4)
    ks.fill_(1.0)
    vs.fill_(1.0)
    kc, vc = kv.transpose(1, 2).split(row + 4, dim=-1)
    code = {"int8_per_token_head": torch.int8, "fp8_per_token_head": torch.float8_e4m3fn if typed else None}.get(fmt)
    if code is not None:
        kc, vc = kc.view(code), vc.view(code)
    return kv, (kc, vc, ks, vs)
