"""XTML rendering (PROTOCOLS §2) and the regions reader (§3), rule by rule."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from chat_helpers import assert_stream_invariant, items_from_ids, make_hf, run_parser

from warp_providers.chat.base import ChatFormatError, ImageInfo, M, Prompt, T
from warp_providers.chat.formats.xtml import (
    CLOSE,
    EOM,
    OPEN,
    SEP,
    XtmlFormat,
    XtmlParser,
    _normalise_message,
    decode_argument,
    escape_attr,
    parse_header,
    resort_tool_results,
    unescape_attr,
)
from warp_providers.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def fmt(hf_tok: Tokenizer) -> XtmlFormat:
    f = XtmlFormat()
    f.bind(hf_tok)
    return f


def render(fmt: XtmlFormat, messages: list[dict[str, Any]], **kw: Any) -> str:
    gen = kw.pop("add_generation_prompt", False)
    images = kw.pop("images", None)
    return fmt.render({"messages": messages, **kw}, images=images, add_generation_prompt=gen).text


USER = {"role": "user", "content": "q"}

# --------------------------------------------------------------------------- §2.2 tags and attributes


def test_opening_tag_segments_and_escaping(fmt: XtmlFormat) -> None:
    p = fmt.render(
        {"messages": [{"role": "user", "content": "Hola", "name": 'Jo"s&é'}]},
        add_generation_prompt=False,
    )
    assert list(p) == [
        M(OPEN),
        T("message"),
        T(" role"),
        T('="'),
        T("user"),
        T('"'),
        T(" name"),
        T('="'),
        T("Jo&quot;s&amp;é"),
        T('"'),
        M(SEP),
        T("Hola"),
        M(CLOSE),
        T("message"),
        M(SEP),
        M(EOM),
    ]


@pytest.mark.parametrize(
    "raw,escaped",
    [
        ('say "hi"', "say &quot;hi&quot;"),
        ("a&b", "a&amp;b"),
        ("&quot;", "&amp;quot;"),
        ("<x>", "<x>"),
    ],
)
def test_escape_order_and_reverse(raw: str, escaped: str) -> None:
    assert escape_attr(raw) == escaped
    assert unescape_attr(escaped) == raw


def test_unescape_quot_first_quirk() -> None:
    assert unescape_attr("say &amp;quot;hi&amp;quot;") == "say &quot;hi&quot;"


def test_empty_attribute_value_segment_omitted(fmt: XtmlFormat) -> None:
    p = fmt.render(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"k": ""}}}],
                }
            ],
            "thinking": False,
        },
        add_generation_prompt=False,
    )
    text = p.text
    assert '<|open|>argument key="k" type="string"<|sep|><|close|>argument<|sep|>' in text
    assert T("") not in list(p)


def test_user_message_example(fmt: XtmlFormat) -> None:
    assert render(fmt, [{"role": "user", "content": "Hola", "name": "José"}]) == (
        '<|open|>message role="user" name="José"<|sep|>Hola<|close|>message<|sep|><|end_of_msg|>'
    )


def test_falsy_name_omitted_and_developer_is_system(fmt: XtmlFormat) -> None:
    assert render(fmt, [{"role": "developer", "content": "d", "name": ""}]) == (
        '<|open|>message role="system"<|sep|>d<|close|>message<|sep|><|end_of_msg|>'
    )


# --------------------------------------------------------------------------- §2.4 assistant body
def test_assistant_thinking_on_empty_reasoning(fmt: XtmlFormat) -> None:
    assert render(fmt, [{"role": "assistant", "content": "Hello."}], thinking=True) == (
        '<|open|>message role="assistant"<|sep|><|open|>think<|sep|><|close|>think<|sep|>'
        "<|open|>response<|sep|>Hello.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
    )


def test_assistant_thinking_off_drops_think_element(fmt: XtmlFormat) -> None:
    out = render(
        fmt, [{"role": "assistant", "content": "Hi", "reasoning_content": "R"}], thinking=False
    )
    assert "think" not in out and out.startswith(
        '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>Hi'
    )


@pytest.mark.parametrize(
    "msg,body",
    [
        ({"reasoning_content": " R "}, " R "),
        ({"reasoning_content": "", "reasoning": "fallback"}, "fallback"),
        ({"reasoning_content": None, "reasoning": "fb"}, "fb"),
        ({"reasoning_content": "  \n "}, ""),
        ({"reasoning": "   "}, ""),
    ],
)
def test_reasoning_source_and_strip_rule(fmt: XtmlFormat, msg: dict[str, Any], body: str) -> None:
    out = render(fmt, [{"role": "assistant", "content": None, **msg}], thinking=True)
    assert f"<|open|>think<|sep|>{body}<|close|>think<|sep|>" in out
    assert "<|open|>response<|sep|><|close|>response<|sep|>" in out


@pytest.mark.parametrize(
    "value,kind,text",
    [
        (True, "boolean", "true"),
        (False, "boolean", "false"),
        (None, "null", "null"),
        (7, "number", "7"),
        (-12, "number", "-12"),
        (2.5, "number", "2.5"),
        (3.0, "number", "3.0"),
        (1e21, "number", "1e+21"),
        (math.nan, "number", "NaN"),
        (math.inf, "number", "Infinity"),
        ("raw <|sep|>\n text", "string", "raw <|sep|>\n text"),
        ({"z": 1, "a": [True, None]}, "object", '{"z": 1, "a": [true, null]}'),
        (["ü", 1], "array", '["ü", 1]'),
    ],
)
def test_argument_types(fmt: XtmlFormat, value: Any, kind: str, text: str) -> None:
    out = render(
        fmt,
        [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"k": value}}}],
            }
        ],
        thinking=False,
    )
    assert (
        f'<|open|>call tool="f" index="1"<|sep|><|open|>argument key="k" type="{kind}"<|sep|>{text}<|close|>argument<|sep|><|close|>call<|sep|>'
        in out
    )
    assert "c1" not in out  # the OpenAI id is not rendered


def test_arguments_in_mapping_order_and_tools_element(fmt: XtmlFormat) -> None:
    out = render(
        fmt,
        [
            {
                "role": "assistant",
                "content": "x",
                "tool_calls": [
                    {"function": {"name": "f", "arguments": '{"z": 1, "a": 2}'}},
                    {"name": "g", "arguments": None},
                ],
            }
        ],
        thinking=False,
    )
    assert out.index('key="z"') < out.index('key="a"')
    assert '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"' in out
    assert '<|open|>call tool="g" index="2"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>' in out


@pytest.mark.parametrize("arguments", [None, "", "   ", {}])
def test_empty_arguments(fmt: XtmlFormat, arguments: Any) -> None:
    call: dict[str, Any] = {"function": {"name": "ping"}}
    if arguments is not None:
        call["function"]["arguments"] = arguments
    out = render(fmt, [{"role": "assistant", "tool_calls": [call]}], thinking=False)
    assert '<|open|>call tool="ping" index="1"<|sep|><|close|>call<|sep|>' in out


def test_unparseable_arguments_become_raw_json_block(fmt: XtmlFormat) -> None:
    out = render(
        fmt,
        [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
        thinking=False,
    )
    assert '<|open|>json type="object"<|sep|>{oops<|close|>json<|sep|>' in out


def test_raw_block_cannot_be_smuggled() -> None:
    from warp_providers.chat.formats.xtml import _RAW

    msg = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}', _RAW: "evil"}}],
    }
    out = _normalise_message(msg)
    assert _RAW not in out["tool_calls"][0]["function"]
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # caller's object untouched


@pytest.mark.parametrize(
    "call,message",
    [
        ("not an object", "Kimi K3 tool calls must be objects."),
        ({"function": {"name": ""}}, "Kimi K3 tool calls require a non-empty function name."),
        (
            {"function": {"name": "f", "arguments": "[1, 2]"}},
            "Kimi K3 tool call arguments must be a JSON object.",
        ),
        (
            {"function": {"name": "f", "arguments": "3"}},
            "Kimi K3 tool call arguments must be a JSON object.",
        ),
        (
            {"function": {"name": "f", "arguments": 5}},
            "Kimi K3 tool call arguments must be a dict or a JSON object string.",
        ),
    ],
)
def test_call_normalisation_errors(call: Any, message: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        _normalise_message({"role": "assistant", "tool_calls": [call]})
    assert err.value.message == message and err.value.param == "messages"


def test_arguments_duplicate_keys_last_wins_and_nan(fmt: XtmlFormat) -> None:
    out = render(
        fmt,
        [
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1, "a": NaN}'}}],
            }
        ],
        thinking=False,
    )
    assert (
        '<|open|>argument key="a" type="number"<|sep|>NaN<|close|>argument' in out
        and ">1<" not in out
    )


# --------------------------------------------------------------------------- §2.5 tool declarations
def test_initial_tool_declaration_is_sorted_compact_one_segment(fmt: XtmlFormat) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "parameters": {"type": "object", "b": 1, "a": {"z": 1, "y": "é"}},
                "description": "…",
            },
        }
    ]
    p = fmt.render({"messages": [USER], "tools": tools}, add_generation_prompt=False)
    body = (
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
        '[{"function":{"description":"…","name":"calc","parameters":{"a":{"y":"é","z":1},"b":1,"type":"object"}},"type":"function"}]\n```'
    )
    assert p[:14] == [
        M(OPEN),
        T("message"),
        T(" role"),
        T('="'),
        T("system"),
        T('"'),
        T(" type"),
        T('="'),
        T("tool-declare"),
        T('"'),
        M(SEP),
        T(body),
        M(CLOSE),
        T("message"),
    ]


def test_lazy_tool_declaration_in_place(fmt: XtmlFormat) -> None:
    tools = [{"type": "function", "function": {"name": "late"}}]
    out = render(fmt, [USER, {"role": "system", "content": "ignored", "tools": tools}, USER])
    expected = (
        '<|open|>message role="system" type="tool-declare"<|sep|>## New Tools Available\n'
        "The system dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended tools.\n"
        'Here are the specs for the extended tools.\n\n```json\n[{"function":{"name":"late"},"type":"function"}]\n```'
        "<|close|>message<|sep|><|end_of_msg|>"
    )
    assert expected in out and "ignored" not in out
    assert out.index("q") < out.index("New Tools") < out.rindex("q")


def test_empty_tools_render_nothing(fmt: XtmlFormat) -> None:
    assert "Tools" not in render(
        fmt, [USER, {"role": "system", "content": "s", "tools": []}], tools=[]
    )


# --------------------------------------------------------------------------- §2.6 tool results
def _calls(*names: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"id{n}", "function": {"name": name, "arguments": "{}"}}
            for n, name in enumerate(names, 1)
        ],
    }


def _result(key: str | None, content: str, **extra: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "tool", "content": content, **extra}
    if key is not None:
        msg["tool_call_id"] = key
    return msg


def _tool_headers(out: str) -> list[str]:
    import re

    return re.findall(r'role="tool" tool="([^"]*)" index="(\d+)"<\|sep\|>([^<]*)', out)  # type: ignore[return-value]


def test_results_resorted_by_call_id(fmt: XtmlFormat) -> None:
    out = render(
        fmt,
        [_calls("a", "b", "c"), _result("id3", "C"), _result("id1", "A"), _result("id2", "B")],
        thinking=False,
    )
    assert _tool_headers(out) == [("a", "1", "A"), ("b", "2", "B"), ("c", "3", "C")]


def test_partial_results_numbered_by_rendered_position(fmt: XtmlFormat) -> None:
    out = render(
        fmt, [_calls("a", "b", "c"), _result("id3", "C"), _result("id1", "A")], thinking=False
    )
    assert _tool_headers(out) == [("a", "1", "A"), ("c", "2", "C")]


def test_unmatched_run_keeps_order_and_positional_names(fmt: XtmlFormat) -> None:
    out = render(fmt, [_calls("a", "b"), _result("id2", "B"), _result("nope", "X")], thinking=False)
    assert _tool_headers(out) == [("a", "1", "B"), ("b", "2", "X")]


def test_stale_name_overwritten_and_key_falls_back_to_id(fmt: XtmlFormat) -> None:
    msgs = [
        _calls("a", "b"),
        {"role": "tool", "id": "id2", "name": "stale", "content": "B"},
        _result("id1", "A", name="old"),
    ]
    out = resort_tool_results(msgs)
    assert [(m.get("tool"), m.get("name"), m["content"]) for m in out[1:]] == [
        ("a", "a", "A"),
        ("b", "b", "B"),
    ]
    assert msgs[1]["name"] == "stale" and "tool" not in msgs[1]  # caller objects untouched
    assert resort_tool_results(out) == out  # idempotent


def test_index_rules_duplicates_null_ids_and_non_resetting_roles() -> None:
    calls = {
        "role": "assistant",
        "tool_calls": [
            {"id": None, "function": {"name": "n"}},
            {"id": "x", "function": {"name": "first"}},
            {"id": "x", "function": {"name": "dup"}},
        ],
    }
    out = resort_tool_results([calls, {"role": "user", "content": "u"}, _result("x", "R")])
    assert out[2]["tool"] == "first"
    out = resort_tool_results(
        [calls, {"role": "assistant", "content": "no calls"}, _result("x", "R")]
    )
    assert "tool" not in out[2]


def test_numbering_restarts_after_assistant_and_explicit_tool_member(fmt: XtmlFormat) -> None:
    out = render(
        fmt,
        [_calls("a"), _result(None, "1", name="n1"), _calls("b"), _result(None, "2", tool="t2")],
        thinking=False,
    )
    assert _tool_headers(out) == [("n1", "1", "1"), ("t2", "1", "2")]


def test_unresolvable_tool_name(fmt: XtmlFormat) -> None:
    with pytest.raises(ChatFormatError) as err:
        render(fmt, [USER, {"role": "tool", "content": "x"}])
    assert err.value.message == (
        "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, or match a preceding assistant tool_call by order."
    )


# --------------------------------------------------------------------------- §2.7/2.8 notes, effort
EFFORT_BODY = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
    "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort={}`."
)


def _note(kind: str, body: str) -> str:
    return f'<|open|>message role="system" type="{kind}"<|sep|>{body}<|close|>message<|sep|><|end_of_msg|>'


@pytest.mark.parametrize("effort", ["low", "high", "max", "HIGH"])
def test_effort_note(fmt: XtmlFormat, effort: str) -> None:
    out = render(fmt, [USER], reasoning_effort=effort)
    assert out.startswith(_note("thinking-effort", EFFORT_BODY.format(effort.lower())))


@pytest.mark.parametrize("effort", ["none", "minimal", "off", "OFF"])
def test_no_reasoning_efforts_turn_thinking_off(fmt: XtmlFormat, effort: str) -> None:
    p = fmt.render({"messages": [USER], "reasoning_effort": effort, "thinking": True})
    assert (
        "thinking-effort" not in p.text
        and p.text.endswith("<|open|>response<|sep|>")
        and not p.reasoning_open
    )


@pytest.mark.parametrize("effort", ["medium", "Medium", "extreme"])
def test_unsupported_effort_refused(fmt: XtmlFormat, effort: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        render(fmt, [USER], reasoning_effort=effort)
    assert err.value.param == "reasoning_effort"
    assert err.value.message.startswith(
        f"reasoning_effort={effort!r} is not supported by this model. Kimi K3 accepts"
    )


def test_effort_with_thinking_false_conflict(fmt: XtmlFormat) -> None:
    with pytest.raises(ChatFormatError) as err:
        render(fmt, [USER], reasoning_effort="high", thinking=False)
    assert (
        err.value.message
        == "'thinking' is false but 'reasoning_effort' asks for reasoning \u2014 pick one"
    )


def test_thinking_off_emits_no_note(fmt: XtmlFormat) -> None:
    out = render(fmt, [USER], thinking=False)
    assert "thinking-effort" not in out


@pytest.mark.parametrize(
    "choice,body",
    [
        (
            "required",
            "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        ),
        (
            "none",
            "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.",
        ),
        ("auto", None),
    ],
)
def test_tool_choice_notes(fmt: XtmlFormat, choice: str, body: str | None) -> None:
    out = render(fmt, [USER], tool_choice=choice)
    assert (_note("tool-choice", body) in out) if body else ("tool-choice" not in out)


def test_named_tool_choice_adds_system_message_then_required_note(fmt: XtmlFormat) -> None:
    out = render(fmt, [USER], tool_choice={"type": "function", "function": {"name": "calc"}})
    named = '<|open|>message role="system"<|sep|>You must call the tool `calc` in your next message, and no other.<|close|>message<|sep|><|end_of_msg|>'
    assert out.index(named) < out.index('type="tool-choice"')


JSON_ONLY = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting."


@pytest.mark.parametrize(
    "rf,schema",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {"b": 1, "a": "é"}}},
            '{"a":"é","b":1}',
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "n", "strict": True}},
            '{"name":"n","strict":true}',
        ),
        ({"type": "json_schema"}, "null"),
        ({"type": "json_schema", "json_schema": {"name": "n", "json_schema": {"x": 1}}}, '{"x":1}'),
    ],
)
def test_response_format_json_schema(fmt: XtmlFormat, rf: dict[str, Any], schema: str) -> None:
    body = f"The system is invoked with `response_format=json_schema`.\n{JSON_ONLY}\nThe JSON data must match the following schema:\n```json\n{schema}\n```"
    assert _note("response-format", body) in render(fmt, [USER], response_format=rf)


def test_response_format_json_object_and_text(fmt: XtmlFormat) -> None:
    body = f"The system is invoked with `response_format=json_object`.\n{JSON_ONLY}"
    assert _note("response-format", body) in render(
        fmt, [USER], response_format={"type": "json_object"}
    )
    assert "response-format" not in render(fmt, [USER], response_format={"type": "text"})


# --------------------------------------------------------------------------- §2.9/2.10 images
MEDIA = "<|media_begin|>image 640x480<|media_content|><|media_pad|><|media_end|>"


def test_image_parts_and_placeholders_take_blocks_in_order(fmt: XtmlFormat) -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a<|kimi_image_placeholder|>b"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        }
    ]
    p = fmt.render(
        {"messages": msgs},
        images=[ImageInfo(640, 480), ImageInfo(1, 2)],
        add_generation_prompt=False,
    )
    assert [s for s in p if s.text.startswith("<|media")] == [
        M(MEDIA),
        M("<|media_begin|>image 1x2<|media_content|><|media_pad|><|media_end|>"),
    ]
    assert T("a") in p and T("b") in p


def test_placeholder_is_plain_without_images(fmt: XtmlFormat) -> None:
    p = fmt.render(
        {"messages": [{"role": "user", "content": "x<|kimi_image_placeholder|>y"}]},
        add_generation_prompt=False,
    )
    assert T("x<|kimi_image_placeholder|>y") in p


def test_image_count_mismatches(fmt: XtmlFormat) -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "<|kimi_image_placeholder|>"},
            ],
        }
    ]
    with pytest.raises(ChatFormatError, match=r"^More image placeholders than image prompts\.$"):
        fmt.render({"messages": msgs}, images=[ImageInfo(1, 1)])
    with pytest.raises(
        ChatFormatError, match=r"^image prompt count 2 != consumed placeholder count 0$"
    ):
        fmt.render({"messages": [USER]}, images=[ImageInfo(1, 1), ImageInfo(2, 2)])


def test_placeholder_in_reasoning_and_arguments_consumes_blocks(fmt: XtmlFormat) -> None:
    msgs = [
        {
            "role": "assistant",
            "reasoning_content": "r<|kimi_image_placeholder|>",
            "tool_calls": [
                {"function": {"name": "f", "arguments": {"k": "<|kimi_image_placeholder|>"}}}
            ],
        }
    ]
    p = fmt.render(
        {"messages": msgs, "thinking": True},
        images=[ImageInfo(1, 1), ImageInfo(2, 2)],
        add_generation_prompt=False,
    )
    assert sum(s.markup and s.text.startswith("<|media_begin|>") for s in p) == 2


def test_images_refused_without_media_markers() -> None:
    from chat_helpers import XTML_MARKERS

    f = XtmlFormat()
    f.bind(make_hf(XTML_MARKERS))
    with pytest.raises(ChatFormatError, match="media markers"):
        f.render({"messages": [USER]}, images=[ImageInfo(1, 1)])


# --------------------------------------------------------------------------- §2.11/2.13 order, generation prompt
def test_generation_prompt_segments(fmt: XtmlFormat) -> None:
    p = fmt.render({"messages": [USER], "thinking": True})
    assert p[-10:] == [
        M(OPEN),
        T("message"),
        T(" role"),
        T('="'),
        T("assistant"),
        T('"'),
        M(SEP),
        M(OPEN),
        T("think"),
        M(SEP),
    ]
    assert p.reasoning_open
    q = fmt.render({"messages": [USER], "thinking": False})
    assert (
        q.text.endswith('<|open|>message role="assistant"<|sep|><|open|>response<|sep|>')
        and not q.reasoning_open
    )


def test_worked_example(fmt: XtmlFormat) -> None:
    req = {
        "messages": [
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "3*3 as JSON"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "calc", "description": "…", "parameters": {"type": "object"}},
            }
        ],
        "reasoning_effort": "high",
        "tool_choice": {"type": "function", "function": {"name": "calc"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"type": "object"}},
        },
    }
    expected = (
        '<|open|>message role="system" type="tool-declare"<|sep|># Tools\nHere are the available tools, described in JSONSchema.\n\n'
        '```json\n[{"function":{"description":"…","name":"calc","parameters":{"type":"object"}},"type":"function"}]\n```'
        "<|close|>message<|sep|><|end_of_msg|>"
        + _note("thinking-effort", EFFORT_BODY.format("high"))
        + '<|open|>message role="system"<|sep|>Be exact.<|close|>message<|sep|><|end_of_msg|>'
        '<|open|>message role="user"<|sep|>3*3 as JSON<|close|>message<|sep|><|end_of_msg|>'
        '<|open|>message role="system"<|sep|>You must call the tool `calc` in your next message, and no other.<|close|>message<|sep|><|end_of_msg|>'
        + _note(
            "tool-choice",
            "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.",
        )
        + _note(
            "response-format",
            f'The system is invoked with `response_format=json_schema`.\n{JSON_ONLY}\nThe JSON data must match the following schema:\n```json\n{{"type":"object"}}\n```',
        )
        + '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
    )
    assert fmt.render(req).text == expected


def test_stop_ids_and_binding(fmt: XtmlFormat, hf_tok: Tokenizer) -> None:
    assert fmt.stop_ids == (hf_tok.marker_id(EOM),)
    with pytest.raises(ChatFormatError) as err:
        XtmlFormat().bind(make_hf(("<|open|>", "<|close|>", "<|sep|>")))
    assert "<|end_of_msg|>" in err.value.message and err.value.code == "unsupported_chat_format"


# --------------------------------------------------------------------------- §3 reading replies
@pytest.mark.parametrize(
    "header,name,attrs",
    [
        ('call tool="get_weather" index="1"', "call", {"tool": "get_weather", "index": "1"}),
        ("  ", "", {}),
        ("think", "think", {}),
        ('junk tool="f"', "junk", {"tool": "f"}),
        ('call junk tool="f"', "call", {"junk tool": "f"}),
        ("a\tb", "a\tb", {}),
        ('x k="unterminated', "x", {"k": "unterminated"}),
        ("x k=bare v=2", "x", {"k": "bare", "v": "2"}),
        ('x ="v" k="1" k="2"', "x", {"k": "2"}),
        ('x k="say &amp;quot;hi&amp;quot;"', "x", {"k": "say &quot;hi&quot;"}),
        ("x noequals", "x", {}),
    ],
)
def test_header_syntax(header: str, name: str, attrs: dict[str, str]) -> None:
    assert parse_header(header) == (name, attrs)


@pytest.mark.parametrize(
    "text,kind,value",
    [
        (" x ", "string", " x "),
        ("anything", "null", None),
        (" TRUE ", "boolean", True),
        ("False", "boolean", False),
        ("yes", "boolean", "yes"),
        (" 3 ", "number", 3),
        ('"x"', "number", "x"),
        ("NaN", "number", "nan"),
        ("abc ", "number", "abc "),
        ('{"a": 1}', "object", {"a": 1}),
        ("[1]", "array", [1]),
        ("[1", "array", "[1"),
        ("7", "integer", 7),
        (" 7 ", "", 7),
        ("nope", "", "nope"),
    ],
)
def test_typed_argument_decode(text: str, kind: str, value: Any) -> None:
    got = decode_argument(text, kind)
    assert (isinstance(got, float) and math.isnan(got)) if value == "nan" else got == value


class Reply:
    """Build a token-path reply from markers and text, with a real vocabulary."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.items: list[tuple[int, str]] = []

    def m(self, marker: str) -> Reply:
        self.items.append((self.tok.marker_id(marker), marker))  # type: ignore[arg-type]
        return self

    def t(self, text: str) -> Reply:
        self.items += items_from_ids(self.tok, self.tok.encode_content(text))
        return self

    def open(self, header: str) -> Reply:
        return self.m(OPEN).t(header).m(SEP)

    def close(self, name: str) -> Reply:
        return self.m(CLOSE).t(name).m(SEP)


def parse(fmt: XtmlFormat, tok: Tokenizer, reply: Reply, initial: str = "think") -> Any:
    ids = {tok.marker_id(m): m for m in (OPEN, CLOSE, SEP, EOM)}
    msg = assert_stream_invariant(lambda: XtmlParser(ids, initial), tok, reply.items)
    return msg


def _check_cases(
    fmt: XtmlFormat, tok: Tokenizer, cases: list[tuple[str, Reply, dict[str, Any]]]
) -> None:
    for label, reply, want in cases:
        msg = parse(fmt, tok, reply)
        assert msg.content == want.get("content"), label
        assert msg.reasoning == want.get("reasoning"), label
        assert [(c.id, c.name, c.arguments) for c in msg.tool_calls] == want.get("calls", []), label


def test_catalogue_ends_inside_reasoning(fmt: XtmlFormat, hf_tok: Tokenizer) -> None:
    r = Reply(hf_tok).t("thinking...")
    ids = {hf_tok.marker_id(m): m for m in (OPEN, CLOSE, SEP, EOM)}
    _, msg = run_parser(XtmlParser(ids, "think"), r.items, hit_limit=True)
    assert (msg.reasoning, msg.content, msg.finish_reason) == ("thinking...", None, "length")


def test_catalogue_table(fmt: XtmlFormat, hf_tok: Tokenizer) -> None:
    R = lambda: Reply(hf_tok)  # noqa: E731
    cases: list[tuple[str, Reply, dict[str, Any]]] = [
        (
            "cut between OPEN and SEP",
            R().close("think").t("a").m(OPEN).t("resp"),
            {"content": "a<|open|>resp"},
        ),
        (
            "cut after EOM with header pending",
            R().close("think").m(OPEN).t("x").m(EOM),
            {"content": "<|open|>x"},
        ),
        ("SEP without header", R().close("think").m(SEP).t("a"), {"content": "a"}),
        (
            "close of unopened",
            R().close("think").open("response").t("a").close("nonesuch").close("message").t("b"),
            {"content": "ab"},
        ),
        (
            "empty close pops innermost",
            R().t("r").close("").t("c"),
            {"reasoning": "r", "content": "c"},
        ),
        (
            "text in tools/call dropped",
            R()
            .close("think")
            .open("tools")
            .t("junk")
            .open('call tool="f"')
            .t("x")
            .close("tools")
            .t("c"),
            {"content": "c", "calls": [("call_1", "f", "{}")]},
        ),
        (
            "bare text after think",
            R().t("r").close("think").t("answer"),
            {"reasoning": "r", "content": "answer"},
        ),
        (
            "think again inside response",
            R().close("think").open("response").t("a").open("think").t("r2").close("think").t("b"),
            {"reasoning": "r2", "content": "ab"},
        ),
        (
            "OPEN while header pending",
            R().close("think").m(OPEN).t("garb").open("response").t("a"),
            {"content": "a"},
        ),
        (
            "argument without key",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument type="string"')
            .t("leak")
            .close("argument"),
            {"content": "leak", "calls": [("call_1", "f", "{}")]},
        ),
        (
            "argument after call closed",
            R()
            .close("think")
            .open('call tool="f"')
            .close("call")
            .open('argument key="k"')
            .t("1")
            .close("argument"),
            {"calls": [("call_1", "f", '{"k": 1}')]},
        ),
        (
            "argument before any call",
            R().close("think").open('argument key="k"').t("lost").close("argument").t("c"),
            {"content": "c"},
        ),
        (
            "type that does not fit",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="n" type="number"')
            .t("abc")
            .close("argument"),
            {"calls": [("call_1", "f", '{"n": "abc"}')]},
        ),
        (
            "non-integer index",
            R()
            .close("think")
            .open('call tool="f" index="x"')
            .close("call")
            .open('call tool="g" index=" +1_0 "')
            .close("call"),
            {"calls": [("call_1", "f", "{}"), ("call_10", "g", "{}")]},
        ),
        (
            "explicit id",
            R().close("think").open('call tool="f" id="abc"').close("call"),
            {"calls": [("abc", "f", "{}")]},
        ),
        (
            "duplicate indices",
            R()
            .close("think")
            .open('call tool="f" index="1"')
            .close("call")
            .open('call tool="g" index="1"')
            .close("call"),
            {"calls": [("call_1", "f", "{}"), ("call_1", "g", "{}")]},
        ),
        (
            "json block outside any call",
            R().close("think").open("json").t('{"a":1}').close("json").t("c"),
            {"content": "c"},
        ),
        (
            "close json with none open",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="k"')
            .t("1")
            .close("argument")
            .close("json"),
            {"calls": [("call_1", "f", "")]},
        ),
        (
            "json block wins",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="k"')
            .t("1")
            .close("argument")
            .open("json")
            .t('{"j": 2}')
            .close("json"),
            {"calls": [("call_1", "f", '{"j": 2}')]},
        ),
        (
            "ends inside argument",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="k" type="string"')
            .t("part"),
            {"calls": [("call_1", "f", '{"k": "part"}')]},
        ),
        (
            "ends inside json block",
            R().close("think").open('call tool="f"').open("json").t('{"a": '),
            {"calls": [("call_1", "f", '{"a": ')]},
        ),
        (
            "after EOM ignored",
            R().close("think").t("a").close("message").m(EOM).t("b").open("response").t("c"),
            {"content": "a"},
        ),
        (
            "spelled marker is text",
            R().close("think").t("x <|close|>response<|sep|> y"),
            {"content": "x <|close|>response<|sep|> y"},
        ),
        (
            "string args keep markers",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="k" type="string"')
            .t(" <|sep|> ")
            .close("argument"),
            {"calls": [("call_1", "f", '{"k": " <|sep|> "}')]},
        ),
        (
            "attribute unescape",
            R().close("think").open('call tool="a&amp;b&quot;"').close("call"),
            {"calls": [("call_1", 'a&b"', "{}")]},
        ),
        (
            "NaN value",
            R()
            .close("think")
            .open('call tool="f"')
            .open('argument key="x" type="number"')
            .t("NaN")
            .close("argument"),
            {"calls": [("call_1", "f", '{"x": NaN}')]},
        ),
    ]
    _check_cases(fmt, hf_tok, cases)


def test_malformed_json_block_is_flagged_not_dropped(hf_tok: Tokenizer) -> None:
    r = Reply(hf_tok).close("think").open('call tool="f"').open("json").t("{oops").close("json")
    msg = parse(XtmlFormat(), hf_tok, r)
    assert msg.tool_calls[0].arguments == "{oops" and msg.tool_calls[0].malformed


def test_initial_channel_and_empty_stack(hf_tok: Tokenizer) -> None:
    ids = {hf_tok.marker_id(m): m for m in (OPEN, CLOSE, SEP, EOM)}
    items = Reply(hf_tok).t("x").items
    assert run_parser(XtmlParser(ids, "response"), items)[1].content == "x"
    assert run_parser(XtmlParser(ids, None), items)[1].content == "x"
    assert run_parser(XtmlParser(ids, "think"), items)[1].reasoning == "x"


def test_new_parser_follows_prompt(fmt: XtmlFormat, hf_tok: Tokenizer) -> None:
    off = fmt.render({"messages": [USER], "thinking": False})
    assert run_parser(fmt.new_parser(off), Reply(hf_tok).t("x").items)[1].content == "x"
    assert run_parser(fmt.new_parser(), Reply(hf_tok).t("x").items)[1].reasoning == "x"


def test_deltas_and_call_events(hf_tok: Tokenizer) -> None:
    ids = {hf_tok.marker_id(m): m for m in (OPEN, CLOSE, SEP, EOM)}
    p = XtmlParser(ids, "response")
    r = (
        Reply(hf_tok)
        .open('call tool="f"')
        .open('argument key="a" type="number"')
        .t("1")
        .close("argument")
        .close("call")
        .open('call tool="g"')
    )
    deltas = [p.feed(i, s) for i, s in r.items]
    events = [ev for d in deltas for ev in d.tool_calls]
    assert [type(e).__name__ for e in events] == [
        "ToolCallStart",
        "ToolCallArguments",
        "ToolCallEnd",
        "ToolCallStart",
    ]
    assert events[1].fragment == '{"a": 1}'  # type: ignore[union-attr]
    tail = p.flush()
    assert [type(e).__name__ for e in tail.tool_calls] == ["ToolCallArguments", "ToolCallEnd"]
    assert p.flush().empty


# --------------------------------------------------------------------------- §3.10 text path
def test_text_path_chunking_invariance_and_ambiguity() -> None:
    ids = {1: OPEN, 2: CLOSE, 3: SEP, 4: EOM}
    text = (
        "r<|close|>think<|sep|><|open|>response<|sep|>The tag is <|close|>response<|sep|> see?"
        '<|open|>call tool="f"<|sep|><|open|>argument key="k"<|sep|>5<|close|>argument<|sep|><|close|>call<|sep|>'
        "<|end_of_msg|>ignored"
    )
    results = []
    for size in (1, 2, 3, 5, 13, 14, len(text)):
        p = XtmlParser(ids, "think")
        deltas = [p.feed_text(text[i : i + size]) for i in range(0, len(text), size)]
        deltas.append(p.flush())
        msg = p.finish()
        assert "".join(d.content for d in deltas) == (msg.content or "")
        results.append(msg)
    assert all(r == results[0] for r in results)
    assert results[0].content == "The tag is  see?" and results[0].reasoning == "r"
    assert json.loads(results[0].tool_calls[0].arguments) == {"k": 5}


def test_text_path_holds_back_marker_prefix() -> None:
    p = XtmlParser({}, "response")
    assert p.feed_text("abc<|clo").content == "abc"
    assert p.flush().content == "<|clo"


def test_finish_after_eom_with_pending_header_uses_the_marker_spelling(hf_tok: Tokenizer) -> None:
    ids = {hf_tok.marker_id(m): m for m in (OPEN, CLOSE, SEP, EOM)}
    p = XtmlParser(ids, "response")
    for i, s in Reply(hf_tok).m(CLOSE).t("resp").m(EOM).items:
        p.feed(i, s)
    assert p.finish().content == "<|close|>resp" and p.finished


def test_prompt_is_a_list_of_segments(fmt: XtmlFormat) -> None:
    p = fmt.render({"messages": [USER]})
    assert isinstance(p, Prompt) and isinstance(p, list) and p.thinking


# --------------------------------------------------------------------------- §2.3/2.5 names and declarations
@pytest.mark.parametrize("role", ["system", "assistant"])
def test_truthy_name_on_system_and_assistant(fmt: XtmlFormat, role: str) -> None:
    out = render(fmt, [{"role": role, "content": "c", "name": "Ann"}], thinking=False)
    assert out.startswith(f'<|open|>message role="{role}" name="Ann"<|sep|>')


def test_lazy_declaration_ignores_the_message_name(fmt: XtmlFormat) -> None:
    tools = [{"type": "function", "function": {"name": "late"}}]
    out = render(fmt, [USER, {"role": "system", "name": "Ann", "content": "c", "tools": tools}])
    assert '<|open|>message role="system" type="tool-declare"<|sep|>## New Tools' in out
    assert "Ann" not in out


def test_null_tools_render_nothing(fmt: XtmlFormat) -> None:
    out = render(fmt, [USER, {"role": "system", "content": "s", "tools": None}], tools=None)
    assert "tool-declare" not in out and '<|open|>message role="system"<|sep|>s<|close|>' in out


def test_declaration_keeps_the_order_of_several_tools(fmt: XtmlFormat) -> None:
    names = ["zeta", "alpha", "mid"]
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    for out in (
        render(fmt, [USER], tools=tools),
        render(fmt, [USER, {"role": "system", "tools": tools}]),
    ):
        declared = json.loads(out.split("```json\n", 1)[1].split("\n```", 1)[0])
        assert [t["function"]["name"] for t in declared] == names


# --------------------------------------------------------------------------- §2.6 re-sort details
def test_resort_compares_ids_as_strings() -> None:
    calls = {
        "role": "assistant",
        "tool_calls": [
            {"id": 7, "function": {"name": "a"}},
            {"id": "8", "function": {"name": "b"}},
        ],
    }
    out = resort_tool_results([calls, _result(8, "B"), _result("7", "A")])
    assert [(m["tool"], m["content"]) for m in out[1:]] == [("a", "A"), ("b", "B")]


def test_null_ids_count_for_position(fmt: XtmlFormat) -> None:
    calls = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": None, "function": {"name": "n", "arguments": "{}"}},
            {"id": "x", "function": {"name": "a", "arguments": "{}"}},
            {"id": "y", "function": {"name": "b", "arguments": "{}"}},
        ],
    }
    msgs = [calls, _result("y", "Y"), _result("x", "X")]
    assert [m["content"] for m in resort_tool_results(msgs)[1:]] == ["X", "Y"]
    # rendered numbering is by position in the run, names from the matched calls
    assert _tool_headers(render(fmt, msgs, thinking=False)) == [("a", "1", "X"), ("b", "2", "Y")]


def test_resort_ties_keep_arrival_order_and_name_is_not_added() -> None:
    msgs = [_calls("a", "b"), _result("id2", "B"), _result("id1", "A1"), _result("id1", "A2")]
    out = resort_tool_results(msgs)
    assert [m["content"] for m in out[1:]] == ["A1", "A2", "B"]
    assert all("name" not in m and m["tool"] in ("a", "b") for m in out[1:])


def test_null_tool_member_falls_back_to_positional_name(fmt: XtmlFormat) -> None:
    msgs = [_calls("a", "b"), _result(None, "1", tool=None, name="ignored"), _result(None, "2")]
    assert _tool_headers(render(fmt, msgs, thinking=False)) == [("a", "1", "1"), ("b", "2", "2")]


# --------------------------------------------------------------------------- §2.7 notes
@pytest.mark.parametrize(
    "request_",
    [
        {"reasoning_effort": "high"},
        {"tool_choice": "required"},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
    ],
)
def test_note_body_is_one_stripped_plain_segment(fmt: XtmlFormat, request_: dict[str, Any]) -> None:
    p = fmt.render({"messages": [USER], **request_}, add_generation_prompt=False)
    type_at = p.index(T(" type"))
    body = p[type_at + 5]
    assert p[type_at + 4] == M(SEP) and p[type_at + 6] == M(CLOSE)
    assert not body.markup and body.text == body.text.strip() and body.text


@pytest.mark.parametrize(
    "rf,schema",
    [
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": None}}, "null"),
        ({"type": "json_schema", "json_schema": "a string"}, '"a string"'),
        ({"type": "json_schema", "json_schema": [{"b": 1, "a": 2}]}, '[{"a":2,"b":1}]'),
    ],
    ids=["schema-null", "string-json_schema", "list-json_schema"],
)
def test_response_format_schema_null_and_non_object_json_schema(
    fmt: XtmlFormat, rf: dict[str, Any], schema: str
) -> None:
    """`schema: null` renders `null`; a non-object `json_schema` is the schema itself (§2.7)."""
    body = f"The system is invoked with `response_format=json_schema`.\n{JSON_ONLY}\nThe JSON data must match the following schema:\n```json\n{schema}\n```"
    assert _note("response-format", body) in render(fmt, [USER], response_format=rf)


def test_response_format_without_type_renders_nothing(fmt: XtmlFormat) -> None:
    rf = {"json_schema": {"schema": {"type": "object"}}}
    assert render(fmt, [USER], response_format=rf) == render(fmt, [USER])


# --------------------------------------------------------------------------- §2.9/2.10 images
def test_placeholder_splices_inside_a_raw_json_block(fmt: XtmlFormat) -> None:
    call = {"function": {"name": "f", "arguments": "{oops <|kimi_image_placeholder|> x"}}
    p = fmt.render(
        {"messages": [{"role": "assistant", "tool_calls": [call]}], "thinking": False},
        images=[ImageInfo(3, 4)],
        add_generation_prompt=False,
    )
    block = M("<|media_begin|>image 3x4<|media_content|><|media_pad|><|media_end|>")
    at = p.index(block)
    assert p[at - 1 : at + 2] == [T("{oops "), block, T(" x")]
    assert p[at - 8 : at - 1] == [
        M(OPEN),
        T("json"),
        T(" type"),
        T('="'),
        T("object"),
        T('"'),
        M(SEP),
    ]


def test_image_part_without_images_is_the_bare_placeholder_markup(fmt: XtmlFormat) -> None:
    msg = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    p = fmt.render({"messages": [msg]}, add_generation_prompt=False)
    assert M("<|kimi_image_placeholder|>") in p


# --------------------------------------------------------------------------- §2.12 renderer errors
def test_renderer_errors_have_param_messages_and_no_code(fmt: XtmlFormat) -> None:
    with pytest.raises(ChatFormatError) as err:
        render(fmt, [USER, {"role": "tool", "content": "x"}])
    assert (err.value.param, err.value.code, err.value.type) == (
        "messages",
        None,
        "invalid_request_error",
    )


def test_effort_is_refused_before_the_renderer_sees_it(fmt: XtmlFormat) -> None:
    """§2.12's `Unsupported thinking_effort=...` is unreachable: §7.6 refuses first, in render."""
    with pytest.raises(ChatFormatError) as err:
        render(fmt, [USER], reasoning_effort="medium", thinking=True)
    assert err.value.message == (
        "reasoning_effort='medium' is not supported by this model. Kimi K3 accepts ['high', 'low', 'max'], "
        "or ['minimal', 'none', 'off'] to answer without reasoning. (K3's own encoder documents 'medium' and then rejects it.)"
    )
    assert err.value.code is None


# --------------------------------------------------------------------------- §3.2-3.6 more reader rules
def test_reader_rules_added(fmt: XtmlFormat, hf_tok: Tokenizer) -> None:
    R = lambda: Reply(hf_tok)  # noqa: E731
    call = lambda: R().close("think").open('call tool="f"')  # noqa: E731
    cases: list[tuple[str, Reply, dict[str, Any]]] = [
        (
            "§3.2 control ids that are no XTML markers are text",
            R().close("think").m("<|media_pad|>").m("<|im_end|>").t("x"),
            {"content": "<|media_pad|><|im_end|>x"},
        ),
        (
            "§3.4 an open JSON block takes text before an open argument",
            call().open("json").open('argument key="k"').t("T").close("argument").close("json"),
            {"calls": [("call_1", "f", "T")]},
        ),
        (
            "§3.4 text in an unknown element is content, even above think",
            R().open("nonesuch").t("u").close("nonesuch").t("r"),
            {"content": "u", "reasoning": "r"},
        ),
        (
            "§3.4 text in an empty-named element is content",
            R().open("").t("e").close("").t("r"),
            {"content": "e", "reasoning": "r"},
        ),
        (
            "§3.5 an open argument is abandoned when another opens",
            call()
            .open('argument key="a"')
            .t("1")
            .open('argument key="b"')
            .t("2")
            .close("argument"),
            {"calls": [("call_1", "f", '{"b": 2}')]},
        ),
        (
            "§3.5 an open JSON block restarts",
            call().open("json").t("AAA").open("json").t("{}").close("json"),
            {"calls": [("call_1", "f", "{}")]},
        ),
        (
            "§3.6 an argument is filed though no longer on the stack",
            call().open('argument key="k"').t("1").close("call").close("argument").t("c"),
            {"content": "c", "calls": [("call_1", "f", '{"k": 1}')]},
        ),
        (
            "§3.6 a JSON block is filed though no longer on the stack",
            call().open("json").t('{"j": 1}').close("call").close("json").t("c"),
            {"content": "c", "calls": [("call_1", "f", '{"j": 1}')]},
        ),
    ]
    _check_cases(fmt, hf_tok, cases)
