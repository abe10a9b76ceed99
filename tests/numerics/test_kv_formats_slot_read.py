"""The slot formats' read (turboquant_attention) against the dequantized copy it replaced.

The read decodes a chunk of keys at a time into float32 rows, runs the float32 tile over each chunk and
merges the chunks' softmax states. The judge is the path it replaced, written here from the public pieces:
every referenced slot dequantized by turboquant_gather (judged bit for bit against the NumPy twins and vLLM in
test_kv_formats_tq*.py, _uq.py and _octave.py) into a float32 paged copy, the query put in the key basis as
the row says, and flash_attn_varlen_func over the copy. Sequences span many chunks (the chunk holds ~256 KB of
decoded K and V: 64-128 keys here), items start mid-block (split decode, block size 32) and cover KV heads
from the fourth on (prefill tiles of four KV heads), with windows, softcap, ALiBi, sinks and the lse.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

HKV, G, NB = 8, 2, 160


def cache_of(fmt, D, bs, rng):
    S = vt.turboquant_slot_bytes(fmt, D)
    cache = np.zeros((NB, bs, HKV, S), np.uint8)
    T = NB * bs
    k = (rng.standard_normal((T, HKV, D)) * rng.uniform(0.5, 3.0, (T, HKV, 1))).astype(np.float32)
    v = rng.standard_normal((T, HKV, D)).astype(np.float32)
    vt.turboquant_store(k, v, cache, np.arange(T, dtype=np.int64), fmt)
    return cache


def copy_path(q, cache, fmt, bs, cu, sk, bt, **kw):
    """gather every slot, put q in the key basis (the row's key_basis and query rounding), attend over floats."""
    D = q.shape[2]
    info = vt.dtype_info(fmt)
    k, v = vt.turboquant_gather(cache, np.arange(NB * bs, dtype=np.int64), fmt, D)
    qf = q.astype(np.float32)
    if info.key_basis == "hadamard":
        h = np.ones((1, 1), np.float32)
        while h.shape[0] < D:  # Sylvester: H_2n = [[H, H], [H, -H]]
            h = np.kron(np.array([[1, 1], [1, -1]], np.float32), h)
        qf = (qf.reshape(-1, D) @ (h / np.float32(np.sqrt(D)))).reshape(qf.shape).astype(np.float32)
    if info.query_dtype != "float32":
        qf = qf.astype(vt.dtype_info(info.query_dtype).numpy_dtype).astype(np.float32)
    return vt.flash_attn_varlen_func(qf, k.reshape(NB, bs, HKV, D), v.reshape(NB, bs, HKV, D), cu_seqlens_q=cu,
                                     seqused_k=sk, block_table=bt, **kw)


CASES = {
    "decode": dict(q_lens=[1, 1, 1], k_lens=[1700, 45, 2400], kw={}),
    "prefill, window, softcap, alibi, sinks": dict(
        q_lens=[17, 3], k_lens=[900, 350], kw=dict(window_size=(300, 0), softcap=20.0, alibi=True, sinks=True)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("fmt", vt.SLOT_DTYPES)
def test_chunked_read_equals_the_dequantized_copy(fmt, bs, case):
    c = CASES[case]
    D = 64 if "octave" not in fmt else 128
    rng = np.random.default_rng([len(fmt), bs, len(case)])
    cache = cache_of(fmt, D, bs, rng)
    B = len(c["q_lens"])
    cu = np.concatenate([[0], np.cumsum(c["q_lens"])]).astype(np.int32)
    sk = np.array(c["k_lens"], np.int32)
    mb = max(-(-k // bs) for k in c["k_lens"])
    bt = np.stack([rng.permutation(NB)[:mb] for _ in range(B)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), HKV * G, D)).astype(ml_dtypes.bfloat16)
    kw = dict(c["kw"])
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = rng.uniform(0.0, 0.05, HKV * G).astype(np.float32)
    if kw.pop("sinks", False):
        kw["s_aux"] = rng.standard_normal(HKV * G).astype(np.float32)
    out, lse = vt.turboquant_attention(q, cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt,
                                       return_lse=True, num_threads=2, **kw)
    ref, ref_lse = copy_path(q, cache, fmt, bs, cu, sk, bt, return_lse=True, num_threads=2, **kw)
    assert out.dtype == q.dtype
    ref = np.asarray(ref).astype(np.float32)
    # both round to bfloat16 at the end: one bf16 ulp of the largest output bounds the float32 merge's rounding
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=0, atol=scale * 2.0 ** -8)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=2e-5)
    # away from bf16 rounding: float32 queries, the outputs themselves. Both sides sum up to 2400 keys in
    # float32 in different orders (chunks of 64-128 keys merged, against one pass): ~sqrt(n) float32 ulps of
    # the largest output apart (2400: ~50 ulps, 3e-6 of it), so 2e-5 of it holds on every ISA's tile
    out32 = vt.turboquant_attention(q.astype(np.float32), cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                    kv_cache_dtype=fmt, num_threads=1, **kw)
    ref32 = copy_path(q.astype(np.float32), cache, fmt, bs, cu, sk, bt, num_threads=1, **kw)
    np.testing.assert_allclose(out32, ref32, rtol=0, atol=scale * 2e-5)


def test_the_read_leaves_the_cache_and_the_rows_outside_the_sequences():
    fmt, D, bs = "turboquant_k8v4", 64, 16
    rng = np.random.default_rng(5)
    cache = cache_of(fmt, D, bs, rng)
    before = cache.copy()
    q = rng.standard_normal((3, HKV * G, D)).astype(np.float32)
    out = vt.turboquant_attention(q, cache, cu_seqlens_q=np.array([0, 2], np.int32), seqused_k=np.array([300], np.int32),
                                  block_table=rng.permutation(NB)[None, :19].astype(np.int32), kv_cache_dtype=fmt)
    assert np.array_equal(cache, before)
    assert np.isfinite(out[:2]).all() and np.abs(out[:2]).max() > 0 and not out[2].any()


def test_the_read_rotates_and_rounds_the_query_itself():
    """The query goes in in the model's basis, whatever its dtype and strides; the read rotates each row and
    rounds it to e4m3fn for UltraQuant as the e4m3fn cast of ml_dtypes and c10 does: 464 (the midpoint of 448
    and the NaN code's 480) ties to the even 448, anything past it is NaN. A query of equal entries c / 8
    (D = 64) has the rotated row (c, 0, ..., 0) exactly, so the rounding edge is hit on the exact value."""
    fmt, D, bs = "ultraquant_4bit", 64, 16
    rng = np.random.default_rng(11)
    cache = cache_of(fmt, D, bs, rng)
    cu, sk = np.array([0, 1], np.int32), np.array([200], np.int32)
    bt = rng.permutation(NB)[None, :13].astype(np.int32)
    q = rng.standard_normal((1, HKV * G, D)).astype(np.float32)
    edge = {0: 464.0, 1: float(np.nextafter(np.float32(464.0), np.float32(1e9))), 2: -470.0, 3: 448.0, 4: np.inf}
    for h, c in edge.items():
        q[0, h] = np.float32(c) / np.float32(8.0)
    out = vt.turboquant_attention(q, cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt)
    with np.errstate(invalid="ignore"):  # the inf row's product: inf - inf
        ref = copy_path(q, cache, fmt, bs, cu, sk, bt)
    assert np.isfinite(out[0, [0, 3]]).all() and np.isnan(out[0, [1, 2, 4]]).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_allclose(out[fin], ref[fin], rtol=0, atol=float(np.abs(ref[fin]).max()) * 2e-6)
    # the same query as a strided bfloat16 view: read through its strides, out in bfloat16
    wide = np.zeros((1, HKV * G, 2 * D), ml_dtypes.bfloat16)
    wide[:, :, ::2] = q.astype(ml_dtypes.bfloat16)
    out16 = vt.turboquant_attention(wide[:, :, ::2], cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt,
                                    kv_cache_dtype=fmt)
    assert out16.dtype == ml_dtypes.bfloat16
    ref16 = vt.turboquant_attention(np.ascontiguousarray(wide[:, :, ::2]), cache, cu_seqlens_q=cu, seqused_k=sk,
                                    block_table=bt, kv_cache_dtype=fmt)
    np.testing.assert_array_equal(out16.view(np.uint16), ref16.view(np.uint16))
