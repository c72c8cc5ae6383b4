"""Tiny real models for the LangChain real-engine suites (built once per test process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import real_models

MODEL_JUDGEMENT = {
    ("TestChatWarpRealIntegration", "test_agent_loop"): (
        "deciding unforced to call a tool is the model's judgement, which SmolLM2-135M "
        "(never trained on the tool markers) lacks: this test runs on the scripted engine "
        "(TestChatWarpStandard); the real engine runs the loop with its first call forced "
        "(test_agent_loop_with_forced_first_call)"
    ),
}
"""Standard tests that measure a model's judgement, run on the scripted engine only."""

_deselected: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    drop = [i for i in items
            if (getattr(i.cls, "__name__", ""), getattr(i, "originalname", "")) in MODEL_JUDGEMENT]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
        _deselected.extend(
            f"{i.nodeid}: {MODEL_JUDGEMENT[(i.cls.__name__, i.originalname)]}" for i in drop)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    for line in _deselected:
        terminalreporter.write_line(f"  DESELECTED {line}")


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
