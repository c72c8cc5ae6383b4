"""chat.json formats (PROTOCOLS §4): load validation, marker checks, protocol discovery, rendering, refusals, reader."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_helpers import CHATML_JSON, GLM_MARKERS, KIMI_MARKERS, items_from_ids, make_hf, run_parser

from warp_providers.chat.base import ChatFormatError, ImageInfo, M, T
from warp_providers.chat.formats.chatjson import (
    MARKER_PATTERN,
    ChatJsonFormat,
    ChatJsonParser,
    load_chat_json,
)
from warp_providers.chat.formats.glm import GLM_CHAT_JSON
from warp_providers.chat.formats.kimi import KIMI_CHAT_JSON
from warp_providers.tokenizer import Tokenizer

K3_CHAT_JSON = {
    "system": ['<|open|>message role="system"<|sep|>', "<|close|>message<|sep|><|end_of_msg|>"],
    "user": ['<|open|>message role="user"<|sep|>', "<|close|>message<|sep|><|end_of_msg|>"],
    "assistant": [
        '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>',
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
    ],
    "open": '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>',
}
CHATML_ONLY = make_hf(("<|im_start|>", "<|im_end|>"))
USER = {"role": "user", "content": "hi"}


def chatml(tok: Tokenizer = CHATML_ONLY, data: dict[str, Any] | None = None) -> ChatJsonFormat:
    f = ChatJsonFormat(data or CHATML_JSON)
    f.bind(tok)
    return f


# --------------------------------------------------------------------------- §4.2 load-time validation
BASE = {"user": ["<|im_start|>user\n", "<|im_end|>"], "open": "<|im_start|>assistant\n"}
LOAD_CASES = [
    ([1, 2], "chat.json must be a JSON object"),
    ({**BASE, "system": ["a"]}, 'chat.json "system" must be a [prefix, suffix] pair of strings'),
    (
        {**BASE, "assistant": ["a", 1]},
        'chat.json "assistant" must be a [prefix, suffix] pair of strings',
    ),
    (
        {**BASE, "open": ""},
        'chat.json has no "open", so there is nothing to hand the model the floor with',
    ),
    (
        {"user": BASE["user"]},
        'chat.json has no "open", so there is nothing to hand the model the floor with',
    ),
    ({}, 'chat.json has no "open", so there is nothing to hand the model the floor with'),
    (
        {"open": "x", "stop": "<|im_end|>"},
        'chat.json has no "user" turn, so a request cannot be put to the model',
    ),
    ({**BASE, "stop": 3}, 'chat.json "stop" must be a string'),
    (
        {"user": ["u", "no marker"], "open": "o"},
        'chat.json carries no control token that ends a generated turn: give it a "stop", or an "assistant" suffix that has one',
    ),
    (
        {**BASE, "assistant": ["a", "plain"]},
        'chat.json carries no control token that ends a generated turn: give it a "stop", or an "assistant" suffix that has one',
    ),
    ({**BASE, "stop": "<|im_end|>", "prelude": 5}, 'chat.json "prelude" must be a string'),
    (
        {**BASE, "stop": "<|im_end|>", "think": ["<think>", ""]},
        'chat.json "think" must be an [open, close] pair of non-empty strings',
    ),
    (
        {**BASE, "stop": "<|im_end|>", "think": "<think>"},
        'chat.json "think" must be an [open, close] pair of non-empty strings',
    ),
    ({**BASE, "stop": "<|im_end|>", "effort": ["x"]}, 'chat.json "effort" must be a string'),
    ({**BASE, "stop": "<|im_end|>", "image": 1}, 'chat.json "image" must be a string'),
    (
        {**BASE, "stop": "<|im_end|>", "effort": "level"},
        'chat.json "effort" must contain {} where the level goes',
    ),
]


@pytest.mark.parametrize("data,message", LOAD_CASES)
def test_load_validation_messages(data: Any, message: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        load_chat_json(data)
    assert err.value.message == message and err.value.param == "model"


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(
        ChatFormatError,
        match=r"^the container has no chat.json describing its conversation format \(examples/ has one per supported architecture\)$",
    ):
        load_chat_json(tmp_path / "chat.json")
    with pytest.raises(ChatFormatError, match="^the container has no chat.json"):
        load_chat_json(None)
    bad = tmp_path / "chat.json"
    bad.write_text("{nope")
    with pytest.raises(ChatFormatError, match=r"^chat.json cannot be read: "):
        load_chat_json(bad)
    bad.write_text(json.dumps(CHATML_JSON))
    assert load_chat_json(bad).stop_marker == "<|im_end|>"


def test_stop_marker_sources() -> None:
    assert (
        load_chat_json({**BASE, "assistant": ["a", "x<|eot|>y<|im_end|>"]}).stop_marker == "<|eot|>"
    )
    assert (
        load_chat_json({**BASE, "assistant": ["a", "<|im_end|>"], "stop": "<|user|>"}).stop_marker
        == "<|user|>"
    )
    assert load_chat_json(GLM_CHAT_JSON).stop_marker == "<|user|>"


@pytest.mark.parametrize(
    "text,found",
    [
        ("<|im_start|>system\n", ["<|im_start|>"]),
        ("[gMASK]<sop>", []),
        ("<think></think>", ["<think>", "</think>"]),
        ("<||>", []),
        ("<|a|b|>", []),
        ("x<|a|><|b|>", ["<|a|>", "<|b|>"]),
        ("<|x>y|>", []),
    ],
)
def test_marker_pattern(text: str, found: list[str]) -> None:
    assert MARKER_PATTERN.findall(text) == found


def test_vocabulary_check_names_marker_and_count() -> None:
    f = ChatJsonFormat(CHATML_JSON)
    with pytest.raises(ChatFormatError) as err:
        f.bind(make_hf(("<|im_end|>",)))
    assert err.value.message.startswith(
        "chat.json uses <|im_start|>, which is not a single token in this container (got "
    )
    assert err.value.message.endswith("): the tokenizer and the chat format disagree")


def test_markers_checked_in_sorted_order() -> None:
    data = {**CHATML_JSON, "prelude": "<|zz|><|aa|>"}
    with pytest.raises(ChatFormatError, match="chat.json uses <|aa|>"):
        ChatJsonFormat(data).bind(CHATML_ONLY)


# --------------------------------------------------------------------------- §4.5 protocol discovery
def test_protocol_discovery() -> None:
    assert chatml().protocol is None
    assert chatml(make_hf(("<|im_start|>", "<|im_end|>", *GLM_MARKERS))).protocol.name == "glm"  # type: ignore[union-attr]
    assert (
        chatml(make_hf(("<|im_start|>", "<|im_end|>", *GLM_MARKERS, *KIMI_MARKERS))).protocol.name
        == "kimi"
    )  # type: ignore[union-attr]
    half_kimi = [m for m in KIMI_MARKERS if m != "<|tool_call_end|>"]
    assert chatml(make_hf(("<|im_start|>", *half_kimi))).protocol is None


# --------------------------------------------------------------------------- §4.6 rendering
def test_rendering_order_and_segments() -> None:
    f = chatml()
    p = f.render(
        {
            "messages": [
                {"role": "developer", "content": "S"},
                USER,
                {"role": "assistant", "content": "A", "reasoning_content": "hidden"},
                USER,
            ]
        }
    )
    assert list(p) == [
        M("<|im_start|>system\n"),
        T("S"),
        M("<|im_end|>\n"),
        M("<|im_start|>user\n"),
        T("hi"),
        M("<|im_end|>\n"),
        M("<|im_start|>assistant\n"),
        T("A"),
        M("<|im_end|>\n"),
        M("<|im_start|>user\n"),
        T("hi"),
        M("<|im_end|>\n"),
        M("<|im_start|>assistant\n"),
    ]
    assert (
        not p.thinking
        and not p.reasoning_open
        and f.stop_ids == (CHATML_ONLY.marker_id("<|im_end|>"),)
    )


def test_prelude_effort_think_and_generation_prompt() -> None:
    tok = make_hf(("<|im_start|>", "<|im_end|>", "<think>", "</think>", "[gMASK]", "<|effort|>"))
    f = chatml(
        tok,
        {
            **CHATML_JSON,
            "prelude": "[gMASK]",
            "think": ["<think>", "</think>"],
            "effort": "<|effort|>{} effort",
        },
    )
    p = f.render({"messages": [USER], "reasoning_effort": "high"})
    assert p[:2] == [M("[gMASK]"), M("<|effort|>High effort")]
    assert p[-2:] == [M("<|im_start|>assistant\n"), M("<think>")] and p.reasoning_open
    assert f.default_thinking


def test_content_parts_and_images() -> None:
    tok = make_hf(("<|im_start|>", "<|im_end|>", "<|image|>"))
    f = chatml(tok, {**CHATML_JSON, "image": "<|image|>"})
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "input_text", "text": "!"},
            ],
        }
    ]
    p = f.render({"messages": msgs}, images=[ImageInfo(3, 4)])
    assert p[1:4] == [T("see"), M("<|image|>"), T("!")]
    with pytest.raises(ChatFormatError) as err:
        f.render({"messages": msgs})
    assert (err.value.param, err.value.message) == (
        "messages[0].content",
        "messages[0] carries more images than the request encoded",
    )
    with pytest.raises(ChatFormatError) as err:
        f.render({"messages": [USER]}, images=[ImageInfo(1, 1)])
    assert err.value.message == "more images were encoded than the conversation places"


# --------------------------------------------------------------------------- §4.7 refusals
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }
]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
}
REFUSALS = [
    (
        "1",
        {"messages": [USER], "tools": TOOLS},
        "tools",
        "this container is served from its chat.json, which cannot express tool definitions because its tokenizer carries neither the Kimi K2 native tool markers nor GLM's <tool_call> XML protocol",
    ),
    (
        "2 auto",
        {"messages": [USER], "tool_choice": "auto"},
        "tool_choice",
        "this container is served from its chat.json, which cannot express 'tool_choice'",
    ),
    (
        "2 named",
        {"messages": [USER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        "tool_choice",
        "this container is served from its chat.json, which cannot express 'tool_choice'",
    ),
    (
        "3",
        {"messages": [USER], "response_format": {"type": "text"}},
        "response_format",
        "this container is served from its chat.json, which cannot express 'response_format'",
    ),
    (
        "4",
        {"messages": [USER], "thinking": True},
        "reasoning_effort",
        "this container has no reasoning channel in its tokenizer, so it cannot think on request; pass reasoning_effort 'none' or thinking false",
    ),
    (
        "4 effort",
        {"messages": [USER], "reasoning_effort": "low"},
        "reasoning_effort",
        "this container has no reasoning channel in its tokenizer, so it cannot think on request; pass reasoning_effort 'none' or thinking false",
    ),
    (
        "medium quirk",
        {"messages": [USER], "reasoning_effort": "medium"},
        "reasoning_effort",
        "reasoning_effort='medium' is not supported by this model. Kimi K3 accepts ['high', 'low', 'max'], or ['minimal', 'none', 'off'] to answer without reasoning. (K3's own encoder documents 'medium' and then rejects it.)",
    ),
    (
        "8",
        {"messages": [{"role": "tool", "tool_call_id": "x", "content": "r"}]},
        "messages[0]",
        "this container is served from its chat.json, which cannot express a tool call or its result",
    ),
    (
        "9 calls",
        {"messages": [USER, CALL]},
        "messages[1]",
        "this container is served from its chat.json, which cannot express a tool call or its result",
    ),
]


@pytest.mark.parametrize("label,request_,param,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals(label: str, request_: dict[str, Any], param: str, message: str | None) -> None:
    with pytest.raises(ChatFormatError) as err:
        chatml().render(request_)
    assert err.value.param == param and err.value.type == "invalid_request_error"
    if message is not None:
        assert err.value.message == message


def test_refusals_5_5b_6_and_role_without_pair() -> None:
    think = chatml(
        make_hf(("<|im_start|>", "<|im_end|>", "<think>", "</think>")),
        {**CHATML_JSON, "think": ["<think>", "</think>"]},
    )
    with pytest.raises(ChatFormatError) as err:
        think.render({"messages": [USER], "reasoning_effort": "none"})
    assert (err.value.param, err.value.message) == (
        "reasoning_effort",
        "this container's chat format always opens a reasoning channel, so it cannot answer without one; drop 'thinking'/'reasoning_effort' or use a container whose format does not",
    )
    with pytest.raises(ChatFormatError) as err:
        think.render({"messages": [USER], "reasoning_effort": "high"})
    assert (
        err.value.message
        == "this container's chat.json does not say how to ask for a reasoning effort"
    )
    with pytest.raises(ChatFormatError) as err:
        chatml().render({"messages": [USER]}, images=[ImageInfo(1, 1)])
    assert (err.value.param, err.value.message) == (
        "messages",
        "this container is served from its chat.json, which does not say how to place an image",
    )
    with pytest.raises(ChatFormatError) as err:
        chatml().render(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:,"}}],
                    }
                ]
            }
        )
    assert err.value.param == "messages[0].content"
    assert (
        err.value.message
        == "messages[0] carries an image, and this container is served from its chat.json, which does not say how to place one"
    )
    no_system = chatml(data={k: v for k, v in CHATML_JSON.items() if k != "system"})
    with pytest.raises(ChatFormatError) as err:
        no_system.render({"messages": [{"role": "system", "content": "s"}, USER]})
    assert (err.value.param, err.value.message) == (
        "messages[0].role",
        'messages[0] is a "system" turn, and this container\'s chat.json does not describe one',
    )


def test_step_3_refusals_come_in_the_spec_order() -> None:
    """§4.6 steps 2-3: tools, then tool_choice, response_format, thinking, effort, images."""
    think = chatml(
        make_hf(("<|im_start|>", "<|im_end|>", "<think>", "</think>")),
        {**CHATML_JSON, "think": ["<think>", "</think>"]},
    )
    everything = {
        "messages": [USER],
        "tools": TOOLS,
        "tool_choice": "auto",
        "response_format": {"type": "text"},
        "thinking": True,
    }
    order = [
        (chatml(), everything, "tools"),
        (chatml(), {**everything, "tools": None}, "tool_choice"),
        (
            chatml(),
            {"messages": [USER], "response_format": {"type": "text"}, "thinking": True},
            "response_format",
        ),
        (
            chatml(),
            {"messages": [USER], "thinking": True},
            "this container has no reasoning channel",
        ),
        (
            think,
            {"messages": [USER], "reasoning_effort": "none"},
            "this container's chat format always opens",
        ),
        (
            think,
            {"messages": [USER], "reasoning_effort": "low"},
            "this container's chat.json does not say how to ask",
        ),
    ]
    for fmt, request_, first in order:
        with pytest.raises(ChatFormatError) as err:
            fmt.render(request_, images=[ImageInfo(1, 1)])
        assert err.value.param == first or err.value.message.startswith(first), (first, err.value)


def test_no_placeholder_splicing() -> None:
    """§4.6.1: the XTML image placeholder is plain text here and places no image."""
    tok = make_hf(("<|im_start|>", "<|im_end|>", "<|image|>"))
    f = chatml(tok, {**CHATML_JSON, "image": "<|image|>"})
    text = "a<|kimi_image_placeholder|>b"
    p = f.render({"messages": [{"role": "user", "content": text}]})
    assert T(text) in p and not any(s.markup and "image" in s.text for s in p)
    with pytest.raises(ChatFormatError) as err:
        f.render({"messages": [{"role": "user", "content": text}]}, images=[ImageInfo(1, 1)])
    assert err.value.message == "more images were encoded than the conversation places"


def test_tool_calls_on_a_non_assistant_turn_name_the_field() -> None:
    """§4.7 #10: refused at this layer too (by request validation, as §7.5 does first)."""
    f = chatml(make_hf(("<|im_start|>", "<|im_end|>", *KIMI_MARKERS)))
    turn = {"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    with pytest.raises(ChatFormatError) as err:
        f.render({"messages": [USER, turn]})
    assert err.value.param == "messages[1].tool_calls"
    assert "tool_calls is only valid for assistant messages" in err.value.message


def test_none_effort_accepted_without_think() -> None:
    for effort in ("none", "minimal", "off"):
        assert (
            chatml()
            .render({"messages": [USER], "reasoning_effort": effort})
            .text.endswith("<|im_start|>assistant\n")
        )


def test_kimi_result_needs_system_pair() -> None:
    tok = make_hf(("<|im_start|>", "<|im_end|>", *KIMI_MARKERS))
    f = chatml(tok, {k: v for k, v in CHATML_JSON.items() if k != "system"})
    with pytest.raises(ChatFormatError) as err:
        f.render({"messages": [USER, {"role": "tool", "tool_call_id": "x", "content": "r"}]})
    assert (err.value.param, err.value.message) == (
        "messages[1].role",
        "messages[1] is a tool result, but this container's chat.json has no system turn",
    )


def test_shipped_examples_load_and_bind() -> None:
    from chat_helpers import XTML_MARKERS

    for data, markers in (
        (K3_CHAT_JSON, XTML_MARKERS),
        (KIMI_CHAT_JSON, KIMI_MARKERS),
        (GLM_CHAT_JSON, GLM_MARKERS),
        (CHATML_JSON, ("<|im_start|>", "<|im_end|>")),
    ):
        f = ChatJsonFormat(data)
        f.bind(make_hf(markers))
        assert f.render({"messages": [USER]}).text.endswith(
            data["open"] + ("<think>" if "think" in data else "")
        )


# --------------------------------------------------------------------------- §4.8 reader
@pytest.fixture(scope="module")
def glm_tok() -> Tokenizer:
    return make_hf((*GLM_MARKERS, "<|im_end|>"))


def _items(tok: Tokenizer, *parts: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for part in parts:
        mid = tok.marker_id(part)
        out += [(mid, part)] if mid is not None else items_from_ids(tok, tok.encode_content(part))
    return out


def test_reader_rules(glm_tok: Tokenizer) -> None:
    f = ChatJsonFormat(GLM_CHAT_JSON)
    f.bind(glm_tok)
    prompt = f.render({"messages": [USER]})
    cases = [
        (("r", "</think>", "c", "<|user|>", "after"), "r", "c"),
        (("r", "</think>", "c", "</think>", "d"), "r", "c</think>d"),
        (
            ("r", "</think>", "c", "<|im_end|>", "x"),
            "r",
            "c<|im_end|>x",
        ),  # not in GLM's table: text
        (("r", "</think>", "c", "<|observation|>", "x"), "r", "c"),
        (("r", "</think>", "c", "<tool_response>", "x"), "r", "c"),
        (("still thinking <think> x",), "still thinking <think> x", None),
    ]
    for parts, reasoning, content in cases:
        _, msg = run_parser(f.new_parser(prompt), _items(glm_tok, *parts))
        assert (msg.reasoning, msg.content) == (reasoning, content), parts


def test_reader_im_end_hardwired_and_channel_closed(glm_tok: Tokenizer) -> None:
    table = {
        glm_tok.marker_id("<|user|>"): "<|user|>",
        glm_tok.marker_id("<|im_end|>"): "<|im_end|>",
    }
    p = ChatJsonParser(table, -1, False)
    _, msg = run_parser(p, _items(glm_tok, "a", "<|im_end|>", "b"))
    assert msg.content == "a" and p.finished
    p = ChatJsonParser(table, -1, False)
    assert (
        p.feed(glm_tok.marker_id("<think>"), "<think>").content == "<think>"
    )  # not a marker of this table: text
    assert p.feed(5, "").empty
