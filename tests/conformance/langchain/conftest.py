"""Tiny real models for the LangChain real-engine suites (built once per test process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import real_models


@pytest.fixture(scope="session")
def smol_hermes_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2-135M-Instruct with Hermes tool markers (see `real_models.smollm2_hermes`)."""
    return str(real_models.smollm2_hermes(tmp_path_factory.mktemp("smol")))


@pytest.fixture(scope="session")
def smol_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2-135M-Instruct as converted (no tool markers)."""
    return str(real_models.smollm2(tmp_path_factory.mktemp("smol")))


@pytest.fixture(scope="session")
def hermes_tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny Qwen3-MoE with ChatML/Hermes/think markers."""
    return str(real_models.hermes_tiny(Path(tmp_path_factory.mktemp("hermes"))))
