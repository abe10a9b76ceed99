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


@pytest.fixture(scope="session")
def vllm_tp_loader(vllm_source: upstream.Source):
    """compressed-tensors' ``_tp_aware_loader`` (needs torch)."""
    pytest.importorskip("torch")
    return upstream.tp_aware_loader(vllm_source)


@pytest.fixture(scope="session")
def vllm_scalar_loader(vllm_source: upstream.Source):
    pytest.importorskip("torch")
    return upstream.scalar_scale_loader(vllm_source)


@pytest.fixture(scope="session")
def llmc_checkpoints(tmp_path_factory):
    """Checkpoints made by llm-compressor itself, once per pytest run, in a
    temporary directory (vtinfer.testing.checkpoints). Skipped without
    llm-compressor; a failure with VTINFER_REQUIRE_LLMCOMPRESSOR=1 (CI)."""
    from vtinfer.testing import checkpoints

    try:
        return checkpoints.make_llmcompressor_checkpoints(tmp_path_factory.mktemp("llmcompressor"))
    except checkpoints.ToolUnavailable as e:
        if checkpoints.require_llmcompressor():
            pytest.fail(f"llm-compressor required (VTINFER_REQUIRE_LLMCOMPRESSOR=1): {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def vllm_align(vllm_source: upstream.Source):
    """``Platform._align_heterogeneous_kv_block_size`` with stubs."""
    return upstream.heterogeneous_alignment(vllm_source)
