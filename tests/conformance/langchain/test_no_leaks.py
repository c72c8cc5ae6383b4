"""Reasoning never reaches `.content`; raw format markers never reach `.content` or arguments.

Scripted engine: replies stream one character per token with every marker (`<think>`,
`</think>`, `<tool_call>`, `</tool_call>`, `<|im_end|>`) as its control id, through every
call path (invoke, stream, ainvoke, astream; output_version v0 and v1). Real engine: the
random tiny Qwen3-MoE whose vocabulary carries the same markers as control tokens, free
text, a forced call and schema-constrained JSON; whatever it writes, the markers must be
parsed out, never passed through.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from fake_engine import MARKERS, ScriptedEngine, tool_call_text
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_warp import ChatWarp
from pydantic import BaseModel

REASONING = "The user wants weather; secret plan: call both tools."
ANSWER = "Checking Oslo and Paris."
REPLY = (
    f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    + tool_call_text("get_weather", {"city": "Oslo", "note": "a <b> tag & \"quotes\""})
    + tool_call_text("get_weather", {"city": "Paris"})
)


def get_weather(city: str, note: str = "") -> str:
    """Weather of a city."""
    return "sunny"


def _texts(msg: BaseMessage) -> list[str]:
    """Every text a caller may read as the answer or as arguments."""
    out = [msg.text]
    if isinstance(msg.content, list):
        out += [json.dumps(b) for b in msg.content if b.get("type") not in ("reasoning",)]
    if isinstance(msg, AIMessage):
        out += [json.dumps(c["args"]) for c in msg.tool_calls]
        out += [str(c.get("args")) for c in msg.invalid_tool_calls]
        out += [str(c.get("args")) for c in getattr(msg, "tool_call_chunks", [])]
    return out


def assert_clean(msg: BaseMessage, reasoning: str | None) -> None:
    for text in _texts(msg):
        for marker in MARKERS:
            assert marker not in text, (marker, text)
        if reasoning:
            assert reasoning not in text, text


def _scripted(**kw: Any) -> Any:
    return ChatWarp(engine=ScriptedEngine([REPLY]), **kw).bind_tools([get_weather])


@pytest.mark.parametrize("version", ["v0", "v1"])
def test_scripted_every_path_keeps_reasoning_and_markers_out(version: str) -> None:
    llm = _scripted(output_version=version)
    msg = llm.invoke("Weather in Oslo and Paris?")
    assert msg.text == ANSWER
    assert [c["args"]["city"] for c in msg.tool_calls] == ["Oslo", "Paris"]
    assert msg.tool_calls[0]["args"]["note"] == 'a <b> tag & "quotes"'
    if version == "v0":
        assert msg.additional_kwargs["reasoning_content"].strip() == REASONING
    else:
        assert [b["reasoning"].strip() for b in msg.content_blocks if b["type"] == "reasoning"] \
            == [REASONING]
    assert_clean(msg, REASONING)

    chunks = list(llm.stream("Weather in Oslo and Paris?"))
    assert len(chunks) >= len(REASONING) + len(ANSWER)  # one chunk per character of text
    for chunk in chunks:
        assert_clean(chunk, None)
        for marker in MARKERS:
            assert marker not in str(chunk.content)
    full: AIMessageChunk = sum(chunks[1:], chunks[0])
    assert full.text == ANSWER and len(full.tool_calls) == 2
    assert_clean(full, REASONING)

    async def run() -> tuple[AIMessage, AIMessageChunk]:
        a = await llm.ainvoke("Weather in Oslo and Paris?")
        parts = [c async for c in llm.astream("Weather in Oslo and Paris?")]
        return a, sum(parts[1:], parts[0])

    a, b = asyncio.run(run())
    assert a.text == b.text == ANSWER
    assert_clean(a, REASONING)
    assert_clean(b, REASONING)


def test_scripted_structured_output_excludes_reasoning() -> None:
    class City(BaseModel):
        city: str

    reply = '<think>\nJSON with "city": "Rome"? No: Oslo.\n</think>\n\n{"city": "Oslo"}'
    llm = ChatWarp(engine=ScriptedEngine([reply]))
    out = llm.with_structured_output(City, include_raw=True).invoke("A city?")
    assert out["parsed"] == City(city="Oslo")
    assert out["raw"].text == '{"city": "Oslo"}'
    assert_clean(out["raw"], "Rome")


# --------------------------------------------------------------------------- real engine
class Paint(BaseModel):
    """Paint the wall."""

    color: Literal["red", "green", "blue"]
    glossy: bool


@pytest.mark.slow
def test_real_engine_keeps_markers_and_reasoning_out(hermes_tiny_path: str) -> None:
    llm = ChatWarp(model_path=hermes_tiny_path, max_tokens=64)
    free = llm.invoke("Say something.")
    assert_clean(free, free.additional_kwargs.get("reasoning_content"))

    forced = (
        ChatWarp(model_path=hermes_tiny_path, max_tokens=400)
        .bind_tools([Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False)
        .invoke("Paint the wall.")
    )
    assert [c["name"] for c in forced.tool_calls] == ["Paint"]
    assert_clean(forced, forced.additional_kwargs.get("reasoning_content"))

    streamed = list(
        ChatWarp(model_path=hermes_tiny_path, max_tokens=400)
        .bind_tools([Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False)
        .stream("Paint the wall.")
    )
    for chunk in streamed:
        assert_clean(chunk, None)
    full = sum(streamed[1:], streamed[0])
    assert [c["name"] for c in full.tool_calls] == ["Paint"]
    Paint.model_validate(full.tool_calls[0]["args"])
    assert_clean(full, full.additional_kwargs.get("reasoning_content"))

    raw = (
        ChatWarp(model_path=hermes_tiny_path, max_tokens=400)
        .with_structured_output(Paint, strict=True, include_raw=True)
        .invoke("Paint the wall.")
    )
    assert isinstance(raw["parsed"], Paint), raw
    assert Paint.model_validate_json(raw["raw"].text) == raw["parsed"]  # content is JSON only
    assert_clean(raw["raw"], raw["raw"].additional_kwargs.get("reasoning_content"))
