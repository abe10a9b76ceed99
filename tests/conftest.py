"""Shared pytest fixtures for every test folder."""

from __future__ import annotations

import contextlib

import pytest

from vtinfer import _C

ISA_ORDER = ("scalar", "avx2", "avx512")


def available_isas() -> list[str]:
    """The ISAs this CPU can run, lowest first."""
    best = _C.build_info()["isa_best"]
    return list(ISA_ORDER[: ISA_ORDER.index(best) + 1])


@contextlib.contextmanager
def forced_isa(name: str):
    """Run a block with the kernels of `name`, restoring the previous ISA."""
    before = _C.isa()
    _C.set_isa(name)
    try:
        yield
    finally:
        _C.set_isa(before)


@pytest.fixture(params=available_isas())
def isa(request):
    """Parametrise a test over every ISA the CPU has (the scalar twin first)."""
    with forced_isa(request.param):
        yield request.param
