"""vtinfer inside vLLM: an attention backend whose kernels are vtinfer's.

vLLM loads :func:`register` through the ``vllm.general_plugins`` entry point
in every process it starts (front end, engine core, each worker). It does
nothing unless the user switched vtinfer on with ``VTINFER_VLLM=1``; then it
points vLLM's ``CPU_ATTN`` backend at :class:`vtinfer.vllm.backend.VtinferAttentionBackend`
(vLLM's CPU platform returns ``CPU_ATTN``'s class path whatever backend was
asked for, so that member is the one to override) and logs one INFO line that
names vtinfer, its version and the kernels' ISA.

No other part of vLLM is patched: vLLM 0.32's CPU build refuses KV dtypes only
inside CPU_ATTN itself (its supported list, and ``_get_attn_isa``'s "FP8 KV
cache on CPU requires x86 with AVX-512 or AMX" in CPU_ATTN's metadata
builder), which vtinfer's backend replaces whole; the config, the CPU platform
and the CPU model runner accept every ``CacheDType`` value.

Nothing here imports vLLM at module level: ``import vtinfer`` and
``import vtinfer.vllm`` never import it; :func:`register` does, inside vLLM.
"""

from __future__ import annotations

import logging
import os

ENV = "VTINFER_VLLM"
BACKEND_PATH = "vtinfer.vllm.backend.VtinferAttentionBackend"

# A child of vLLM's "vllm" logger, so the line goes through vLLM's handlers
# and format (vLLM configures only that namespace).
logger = logging.getLogger("vllm.plugins.vtinfer")


def enabled() -> bool:
    """Whether ``VTINFER_VLLM`` switches vtinfer on: ``1`` yes; unset, empty or ``0`` no.

    Any other value raises ValueError: a typo must not leave the user on
    vLLM's own backend believing they run vtinfer's.
    """
    raw = os.environ.get(ENV, "")
    value = raw.strip().lower()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"vtinfer: {ENV} must be 1 (use vtinfer's attention) or 0 / unset; got {raw!r}")


def register() -> None:
    """vLLM's general-plugin hook: route ``CPU_ATTN`` to vtinfer when ``VTINFER_VLLM=1``.

    Safe to call many times (vLLM calls it once per process). With the
    variable unset it returns before importing anything, so vLLM behaves as
    if vtinfer were not installed.
    """
    if not enabled():
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
    if logger.isEnabledFor(logging.INFO):
        announce()


_announced = False


def announce() -> None:
    """Log, once per process, the INFO line that names vtinfer as vLLM's attention.

    :func:`register` calls it when vLLM's logging is already set up; in a process where vLLM loads
    its plugins before it configures logging (the front end and an in-process engine core: the
    ``vllm`` logger is then still at the root's WARNING and the line would be dropped), the first
    attention layer built calls it instead (``VtinferAttentionImpl.__init__``).
    """
    global _announced
    if _announced:
        return
    import vtinfer

    _announced = True
    info = vtinfer.build_info()
    logger.info("vtinfer %s attention active (VTINFER_VLLM=1): CPU_ATTN -> %s, ISA %s",
                info["version"], BACKEND_PATH, info["isa"])
