"""Tensor parallelism as vLLM shards attention: which heads each rank holds.

vLLM's rule (``ModelConfig.verify_with_parallel_config``,
``QKVParallelLinear.__init__`` and the decoder attention layers of the pinned
release): the query heads are split evenly over the ``N`` ranks (``H % N``
must be 0); the KV heads are split evenly when ``H_kv >= N`` (``H_kv % N``
must be 0), otherwise every rank holds one KV head, replicated ``N // H_kv``
times (``N % H_kv`` must be 0), rank ``r`` holding KV head ``r // (N // H_kv)``.
Per-rank scale slices follow the same rule (compressed-tensors'
``_tp_aware_loader``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankHeads:
    """The heads one tensor-parallel rank holds.

    Attributes
    ----------
    rank, tensor_parallel_size : int
    num_heads, num_kv_heads : int
        Per rank (``H // N`` and ``max(1, H_kv // N)``).
    heads : tuple of int
        The global query-head indices of this rank.
    kv_heads : tuple of int
        The global KV-head indices of this rank.
    kv_replicas : int
        How many ranks hold each KV head (1 when the KV heads are split).
    """

    rank: int
    tensor_parallel_size: int
    num_heads: int
    num_kv_heads: int
    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    kv_replicas: int


def check_tensor_parallel(total_num_heads: int, total_num_kv_heads: int, tensor_parallel_size: int,
                          rank: int | None = None, *, who: str = "tensor_parallel") -> None:
    """Refuse what vLLM refuses, by name.

    Raises
    ------
    ValueError
        ``tensor_parallel_size`` not a positive int, query heads not divisible
        by it (vLLM's message), KV heads neither divisible by it nor dividing
        it, ``rank`` outside ``[0, tensor_parallel_size)``.
    """
    n = tensor_parallel_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ValueError(f"{who}: tensor_parallel_size must be a positive int; got {n!r}")
    if total_num_heads % n:
        raise ValueError(f"{who}: Total number of attention heads ({total_num_heads}) must be divisible by tensor "
                         f"parallel size ({n}).")
    if total_num_kv_heads >= n and total_num_kv_heads % n:
        raise ValueError(f"{who}: total_num_kv_heads must be divisible by tensor_parallel_size when "
                         f"total_num_kv_heads >= tensor_parallel_size; got {total_num_kv_heads} is not divisible "
                         f"by {n}")
    if total_num_kv_heads < n and n % total_num_kv_heads:
        raise ValueError(f"{who}: tensor_parallel_size must be divisible by total_num_kv_heads when "
                         f"total_num_kv_heads < tensor_parallel_size; got {n} is not divisible by "
                         f"{total_num_kv_heads}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, (int, np.integer))
                             or not 0 <= rank < n):
        raise ValueError(f"{who}: rank must be an int in [0, {n}); got {rank!r}")


def rank_heads(total_num_heads: int, total_num_kv_heads: int, tensor_parallel_size: int = 1,
               rank: int = 0) -> RankHeads:
    """The heads rank ``rank`` of ``tensor_parallel_size`` holds (see the module docs)."""
    check_tensor_parallel(total_num_heads, total_num_kv_heads, tensor_parallel_size, rank, who="rank_heads")
    n, r = int(tensor_parallel_size), int(rank)
    hpr = total_num_heads // n
    if total_num_kv_heads >= n:
        kpr, replicas = total_num_kv_heads // n, 1
        kv = tuple(range(r * kpr, (r + 1) * kpr))
    else:
        kpr, replicas = 1, n // total_num_kv_heads
        kv = (r // replicas,)
    return RankHeads(r, n, hpr, kpr, tuple(range(r * hpr, (r + 1) * hpr)), kv, replicas)


def rank_slice(values: np.ndarray, heads: RankHeads) -> np.ndarray:
    """The KV-head slice of a ``[total_num_kv_heads]`` array held by ``heads.rank``
    (a one-element array is returned as is: per-tensor scales are replicated)."""
    a = np.asarray(values)
    if a.size == 1:
        return a
    return a[list(heads.kv_heads)]
