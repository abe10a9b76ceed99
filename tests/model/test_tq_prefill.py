"""vLLM 0.33's TurboQuant prefill rules (vtinfer/models/tq_prefill.py) against the float64 oracle.

Per request: a first chunk (q_len > 1, nothing cached) attends to its raw K/V; a continuation of at most
128 queries reads the slot cache (its own tokens quantized too); a longer continuation reads the cached
prefix through float16 dequant buffers (MSE keys rotated back by a float16 product) and its own raw K/V;
decodes read the cache. The oracle's quantized K/V come from the independent NumPy twin
(tests/numerics/tq_twin.py), not from vtinfer's gather.
"""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import tq_twin
from tests.numerics.test_attention_oracle import check_close
from tests.numerics.test_kv_formats_tq_store import twin_codebook
from vtinfer.models import Decoder, tq_prefill

BS, HKV, H = 16, 2, 4
VLLM_THRESHOLD = 128  # vLLM 0.33's _CONTINUATION_DECODE_THRESHOLD (turboquant_attn.py), stated independently


def _twin_kv(fmt, k, v, D):
    """The twin's store then read, K in the model basis (float64 Hadamard), float32."""
    kb = tq_twin.PRESETS[fmt][0]
    mids = None if kb == 8 else twin_codebook(D, kb)[1]
    slots = tq_twin.store(fmt, k, v, mids=mids)
    kk, vv = tq_twin.dequantize(fmt, slots, D, None if kb == 8 else twin_codebook(D, kb)[0])
    if kb != 8:
        return kk, vv, True
    return kk, vv, False


def _case(fmt, D, prefix, n, seed):
    rng = np.random.default_rng(seed)
    total = prefix + n
    k = (rng.standard_normal((total, HKV, D)) * 1.5).astype(np.float32)
    v = rng.standard_normal((total, HKV, D)).astype(np.float32)
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    nb = -(-total // BS) + 1
    table = rng.permutation(nb)[None, : -(-total // BS)].astype(np.int32)
    j = np.arange(total)
    slots = table[0, j // BS].astype(np.int64) * BS + j % BS
    cache = np.zeros((nb, BS, HKV, vt.turboquant_slot_bytes(fmt, D)), np.uint8)
    vt.turboquant_store(k, v, cache, slots, fmt)  # vLLM stores the batch before it attends
    kq, vq, rotated = _twin_kv(fmt, k, v, D)
    Hd = tq_twin.hadamard(D)
    if n == 1 or (prefix > 0 and n <= VLLM_THRESHOLD):
        K = kq.astype(np.float64) @ Hd.astype(np.float64) if rotated else kq.astype(np.float64)
        V = vq.astype(np.float64)
    else:
        pk, pv = kq[:prefix].astype(np.float16), vq[:prefix].astype(np.float16)
        if rotated:
            H16 = Hd.astype(np.float16).astype(np.float32)
            pk = (pk.astype(np.float32).reshape(-1, D) @ H16).astype(np.float16).reshape(pk.shape)
        K = np.concatenate([pk.astype(np.float64), k[prefix:].astype(np.float64)])
        V = np.concatenate([pv.astype(np.float64), v[prefix:].astype(np.float64)])
    # the oracle's paged copy: identity block table over the sequence's rows
    nbo = -(-total // BS)
    Kp = np.zeros((nbo * BS, HKV, D)); Kp[:total] = K
    Vp = np.zeros((nbo * BS, HKV, D)); Vp[:total] = V
    oracle = (q, Kp.reshape(nbo, BS, HKV, D), Vp.reshape(nbo, BS, HKV, D), np.array([0, n], np.int32),
              np.array([total], np.int32), np.arange(nbo, dtype=np.int32)[None])
    return q, k[prefix:], v[prefix:], cache, table, oracle


@pytest.mark.parametrize("fmt,D", [("turboquant_k8v4", 64), ("turboquant_4bit_nc", 64), ("turboquant_3bit_nc", 32)])
@pytest.mark.parametrize("prefix,n", [(0, 37), (0, 1), (20, 5), (33, 128), (40, 150), (17, 129)])
def test_attend_follows_vllm_rules(fmt, D, prefix, n):
    q, k, v, cache, table, oracle = _case(fmt, D, prefix, n, seed=D + prefix + n)
    out = tq_prefill.attend(q, k, v, cache, fmt, cu=np.array([0, n], np.int32),
                            used=np.array([prefix + n], np.int32), table=table, softmax_scale=D ** -0.5,
                            window_size=(-1, -1), num_threads=2)
    check_close(out, None, oracle, {"softmax_scale": D ** -0.5}, what=f"{fmt} prefix={prefix} n={n}")


def test_decoder_vllm_prefill_first_chunk_is_raw(tiny_dirs):
    """One chunk, nothing cached: vLLM's TurboQuant prefill sees raw K/V, so the logits are the float32 run's
    (to the packed-vs-paged read's round-off); the decode-equivalent mode reads quantized keys and differs."""
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    toks = np.random.default_rng(5).integers(0, 100, 40)
    f32 = m.score(toks, "float32", chunk=64)
    vllm = m.score(toks, "turboquant_3bit_nc", chunk=64, turboquant_boundary=False, turboquant_prefill="vllm")
    cache = m.score(toks, "turboquant_3bit_nc", chunk=64, turboquant_boundary=False)
    gap = float(np.abs(cache - f32).max())
    assert gap > 1e-3, "anti-vacuity: the quantized read must move the logits"
    assert float(np.abs(vllm - f32).max()) <= 1e-4 * max(1.0, float(np.abs(f32).max())), "first chunk not raw"
    # a second, short chunk reads the cache (its keys and the first chunk's quantized)
    two = m.score(toks, "turboquant_3bit_nc", chunk=30, turboquant_boundary=False, turboquant_prefill="vllm")
    np.testing.assert_allclose(two[:30], vllm[:30], rtol=0, atol=1e-4 * max(1.0, float(np.abs(f32).max())))
    assert float(np.abs(two[30:] - f32[30:]).max()) > 1e-3


def test_turboquant_prefill_mode_is_checked(tiny_dirs):
    m = Decoder.from_pretrained(tiny_dirs["llama"])
    with pytest.raises(ValueError, match=r"Session: turboquant_prefill must be 'cache' or 'vllm'; got 'raw'"):
        m.session("turboquant_k8v4", turboquant_prefill="raw")
