"""The Python wrappers' routing to the CUDA arm, checked without a device: the arm is stood in for (a
monkeypatched vtinfer._cuda_ops), so these tests hold what the wrapper hands it, not what the device does
(tests/cuda)."""

from __future__ import annotations

import numpy as np

import vtinfer as vt
from vtinfer import _cuda_ops


def test_the_cuda_arm_of_flash_attn_varlen_func_gets_every_paged_argument(monkeypatch):
    """The Python wrapper hands a CUDA q to the CUDA arm with every paged-form argument under its name and the
    caller's value (the arm is stood in for: this checks the wrapper's routing, not the device)."""
    got = {}
    monkeypatch.setattr(_cuda_ops, "is_cuda", lambda x: True)
    monkeypatch.setattr(_cuda_ops, "flash_attn_varlen_func", lambda q, k, v, **kw: got.update(kw, q=q) or "arm")
    q = np.zeros((1, 8, 64), np.float32)
    k = np.zeros((1, 16, 8, 64), np.float32)
    sent = dict(cu_seqlens_q=np.array([0, 1], np.int32), seqused_k=np.array([3], np.int32),
                block_table=np.zeros((1, 1), np.int32), max_seqlen_q=1, max_seqlen_k=3, softmax_scale=0.5,
                causal=False, window_size=(2, 1), softcap=3.0, alibi_slopes=np.ones(8, np.float32),
                s_aux=np.zeros(8, np.float32), k_descale=np.float32(0.5), v_descale=np.float32(2.0),
                kv_cache_dtype="auto", out=None, return_lse=True, num_threads=2, k_scale_cache=None,
                v_scale_cache=None)
    assert vt.flash_attn_varlen_func(q, k, k, **sent) == "arm"
    assert got.pop("q") is q
    assert set(got) == set(sent)
    for name, value in sent.items():
        assert got[name] is value, name
