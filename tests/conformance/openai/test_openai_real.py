"""The OpenAI suite on the real engine: the real `openai` client, tiny real models.

Tests run in-process (`warp_openai_client(path)`, no socket) and over `warp serve`'s HTTP
server on 127.0.0.1 (bearer key, SSE). SmolLM2 is slow on CI's two cores (about 13 tok/s),
so over HTTP it runs the text test only; the tiny MoE runs everything both ways. Models:

* `smol`: SmolLM2-135M-Instruct (trained weights, a real BPE vocabulary): text, streaming,
  usage, response_format, `parse`, `stream`, models, raw responses, async.
* `moe`: a tiny random-weight Qwen3-MoE with Hermes tool markers (openai_cases.py): the
  MoE path (expert stats) and tool calls. A random model cannot decide to call a tool, so
  calls are forced (tool_choice) and made well-formed by constrained decoding; what a
  model decides is tested on the scripted engine.

Replies are greedy, so a request gives the same reply blocking, streamed, sync or async.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import openai
import pytest
from openai_cases import check_invariants
from pydantic import BaseModel

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name a color."}]


class Paint(BaseModel):
    """Closed values and no extra keys keep a forced reply short on any model."""

    color: Literal["red", "green", "blue"]
    glossy: bool


PAINT_SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "glossy": {"type": "boolean"}},
    "required": ["color", "glossy"],
    "additionalProperties": False,
}


def tool(name: str, schema: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


PAINT = tool("paint", PAINT_SCHEMA)
COUNT = tool(
    "count",
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    },
)


def _http(model: str):
    return pytest.param((model, "http"), marks=pytest.mark.enable_socket, id=f"{model}-http")


TARGETS = [
    pytest.param(("smol", "inproc"), id="smol-inproc"),
    pytest.param(("moe", "inproc"), id="moe-inproc"),
    _http("moe"),
]
EVERY_TARGET = [*TARGETS, _http("smol")]


@pytest.fixture(params=TARGETS)
def target(request, connect):
    """A model and the clients pointed at it (see conftest.Target)."""
    model, via = request.param
    return connect(request.getfixturevalue(f"{model}_path"), via)


@pytest.fixture
def moe(connect, moe_path, via):
    return connect(moe_path, via)


def _content(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# --------------------------------------------------------------------------- text
@pytest.mark.parametrize("target", EVERY_TARGET, indirect=True)
def test_create_then_stream_gives_the_same_reply(target):
    client = target.client
    r = client.chat.completions.create(model=target.model_id, messages=ASK, max_tokens=6)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == target.model_id
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.tool_calls is None
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    warp = r.model_extra["warp"]
    assert warp["tokens_generated"] == r.usage.completion_tokens and warp["tok_s"] > 0
    if target.engine.info()["n_experts"]:  # the MoE streams experts: the counters move
        assert warp["experts_hit"] + warp["experts_missed"] > 0

    chunks = list(
        client.chat.completions.create(
            model=target.model_id,
            messages=ASK,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    check_invariants(chunks, usage=True)
    assert _content(chunks) == (choice.message.content or "")
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == choice.finish_reason
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(chunks[-1].usage, k) for k in counts] == [getattr(r.usage, k) for k in counts]
    # the streamed request repeats the prompt: the engine reused all of it but its last token
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def test_logprobs_blocking_and_streamed(connect, smol_path):
    """`logprobs: true` gives the sampled token's log-probability for every content piece,
    the same whether the reply is blocking or streamed; the pieces spell the content."""
    client = connect(smol_path).client
    r = client.chat.completions.create(model="m", messages=ASK, max_tokens=6, logprobs=True)
    entries = r.choices[0].logprobs.content
    assert entries and "".join(e.token for e in entries) == r.choices[0].message.content
    assert all(e.logprob <= 0.0 and e.bytes == list(e.token.encode()) for e in entries)
    assert any(e.logprob < 0.0 for e in entries)  # a real distribution, not a constant
    chunks = list(client.chat.completions.create(model="m", messages=ASK, max_tokens=6,
                                                 logprobs=True, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    # the second request reuses the cached prompt prefix: equal up to float rounding
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries],
                                                          abs=1e-5)
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=6)
    assert plain.choices[0].logprobs is None


def test_response_format_json_schema_and_json_object(moe):
    """On the random MoE at temperature 1 (the greedy trained model may loop in an open
    json_object until max_tokens, which no grammar prevents); many schemas:
    test_openai_real_constrained.py."""
    import jsonschema

    r = moe.client.chat.completions.create(
        model=moe.model_id,
        messages=[{"role": "user", "content": "Paint the wall: which color, glossy or not?"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "paint", "schema": PAINT_SCHEMA, "strict": True},
        },
        temperature=1.0,
        seed=0,
        max_tokens=400,
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PAINT_SCHEMA)
    r = moe.client.chat.completions.create(
        model=moe.model_id,
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=0,
        extra_body={"top_k": 8},  # keeps a random model's open object short
        max_tokens=1500,
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_parse_and_stream_helper(target):
    ask = [{"role": "user", "content": "Paint the wall: which color, glossy or not?"}]
    r = target.client.chat.completions.parse(
        model=target.model_id, messages=ask, response_format=Paint, max_tokens=200
    )
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Paint)
    with target.client.chat.completions.stream(
        model=target.model_id, messages=ask, response_format=Paint, max_tokens=200
    ) as stream:
        kinds = {e.type for e in stream}
        final = stream.get_final_completion()
    assert {"chunk", "content.delta", "content.done"} <= kinds
    assert final.choices[0].message.parsed == parsed  # greedy: the same object


def test_models_and_raw_response(target):
    client = target.client
    assert [m.id for m in client.models.list()] == [target.model_id]
    model = client.models.retrieve(target.model_id)
    assert model.owned_by == "warp" and model.model_extra["warp"]["vocab_size"] > 0
    raw = client.chat.completions.with_raw_response.create(
        model=target.model_id, messages=ASK, max_tokens=2
    )
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"
    assert raw.parse().usage.completion_tokens <= 2
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("not-" + target.model_id)


def test_async_equivalents(target):
    sync = target.client.chat.completions.create(model=target.model_id, messages=ASK, max_tokens=5)
    ask = [{"role": "user", "content": "Paint the wall: which color, glossy or not?"}]

    async def go() -> None:
        client = target.aclient()
        r = await client.chat.completions.create(model=target.model_id, messages=ASK, max_tokens=5)
        assert r.choices[0].message.content == sync.choices[0].message.content
        stream = await client.chat.completions.create(
            model=target.model_id,
            messages=ASK,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        check_invariants(chunks, usage=True)
        assert _content(chunks) == (sync.choices[0].message.content or "")
        parsed = await client.chat.completions.parse(
            model=target.model_id, messages=ask, response_format=Paint, max_tokens=200
        )
        assert isinstance(parsed.choices[0].message.parsed, Paint)
        async with client.chat.completions.stream(
            model=target.model_id, messages=ask, response_format=Paint, max_tokens=200
        ) as s:
            kinds = {e.type async for e in s}
            final = await s.get_final_completion()
        assert "content.delta" in kinds
        assert final.choices[0].message.parsed == parsed.choices[0].message.parsed
        assert [m.id async for m in client.models.list()] == [target.model_id]
        raw = await client.chat.completions.with_raw_response.create(
            model=target.model_id, messages=ASK, max_tokens=1
        )
        assert raw.status_code == 200 and raw.parse().usage.completion_tokens == 1
        await client.close()

    asyncio.run(asyncio.wait_for(go(), 120))


# --------------------------------------------------------------------------- tools
PROMPT = [{"role": "user", "content": "Paint the wall."}]


def _check_call(call, name: str | None = None) -> dict:
    import jsonschema

    assert call.type == "function" and call.id
    schema = {"paint": PAINT_SCHEMA, "count": COUNT["function"]["parameters"]}
    assert call.function.name in schema and (name is None or call.function.name == name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema[call.function.name])
    return args


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_call(moe, choice):
    tool_choice = (
        "required" if choice == "required" else {"type": "function", "function": {"name": "count"}}
    )
    r = moe.client.chat.completions.create(
        model=moe.model_id,
        messages=PROMPT,
        tools=[PAINT, COUNT],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=600,
    )
    choice0 = r.choices[0]
    assert choice0.finish_reason == "tool_calls"
    (call,) = choice0.message.tool_calls
    _check_call(call, None if choice == "required" else "count")


def test_tool_choice_none(moe):
    """Tools offered but not callable: a model that emits call markers at random never
    returns tool_calls (the marker is masked; tested at temperature 1 over seeds)."""
    for seed in range(6):
        r = moe.client.chat.completions.create(
            model=moe.model_id,
            messages=PROMPT,
            tools=[PAINT],
            tool_choice="none",
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason in ("stop", "length")


def test_streamed_parallel_tool_call_deltas(moe):
    calls: dict[int, dict] = {}
    chunks = list(
        moe.client.chat.completions.create(
            model=moe.model_id,
            messages=PROMPT,
            tools=[PAINT, COUNT],
            tool_choice="required",
            temperature=1.0,
            seed=1,  # this seed makes several calls
            max_tokens=1500,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    check_invariants(chunks, usage=True)
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.id is not None:  # the announcement: a new index with id, type and name
                assert d.index == len(calls) and d.type == "function" and d.function.name
                calls[d.index] = {"id": d.id, "name": d.function.name, "args": ""}
                calls[d.index]["args"] += d.function.arguments or ""
            else:
                assert d.index in calls and d.function.name is None
                calls[d.index]["args"] += d.function.arguments
    assert len(calls) >= 2, "seed 1 is expected to make parallel calls"
    assert len({c["id"] for c in calls.values()}) == len(calls)
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "tool_calls"
    # The argument deltas concatenate to what the blocking reply holds.
    blocking = moe.client.chat.completions.create(
        model=moe.model_id,
        messages=PROMPT,
        tools=[PAINT, COUNT],
        tool_choice="required",
        temperature=1.0,
        seed=1,
        max_tokens=1500,
    )
    got = [(c.function.name, c.function.arguments) for c in blocking.choices[0].message.tool_calls]
    assert got == [(c["name"], c["args"]) for c in calls.values()]
    for call in blocking.choices[0].message.tool_calls:
        _check_call(call)


def test_tools_on_a_model_without_tool_markers(connect, smol_path, via):
    """SmolLM2's template cannot carry tools: refused before the engine runs (400)."""
    target = connect(smol_path, via)
    before = target.engine.stats()["tokens"]
    with pytest.raises(openai.BadRequestError) as info:
        target.client.chat.completions.create(model=target.model_id, messages=ASK, tools=[PAINT])
    assert info.value.body["param"] == "tools"
    assert target.engine.stats()["tokens"] == before


def test_context_overflow(moe):
    with pytest.raises(openai.BadRequestError) as info:
        moe.client.chat.completions.create(
            model=moe.model_id, messages=[{"role": "user", "content": "x" * 5000}]
        )
    assert info.value.code == "context_length_exceeded"


# ------------------------------------------------------------------ the shared registry
def test_clients_share_one_engine_and_the_last_close_frees_it(moe_path) -> None:
    """Each client holds one reference to the shared engine; closing gives it back."""
    from warp_openai import warp_async_openai_client, warp_openai_client

    from warp_providers.models import references, release, shared_engine

    opts = {"ctx": 192}  # options of this test alone: no other test holds this engine
    first, second = warp_openai_client(moe_path, **opts), warp_openai_client(moe_path, **opts)
    engine = shared_engine(moe_path, **opts)
    assert references(engine) == 3
    assert release(engine) is False

    first.close()
    assert references(engine) == 1 and not engine.closed
    reply = second.chat.completions.create(model="m", messages=ASK, max_tokens=3)
    assert reply.usage.completion_tokens >= 1  # the survivor still answers

    async def async_client() -> None:
        client = warp_async_openai_client(moe_path, **opts)
        assert references(engine) == 2
        await client.chat.completions.create(model="m", messages=ASK, max_tokens=3)
        await client.close()

    asyncio.run(async_client())
    assert references(engine) == 1 and not engine.closed

    second.close()
    assert engine.closed and references(engine) == 0
    with pytest.raises(ValueError, match="does not hold"):
        release(engine)

    third = warp_openai_client(moe_path, **opts)  # opens the model afresh
    fresh = shared_engine(moe_path, **opts)
    release(fresh)
    try:
        assert fresh is not engine and not fresh.closed
        reply = third.chat.completions.create(model="m", messages=ASK, max_tokens=3)
        assert reply.usage.completion_tokens >= 1
    finally:
        third.close()
    assert fresh.closed
