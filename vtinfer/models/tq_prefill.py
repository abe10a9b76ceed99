"""vLLM 0.33's TurboQuant prefill rules, for the reference decoder.

vLLM's TurboQuant backend (``TurboQuantAttentionImpl._prefill_attention`` in
``vllm/v1/attention/backends/turboquant_attn.py``) stores every new token
into the slot cache first, then, per request of a prefill batch:

- **first chunk** (no cached tokens: ``q_len == seq_len``, ``q_len > 1``):
  causal attention over the chunk's own raw K/V; the cache is not read;
- **short continuation** (``q_len <= 128``): each query reads the slot cache
  as a decode does (the chunk's own tokens included, quantized);
- **long continuation** (``q_len > 128``): the cached prefix is dequantized
  into float16 buffers (MSE keys rotated back with a float16 product by the
  rotation matrix), the chunk's raw K/V are appended, and causal attention
  runs over the whole sequence.

Decodes (``q_len == 1``) read the cache. :func:`attend` applies these rules
to one layer of a :class:`vtinfer.models.decoder.Session` batch; the
decode-equivalent alternative (every query reads the cache) is
``vt.turboquant_attention`` alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import vtinfer as vt

CONTINUATION_DECODE_THRESHOLD = 128  # vLLM's _CONTINUATION_DECODE_THRESHOLD


def _prefix_kv(cache: np.ndarray, table_row: np.ndarray, cached: int, fmt: str, D: int) -> tuple[np.ndarray, ...]:
    """The first ``cached`` tokens of a request from its slot cache, as vLLM's float16 dequant buffers give them."""
    from vtinfer._turboquant import hadamard, turboquant_gather

    bs = cache.shape[1]
    j = np.arange(cached, dtype=np.int64)
    slots = table_row[j // bs].astype(np.int64) * bs + j % bs
    k, v = turboquant_gather(cache, slots, fmt, D)
    k, v = k.astype(np.float16), v.astype(np.float16)
    if vt.dtype_info(fmt).key_bits != 8:  # rotated basis -> the model's, in float16 as vLLM's Pi_half product
        H16 = hadamard(D).astype(np.float16).astype(np.float32)
        k = (k.astype(np.float32).reshape(-1, D) @ H16).astype(np.float16).reshape(k.shape)
    return k.astype(np.float32), v.astype(np.float32)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: np.ndarray, fmt: str, *, cu: np.ndarray,
           used: np.ndarray, table: np.ndarray, softmax_scale: float, window_size: Any,
           num_threads: int | None) -> np.ndarray:
    """One layer's attention for a batch whose new tokens are already in ``cache``.

    Parameters
    ----------
    q : float32 ``[n, H, D]``; k, v : float32 ``[n, H_kv, D]``
        The batch's new rows (raw, as vLLM's forward receives them).
    cache : uint8 ``[num_blocks, block_size, H_kv, slot_bytes]``
        The layer's slot cache, already holding the new rows.
    cu, used, table
        ``cu_seqlens_q`` int32 ``[B + 1]``, the sequences' lengths after this
        batch int32 ``[B]``, the block table int32 ``[B, max_blocks]``.

    Returns float32 ``[n, H, D]``.
    """
    out = np.empty_like(q)
    D = q.shape[-1]
    common = dict(softmax_scale=softmax_scale, causal=True, window_size=window_size, num_threads=num_threads)
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        n, seq = e - s, int(used[b])
        if n == 0:
            continue
        cached = seq - n
        if n == 1 or (cached > 0 and n <= CONTINUATION_DECODE_THRESHOLD):  # decode / short continuation: the cache
            out[s:e] = vt.turboquant_attention(
                q[s:e], cache, cu_seqlens_q=np.array([0, n], np.int32), seqused_k=np.array([seq], np.int32),
                block_table=table[b:b + 1], kv_cache_dtype=fmt, **common)
            continue
        kk, vv = k[s:e], v[s:e]
        if cached > 0:  # long continuation: the dequantized prefix, then the chunk's raw rows
            pk, pv = _prefix_kv(cache, table[b], cached, fmt, D)
            kk, vv = np.concatenate([pk, kk]), np.concatenate([pv, vv])
        out[s:e] = vt.flash_attn_varlen_func(
            q[s:e], np.ascontiguousarray(kk), np.ascontiguousarray(vv), cu_seqlens_q=np.array([0, n], np.int32),
            cu_seqlens_k=np.array([0, seq], np.int32), **common)
    return out
