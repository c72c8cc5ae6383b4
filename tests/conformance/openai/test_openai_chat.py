"""Blocking chat completions, models, raw completions and SDK helpers over the transport."""

from __future__ import annotations

import json

import openai
import pytest
from fake_engine import ScriptedEngine
from openai_cases import TIME, USER, WEATHER, CountingEngine, tool_call_text
from pydantic import BaseModel

from warp_providers.constrain import TokenBan


def test_plain_create(make_client):
    client = make_client(ScriptedEngine(["Hello there!"]))
    r = client.chat.completions.create(model="anything", messages=USER)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-") and len(r.id) == len("chatcmpl-") + 24
    assert r.model == "scripted"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello there!"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert r.usage.completion_tokens == len("Hello there!") + 1  # the end marker counts
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    warp = r.model_extra["warp"]
    assert set(warp) >= {
        "tokens_generated",
        "experts_hit",
        "experts_missed",
        "expert_hit_rate",
        "bytes_read",
        "direct_io",
        "ms",
        "tok_s",
    }
    assert warp["expert_hit_rate"] == pytest.approx(0.75)


def test_reasoning_content(make_client):
    client = make_client(ScriptedEngine(["<think>Let me see.</think>Four."]))
    r = client.chat.completions.create(model="m", messages=USER)
    msg = r.choices[0].message
    assert msg.content == "Four."
    assert msg.model_extra["reasoning_content"] == "Let me see."


class EffortEngine(ScriptedEngine):
    """A scripted model whose template reads `reasoning_effort` and `enable_thinking`."""

    def chat_metadata(self) -> dict[str, str | None]:
        from fake_engine import CHATML_TEMPLATE

        return {"format": None, "template": CHATML_TEMPLATE.replace(
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if enable_thinking is false %}<think>\n\n</think>\n\n"
            "{%- elif reasoning_effort %}<think>effort {{ reasoning_effort }}\n{%- endif %}"
            "{%- endif %}")}


@pytest.mark.parametrize("fields,rendered", [
    ({"reasoning_effort": "High"}, "<think>effort high\n"),
    ({"reasoning": {"effort": "low"}}, "<think>effort low\n"),
    ({"thinking_effort": "medium", "reasoning_effort": None}, "<think>effort medium\n"),
    ({"reasoning_effort": "none", "thinking": True}, "<think>\n\n</think>\n\n"),
    ({"thinking": False}, "<think>\n\n</think>\n\n"),
])
def test_reasoning_effort_reaches_the_template(make_client, fields, rendered):
    """§7.6 through the API: the first non-null effort spelling, lower-cased; `none` turns
    reasoning off even with thinking true."""
    engine = EffortEngine(["Four."])
    client = make_client(engine)
    client.chat.completions.create(model="m", messages=USER, extra_body=fields)
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    squeeze = "".join  # the template's `{%-` trims whitespace: compare without it
    assert squeeze(prompt.split()).endswith(squeeze(("<|im_start|>assistant" + rendered).split()))


@pytest.mark.parametrize("fields,message", [
    ({"reasoning_effort": "max"}, "reasoning_effort='max' is not supported"),
    ({"reasoning_effort": "high", "thinking": False}, "'thinking' is false but"),
    ({"thinking": "yes", "reasoning_effort": 5}, "'thinking' must be a boolean"),
    ({"reasoning_effort": 5, "tools": {}}, "'reasoning_effort' must be a string"),
])
def test_reasoning_refusals_through_the_sdk(make_client, fields, message):
    """Each refusal is a BadRequestError; reasoning is checked before tools (§7.4)."""
    client = make_client(EffortEngine(["x"]))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=USER, extra_body=fields)
    assert info.value.body["message"].startswith(message)
    assert info.value.body["param"] in ("reasoning_effort", "thinking")


def test_reasoning_in_history_is_accepted(make_client):
    engine = ScriptedEngine(["ok"])
    client = make_client(engine)
    history = [
        *USER,
        {"role": "assistant", "content": "a", "reasoning_content": "because"},
        {"role": "user", "content": "and?"},
    ]
    assert (
        client.chat.completions.create(model="m", messages=history).choices[0].message.content
        == "ok"
    )


def test_tool_call(make_client):
    client = make_client(ScriptedEngine([tool_call_text("get_weather", {"city": "Paris"})]))
    r = client.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id


def test_parallel_tool_calls(make_client):
    reply = (
        tool_call_text("get_weather", {"city": "Paris"})
        + "\n"
        + tool_call_text("get_time", {"tz": "CET"})
    )
    client = make_client(ScriptedEngine([reply]))
    r = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER, TIME], parallel_tool_calls=True
    )
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_choice_is_constrained(make_client, choice):
    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Rome"})])
    client = make_client(engine)
    r = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER, TIME], tool_choice=choice
    )
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    (proc,) = engine.calls[-1]["processors"]
    assert "get_weather" in proc.grammar
    if isinstance(choice, dict):  # a named function: the other tool is not in the grammar
        assert "get_time" not in proc.grammar
    # The format cannot say it in the prompt, so a note asks for the call.
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert "call" in prompt


def test_tool_choice_none_drops_tools(make_client):
    engine = ScriptedEngine(["No tools."])
    client = make_client(engine)
    r = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], tool_choice="none"
    )
    assert r.choices[0].message.content == "No tools."
    assert "get_weather" not in engine.tokenizer.decode(engine.prompts[-1])
    # No grammar; only the call-opening marker is banned, so no call can appear.
    (ban,) = engine.calls[-1]["processors"]
    assert isinstance(ban, TokenBan)
    assert ban.ids.tolist() == [engine.tokenizer.marker_id("<tool_call>")]


def test_tool_choice_none_never_returns_calls(make_client):
    """A model that opens a call anyway cannot: the marker is masked, not parsed away."""
    import numpy as np

    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Paris"})])
    client = make_client(engine)
    client.chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="none")
    (ban,) = engine.calls[-1]["processors"]
    logits = np.zeros(engine.tokenizer.vocab_size, dtype=np.float32)
    ban([], logits)
    assert logits[engine.tokenizer.marker_id("<tool_call>")] == -np.inf
    assert np.isfinite(np.delete(logits, ban.ids)).all()


def test_tool_history_round_trip(make_client):
    engine = ScriptedEngine(["It is sunny."])
    client = make_client(engine)
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert r.choices[0].message.content == "It is sunny."
    assert "sunny" in engine.tokenizer.decode(engine.prompts[-1])


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_response_format(make_client):
    engine = ScriptedEngine(['{"name": "Ada", "age": 36}'])
    client = make_client(engine)
    r = client.chat.completions.create(
        model="m",
        messages=USER,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
    )
    assert json.loads(r.choices[0].message.content) == {"name": "Ada", "age": 36}
    (proc,) = engine.calls[-1]["processors"]
    assert '"age"' in proc.grammar


def test_json_object_response_format(make_client):
    engine = ScriptedEngine(['{"ok": true}'])
    client = make_client(engine)
    r = client.chat.completions.create(
        model="m", messages=USER, response_format={"type": "json_object"}
    )
    assert json.loads(r.choices[0].message.content) == {"ok": True}
    assert engine.calls[-1]["processors"]


class Person(BaseModel):
    name: str
    age: int


def test_parse_pydantic(make_client):
    client = make_client(ScriptedEngine(['{"name": "Ada", "age": 36}']))
    r = client.chat.completions.parse(model="m", messages=USER, response_format=Person)
    assert r.choices[0].message.parsed == Person(name="Ada", age=36)


def test_models(make_client):
    client = make_client(ScriptedEngine())
    models = client.models.list()
    assert [m.id for m in models.data] == ["scripted"]
    assert models.data[0].object == "model" and models.data[0].owned_by == "warp"
    assert client.models.retrieve("scripted").id == "scripted"


def test_with_raw_response(make_client):
    client = make_client(ScriptedEngine(["Hi"]))
    raw = client.chat.completions.with_raw_response.create(model="m", messages=USER)
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert raw.parse().choices[0].message.content == "Hi"


def test_raw_completions(make_client):
    client = make_client(ScriptedEngine(["and so on. STOP here"]))
    r = client.completions.create(model="m", prompt="Once upon a time", stop=["STOP"])
    assert r.object == "text_completion"
    assert r.choices[0].text == "and so on. "
    assert r.choices[0].finish_reason == "stop"


def test_sampling_fields_reach_the_engine(make_client):
    engine = ScriptedEngine(["x"])
    client = make_client(engine)
    client.chat.completions.create(
        model="m",
        messages=USER,
        temperature=0.7,
        top_p=0.9,
        seed=-1,
        max_completion_tokens=5,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        stop=["zz"],
        user="u",
        metadata={"a": "b"},
        logprobs=False,
        extra_body={"top_k": 7, "min_p": 0.05, "unknown_knob": 1},
    )
    kw = engine.calls[-1]
    s = kw["sampling"]
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.7, 0.9, 7, 0.05)
    assert s.seed == 2**64 - 1
    assert (s.presence_penalty, s.frequency_penalty) == (0.5, 0.25)
    assert kw["max_tokens"] == 5


def test_max_tokens_gives_length(make_client):
    client = make_client(ScriptedEngine(["a long reply that gets cut"]))
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=4)
    assert r.choices[0].message.content == "a lo"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4


def test_stop_string(make_client):
    client = make_client(ScriptedEngine(["one, two, three"]))
    r = client.chat.completions.create(model="m", messages=USER, stop=", t")
    assert r.choices[0].message.content == "one"
    assert r.choices[0].finish_reason == "stop"


def test_state_is_per_request(make_client):
    engine = CountingEngine(lambda ids: f"{len(ids)}")
    client = make_client(engine)
    a = client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "other" * 9}])
    b = client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    assert a == b


def test_httpx_client_with_openai(make_client):
    """openai 2.x style (and 3.x given a legacy client): an httpx.Client transport."""
    client = make_client(ScriptedEngine(["via httpx"]), http="httpx")
    import httpx

    assert isinstance(client._client, httpx.Client)
    assert (
        client.chat.completions.create(model="m", messages=USER).choices[0].message.content
        == "via httpx"
    )


def test_plain_httpx_and_httpx2():
    import httpx
    from warp_openai import warp_transport

    for http in ("httpx", "httpx2"):
        with warp_transport(engine=ScriptedEngine(["x"]), http=http) as client:
            r = client.post("/v1/chat/completions", json={"messages": USER})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "x"
            h = client.get("/health").json()
            assert h["status"] == "ok" and h["model"] == "scripted"
    assert httpx  # imported: openai 3.x then also accepts httpx clients


def test_convenience_clients():
    import asyncio

    from warp_openai import warp_async_openai_client, warp_openai_client

    client = warp_openai_client(engine=ScriptedEngine(["sync"]))
    assert (
        client.chat.completions.create(model="m", messages=USER).choices[0].message.content
        == "sync"
    )

    async def go() -> str:
        aclient = warp_async_openai_client(engine=ScriptedEngine(["async"]))
        r = await aclient.chat.completions.create(model="m", messages=USER)
        await aclient.close()
        return r.choices[0].message.content

    assert asyncio.run(go()) == "async"


def test_async_create_and_models(make_async_client):
    import asyncio

    async def go() -> None:
        client = make_async_client(
            ScriptedEngine([tool_call_text("get_weather", {"city": "Oslo"})])
        )
        r = await client.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert [m.id async for m in client.models.list()] == ["scripted"]
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=USER)
        assert raw.status_code == 200
        await client.close()

    asyncio.run(go())


def test_async_parse(make_async_client):
    import asyncio

    async def go() -> Person:
        client = make_async_client(ScriptedEngine(['{"name": "Bo", "age": 3}']))
        r = await client.chat.completions.parse(model="m", messages=USER, response_format=Person)
        await client.close()
        return r.choices[0].message.parsed

    assert asyncio.run(go()) == Person(name="Bo", age=3)
