"""Accuracy of a run against the float32-KV reference: top-1 agreement, KL, perplexity and its noise."""

from __future__ import annotations

import numpy as np

__all__ = ["log_softmax", "compare", "perplexity", "perplexity_noise", "token_nll"]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def token_nll(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Negative log-likelihood (nats, float64) of each of ``tokens[1:]`` under ``logits[:-1]``: ``[n - 1]``."""
    toks = np.asarray(tokens).reshape(-1)
    out = np.zeros(max(len(toks) - 1, 0), np.float64)
    for i in range(0, len(toks) - 1, 128):
        j = min(i + 128, len(toks) - 1)
        lp = log_softmax(logits[i:j])
        out[i:j] = -lp[np.arange(j - i), toks[i + 1:j + 1]]
    return out


def perplexity(logits: np.ndarray, tokens: np.ndarray) -> float:
    """exp(mean negative log-likelihood of ``tokens[1:]`` under ``logits[:-1]``)."""
    nll = token_nll(logits, tokens)
    return float(np.exp(nll.sum() / max(len(nll), 1)))


def _batch_mean_se(x: np.ndarray, batch: int) -> float:
    """Standard error of mean(x) by batch means: the spread of the means of consecutive batches of ``batch``
    values (a trailing partial batch dropped), which keeps the correlation between neighbouring tokens."""
    nb = len(x) // batch
    if nb < 2:
        return float("nan")
    means = x[: nb * batch].reshape(nb, batch).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(nb))


def perplexity_noise(nll: np.ndarray, ref_nll: np.ndarray | None = None, batch: int = 32) -> dict[str, float]:
    """Perplexity with its noise from per-token NLLs (:func:`token_nll`).

    ``ppl`` = exp(mean NLL); ``ppl_se`` its standard error, ``ppl * se(mean NLL)`` (first order), with
    se(mean NLL) by batch means over consecutive ``batch``-token batches: how much ppl would move on other
    text of this length. With a reference run's ``ref_nll`` on the same tokens also ``ppl_ratio`` =
    exp(mean(nll - ref_nll)) (= ppl / ref ppl) and ``ppl_ratio_se`` from the paired per-token differences
    the same way: the noise of the gap between the two runs, far smaller than either ppl's own noise
    because both score the same tokens. NaN where fewer than two batches exist.
    """
    nll = np.asarray(nll, np.float64)
    ppl = float(np.exp(nll.mean())) if len(nll) else float("nan")
    out = {"ppl": ppl, "ppl_se": ppl * _batch_mean_se(nll, batch)}
    if ref_nll is not None:
        d = nll - np.asarray(ref_nll, np.float64)
        ratio = float(np.exp(d.mean())) if len(d) else float("nan")
        out.update(ppl_ratio=ratio, ppl_ratio_se=ratio * _batch_mean_se(d, batch))
    return out


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
