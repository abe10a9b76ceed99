"""Tokenizers for the decoder: ``tokenizer.json`` through the ``tokenizers``
package, or a byte tokenizer for generated checkpoints that have none."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ByteTokenizer", "HFTokenizer", "load_tokenizer"]


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocabularies of at least 256)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` with plain ``encode``/``decode``."""

    def __init__(self, path: str | os.PathLike) -> None:
        from tokenizers import Tokenizer

        self.tk = Tokenizer.from_file(os.fspath(path))

    def encode(self, text: str) -> list[int]:
        return list(self.tk.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(path: str | os.PathLike, vocab_size: int) -> Any:
    """``tokenizer.json`` when present (needs ``tokenizers``), else bytes; None
    when neither fits."""
    p = Path(path) / "tokenizer.json"
    if p.is_file():
        try:
            return HFTokenizer(p)
        except ImportError:
            pass
    return ByteTokenizer() if vocab_size >= 256 else None
