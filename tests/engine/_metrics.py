"""Accuracy of one run against another from each position's top-K log-probabilities.

vLLM hands back, per position, the K most likely tokens and their log-probabilities (a log-softmax
over the whole vocabulary) rather than the logits, so the KL here is computed from those lists, and
the decoder's figures are put through the same function (:func:`topk_from_logits`) before they are
compared: like with like.

KL: per position, S = the tokens in both runs' top K (both log-probabilities known). The two
distributions are coarsened to the |S| + 1 outcomes "each token of S" and "any other token", and

    KL_S(p || q) = sum_{v in S} p(v) log(p(v) / q(v)) + p(rest) log(p(rest) / q(rest)),
    p(rest) = 1 - sum_{v in S} p(v)

is the KL between the coarsened distributions: at most the full KL (a coarsening never raises a
KL), equal to it when the rest holds no mass. :func:`truncation_error` measures how far it falls
short on the decoder's full logits.
"""

from __future__ import annotations

import numpy as np

BATCH = 32  # tokens per batch for the batch-means noise (the demo's perplexity_noise batch)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def topk_from_logits(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [n, k], log-probabilities [n, k])``, most likely first, of full ``logits [n, vocab]``."""
    ids = np.empty((len(logits), k), np.int64)
    lps = np.empty((len(logits), k), np.float64)
    for i in range(0, len(logits), 128):
        lp = log_softmax(logits[i:i + 128])
        part = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
        vals = np.take_along_axis(lp, part, axis=-1)
        order = np.argsort(-vals, axis=-1, kind="stable")
        ids[i:i + 128] = np.take_along_axis(part, order, axis=-1)
        lps[i:i + 128] = np.take_along_axis(vals, order, axis=-1)
    return ids, lps


def kl_per_position(ref_ids, ref_lps, run_ids, run_lps) -> np.ndarray:
    """KL_S(ref || run) per position (nats), S = the tokens in both top-K lists (module docs)."""
    out = np.empty(len(ref_ids), np.float64)
    for i, (ri, rl, qi, ql) in enumerate(zip(ref_ids, ref_lps, run_ids, run_lps)):
        q = dict(zip((int(t) for t in qi), (float(x) for x in ql)))
        lp = np.array([x for t, x in zip(ri, rl) if int(t) in q], np.float64)
        lq = np.array([q[int(t)] for t in ri if int(t) in q], np.float64)
        p_s, q_s = float(np.exp(lp).sum()), float(np.exp(lq).sum())
        kl = float(np.sum(np.exp(lp) * (lp - lq)))
        rp, rq = 1.0 - p_s, 1.0 - q_s
        if rp > 1e-12:
            kl += rp * np.log(rp / max(rq, 1e-12))
        out[i] = max(kl, 0.0)
    return out


def top1_per_position(ref_ids, run_ids) -> np.ndarray:
    """1.0 where both runs' most likely token is the same."""
    return np.array([float(int(a[0]) == int(b[0])) for a, b in zip(ref_ids, run_ids)])


def batch_mean_se(x: np.ndarray, batch: int = BATCH) -> float:
    """Standard error of mean(x) by batch means over consecutive ``batch``-value batches (neighbouring
    tokens are correlated; the demo's perplexity noise uses the same estimator)."""
    x = np.asarray(x, np.float64)
    nb = len(x) // batch
    means = x[: nb * batch].reshape(nb, batch).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(nb))


def summary(ref_ids, ref_lps, run_ids, run_lps) -> dict[str, float]:
    """top-1 agreement and mean KL_S with their batch-means standard errors."""
    t1 = top1_per_position(ref_ids, run_ids)
    kl = kl_per_position(ref_ids, ref_lps, run_ids, run_lps)
    return {"top1": float(t1.mean()), "top1_se": batch_mean_se(t1), "kl": float(kl.mean()),
            "kl_se": batch_mean_se(kl), "n": len(t1)}


def full_kl(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(ref || run) per position over the whole vocabulary (the demo's ``compare``)."""
    out = []
    for i in range(0, len(ref_logits), 128):
        lp, lq = log_softmax(ref_logits[i:i + 128]), log_softmax(logits[i:i + 128])
        out.append(np.maximum(np.sum(np.exp(lp) * (lp - lq), axis=-1), 0.0))
    return np.concatenate(out)
