"""A block allocator for the paged KV cache: blocks per sequence with
reference counts, block tables and slot mappings for a batch.

>>> a = BlockAllocator(num_blocks=8, block_size=4)
>>> a.allocate("s0", 6)          # two blocks
[0, 1]
>>> a.fork("s0", "s1")           # s1 shares s0's blocks (prefix)
[0, 1]
>>> a.slot_mapping(["s0"], [[4, 5]]).tolist()
[4, 5]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["BlockAllocator"]


class BlockAllocator:
    """Hands out block ids in ``[0, num_blocks)`` to sequences.

    A block may belong to several sequences (a shared prefix); it returns to
    the free list when its reference count reaches zero. Free blocks are
    handed out lowest id first, so allocation is deterministic.

    Parameters
    ----------
    num_blocks : int
        Blocks in the cache (> 0).
    block_size : int
        Tokens per block (> 0).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"BlockAllocator: {name} must be an int; got {type(v).__name__}")
            if v <= 0:
                raise ValueError(f"BlockAllocator: {name} must be > 0; got {v}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self._refcount = np.zeros(self.num_blocks, dtype=np.int64)
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # pop() gives the lowest id
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}

    # ---- queries ----
    @property
    def num_free(self) -> int:
        """Blocks with reference count zero."""
        return len(self._free)

    def refcount(self, block: int) -> int:
        """Reference count of ``block``."""
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"BlockAllocator.refcount: block must be in [0, {self.num_blocks}); got {block}")
        return int(self._refcount[block])

    def blocks(self, seq: Hashable) -> list[int]:
        """Block ids of ``seq`` in order (a copy)."""
        return list(self._table(seq, "blocks"))

    def length(self, seq: Hashable) -> int:
        """Tokens ``seq`` holds."""
        self._table(seq, "length")
        return self._lengths[seq]

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._tables

    def _table(self, seq: Hashable, fn: str) -> list[int]:
        try:
            return self._tables[seq]
        except KeyError:
            raise KeyError(f"BlockAllocator.{fn}: seq must be an allocated sequence; got {seq!r}") from None

    def _take(self, n: int, fn: str) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"BlockAllocator.{fn}: {n} free blocks needed; {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self._refcount[out] += 1
        return out

    # ---- changes ----
    def allocate(self, seq: Hashable, num_tokens: int) -> list[int]:
        """Give a new sequence enough blocks for ``num_tokens`` tokens.

        Raises KeyError when ``seq`` exists, ValueError for a negative count,
        MemoryError (nothing allocated) when too few blocks are free.
        """
        if seq in self._tables:
            raise KeyError(f"BlockAllocator.allocate: seq must be new; got {seq!r}, which exists")
        if num_tokens < 0:
            raise ValueError(f"BlockAllocator.allocate: num_tokens must be >= 0; got {num_tokens}")
        need = -(-num_tokens // self.block_size)
        self._tables[seq] = self._take(need, "allocate")
        self._lengths[seq] = int(num_tokens)
        return list(self._tables[seq])

    def append(self, seq: Hashable, num_tokens: int = 1) -> list[int]:
        """Grow ``seq`` by ``num_tokens``; returns the slots of the new tokens.

        A partly filled last block shared with another sequence (after
        :meth:`fork`) is never written into: this method raises ValueError
        instead (copy-on-write is the caller's business).
        """
        table = self._table(seq, "append")
        if num_tokens < 0:
            raise ValueError(f"BlockAllocator.append: num_tokens must be >= 0; got {num_tokens}")
        n0 = self._lengths[seq]
        if n0 % self.block_size and table and self._refcount[table[-1]] > 1 and num_tokens > 0:
            raise ValueError(
                f"BlockAllocator.append: the last block of {seq!r} must not be shared to append into it; "
                f"block {table[-1]} has refcount {int(self._refcount[table[-1]])}"
            )
        need = -(-(n0 + num_tokens) // self.block_size) - len(table)
        table.extend(self._take(max(need, 0), "append"))
        self._lengths[seq] = n0 + num_tokens
        pos = np.arange(n0, n0 + num_tokens, dtype=np.int64)
        return (np.asarray(table, dtype=np.int64)[pos // self.block_size] * self.block_size
                + pos % self.block_size).tolist()

    def fork(self, parent: Hashable, child: Hashable) -> list[int]:
        """Make ``child`` share every block of ``parent`` (reference counts + 1)."""
        table = self._table(parent, "fork")
        if child in self._tables:
            raise KeyError(f"BlockAllocator.fork: child must be new; got {child!r}, which exists")
        self._tables[child] = list(table)
        self._lengths[child] = self._lengths[parent]
        if table:
            np.add.at(self._refcount, table, 1)
        return list(table)

    def free(self, seq: Hashable) -> None:
        """Drop ``seq``; blocks whose count reaches zero become free."""
        table = self._table(seq, "free")
        del self._tables[seq]
        del self._lengths[seq]
        for b in reversed(table):
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free.append(b)
        self._free.sort(reverse=True)

    # ---- arrays for kernels ----
    def block_table(self, seqs: Sequence[Hashable], max_blocks: int | None = None, pad: int = 0) -> np.ndarray:
        """``int32 [len(seqs), max_blocks]`` block ids, rows padded with ``pad``."""
        tables = [self._table(s, "block_table") for s in seqs]
        width = max((len(t) for t in tables), default=0) if max_blocks is None else int(max_blocks)
        out = np.full((len(tables), width), pad, dtype=np.int32)
        for i, t in enumerate(tables):
            if len(t) > width:
                raise ValueError(f"BlockAllocator.block_table: max_blocks must be >= {len(t)}; got {width}")
            out[i, : len(t)] = t
        return out

    def slot_mapping(self, seqs: Sequence[Hashable], positions: Sequence[Sequence[int]]) -> np.ndarray:
        """``int64`` slots of the given token positions of each sequence, concatenated.

        ``positions[i]`` are token indices of ``seqs[i]`` in ``[0, length)``
        (IndexError otherwise); a position of -1 gives slot -1 (padding).
        """
        if len(seqs) != len(positions):
            raise ValueError(
                f"BlockAllocator.slot_mapping: positions must have one entry per seq ({len(seqs)}); got {len(positions)}"
            )
        parts = []
        for s, pos in zip(seqs, positions):
            table = np.asarray(self._table(s, "slot_mapping"), dtype=np.int64)
            p = np.asarray(pos, dtype=np.int64).reshape(-1)
            pad = p == -1
            bad = (~pad) & ((p < 0) | (p >= self._lengths[s]))
            if bad.any():
                raise IndexError(
                    f"BlockAllocator.slot_mapping: positions of {s!r} must be in [0, {self._lengths[s]}) or -1; "
                    f"got {int(p[bad][0])}"
                )
            q = np.where(pad, 0, p)
            slots = table[q // self.block_size] * self.block_size + q % self.block_size if len(table) else q
            parts.append(np.where(pad, -1, slots).astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
