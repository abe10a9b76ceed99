"""The demo's perplexity and its noise (vtinfer.models.metrics) against
references computed here by hand: the per-token NLL from an explicit
float64 softmax, the batch-means standard errors by loops."""

from __future__ import annotations

import math

import numpy as np

from vtinfer.models.metrics import perplexity, perplexity_noise, token_nll


def test_token_nll_and_perplexity_by_hand():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((300, 11)).astype(np.float32)
    toks = rng.integers(0, 11, 300)
    want = []
    for i in range(299):
        row = [float(x) for x in logits[i]]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        want.append(lse - row[toks[i + 1]])
    np.testing.assert_allclose(token_nll(logits, toks), want, rtol=1e-12, atol=1e-12)
    assert math.isclose(perplexity(logits, toks), math.exp(sum(want) / 299), rel_tol=1e-12)


def _se_by_loops(x, batch):
    nb = len(x) // batch
    means = [sum(x[b * batch:(b + 1) * batch]) / batch for b in range(nb)]
    mu = sum(means) / nb
    return math.sqrt(sum((m - mu) ** 2 for m in means) / (nb - 1)) / math.sqrt(nb)


def test_noise_is_batch_means_of_the_nll_and_of_the_paired_gap():
    rng = np.random.default_rng(1)
    ref = rng.gamma(2.0, 1.0, 211)  # 6 batches of 32 and a partial batch of 19, which is dropped
    run = ref + rng.normal(0.01, 0.05, 211)
    got = perplexity_noise(run, ref)
    ppl = math.exp(sum(run) / 211)
    assert math.isclose(got["ppl"], ppl, rel_tol=1e-12)
    assert math.isclose(got["ppl_se"], ppl * _se_by_loops(list(run), 32), rel_tol=1e-9)
    d = list(run - ref)
    ratio = math.exp(sum(d) / 211)
    assert math.isclose(got["ppl_ratio"], ratio, rel_tol=1e-12)
    assert math.isclose(got["ppl_ratio_se"], ratio * _se_by_loops(d, 32), rel_tol=1e-9)
    # paired: the gap's noise is far below either perplexity's own
    assert got["ppl_ratio_se"] * ppl < 0.2 * got["ppl_se"]
    # a run against itself: ratio 1, no noise; too few tokens for two batches: NaN, not a number made up
    same = perplexity_noise(ref, ref)
    assert same["ppl_ratio"] == 1.0 and same["ppl_ratio_se"] == 0.0
    assert math.isnan(perplexity_noise(ref[:40])["ppl_se"])
    assert "ppl_ratio" not in perplexity_noise(ref)
