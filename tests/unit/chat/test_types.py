"""Shared request/response types: what validates, what is refused, what round-trips through a dump."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warp_providers.types import (
    AssistantMessage,
    ChatRequest,
    ImagePart,
    Message,
    MessageToolCall,
    NamedToolChoice,
    TextPart,
    ToolCall,
    ToolDefinition,
    Usage,
)


def test_request_parses_openai_shape() -> None:
    req = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "d"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "data:,"}},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "r",
                    "tool_calls": [
                        {
                            "id": "1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "1", "content": "ok", "custom": 1},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True},
            },
            "reasoning_effort": "high",
        }
    )
    parts = req.messages[1].content
    assert isinstance(parts, list) and [type(p) for p in parts] == [TextPart, ImagePart, TextPart]
    assert isinstance(req.tool_choice, NamedToolChoice)
    assert req.response_format is not None and req.response_format.json_schema is not None
    assert req.response_format.json_schema.schema_ == {"type": "object"}
    dumped = req.model_dump(exclude_unset=True, by_alias=True)
    assert dumped["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert dumped["messages"][3]["custom"] == 1 and "name" not in dumped["messages"][3]


def test_flat_tool_call_and_default_types() -> None:
    call = MessageToolCall.model_validate({"name": "f", "arguments": {"a": 1}})
    assert (
        call.function.name == "f"
        and call.function.arguments == {"a": 1}
        and call.type == "function"
    )
    assert (
        ToolDefinition.model_validate({"function": {"name": "f"}}).model_dump(exclude_unset=True)[
            "type"
        ]
        == "function"
    )


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "x", "tool_calls": []},
        {"role": "robot", "content": "x"},
        {"role": "user", "content": 3},
        {"role": "user", "content": [{"type": "text"}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]},
    ],
)
def test_invalid_messages(message: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError):
        Message.model_validate(message)


def test_request_needs_messages_and_known_choices() -> None:
    with pytest.raises(ValidationError):
        ChatRequest.model_validate({"messages": []})
    with pytest.raises(ValidationError):
        ChatRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}
        )
    with pytest.raises(ValidationError):
        ChatRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "response_format": "json_object"}
        )
    with pytest.raises(ValidationError):
        ChatRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}
        )


@pytest.mark.parametrize(
    "response_format",
    [{"json_schema": {"schema": {}}}, {"type": "json_schema", "json_schema": "s"}],
    ids=["no-type", "non-object-json_schema"],
)
def test_response_format_passes_to_the_format_as_sent(response_format: dict) -> None:  # type: ignore[type-arg]
    """Any object is a response_format; the format decides what it means (PROTOCOLS §2.7, §7.7)."""
    req = ChatRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "response_format": response_format}
    )
    dumped = req.model_dump(mode="python", exclude_unset=True, by_alias=True)
    assert dumped["response_format"] == response_format


def test_results() -> None:
    call = ToolCall(index=0, id="call_0", name="f", arguments='{"a": 1}')
    assert call.parsed_arguments() == {"a": 1}
    assert (
        ToolCall(index=0, id="x", name="f", arguments="[1]", malformed=True).parsed_arguments()
        is None
    )
    assert (
        ToolCall(index=0, id="x", name="f", arguments="{oops", malformed=True).parsed_arguments()
        is None
    )
    msg = AssistantMessage(content="c", tool_calls=[call], finish_reason="tool_calls")
    assert msg.role == "assistant" and msg.reasoning is None
    assert Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5).total_tokens == 5
    with pytest.raises(ValidationError):
        Usage(prompt_tokens=3, completion_tokens=2, total_tokens=4)
    with pytest.raises(ValidationError):
        AssistantMessage(finish_reason="maybe")  # type: ignore[arg-type]
