"""Fixtures for differential tests against the pinned vLLM release's own
functions (extracted with ast; never imported). Offline: a skip with the
reason; with VTINFER_REQUIRE_UPSTREAM=1 (CI) a missing wheel fails."""

from __future__ import annotations

import pytest

from vtinfer.testing import upstream


@pytest.fixture(scope="session")
def vllm_source() -> upstream.Source:
    return upstream.locate_or_skip()


@pytest.fixture(scope="session")
def vllm_resolver(vllm_source: upstream.Source) -> upstream.ResolverFunctions:
    return upstream.resolver_functions(vllm_source)


@pytest.fixture(scope="session")
def vllm_remap(vllm_source: upstream.Source):
    fn, _logger = upstream.remap_function(vllm_source)
    return fn
