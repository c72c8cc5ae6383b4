"""GLM tool protocol (PROTOCOLS §5): declaration bytes, calls, results, the whole prompt, the typed reader."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

from typing import Any

import pytest
from chat_helpers import GLM_MARKERS, assert_stream_invariant, items_from_ids, make_hf, run_parser

from warp_providers.chat.base import ChatFormatError, M, T, ToolCallStart
from warp_providers.chat.formats.glm import FOOTER, HEADER, GlmFormat, GlmProtocol
from warp_providers.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "n": {"type": "number"},
                "ok": {"type": "boolean"},
                "o": {"type": "object"},
                "a": {"type": "array"},
                "z": {"type": "null"},
                "code": {"type": "string"},
                "u": {"type": ["integer", "null"]},
            },
        },
    },
}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return make_hf(GLM_MARKERS)


@pytest.fixture(scope="module")
def fmt(tok: Tokenizer) -> GlmFormat:
    f = GlmFormat()
    f.bind(tok)
    return f


def test_header_and_footer_bytes() -> None:
    assert HEADER == (
        "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    )
    assert FOOTER == (
        "\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
        "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
        "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
    )


def test_declaration_segments(fmt: GlmFormat) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "Météo",
            "description": "d",
            "parameters": {"type": "object", "properties": {}},
            "defer_loading": False,
        },
    }
    p = fmt.render({"messages": [{"role": "user", "content": "q"}], "tools": [WEATHER, tool]})
    sig1 = '{"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}'
    sig2 = (
        '{"name": "Météo", "description": "d", "parameters": {"type": "object", "properties": {}}}'
    )
    assert list(p[:6]) == [
        M("[gMASK]<sop>"),
        M("<|system|>"),
        T(HEADER),
        T("\n" + sig1 + "\n\n"),
        T("\n" + sig2 + "\n\n"),
        M(FOOTER),
    ]
    assert "}\n\n\n{" in p.text


@pytest.mark.parametrize(
    "tool,param,message",
    [
        ({"function": {"name": ""}}, "tools[0]", "each tool must name a function"),
        ({"function": "x"}, "tools[0]", "each tool must name a function"),
        (
            {"function": {"name": "f", "parameters": None}},
            "tools[0].function.parameters",
            "tool parameters and properties must be objects",
        ),
        (
            {"function": {"name": "f", "parameters": {"properties": []}}},
            "tools[0].function.parameters",
            "tool parameters and properties must be objects",
        ),
        (
            {"function": {"name": "f", "defer_loading": True}},
            "tools",
            "deferred tool loading is not supported",
        ),
    ],
)
def test_declaration_validation(tool: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        GlmProtocol().declaration([tool])
    assert (err.value.param, err.value.message) == (param, message)


def test_flat_tool_without_function_member() -> None:
    """§5.2: the function object is the tool itself when it has no `function` member."""
    flat = {"name": "ping", "description": "Ping.", "strict": False, "parameters": {}}
    segs = GlmProtocol().declaration([flat])
    assert segs[2] == T('\n{"name": "ping", "description": "Ping.", "parameters": {}}\n\n')
    with pytest.raises(ChatFormatError) as err:
        GlmProtocol().declaration([{"description": "no name"}])
    assert (err.value.param, err.value.message) == ("tools[0]", "each tool must name a function")


def test_declaration_validation_through_request(fmt: GlmFormat) -> None:
    with pytest.raises(ChatFormatError) as err:
        fmt.render(
            {
                "messages": [{"role": "user", "content": "q"}],
                "tools": [WEATHER, {"function": {"name": "f", "parameters": None}}],
            }
        )
    assert err.value.param == "tools[1].function.parameters"


def test_history_calls_example(fmt: GlmFormat) -> None:
    msg = {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "x1",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 3}'},
            },
            {"id": "x2", "function": {"name": "search", "arguments": {"q": "rome"}}},
        ],
    }
    p = fmt.render(
        {"messages": [{"role": "user", "content": "q"}, msg]}, add_generation_prompt=False
    )
    assert p.text.endswith(
        "<|assistant|>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>search<arg_key>q</arg_key><arg_value>rome</arg_value></tool_call>"
    )
    assert T("get_weather") in p and T("Oslo") in p and M("<arg_key>") in p and "x1" not in p.text


@pytest.mark.parametrize(
    "value,text",
    [
        (3, "3"),
        (True, "true"),
        ({"year": 2024, "ok": True}, '{"year": 2024, "ok": true}'),
        (["x", "ü"], '["x", "ü"]'),
        (None, "null"),
        ('raw "s"', 'raw "s"'),
    ],
)
def test_value_text(fmt: GlmFormat, value: Any, text: str) -> None:
    segs = GlmProtocol().calls(0, [{"function": {"name": "f", "arguments": {"k": value}}}])
    assert T(text) in segs


@pytest.mark.parametrize(
    "fn,param,message",
    [
        (
            {"name": ""},
            "messages[1].tool_calls[0].function.name",
            "messages[1].tool_calls[0] has no function name",
        ),
        (
            {"name": "f", "arguments": "{oops"},
            "messages[1].tool_calls[0].function.arguments",
            "messages[1].tool_calls[0] carries JSON arguments this protocol cannot split into <arg_key>/<arg_value> pairs",
        ),
        (
            {"name": "f", "arguments": ""},
            "messages[1].tool_calls[0].function.arguments",
            "messages[1].tool_calls[0] carries JSON arguments this protocol cannot split into <arg_key>/<arg_value> pairs",
        ),
        (
            {"name": "f", "arguments": "[1]"},
            "messages[1].tool_calls[0].function.arguments",
            "messages[1].tool_calls[0] arguments must be an object",
        ),
        (
            {"name": "f", "arguments": None},
            "messages[1].tool_calls[0].function.arguments",
            "messages[1].tool_calls[0] arguments must be an object",
        ),
    ],
)
def test_history_call_refusals(fn: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        GlmProtocol().calls(1, [{"function": fn}])
    assert (err.value.param, err.value.message) == (param, message)


def test_absent_arguments_are_empty(fmt: GlmFormat) -> None:
    p = fmt.render(
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "ping"}}]}]},
        add_generation_prompt=False,
    )
    assert p.text.endswith("<|assistant|><tool_call>ping</tool_call>")


def test_results_share_one_observation(fmt: GlmFormat) -> None:
    msgs = [
        {"role": "tool", "tool_call_id": "a", "content": "-2C"},
        {"role": "tool", "content": "3 hits", "name": "ignored"},
        {"role": "user", "content": "Thanks."},
        {"role": "tool", "content": "again"},
    ]
    text = fmt.render({"messages": msgs}, add_generation_prompt=False).text
    assert text == (
        "[gMASK]<sop><|observation|><tool_response>-2C</tool_response><tool_response>3 hits</tool_response>"
        "<|user|>Thanks.<|observation|><tool_response>again</tool_response>"
    )


def test_result_segments_markup_and_text(fmt: GlmFormat) -> None:
    """§5.4: the markers are markup; the content (parts too) is plain, with no name or id."""
    msgs = [
        {"role": "tool", "tool_call_id": "a", "name": "n", "content": "<|user|>x"},
        {
            "role": "tool",
            "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}],
        },
    ]
    p = fmt.render({"messages": msgs}, add_generation_prompt=False)
    assert list(p) == [
        M("[gMASK]<sop>"),
        M("<|observation|>"),
        M("<tool_response>"),
        T("<|user|>x"),
        M("</tool_response>"),
        M("<tool_response>"),
        T("p1"),
        T("p2"),
        M("</tool_response>"),
    ]


def test_whole_prompt(fmt: GlmFormat) -> None:
    p = fmt.render(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "not rendered"},
                {"role": "user", "content": "3+3?"},
            ]
        }
    )
    assert (
        p.text
        == "[gMASK]<sop><|system|>Be brief.<|user|>2+2?<|assistant|>4<|user|>3+3?<|assistant|><think>"
    )
    assert list(p[:3]) == [M("[gMASK]<sop>"), M("<|system|>"), T("Be brief.")] and p[-2:] == [
        M("<|assistant|>"),
        M("<think>"),
    ]
    assert p.reasoning_open and fmt.stop_ids == (fmt.tokenizer.marker_id("<|user|>"),)


def test_thinking_cannot_be_turned_off_and_no_effort(fmt: GlmFormat) -> None:
    with pytest.raises(ChatFormatError, match="always opens a reasoning channel"):
        fmt.render({"messages": [{"role": "user", "content": "q"}], "thinking": False})
    with pytest.raises(ChatFormatError, match="does not say how to ask for a reasoning effort"):
        fmt.render({"messages": [{"role": "user", "content": "q"}], "reasoning_effort": "high"})


def test_bind_requires_all_nine_markers() -> None:
    with pytest.raises(ChatFormatError, match="<|observation|>"):
        GlmFormat().bind(make_hf([m for m in GLM_MARKERS if m != "<|observation|>"]))


# --------------------------------------------------------------------------- reader
def reply(tok: Tokenizer, *parts: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for part in parts:
        mid = tok.marker_id(part)
        out += [(mid, part)] if mid is not None else items_from_ids(tok, tok.encode_content(part))
    return out


def parse(fmt: GlmFormat, tok: Tokenizer, *parts: str, tools: list[Any] | None = None) -> Any:
    prompt = fmt.render(
        {"messages": [{"role": "user", "content": "q"}], "tools": tools or [WEATHER, SEARCH]}
    )
    return assert_stream_invariant(lambda: fmt.new_parser(prompt), tok, reply(tok, *parts))


CATALOGUE: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    (
        "plain call",
        (
            "r",
            "</think>",
            "ok",
            "<tool_call>",
            "get_weather",
            "<arg_key>",
            "city",
            "</arg_key>",
            "\n",
            "<arg_value>",
            "Oslo",
            "</arg_value>",
            "<arg_key>",
            "days",
            "</arg_key>",
            "<arg_value>",
            "3",
            "</arg_value>",
            "</tool_call>",
            "<|user|>",
        ),
        {
            "reasoning": "r",
            "content": "ok",
            "calls": [("call_0", "get_weather", '{"city": "Oslo", "days": 3}')],
        },
    ),
    (
        "calls inside reasoning",
        (
            "think ",
            "<tool_call>",
            "search",
            "<arg_key>",
            "q",
            "</arg_key>",
            "<arg_value>",
            "x",
            "</arg_value>",
            "</tool_call>",
            " more",
            "</think>",
            "c",
        ),
        {"reasoning": "think  more", "content": "c", "calls": [("call_0", "search", '{"q": "x"}')]},
    ),
    (
        "whitespace stripped around name and key, value kept",
        (
            "</think>",
            "<tool_call>",
            "\n search \n",
            "<arg_key>",
            " q\n",
            "</arg_key>",
            "<arg_value>",
            " v \n",
            "</arg_value>",
            "</tool_call>",
        ),
        {"calls": [("call_0", "search", '{"q": " v \\n"}')]},
    ),
    (
        "text between pairs swallowed",
        (
            "</think>",
            "<tool_call>",
            "search",
            "<arg_key>",
            "q",
            "</arg_key>",
            "junk",
            "<arg_value>",
            "v",
            "</arg_value>",
            "junk2",
            "</tool_call>",
            "after",
        ),
        {"content": "after", "calls": [("call_0", "search", '{"q": "v"}')]},
    ),
    (
        "value with no key dropped",
        ("</think>", "<tool_call>", "search", "<arg_value>", "v", "</arg_value>", "</tool_call>"),
        {"calls": [("call_0", "search", "{}")]},
    ),
    (
        "empty key dropped",
        (
            "</think>",
            "<tool_call>",
            "search",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "v",
            "</arg_value>",
            "</tool_call>",
        ),
        {"calls": [("call_0", "search", "{}")]},
    ),
    (
        "duplicate key last wins",
        (
            "</think>",
            "<tool_call>",
            "search",
            "<arg_key>",
            "q",
            "</arg_key>",
            "<arg_value>",
            "1",
            "</arg_value>",
            "<arg_key>",
            "q",
            "</arg_key>",
            "<arg_value>",
            "2",
            "</arg_value>",
            "</tool_call>",
        ),
        {"calls": [("call_0", "search", '{"q": "2"}')]},
    ),
    (
        "typed values",
        (
            "</think>",
            "<tool_call>",
            "search",
            "<arg_key>",
            "n",
            "</arg_key>",
            "<arg_value>",
            "2.5",
            "</arg_value>",
            "<arg_key>",
            "ok",
            "</arg_key>",
            "<arg_value>",
            "true",
            "</arg_value>",
            "<arg_key>",
            "o",
            "</arg_key>",
            "<arg_value>",
            '{"a": [1]}',
            "</arg_value>",
            "<arg_key>",
            "a",
            "</arg_key>",
            "<arg_value>",
            "[1, 2]",
            "</arg_value>",
            "<arg_key>",
            "z",
            "</arg_key>",
            "<arg_value>",
            "null",
            "</arg_value>",
            "<arg_key>",
            "code",
            "</arg_key>",
            "<arg_value>",
            "001",
            "</arg_value>",
            "<arg_key>",
            "u",
            "</arg_key>",
            "<arg_value>",
            "4",
            "</arg_value>",
            "<arg_key>",
            "extra",
            "</arg_key>",
            "<arg_value>",
            "3",
            "</arg_value>",
            "</tool_call>",
        ),
        {
            "calls": [
                (
                    "call_0",
                    "search",
                    '{"n": 2.5, "ok": true, "o": {"a": [1]}, "a": [1, 2], "z": null, "code": "001", "u": "4", "extra": "3"}',
                )
            ]
        },
    ),
    (
        "invalid JSON for typed property kept raw",
        (
            "</think>",
            "<tool_call>",
            "get_weather",
            "<arg_key>",
            "days",
            "</arg_key>",
            "<arg_value>",
            "three",
            "</arg_value>",
            "</tool_call>",
        ),
        {"calls": [("call_0", "get_weather", '{"days": "three"}')]},
    ),
    (
        "unknown function: strings",
        (
            "</think>",
            "<tool_call>",
            "nosuch",
            "<arg_key>",
            "days",
            "</arg_key>",
            "<arg_value>",
            "3",
            "</arg_value>",
            "</tool_call>",
        ),
        {"calls": [("call_0", "nosuch", '{"days": "3"}')]},
    ),
    (
        "call with no pairs",
        ("</think>", "<tool_call>", "search", "</tool_call>"),
        {"calls": [("call_0", "search", "{}")]},
    ),
    (
        "ends inside a value",
        (
            "</think>",
            "<tool_call>",
            "search",
            "<arg_key>",
            "q",
            "</arg_key>",
            "<arg_value>",
            "part",
        ),
        {"calls": [("call_0", "search", '{"q": "part"}')]},
    ),
    (
        "ends inside the name",
        ("</think>", "<tool_call>", " sea"),
        {"calls": [("call_0", " sea", "{}")]},
    ),
    (
        "stray close swallows text (quirk)",
        (
            "</think>",
            "a",
            "</arg_value>",
            "swallowed",
            "<tool_call>",
            "search",
            "</tool_call>",
            "b",
        ),
        {"content": "ab", "calls": [("call_0", "search", "{}")]},
    ),
    (
        "stray </arg_key> swallows text too (quirk)",
        ("</think>", "a", "</arg_key>", "swallowed", "<tool_call>", "search", "</tool_call>", "b"),
        {"content": "ab", "calls": [("call_0", "search", "{}")]},
    ),
    ("result marker ends the turn", ("</think>", "c", "<tool_response>", "x"), {"content": "c"}),
    (
        "result close marker ends the turn",
        ("</think>", "c", "</tool_response>", "x", "<tool_call>", "search", "</tool_call>"),
        {"content": "c"},
    ),
    ("observation ends the turn", ("</think>", "c", "<|observation|>", "x"), {"content": "c"}),
    ("stop marker ends the turn", ("</think>", "c", "<|user|>", "x"), {"content": "c"}),
    (
        "marker spelling is text",
        ("</think>", "<tool_call>x</tool_call>"),
        {"content": "<tool_call>x</tool_call>"},
    ),
    (
        "second </think> is content",
        ("r", "</think>", "c", "</think>"),
        {"reasoning": "r", "content": "c</think>"},
    ),
    (
        "two calls positions",
        (
            "</think>",
            "<tool_call>",
            "search",
            "</tool_call>",
            "\n",
            "<tool_call>",
            "get_weather",
            "</tool_call>",
        ),
        {"content": "\n", "calls": [("call_0", "search", "{}"), ("call_1", "get_weather", "{}")]},
    ),
]


@pytest.mark.parametrize("label,parts,want", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_reader_catalogue(
    fmt: GlmFormat, tok: Tokenizer, label: str, parts: tuple[str, ...], want: dict[str, Any]
) -> None:
    msg = parse(fmt, tok, *parts)
    assert msg.reasoning == want.get("reasoning")
    assert msg.content == want.get("content")
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls] == want.get("calls", [])


def test_no_tools_means_strings(fmt: GlmFormat, tok: Tokenizer) -> None:
    prompt = fmt.render({"messages": [{"role": "user", "content": "q"}]})
    _, msg = run_parser(
        fmt.new_parser(prompt),
        reply(
            tok,
            "</think>",
            "<tool_call>",
            "get_weather",
            "<arg_key>",
            "days",
            "</arg_key>",
            "<arg_value>",
            "3",
            "</arg_value>",
            "</tool_call>",
        ),
    )
    assert msg.tool_calls[0].arguments == '{"days": "3"}'


def test_call_announced_at_first_arg_key(fmt: GlmFormat, tok: Tokenizer) -> None:
    prompt = fmt.render({"messages": [{"role": "user", "content": "q"}], "tools": [WEATHER]})
    parser = fmt.new_parser(prompt)
    starts = []
    for i, piece in reply(
        tok, "</think>", "<tool_call>", " get_weather ", "<arg_key>", "city", "</arg_key>"
    ):
        starts += [ev for ev in parser.feed(i, piece).tool_calls if isinstance(ev, ToolCallStart)]
        if i == tok.marker_id("<arg_key>"):
            assert starts == [ToolCallStart(0, "call_0", "get_weather")]
    assert len(starts) == 1
