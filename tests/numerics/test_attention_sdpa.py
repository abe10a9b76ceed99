"""flash_attn_varlen_func against torch's scaled_dot_product_attention (an
independent implementation), on every ISA.

Each sequence's keys are gathered from the paged cache by its block table
and decoded (fp8 codes through ml_dtypes, times the descale); SDPA then runs
with an explicit bottom-right causal mask (SDPA's `is_causal` is top-left,
which differs whenever a sequence has fewer queries than keys). FlashAttention's
rule: our max error against SDPA in float64 is at most twice that of SDPA in
float32, plus 16 float32 units of the largest output; for a bfloat16 or
float16 q, both are first rounded to q's dtype.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import FP8, make_case

torch = pytest.importorskip("torch")
F = torch.nn.functional

Q_DT = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def gather(cache, bt_row, k_len, kv_cache_dtype):
    bs = cache.shape[1]
    j = np.arange(k_len)
    rows = cache[bt_row[j // bs], j % bs]  # [k_len, Hkv, D]
    if kv_cache_dtype in FP8:
        return rows.view(FP8[kv_cache_dtype]).astype(np.float64)
    return rows.astype(np.float64)


def sdpa(q, k, v, cu, sk, bt, kv_cache_dtype, k_descale, v_descale, dtype):
    """Per sequence: SDPA over the gathered keys with a bottom-right causal mask."""
    T, H, D = q.shape
    out = np.zeros((T, H, D), np.float64)
    for b in range(len(sk)):
        q0, q1, kl = int(cu[b]), int(cu[b + 1]), int(sk[b])
        kk = gather(k, bt[b], kl, kv_cache_dtype) * k_descale[b][None, :, None]
        vv = gather(v, bt[b], kl, kv_cache_dtype) * v_descale[b][None, :, None]
        G = H // kk.shape[1]
        tq = torch.from_numpy(q[q0:q1].astype(np.float64)).to(dtype).transpose(0, 1)  # [H, ql, D]
        tk = torch.from_numpy(np.repeat(kk, G, axis=1)).to(dtype).transpose(0, 1)
        tv = torch.from_numpy(np.repeat(vv, G, axis=1)).to(dtype).transpose(0, 1)
        ql = q1 - q0
        pos = kl - ql + np.arange(ql)
        mask = torch.from_numpy(np.arange(kl)[None, :] <= pos[:, None])
        o = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=1.0 / np.sqrt(D))
        out[q0:q1] = o.transpose(0, 1).to(torch.float64).numpy()
    return out


CASES = [
    # (q_dtype, kv_cache_dtype, kv_float, H, Hkv, D, block_size)
    ("float32", "auto", "float32", 8, 8, 64, 16),
    ("float32", "auto", "bfloat16", 8, 2, 128, 16),
    ("bfloat16", "auto", "bfloat16", 16, 2, 128, 16),
    ("float16", "auto", "float16", 8, 1, 80, 32),
    ("bfloat16", "fp8_e4m3", "float32", 32, 8, 128, 16),
    ("float32", "fp8_e5m2", "float32", 8, 2, 96, 5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"q{c[0]}-{c[1]}-{c[2]}-H{c[3]}kv{c[4]}-D{c[5]}-bs{c[6]}")
def test_matches_torch_sdpa(isa, case):
    q_dtype, kvd, kv_float, H, Hkv, D, bs = case
    rng = np.random.default_rng(sum(map(ord, str(case))))
    q_lens, k_lens = [1, 6, 1, 17], [1, 40, 333, 17]
    q, k, v, cu, sk, bt = make_case(rng, q_lens=q_lens, k_lens=k_lens, H=H, Hkv=Hkv, D=D, block_size=bs,
                                    q_dtype=q_dtype, kv_cache_dtype=kvd, kv_float=kv_float)
    kd = rng.uniform(0.5, 2.0, (len(sk), Hkv)).astype(np.float32)
    vd = rng.uniform(0.5, 2.0, (len(sk), Hkv)).astype(np.float32)
    ours = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=kvd,
                                     k_descale=kd, v_descale=vd, num_threads=2)
    ref = sdpa(q, k, v, cu, sk, bt, kvd, kd, vd, torch.float64)
    s32 = sdpa(q, k, v, cu, sk, bt, kvd, kd, vd, torch.float32)
    s32 = s32.astype(np.float32).astype(Q_DT[q_dtype]).astype(np.float64)
    err = np.abs(ours.astype(np.float64) - ref).max()
    err32 = np.abs(s32 - ref).max()
    floor = 16 * 2.0**-24 * np.abs(ref).max()
    assert np.isfinite(err), f"{isa} {case}: non-finite output"
    assert err <= 2 * err32 + floor, f"{isa} {case}: error {err:.3g} > 2 x SDPA float32 {err32:.3g} + {floor:.3g}"
