"""vtinfer's own decoder on the demo's scored tokens: the figures the engine runs are held to.

``Decoder.score(tokens, kv_cache_dtype)`` is what ``vtinfer demo`` runs for each of its rows (float32
weights, teacher-forced in 256-token chunks, the float32-KV run as the reference), so the top-1 and
KL computed here from its logits are the demo's figures for that format, put through the same top-K
estimator as vLLM's (``_metrics.py``) so that the two are compared like with like.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _metrics as M

# vLLM's flag -> the decoder's dtype for the same storage (the demo's "fp8_e4m3 / scale 1.0" row is
# vLLM's `fp8` with the default scale 1.0)
DECODER_DTYPE = {"fp8": "fp8_e4m3"}


class DecoderFigures:
    def __init__(self, model_dir: Any, tokens: list[int], k: int):
        from vtinfer.models.decoder import Decoder

        self.dec = Decoder.from_pretrained(model_dir)
        self.dec.blas_threads = 1  # the demo's default
        self.tokens, self.k = tokens, k
        self.ref_logits = self.dec.score(tokens, "float32")
        self.ref_top = M.topk_from_logits(self.ref_logits, k)
        self._cache: dict[str, dict[str, Any]] = {}

    def actual_logprobs(self, logits: np.ndarray) -> np.ndarray:
        """log P(tokens[i + 1] | tokens[:i + 1]) for i < n - 1 (vLLM's prompt_logprobs order)."""
        lp = M.log_softmax(logits[:-1])
        return lp[np.arange(len(lp)), np.asarray(self.tokens[1:])]

    def figures(self, kv_cache_dtype: str) -> dict[str, Any]:
        """top-1 / KL_S (and their noise) of the decoder's run with this KV dtype against its float32 run,
        and the full-vocabulary KL (the demo's mean_kl)."""
        if kv_cache_dtype not in self._cache:
            logits = self.dec.score(self.tokens, DECODER_DTYPE.get(kv_cache_dtype, kv_cache_dtype))
            ids, lps = M.topk_from_logits(logits, self.k)
            out = M.summary(*self.ref_top, ids, lps)
            out["full_kl"] = float(M.full_kl(self.ref_logits, logits).mean())
            self._cache[kv_cache_dtype] = out
        return self._cache[kv_cache_dtype]

    def figures_with_rounded_kv(self, name: str, rounding: Any) -> dict[str, Any]:
        """As :meth:`figures` for a float32 KV cache whose stored K and V are first put through
        ``rounding`` (float32 array -> float32 array): a model of another store's rounding rule."""
        if name not in self._cache:
            from vtinfer import _kvcache

            orig = _kvcache.PagedKVCache.store

            def store(cache: Any, layer: int, key: Any, value: Any, *a: Any, **kw: Any) -> None:
                orig(cache, layer, rounding(np.asarray(key, np.float32)), rounding(np.asarray(value, np.float32)),
                     *a, **kw)

            _kvcache.PagedKVCache.store = store
            try:
                logits = self.dec.score(self.tokens, "float32")
            finally:
                _kvcache.PagedKVCache.store = orig
            ids, lps = M.topk_from_logits(logits, self.k)
            out = M.summary(*self.ref_top, ids, lps)
            out["full_kl"] = float(M.full_kl(self.ref_logits, logits).mean())
            self._cache[name] = out
        return self._cache[name]


def e4m3_toward_zero(x: np.ndarray) -> np.ndarray:
    """float32 -> the e4m3fn value next to x toward zero (3 mantissa bits, normals from 2^-6, subnormal
    steps of 2^-9), saturating at +-448: the rounding of vLLM's CPU fp8 store at scale 1.0."""
    a = np.abs(x.astype(np.float64))
    _, e = np.frexp(a)  # a = m * 2^e, m in [0.5, 1): the leading bit is 2^(e - 1)
    step = np.exp2(np.maximum(e - 1, -6) - 3.0)
    t = np.minimum(np.floor(a / step) * step, 448.0)
    return (np.sign(x) * t).astype(np.float32)
