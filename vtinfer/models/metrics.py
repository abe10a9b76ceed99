"""Accuracy of a run against the float32-KV reference: top-1 agreement, KL, perplexity."""

from __future__ import annotations

import numpy as np

__all__ = ["log_softmax", "compare", "perplexity"]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def perplexity(logits: np.ndarray, tokens: np.ndarray) -> float:
    """exp(mean negative log-likelihood of ``tokens[1:]`` under ``logits[:-1]``)."""
    toks = np.asarray(tokens).reshape(-1)
    nll = 0.0
    for i in range(0, len(toks) - 1, 128):
        j = min(i + 128, len(toks) - 1)
        lp = log_softmax(logits[i:j])
        nll -= lp[np.arange(j - i), toks[i + 1:j + 1]].sum()
    return float(np.exp(nll / max(len(toks) - 1, 1)))


def compare(ref_logits: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """``top1_agreement`` (fraction of positions with the same argmax),
    ``mean_kl`` (mean over positions of KL(ref || run), nats) and
    ``max_kl``."""
    n = len(ref_logits)
    agree = float(np.mean(ref_logits.argmax(-1) == logits.argmax(-1))) if n else float("nan")
    kls = []
    for i in range(0, n, 128):
        lp, lq = log_softmax(ref_logits[i:i + 128]), log_softmax(logits[i:i + 128])
        kls.append(np.sum(np.exp(lp) * (lp - lq), axis=-1))
    kl = np.concatenate(kls) if kls else np.zeros(0)
    return {"top1_agreement": agree, "mean_kl": float(np.mean(np.maximum(kl, 0.0))) if n else float("nan"),
            "max_kl": float(np.max(kl)) if n else float("nan")}
