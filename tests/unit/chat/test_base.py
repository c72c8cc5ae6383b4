"""Shared pieces of the chat layer: the error, request normalisation, reasoning resolution, JSON helpers, deltas."""

# ruff: noqa: E501 - the tables quote the spec's exact strings; wrapping them hides the bytes.

from __future__ import annotations

import math
from typing import Any

import pytest
from chat_helpers import make_hf

from warp_providers.chat import (
    ChatFormatError,
    Delta,
    DeltaAccumulator,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from warp_providers.chat.base import (
    apply_named_tool_choice,
    deep_sort,
    dumps_compact,
    dumps_py,
    loads_or_raw,
    request_dict,
    resolve_reasoning,
)
from warp_providers.chat.formats.xtml import XtmlFormat


def test_error_fields() -> None:
    err = ChatFormatError("bad", param="messages[0].role", code="x")
    assert isinstance(err, ValueError) and str(err) == "bad"
    assert (err.message, err.param, err.code, err.type) == (
        "bad",
        "messages[0].role",
        "x",
        "invalid_request_error",
    )


@pytest.mark.parametrize(
    "request_,param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
        ({"messages": [{"role": "user"}], "tools": [{"function": {}}]}, "tools[0].function.name"),
    ],
)
def test_request_validation_names_the_field(request_: dict[str, Any], param: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        request_dict(request_)
    assert err.value.param == param


def test_request_dict_keeps_absent_distinct_from_null() -> None:
    out = request_dict(
        {
            "messages": [
                {"role": "developer", "content": "x"},
                {"role": "tool", "content": "r", "tool_call_id": None},
            ]
        }
    )
    assert (
        out["messages"][0]["role"] == "system"
        and "tool_call_id" in out["messages"][1]
        and "name" not in out["messages"][1]
    )


def test_named_tool_choice() -> None:
    msgs, choice = apply_named_tool_choice(
        [{"role": "user"}], {"type": "function", "function": {"name": "calc"}}
    )
    assert choice == "required" and msgs[-1] == {
        "role": "system",
        "content": "You must call the tool `calc` in your next message, and no other.",
    }
    assert apply_named_tool_choice([], "auto") == ([], "auto")


@pytest.mark.parametrize(
    "effort,thinking,default,result",
    [
        (None, None, True, (True, None)),
        (None, None, False, (False, None)),
        (None, False, True, (False, None)),
        ("low", None, False, (True, "low")),
        ("MAX", True, False, (True, "max")),
        ("none", True, True, (False, None)),
        ("Minimal", None, True, (False, None)),
        ("off", None, True, (False, None)),
    ],
)
def test_reasoning_resolution(
    effort: Any, thinking: Any, default: bool, result: tuple[bool, str | None]
) -> None:
    assert resolve_reasoning(effort, thinking, default) == result


@pytest.mark.parametrize(
    "effort,thinking,param,message",
    [
        (None, "yes", "thinking", "'thinking' must be a boolean"),
        (3, None, "reasoning_effort", "'reasoning_effort' must be a string"),
        (
            "medium",
            None,
            "reasoning_effort",
            "reasoning_effort='medium' is not supported by this model. Kimi K3 accepts ['high', 'low', 'max'], or ['minimal', 'none', 'off'] to answer without reasoning. (K3's own encoder documents 'medium' and then rejects it.)",
        ),
        (
            "high",
            False,
            "reasoning_effort",
            "'thinking' is false but 'reasoning_effort' asks for reasoning \u2014 pick one",
        ),
    ],
)
def test_reasoning_refusals(effort: Any, thinking: Any, param: str, message: str) -> None:
    with pytest.raises(ChatFormatError) as err:
        resolve_reasoning(effort, thinking, True)
    assert (err.value.param, err.value.message) == (param, message)


def test_json_helpers() -> None:
    value = {"z": {"b": 1, "a": [{"d": 1, "c": "é"}]}, "a": math.inf}
    assert dumps_compact(deep_sort(value)) == '{"a":Infinity,"z":{"a":[{"c":"é","d":1}],"b":1}}'
    assert dumps_py({"k": "é", "n": [1, None]}) == '{"k": "é", "n": [1, null]}'
    assert dumps_compact({"k": "é"}, ascii_only=True) == '{"k":"\\u00e9"}'
    assert (
        loads_or_raw('{"a": 1, "a": 2}') == {"a": 2}
        and loads_or_raw("nope") == "nope"
        and math.isnan(loads_or_raw("NaN"))
    )


def test_delta_accumulator_folds_events() -> None:
    acc = DeltaAccumulator()
    for d in (
        Delta(reasoning="r"),
        Delta(content="c", tool_calls=(ToolCallStart(0, "call_0", "f"),)),
        Delta(
            tool_calls=(ToolCallArguments(0, '{"a"'), ToolCallArguments(0, ": 1}"), ToolCallEnd(0))
        ),
        Delta(
            tool_calls=(
                ToolCallStart(1, "x", "g"),
                ToolCallArguments(1, "{oops"),
                ToolCallEnd(1, malformed=True),
            )
        ),
    ):
        acc.add(d)
    msg = acc.message("tool_calls")
    assert (msg.reasoning, msg.content) == ("r", "c")
    assert [(c.id, c.name, c.arguments, c.malformed) for c in msg.tool_calls] == [
        ("call_0", "f", '{"a": 1}', False),
        ("x", "g", "{oops", True),
    ]
    assert Delta().empty and not Delta(content="x").empty


def test_bind_names_the_missing_marker_and_unbound_use_fails() -> None:
    with pytest.raises(ChatFormatError) as err:
        XtmlFormat().bind(make_hf(("<|open|>", "<|sep|>", "<|end_of_msg|>")))
    assert "<|close|>" in err.value.message and err.value.param == "model"
    with pytest.raises(RuntimeError, match="bind"):
        XtmlFormat().stop_ids  # noqa: B018


@pytest.mark.parametrize("family", ["wordlevel", "tiktoken"])
def test_bind_refuses_a_marker_that_is_an_ordinary_token(family: str) -> None:
    """One id is not enough: a marker caller text can produce is no control token (§1.3, §2.1)."""
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    from warp_providers.tokenizer import Tokenizer

    if family == "wordlevel":
        words = ["[UNK]", "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
        wl = HF(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok = Tokenizer.from_tokenizer_json(wl.to_str(), special_tokens={"<|end_of_msg|>": 4})
    else:
        ranks = {bytes([b]): b for b in range(256)}
        for word in ("<|", "<|open", "<|open|", "<|open|>"):
            ranks[word.encode()] = len(ranks)
        specials = {m: 1000 + i for i, m in enumerate(("<|close|>", "<|sep|>", "<|end_of_msg|>"))}
        tok = Tokenizer.from_tiktoken_ranks(ranks, r"\S+|\s+", specials)
    assert len(tok.encode_markup("<|open|>")) == 1 and tok.marker_id("<|open|>") is None
    with pytest.raises(ChatFormatError) as err:
        XtmlFormat().bind(tok)
    assert err.value.message == (
        "the xtml chat format needs <|open|> as one control token, but this vocabulary has it "
        "only as an ordinary token, which caller text can produce: the tokenizer and the chat "
        "format disagree"
    )
    assert err.value.param == "model" and err.value.code == "unsupported_chat_format"


def test_parser_ignores_everything_after_flush() -> None:
    fmt = XtmlFormat().bind(make_hf())
    parser = fmt.new_parser()
    parser.feed(fmt.tokenizer.encode_content("a")[0], "a")
    parser.flush()
    assert parser.feed(fmt.tokenizer.encode_content("b")[0], "b").empty
    assert (
        parser.finish().reasoning == "a" and parser.finish(hit_limit=True).finish_reason == "length"
    )
