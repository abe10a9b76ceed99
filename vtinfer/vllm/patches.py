"""The places where vLLM 0.32's CPU build refuses what vtinfer can do, and how each is opened.

Applied by :func:`vtinfer.vllm.register` only (``VTINFER_VLLM=1``). Each
patch is idempotent and narrow; the list is the spec's (``.agents/specs/vllm-plugin.md``).
"""

from __future__ import annotations

_applied = False


def apply() -> None:
    """Apply every patch point once per process."""
    global _applied
    if _applied:
        return
    _applied = True
