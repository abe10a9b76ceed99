"""The float64 oracle of paged attention (and its float32 "naive" twin that
sets the tolerance), plus fixtures that build paged caches.

The oracle is written from the semantics in UPSTREAM.md ("Store and read"),
independently of the C code: gather each sequence's keys through the block
table, decode (ml_dtypes casts, exact), mask, softmax with the sink, weight
V. Tolerance (FlashAttention's rule): our max error against the float64
oracle is at most 2x the error of the same computation done naively in
float32 and rounded to q's dtype, plus 16 float32 units of the largest
output (the float32 accumulation floor, decided a priori)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
FLOATS = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def decode_cache(cache: np.ndarray, kv_cache_dtype: str, dt) -> np.ndarray:
    """Cache values as `dt` (exact for every code; codes are uint8)."""
    if cache.dtype == np.uint8:
        return cache.view(FP8[kv_cache_dtype]).astype(dt)
    return cache.astype(dt)


def attention_ref(
    q, k, v, cu_seqlens_q, seqused_k, block_table, *, softmax_scale=None, causal=True, window_size=(-1, -1),
    softcap=0.0, alibi_slopes=None, s_aux=None, k_descale=None, v_descale=None, kv_cache_dtype="auto",
    dt=np.float64,
):
    """out [total_q, H, D] (float64, or q's dtype when dt is float32) and lse [H, total_q]."""
    T, H, D = q.shape
    Hkv = k.shape[2]
    bs = k.shape[1]
    G = H // Hkv
    scale = 1.0 / math.sqrt(D) if softmax_scale is None else softmax_scale
    B = len(seqused_k)

    def descale(d, b):
        if d is None:
            return np.ones(Hkv, dt)
        d = np.asarray(d, np.float32).astype(dt)
        if d.ndim == 0 or d.size == 1:
            return np.full(Hkv, d.reshape(-1)[0], dt)
        return d if d.ndim == 1 else d[b]

    qd = q.astype(dt)
    out = np.zeros((T, H, D), dt)
    lse = np.zeros((H, T), dt)
    for b in range(B):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ql, kl = q1 - q0, int(seqused_k[b])
        if ql == 0:
            continue
        j = np.arange(kl)
        blocks = block_table[b, j // bs]
        kk = decode_cache(k[blocks, j % bs], kv_cache_dtype, dt)  # [kl, Hkv, D]
        vv = decode_cache(v[blocks, j % bs], kv_cache_dtype, dt)
        kd, vd = descale(k_descale, b), descale(v_descale, b)
        kk = np.repeat(kk * kd[None, :, None], G, axis=1)  # [kl, H, D]
        vv = np.repeat(vv * vd[None, :, None], G, axis=1)
        s = np.einsum("qhd,khd->hqk", qd[q0:q1], kk).astype(dt) * dt(scale)
        if softcap > 0:
            s = dt(softcap) * np.tanh(s / dt(softcap))
        pos = kl - ql + np.arange(ql)
        dist = j[None, :] - pos[:, None]  # [ql, kl]
        if alibi_slopes is not None:
            s = s - np.asarray(alibi_slopes, np.float32).astype(dt)[:, None, None] * np.abs(dist)[None].astype(dt)
        vis = np.ones((ql, kl), bool)
        if causal:
            vis &= dist <= 0
        if window_size[0] >= 0:
            vis &= dist >= -window_size[0]
        if window_size[1] >= 0:
            vis &= dist <= window_size[1]
        s = np.where(vis[None], s, -np.inf)
        m = s.max(axis=2, initial=-np.inf)  # [H, ql]
        if s_aux is not None:
            m = np.maximum(m, np.asarray(s_aux, np.float32).astype(dt)[:, None])
        msafe = np.where(np.isfinite(m), m, 0)
        e = np.exp(s - msafe[:, :, None])
        den = e.sum(axis=2)
        if s_aux is not None:
            den = den + np.exp(np.asarray(s_aux, np.float32).astype(dt)[:, None] - msafe)
        num = np.einsum("hqk,khd->qhd", e, vv).astype(dt)
        with np.errstate(invalid="ignore", divide="ignore"):
            o = num / den.T[:, :, None]
            lse[:, q0:q1] = np.where(den > 0, msafe + np.log(den), -np.inf)
        out[q0:q1] = np.where(den.T[:, :, None] > 0, o, 0)
    if dt == np.float32:
        out = out.astype(q.dtype)
    return out, lse


def check_close(ours, lse_ours, args, kw, *, what=""):
    """FlashAttention's rule against the float64 oracle."""
    ref, lse_ref = attention_ref(*args, **kw, dt=np.float64)
    naive, lse_naive = attention_ref(*args, **kw, dt=np.float32)
    ref_n = np.nan_to_num(ref)
    floor = 16 * 2.0**-24 * max(np.abs(ref_n).max(initial=0.0), 1e-30)
    err = np.abs(ours.astype(np.float64) - ref).max(initial=0.0)
    err_naive = np.abs(naive.astype(np.float64) - ref).max(initial=0.0)
    assert np.isfinite(err), f"{what}: non-finite output (NaN leaked from an unread/poisoned slot?)"
    assert err <= 2 * err_naive + floor, f"{what}: error {err:.3g} > 2 x naive {err_naive:.3g} + {floor:.3g}"
    if lse_ours is not None:
        fin = np.isfinite(lse_ref)
        assert np.array_equal(np.isfinite(lse_ours), fin), f"{what}: lse finiteness differs"
        lfloor = 16 * 2.0**-24 * max(np.abs(lse_ref[fin]).max(initial=0.0), 1.0)
        le = np.abs(lse_ours[fin] - lse_ref[fin]).max(initial=0.0)
        ln = np.abs(lse_naive[fin] - lse_ref[fin]).max(initial=0.0)
        assert le <= 2 * ln + lfloor, f"{what}: lse error {le:.3g} > 2 x naive {ln:.3g} + {lfloor:.3g}"
    return err, err_naive


def shuffled_block_table(rng, k_lens, block_size, *, extra_blocks=3, spare_column=True):
    """(num_blocks, block_table int32 [B, max_blocks (+1)]): each sequence's
    blocks drawn from one permutation of num_blocks = its blocks + extra;
    the unused entries (and the spare column) name the permutation's last
    block, a real block no sequence owns (poison it to catch reads past a
    sequence's keys)."""
    nblk = [max(1, -(-kl // block_size)) for kl in k_lens]
    NB = sum(nblk) + extra_blocks
    perm = rng.permutation(NB)
    bt = np.full((len(k_lens), max(nblk) + (1 if spare_column else 0)), perm[-1], np.int32)
    o = 0
    for b, n in enumerate(nblk):
        bt[b, :n] = perm[o : o + n]
        o += n
    return NB, bt


def make_case(rng, *, q_lens, k_lens, H, Hkv, D, block_size, q_dtype="float32", kv_cache_dtype="auto",
              kv_float="float32", extra_blocks=3, layout="NHD", kv_scale=1.0):
    """q, k, v, cu_seqlens_q, seqused_k, block_table with shuffled blocks;
    every slot no sequence uses holds NaN (codes 0x7F / 0xFF), so a read
    past seqused_k or through a wrong block turns the output NaN."""
    B = len(q_lens)
    T = int(sum(q_lens))
    NB, bt = shuffled_block_table(rng, k_lens, block_size, extra_blocks=extra_blocks)
    q = rng.standard_normal((T, H, D)).astype(np.float32).astype(FLOATS[q_dtype])
    fp8 = kv_cache_dtype in FP8
    shape = (NB, block_size, Hkv, D)
    if fp8:
        k = np.full(shape, 0x7F, np.uint8)
        v = np.full(shape, 0xFF, np.uint8)
    else:
        k = np.full(shape, np.nan, np.float32).astype(FLOATS[kv_float])
        v = np.full(shape, np.nan, np.float32).astype(FLOATS[kv_float])
    for b in range(B):
        kl = k_lens[b]
        j = np.arange(kl)
        kv = rng.standard_normal((2, kl, Hkv, D)).astype(np.float32)
        if fp8:
            enc = (kv / np.float32(kv_scale)).astype(FP8[kv_cache_dtype]).view(np.uint8)
            k[bt[b, j // block_size], j % block_size] = enc[0]
            v[bt[b, j // block_size], j % block_size] = enc[1]
        else:
            k[bt[b, j // block_size], j % block_size] = kv[0].astype(FLOATS[kv_float])
            v[bt[b, j // block_size], j % block_size] = kv[1].astype(FLOATS[kv_float])
    if layout == "HND":
        k = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        v = np.ascontiguousarray(v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return q, k, v, cu, np.asarray(k_lens, np.int32), bt


def test_oracle_matches_a_direct_loop():
    """The vectorised oracle against a plain per-(token, head, key) loop."""
    rng = np.random.default_rng(7)
    args = make_case(rng, q_lens=[2, 1], k_lens=[5, 3], H=4, Hkv=2, D=8, block_size=2)
    kw = dict(softcap=3.0, alibi_slopes=np.array([0.1, 0.2, 0.3, 0.4], np.float32),
              s_aux=np.array([0.5, -1, 0, 2], np.float32), window_size=(2, 0))
    out, lse = attention_ref(*args, **kw)
    q, k, v, cu, sk, bt = args
    for b in range(2):
        ql, kl = cu[b + 1] - cu[b], sk[b]
        for i in range(ql):
            p = kl - ql + i
            for h in range(4):
                logits, vals = [], []
                for jj in range(kl):
                    if jj > p or jj < p - 2:
                        continue
                    kr = k[bt[b, jj // 2], jj % 2, h // 2].astype(np.float64)
                    s = float(q[cu[b] + i, h] @ kr) / math.sqrt(8)
                    s = 3.0 * math.tanh(s / 3.0) + float(kw["alibi_slopes"][h]) * (jj - p)
                    logits.append(s)
                    vals.append(v[bt[b, jj // 2], jj % 2, h // 2].astype(np.float64))
                w = [math.exp(x) for x in logits]
                den = sum(w) + math.exp(float(kw["s_aux"][h]))
                ref = sum(wi * vi for wi, vi in zip(w, vals)) / den
                np.testing.assert_allclose(out[cu[b] + i, h], ref, rtol=1e-12, atol=1e-14)
                assert abs(lse[h, cu[b] + i] - math.log(den)) < 1e-12
