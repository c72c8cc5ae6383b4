"""Constrained decoding on a real BPE vocabulary: every sampled reply parses and validates."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_engine import CHATML_TEMPLATE, MARKERS
from json_schemas import SCHEMAS
from support import has_module, requires

from warp_providers import Sampler, SamplingParams, Tokenizer
from warp_providers.chat import ChatFormatError, registry
from warp_providers.constrain import (
    GrammarProcessor,
    TokenBan,
    check_schema,
    processor_for_request,
    tool_call_grammar,
)

XTML = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]


def _bpe(specials: list[str]) -> Tokenizer:
    """A byte-level BPE with real merges, trained here on JSON-ish text (no download)."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(1)
    words = [
        "name",
        "age",
        "city",
        "items",
        "true",
        "false",
        "null",
        "Paris",
        "value",
        "id",
        "tags",
    ]
    corpus = [
        json.dumps({w: [int(x) for x in rng.integers(0, 999, 3)], "k": w * 2}) for w in words * 40
    ]
    corpus += ['{"a": 1, "b": [1.5, -2e3], "c": {"d": "e\\n"}}'] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(corpus, trainer)
    end = hf.token_to_id(specials[1] if specials is MARKERS else "<|end_of_msg|>")
    return Tokenizer.from_tokenizer_json(hf.to_str(), eos_ids=[end], chat_template=CHATML_TEMPLATE)


@pytest.fixture(scope="module")
def chatml():
    requires(has_module("llguidance"), "llguidance (constrained decoding)")
    tok = _bpe(MARKERS)
    fmt = registry.resolve(chat_template=CHATML_TEMPLATE, tokenizer=tok)
    assert fmt.name == "hf_template"
    return fmt


def sample(fmt, processor, *, seed: int, bias=None, max_tokens: int = 3000) -> list[int]:
    """Random logits at temperature 1 through the real `Sampler`, until a stop id."""
    rng = np.random.default_rng(seed)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed), [processor])
    out: list[int] = []
    n = fmt.tokenizer.vocab_size
    for _ in range(max_tokens):
        logits = rng.normal(0.0, 2.0, n).astype(np.float32)
        if bias is not None:
            logits += bias
        tok, _ = sampler.sample(logits, out)
        if tok in fmt.stop_ids:
            return out
        out.append(tok)
    raise AssertionError(f"no stop within {max_tokens} tokens: {fmt.tokenizer.decode(out)[:200]!r}")


def parse(fmt, prompt, ids):
    parser = fmt.new_parser(prompt)
    tok = fmt.tokenizer
    dec = tok.incremental_decoder()
    for t in ids:
        parser.feed(t, tok.id_to_piece(t) if tok.is_control(t) else dec.feed(t))
    assert dec.flush() == ""
    return parser.finish()


def test_at_least_twenty_schemas():
    assert len(SCHEMAS) >= 20


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_random_replies_validate(chatml, index):
    import jsonschema

    schema = SCHEMAS[index]
    request = {
        "messages": [{"role": "user", "content": "go"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema, "strict": True},
        },
    }
    prompt = chatml.render({"messages": request["messages"]})
    for seed in range(6):
        proc = processor_for_request(chatml, prompt, request)
        ids = sample(chatml, proc, seed=seed)
        msg = parse(chatml, prompt, ids)
        value = json.loads(msg.content)
        jsonschema.validate(value, schema)
        assert proc.done


def test_adversarial_logits(chatml):
    """Logits that love blanks, quotes, the stop id and control tokens still give valid JSON."""
    import jsonschema

    tok = chatml.tokenizer
    schema = SCHEMAS[1]
    request = {
        "messages": [{"role": "user", "content": "go"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
    }
    prompt = chatml.render({"messages": request["messages"]})
    for target in [" ", "\n", '"', "}", "{", "\\"]:
        bias = np.zeros(tok.vocab_size, dtype=np.float32)
        bias[tok.encode_content(target)[0]] = 30.0
        bias[list(tok.control_ids)] = 30.0
        ids = sample(chatml, processor_for_request(chatml, prompt, request), seed=7, bias=bias)
        jsonschema.validate(json.loads(parse(chatml, prompt, ids).content), schema)


def test_json_object_and_reasoning(chatml):
    tok = chatml.tokenizer
    request = {
        "messages": [{"role": "user", "content": "go"}],
        "response_format": {"type": "json_object"},
    }
    prompt = chatml.render({"messages": request["messages"]})
    think_bias = np.zeros(tok.vocab_size, dtype=np.float32)
    think_bias[tok.marker_id("<think>")] = 50.0  # the model wants to reason first
    for seed in range(4):
        ids = sample(
            chatml, processor_for_request(chatml, prompt, request), seed=seed, bias=think_bias
        )
        assert ids[0] == tok.marker_id("<think>")
        msg = parse(chatml, prompt, ids)
        assert isinstance(json.loads(msg.content), dict)


def test_forced_tool_calls(chatml):
    import jsonschema

    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS[1]}},
        {"type": "function", "function": {"name": "set_color", "parameters": SCHEMAS[2]}},
    ]
    messages = [{"role": "user", "content": "go"}]
    prompt = chatml.render({"messages": messages, "tools": tools})
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for choice, parallel in [
        ("required", True),
        ("required", False),
        ({"type": "function", "function": {"name": "set_color"}}, True),
    ]:
        request = {
            "messages": messages,
            "tools": tools,
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
        }
        for seed in range(4):
            ids = sample(chatml, processor_for_request(chatml, prompt, request), seed=seed)
            msg = parse(chatml, prompt, ids)
            assert msg.finish_reason == "tool_calls" and msg.tool_calls
            if not parallel:
                assert len(msg.tool_calls) == 1
            for call in msg.tool_calls:
                assert not call.malformed
                if isinstance(choice, dict):
                    assert call.name == "set_color"
                jsonschema.validate(json.loads(call.arguments), params[call.name])


def test_forced_call_arguments_hold_declared_keys_only(chatml):
    """A parameter schema that leaves its objects open (as LangChain and LlamaIndex write
    them) still gets only the declared keys: the grammar closes argument objects."""
    params = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "maxLength": 8},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
    }}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    messages = [{"role": "user", "content": "go"}]
    prompt = chatml.render({"messages": messages, "tools": tools})
    request = {"messages": messages, "tools": tools, "tool_choice": "required"}
    for seed in range(6):
        ids = sample(chatml, processor_for_request(chatml, prompt, request), seed=seed)
        for call in parse(chatml, prompt, ids).tool_calls:
            args = json.loads(call.arguments)
            assert set(args) <= {"city", "where"}, args
            assert set(args.get("where", {})) <= {"lat"}, args


RECURSIVE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("params", [SCHEMAS[13], RECURSIVE], ids=["defs", "recursive"])
def test_tool_parameters_with_refs(chatml, params):
    """`$ref`s of a parameter schema (pydantic's `#/$defs/...`, `#`) point at its own root,
    which sits under `arguments` in the call object: they are rewritten, not broken."""
    import jsonschema

    tools = [{"type": "function", "function": {"name": "t", "parameters": params}}]
    messages = [{"role": "user", "content": "go"}]
    request = {"messages": messages, "tools": tools, "tool_choice": "required"}
    prompt = chatml.render({"messages": messages, "tools": tools})
    for seed in range(3):
        ids = sample(chatml, processor_for_request(chatml, prompt, request), seed=seed)
        msg = parse(chatml, prompt, ids)
        assert msg.tool_calls
        for call in msg.tool_calls:
            jsonschema.validate(json.loads(call.arguments), params)


@pytest.mark.parametrize(
    "schema,feature",
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "object", "propertyNames": {"pattern": "^a"}}, "propertyNames"),
        ({"type": "string", "format": "bogus-format"}, "bogus-format"),
    ],
)
def test_unsupported_features_are_refused_by_name(schema, feature):
    requires(has_module("llguidance"), "llguidance (constrained decoding)")
    with pytest.raises(ChatFormatError) as info:
        check_schema(schema, param="response_format.json_schema.schema")
    assert feature in info.value.message
    assert info.value.param == "response_format.json_schema.schema"


def test_non_object_schema_is_refused():
    with pytest.raises(ChatFormatError):
        check_schema(["not", "a", "schema"], param="p")


def test_unknown_tool_in_named_choice(chatml):
    prompt = chatml.render({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(ChatFormatError) as info:
        tool_call_grammar(
            chatml, prompt, [{"type": "function", "function": {"name": "a"}}], name="b"
        )
    assert info.value.param == "tool_choice"


def test_no_constraint_for_free_requests(chatml):
    prompt = chatml.render({"messages": [{"role": "user", "content": "x"}]})
    tools = [{"function": {"name": "a"}}]
    assert processor_for_request(chatml, prompt, {"messages": [], "tools": tools}) is None
    auto = {"messages": [], "tool_choice": "auto", "tools": tools}
    assert processor_for_request(chatml, prompt, auto) is None


@pytest.mark.parametrize(
    "request_",
    [
        {"messages": [], "response_format": {"type": "text"}},
        {"messages": [], "tools": [{"function": {"name": "a"}}], "tool_choice": "none"},
    ],
    ids=["no-tools", "tool_choice-none"],
)
def test_no_tool_call_when_none_may_be_called(chatml, request_):
    """No grammar, but the Hermes call marker is banned: random logits never open a call."""
    prompt = chatml.render({"messages": [{"role": "user", "content": "x"}]})
    ban = processor_for_request(chatml, prompt, request_)
    assert isinstance(ban, TokenBan)
    opener = chatml.tokenizer.marker_id("<tool_call>")
    assert ban.ids.tolist() == [opener]
    bias = np.zeros(chatml.tokenizer.vocab_size, dtype=np.float32)
    bias[opener] = 40.0  # the model wants to call a tool
    for seed in range(3):
        ids = sample(chatml, ban, seed=seed, bias=bias, max_tokens=20000)
        assert opener not in ids
        assert parse(chatml, prompt, ids).tool_calls == []


def test_processor_resets_for_a_new_reply(chatml):
    tok = chatml.tokenizer
    proc = GrammarProcessor.from_grammar(tok, 'start: "yes" | "no"', chatml.stop_ids)
    ids = sample(chatml, proc, seed=1)
    assert tok.decode(ids) in ("yes", "no")
    again = sample(chatml, proc, seed=2)  # `generated` restarts empty: the matcher resets
    assert tok.decode(again) in ("yes", "no")


@pytest.fixture(scope="module")
def xtml():
    requires(has_module("llguidance"), "llguidance (constrained decoding)")
    tok = _bpe(["<|end_of_msg|>", "<|end_of_msg|>", *XTML[:3]])
    fmt = registry.resolve(name="xtml", tokenizer=tok)
    return fmt


@pytest.mark.parametrize("thinking", [False, True])
def test_xtml_answer_and_tool_call(xtml, thinking):
    import jsonschema

    effort = {} if thinking else {"reasoning_effort": "none"}
    schema = SCHEMAS[4]
    messages = [{"role": "user", "content": "go"}]
    request = {
        "messages": messages,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        **effort,
    }
    prompt = xtml.render(request)
    assert prompt.reasoning_open == thinking
    tok = xtml.tokenizer
    bias = np.zeros(tok.vocab_size, dtype=np.float32)
    if thinking:  # leave the think channel soon
        bias[tok.marker_id("<|close|>")] = 8.0
    for seed in range(3):
        ids = sample(xtml, processor_for_request(xtml, prompt, request), seed=seed, bias=bias)
        jsonschema.validate(json.loads(parse(xtml, prompt, ids).content), schema)
    tools = [{"type": "function", "function": {"name": "move", "parameters": SCHEMAS[4]}}]
    request = {"messages": messages, "tools": tools, "tool_choice": "required", **effort}
    prompt = xtml.render(request)
    for seed in range(3):
        ids = sample(xtml, processor_for_request(xtml, prompt, request), seed=seed, bias=bias)
        msg = parse(xtml, prompt, ids)
        assert msg.tool_calls and all(c.name == "move" for c in msg.tool_calls)
        for c in msg.tool_calls:
            jsonschema.validate(json.loads(c.arguments), SCHEMAS[4])


def test_close_objects_closes_declared_objects_only() -> None:
    from warp_providers.constrain import close_objects

    schema = {
        "type": "object",
        "properties": {
            "point": {"$ref": "#/$defs/P"},
            "tags": {"type": "object"},  # a free-form map
            "extra": {"type": "object", "properties": {}, "additionalProperties": True},
            "properties": {"type": "string"},  # a field named like the keyword
        },
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"}}}},
    }
    out = close_objects(schema)
    assert out["additionalProperties"] is False
    assert out["$defs"]["P"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]["tags"]
    assert out["properties"]["extra"]["additionalProperties"] is True
    assert "additionalProperties" not in out["properties"]  # the table itself is untouched
    assert out["properties"]["properties"] == {"type": "string"}
    strict = close_objects(schema, free_form=False)
    assert strict["properties"]["tags"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is not modified
