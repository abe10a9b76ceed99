"""Tensor parallelism on one machine: vLLM's multiprocessing executor, each rank holding its slice of
the heads (and, for per-token-head formats, computing its own heads' scales), gives the same greedy
tokens as one rank.

SmolLM2-135M has 9 attention heads and 3 KV heads, so the smallest tensor-parallel size above 1 that
vLLM accepts for it is 3 (one KV head per rank). The model runs in float32: in bfloat16 the
row-parallel projections' partial sums are rounded before they are added, which changes greedy
tokens with vLLM's own CPU_ATTN too (measured 2026-12-02: TP=3 vs TP=1 in bfloat16 diverged at
generated token 26 and 12 of two of the four prompts; in float32 all four equal).
"""

from __future__ import annotations

import pytest

from .conftest import FORMAT_MODEL_DTYPE, TP_DTYPES, TP_SIZE


# An int8 code whose input lies on a rounding boundary flips when the ranks' float32 sums round
# differently, which moves a log-probability by a few 1e-2 here (measured max 0.054 between TP=3 and
# TP=1 where their tokens agree); a wrong head or scale slice moves them by nats.
CODE_FLIP_CAP = {"auto": 0.0, "int8_per_token_head": 0.1}


@pytest.mark.parametrize("kv_cache_dtype", TP_DTYPES)
def test_tensor_parallel_greedy_tokens_equal_one_rank(engines, kv_cache_dtype):
    """``auto`` (float32): equal tokens. ``int8_per_token_head``: equal tokens until a position where one
    rank's choice is a near tie: its top-2 margin below the largest log-probability gap between the
    two runs over the tokens they agree on (the size of a code flip, at most CODE_FLIP_CAP)."""
    one = engines["vtinfer"].get(f"{kv_cache_dtype}-{FORMAT_MODEL_DTYPE}")
    assert one["backend"] == ["vtinfer.vllm.backend.VtinferAttentionBackend"], one["backend"]
    group = engines["tp"]
    many = group.get(f"tp{TP_SIZE}-{kv_cache_dtype}-{FORMAT_MODEL_DTYPE}")
    assert many["llm"]["tensor_parallel_size"] == TP_SIZE
    # the ranks run vtinfer's backend: each worker logs it
    assert sum("attention active" in ln and "VllmWorker" in ln for ln in group.log.splitlines()) >= TP_SIZE
    assert len(many["greedy"]) > 0
    for i, (a, b) in enumerate(zip(one["greedy"], many["greedy"])):
        n = len(b["tokens"])
        ta, tb = a["tokens"][:n], b["tokens"]
        j = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), n)
        gap = max((abs(x - y) for x, y in zip(a["logprobs"][:j], b["logprobs"][:j])), default=0.0)
        assert gap <= max(CODE_FLIP_CAP[kv_cache_dtype], 1e-3), f"prompt {i}: log-probabilities differ by {gap}"
        if kv_cache_dtype == "auto":
            assert ta == tb, f"prompt {i}: TP={TP_SIZE} greedy tokens differ from TP=1 at {j}"
        elif j < n:
            assert a["margins"][j] < gap, (f"prompt {i}: tokens differ at {j} where TP=1's margin "
                                           f"{a['margins'][j]} is no near tie (gap {gap})")
