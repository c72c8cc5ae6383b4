"""ChatWarp against the scripted engine: every feature of the adapter, and an agent.

The scripted engine streams one character per token with chat markers as control ids,
so these tests see what a real reply stream looks like without weights.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from fake_engine import ScriptedEngine, make_tokenizer, tool_call_text
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_warp import ChatWarp
from langchain_warp.chat_models import _tool_choice
from pydantic import BaseModel, Field, ValidationError
from typing_extensions import TypedDict

from warp_providers import ContextOverflowError
from warp_providers.session import ChatSession

THINK = "<think>\nLet me think.\n</think>\n\n"
MARKERS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>")
_TOK = make_tokenizer()


def prompt_text(engine: ScriptedEngine, turn: int = -1) -> str:
    return _TOK.decode(engine.prompts[turn])


def llm_for(*replies: str, **kwargs: Any) -> tuple[ChatWarp, ScriptedEngine]:
    engine = ScriptedEngine(list(replies))
    return ChatWarp(engine=engine, **kwargs), engine


def fold(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return full


def no_markers(*texts: str) -> None:
    for text in texts:
        for m in MARKERS:
            assert m not in text, f"raw marker {m} leaked into {text!r}"


class Weather(BaseModel):
    """Get the weather in a city."""

    city: str = Field(description="The city")


class Clock(BaseModel):
    """Get the local time in a city."""

    city: str


class Joke(BaseModel):
    """A joke."""

    setup: str
    punchline: str


class JokeDict(TypedDict):
    """A joke."""

    setup: str
    punchline: str


JOKE = {"setup": "Why did the cat sit on the computer?", "punchline": "To watch the mouse."}


# --------------------------------------------------------------------------- invoke
def test_invoke_content_reasoning_usage_and_metadata() -> None:
    llm, engine = llm_for(THINK + "Bonjour !")
    msg = llm.invoke([SystemMessage("Answer in French."), HumanMessage("Hello")])
    assert msg.content == "Bonjour !"
    assert msg.additional_kwargs["reasoning_content"] == "Let me think."
    no_markers(msg.content)
    usage = msg.usage_metadata
    assert usage is not None and usage["input_tokens"] == len(engine.prompts[0])
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    meta = msg.response_metadata
    assert meta["finish_reason"] == "stop"
    assert meta["model_name"] == "scripted"
    assert meta["warp_stats"]["expert_hits"] == 3
    assert "Answer in French." in prompt_text(engine)


def test_model_name_field_and_per_call_override() -> None:
    llm, _ = llm_for("Hi", model="my-moe")
    assert llm.invoke("x").response_metadata["model_name"] == "my-moe"
    assert llm.invoke("x", model="other").response_metadata["model_name"] == "other"
    assert llm._get_ls_params()["ls_model_name"] == "my-moe"
    assert llm._get_ls_params(model="other")["ls_model_name"] == "other"
    assert llm._get_ls_params()["ls_provider"] == "warp"


def test_ls_params_name_from_path_without_loading() -> None:
    llm = ChatWarp(model_path="/models/qwen3-30b.warp", max_tokens=7, stop=["x"], temperature=0.5)
    params = llm._get_ls_params(stop=["y"])
    assert params["ls_model_name"] == "qwen3-30b"
    assert params["ls_max_tokens"] == 7 and params["ls_temperature"] == 0.5
    assert params["ls_stop"] == ["x", "y"]


def test_reasoning_blocks_under_output_version_v1() -> None:
    llm, _ = llm_for(THINK + "Answer.", output_version="v1")
    msg = llm.invoke("q")
    kinds = [b["type"] for b in msg.content]  # type: ignore[index]
    assert kinds == ["reasoning", "text"]
    assert msg.text == "Answer."
    chunks = list(llm.stream("q"))
    full = fold(chunks)
    assert full.text == "Answer."
    assert [b["type"] for b in full.content_blocks] == ["reasoning", "text"]


# --------------------------------------------------------------------------- stream
def test_stream_matches_invoke_usage_only_on_last_chunk() -> None:
    llm, _ = llm_for(THINK + "Hello there, friend.")
    chunks = list(llm.stream("hi"))
    assert len(chunks) > 5  # token by token
    assert all(c.usage_metadata is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.usage_metadata is not None and last.usage_metadata["output_tokens"] > 0
    full = fold(chunks)
    assert full.content == "Hello there, friend."
    assert full.additional_kwargs["reasoning_content"] == "Let me think."
    assert full.response_metadata["finish_reason"] == "stop"
    assert full.response_metadata["model_name"] == "scripted"
    assert llm.invoke("hi").content == full.content


def test_streaming_flag_makes_invoke_stream_tokens() -> None:
    tokens: list[str] = []
    from langchain_core.callbacks import BaseCallbackHandler

    class Collect(BaseCallbackHandler):
        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            tokens.append(token)

    llm, _ = llm_for("abc", streaming=True)
    assert llm.invoke("x", config={"callbacks": [Collect()]}).content == "abc"
    assert "".join(tokens) == "abc" and len(tokens) >= 3


def test_stop_sequences_from_field_and_call() -> None:
    llm, _ = llm_for("Hello you there. Bye.", stop=["Bye"])
    assert llm.invoke("x").content == "Hello you there. "
    assert llm.invoke("x", stop=["you"]).content == "Hello "
    chunks = list(llm.stream("x", stop=["there"]))
    assert fold(chunks).content == "Hello you "


def test_max_tokens_ends_with_length() -> None:
    llm, engine = llm_for("A long answer that goes on and on.", max_tokens=5)
    msg = llm.invoke("x")
    assert msg.content == "A lon"
    assert msg.response_metadata["finish_reason"] == "length"
    assert engine.calls[-1]["max_tokens"] == 5


def test_sampling_options_reach_the_engine() -> None:
    llm, engine = llm_for("ok", temperature=0.7, top_p=0.9, top_k=40, seed=3)
    llm.invoke("x")
    s = engine.calls[-1]["sampling"]
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.7, 0.9, 40, 3)
    llm.invoke("x", temperature=0.0, seed=5)
    s = engine.calls[-1]["sampling"]
    assert (s.temperature, s.seed) == (0.0, 5)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.0, 0.0, 1.0)


def test_penalties_reach_the_engine_and_are_validated() -> None:
    llm, engine = llm_for("ok", "ok", frequency_penalty=0.5, presence_penalty=0.25,
                          repetition_penalty=1.1)
    llm.invoke("x")
    s = engine.calls[-1]["sampling"]
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.25, 0.5, 1.1)
    llm.invoke("x", frequency_penalty=0.0)
    assert engine.calls[-1]["sampling"].frequency_penalty == 0.0
    with pytest.raises(ValidationError):
        ChatWarp(engine=engine, frequency_penalty=3.0)
    with pytest.raises(ValidationError):
        ChatWarp(engine=engine, repetition_penalty=0.0)


# --------------------------------------------------------------------------- async
@pytest.mark.asyncio
async def test_ainvoke_and_astream() -> None:
    llm, _ = llm_for(THINK + "Async hello.")
    msg = await llm.ainvoke("hi")
    assert (
        msg.content == "Async hello."
        and msg.additional_kwargs["reasoning_content"] == "Let me think."
    )
    chunks = [c async for c in llm.astream("hi")]
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata is not None
    assert all(c.usage_metadata is None for c in chunks[:-1])
    assert fold(chunks).content == "Async hello."


class SlowEngine(ScriptedEngine):
    """Sleeps per token, like a real engine reading experts from disk."""

    delay = 0.01

    def stream(self, prompt: Any, **kw: Any) -> Any:
        for ev in super().stream(prompt, **kw):
            time.sleep(self.delay)
            yield ev


@pytest.mark.asyncio
async def test_async_never_blocks_the_event_loop() -> None:
    llm = ChatWarp(engine=SlowEngine(["x" * 30]))
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    msg = await llm.ainvoke("go")
    done.set()
    await task
    assert msg.content == "x" * 30
    assert ticks >= 10  # the loop kept running during ~0.3 s of generation


def test_timeout_raises() -> None:
    engine = SlowEngine(["y" * 200])
    llm = ChatWarp(engine=engine, timeout=0.05)
    with pytest.raises(TimeoutError, match="timeout"):
        llm.invoke("x")
    assert engine.last_result is not None and engine.last_result.finish_reason == "cancelled"


@pytest.mark.asyncio
async def test_timeout_raises_async() -> None:
    llm = ChatWarp(engine=SlowEngine(["y" * 200]), timeout=0.05)
    with pytest.raises(TimeoutError):
        await llm.ainvoke("x")


def test_closing_a_stream_stops_generation() -> None:
    engine = SlowEngine(["z" * 200])
    llm = ChatWarp(engine=engine)
    stream = llm.stream("x")
    for _ in range(3):
        next(stream)
    stream.close()
    assert engine.last_result is None or len(engine.last_result.token_ids) < 200


# --------------------------------------------------------------------------- tools
def test_parallel_tool_calls_invoke() -> None:
    reply = (
        THINK
        + tool_call_text("Weather", {"city": "Paris"})
        + tool_call_text("Clock", {"city": "Rome"})
    )
    llm, engine = llm_for(reply)
    msg = llm.bind_tools([Weather, Clock]).invoke("Weather in Paris and time in Rome?")
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [
        ("Weather", {"city": "Paris"}),
        ("Clock", {"city": "Rome"}),
    ]
    assert len({c["id"] for c in msg.tool_calls}) == 2
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    assert msg.content == "" and msg.invalid_tool_calls == []
    no_markers(msg.content, *(json.dumps(c["args"]) for c in msg.tool_calls))
    assert '"name": "Weather"' in prompt_text(engine)


@pytest.mark.parametrize("output_version", [None, "v1"])
def test_parallel_tool_call_chunks_have_distinct_indexes(output_version: str | None) -> None:
    reply = (
        "Checking. "
        + tool_call_text("Weather", {"city": "Paris"})
        + tool_call_text("Clock", {"city": "Rome"})
    )
    llm, _ = llm_for(reply, output_version=output_version)
    chunks = list(llm.bind_tools([Weather, Clock]).stream("q"))
    seen: dict[int, str] = {}
    for c in chunks:
        for tc in c.tool_call_chunks:
            assert tc["index"] is not None
            if tc["name"]:
                seen[tc["index"]] = tc["name"]
    assert sorted(seen.items()) == [(0, "Weather"), (1, "Clock")]
    full = fold(chunks)
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [
        ("Weather", {"city": "Paris"}),
        ("Clock", {"city": "Rome"}),
    ]
    assert full.text == "Checking. "
    assert [b["type"] for b in full.content_blocks] == ["text", "tool_call", "tool_call"]


def test_malformed_tool_arguments_become_invalid_tool_calls() -> None:
    llm, _ = llm_for('<tool_call>\n{"name": "Weather", "arguments": {"city": "Par\n</tool_call>')
    msg = llm.bind_tools([Weather]).invoke("q")
    assert msg.tool_calls == []
    assert len(msg.invalid_tool_calls) == 1
    bad = msg.invalid_tool_calls[0]
    assert bad["name"] == "Weather"  # written before the break, so the caller sees which call
    assert "not complete JSON" in bad["error"]
    no_markers(str(bad["args"]))


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        (False, None),
        ("auto", "auto"),
        ("none", "none"),
        ("any", "required"),
        ("required", "required"),
        (True, "required"),
        ("Weather", {"type": "function", "function": {"name": "Weather"}}),
        (
            {"type": "function", "function": {"name": "Clock"}},
            {"type": "function", "function": {"name": "Clock"}},
        ),
        ({"name": "Clock"}, {"type": "function", "function": {"name": "Clock"}}),
    ],
)
def test_tool_choice_spellings(choice: Any, expected: Any) -> None:
    assert _tool_choice(choice, ["Weather", "Clock"]) == expected


def test_tool_choice_unknown_tool_is_refused() -> None:
    llm, _ = llm_for("x")
    with pytest.raises(ValueError, match="not among the bound tools"):
        llm.bind_tools([Weather], tool_choice="Clock")
    with pytest.raises(ValueError, match="names no function"):
        llm.bind_tools([Weather], tool_choice={"type": "function"})


def test_forced_tool_choice_reaches_the_core() -> None:
    llm, engine = llm_for(tool_call_text("Clock", {"city": "Oslo"}))
    msg = llm.bind_tools([Weather, Clock], tool_choice="Clock").invoke("Hello!")
    assert msg.tool_calls[0]["name"] == "Clock"
    assert "You must call the tool `Clock`" in prompt_text(engine)
    assert engine.calls[-1]["processors"], "a forced call is enforced with a grammar"
    llm.bind_tools([Weather, Clock], tool_choice="any").invoke("Hello!")
    assert "You must call a tool" in prompt_text(engine)
    assert engine.calls[-1]["processors"]


def test_tool_choice_none_hides_the_tools() -> None:
    llm, engine = llm_for("Just text.")
    msg = llm.bind_tools([Weather], tool_choice="none").invoke("q")
    assert msg.content == "Just text." and "<tools>" not in prompt_text(engine)


def test_tool_formats_accepted_by_bind_tools() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    anthropic = {
        "name": "color",
        "description": "Pick a color.",
        "input_schema": {"type": "object", "properties": {"c": {"type": "string"}}},
    }
    openai = {
        "type": "function",
        "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}},
    }
    llm, engine = llm_for(tool_call_text("multiply", {"a": 2, "b": 3}))
    msg = llm.bind_tools([add, multiply, anthropic, openai, Weather]).invoke("2*3?")
    assert msg.tool_calls[0]["args"] == {"a": 2, "b": 3}
    prompt = prompt_text(engine)
    for name in ("add", "multiply", "color", "noop", "Weather"):
        assert f'"name": "{name}"' in prompt


def test_history_with_tool_calls_results_and_reasoning() -> None:
    llm, engine = llm_for("It is sunny in Paris.")
    history = [
        SystemMessage("Be brief."),
        HumanMessage("Weather in Paris?"),
        AIMessage(
            "",
            additional_kwargs={"reasoning_content": "Use the tool."},
            tool_calls=[
                {"name": "Weather", "args": {"city": "Paris"}, "id": "c1", "type": "tool_call"}
            ],
        ),
        ToolMessage("sunny", tool_call_id="c1", name="Weather"),
    ]
    assert llm.bind_tools([Weather]).invoke(history).content == "It is sunny in Paris."
    prompt = prompt_text(engine)
    assert '{"name": "Weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "Use the tool." in prompt


def test_unsupported_content_is_refused_by_name() -> None:
    llm, _ = llm_for("x")
    with pytest.raises(ValueError, match="'file' content block"):
        llm.invoke(
            [HumanMessage([{"type": "file", "base64": "AAAA", "mime_type": "application/pdf"}])]
        )


# --------------------------------------------------------------------------- structured output
@pytest.mark.parametrize("schema", [Joke, JokeDict, Joke.model_json_schema()])
def test_structured_output_json_schema_default(schema: Any) -> None:
    llm, engine = llm_for(THINK + json.dumps(JOKE))
    result = llm.with_structured_output(schema).invoke("Tell me a joke about cats.")
    if schema is Joke:
        assert result == Joke(**JOKE)
    else:
        assert result == JOKE
    assert "The JSON must match this schema" in prompt_text(engine)
    assert engine.calls[-1]["processors"], "the schema is enforced by constrained decoding"
    streamed = list(llm.with_structured_output(schema).stream("Tell me a joke about cats."))
    assert streamed and (streamed[-1] == Joke(**JOKE) if schema is Joke else streamed[-1] == JOKE)


def test_structured_output_function_calling() -> None:
    llm, engine = llm_for(tool_call_text("Joke", JOKE))
    result = llm.with_structured_output(Joke, method="function_calling").invoke("joke")
    assert result == Joke(**JOKE)
    assert "You must call the tool `Joke`" in prompt_text(engine)
    llm2, _ = llm_for(tool_call_text("Joke", JOKE))
    assert (
        llm2.with_structured_output(Joke.model_json_schema(), method="function_calling").invoke(
            "joke"
        )
        == JOKE
    )


def test_structured_output_json_mode() -> None:
    llm, engine = llm_for(json.dumps(JOKE))
    assert llm.with_structured_output(Joke, method="json_mode").invoke("joke as JSON") == Joke(
        **JOKE
    )
    assert "Answer with raw JSON only" in prompt_text(engine)
    assert llm.with_structured_output(None, method="json_mode").invoke("joke as JSON") == JOKE


def test_structured_output_schemas_are_closed_to_undeclared_keys() -> None:
    """json_schema (and json_mode given a schema) constrain to the declared keys only."""
    llm, _ = llm_for()
    for method in ("json_schema", "json_mode"):
        bound = llm.with_structured_output(Joke, method=method).first  # type: ignore[attr-defined]
        spec = bound.kwargs["response_format"]["json_schema"]
        assert spec["schema"]["additionalProperties"] is False
        assert set(spec["schema"]["properties"]) == {"setup", "punchline"}
    bare = llm.with_structured_output(None, method="json_mode").first  # type: ignore[attr-defined]
    assert bare.kwargs["response_format"] == {"type": "json_object"}


def test_structured_output_include_raw() -> None:
    llm, _ = llm_for(json.dumps(JOKE), "not json at all")
    out = llm.with_structured_output(Joke, include_raw=True).invoke("joke")
    assert (
        isinstance(out["raw"], AIMessage)
        and out["parsed"] == Joke(**JOKE)
        and out["parsing_error"] is None
    )
    bad = llm.with_structured_output(Joke, include_raw=True).invoke("joke")
    assert bad["parsed"] is None and isinstance(bad["parsing_error"], OutputParserException)
    assert bad["raw"].content == "not json at all"


def test_unusable_output_raises_output_parser_exception() -> None:
    llm, _ = llm_for('<tool_call>\n{"name": "Joke", "arguments": {"setup": \n</tool_call>')
    with pytest.raises(OutputParserException, match="unusable arguments"):
        llm.with_structured_output(Joke, method="function_calling").invoke("joke")
    llm, _ = llm_for(tool_call_text("Joke", {"setup": "only a setup"}))
    with pytest.raises(OutputParserException, match="do not fit its schema"):
        llm.with_structured_output(Joke, method="function_calling").invoke("joke")
    llm, _ = llm_for('{"setup": 1')
    with pytest.raises(OutputParserException):
        llm.with_structured_output(Joke).invoke("joke")


def test_with_structured_output_arguments_are_checked() -> None:
    llm, _ = llm_for("x")
    with pytest.raises(ValueError, match="method must be"):
        llm.with_structured_output(Joke, method="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a schema"):
        llm.with_structured_output(None)
    with pytest.raises(TypeError):
        llm.with_structured_output(Joke, bogus=1)


# --------------------------------------------------------------------------- errors and loading
def test_context_overflow_is_a_typed_error() -> None:
    llm = ChatWarp(engine=ScriptedEngine(["x"], ctx_tokens=64))
    long = "word " * 100
    with pytest.raises(ContextOverflowError, match="context"):
        llm.invoke(long)
    with pytest.raises(ContextOverflowError):
        list(llm.stream(long))


@pytest.mark.asyncio
async def test_context_overflow_async() -> None:
    llm = ChatWarp(engine=ScriptedEngine(["x"], ctx_tokens=64))
    with pytest.raises(ContextOverflowError):
        await llm.ainvoke("word " * 100)


def test_unknown_arguments_are_refused() -> None:
    with pytest.raises(ValidationError):
        ChatWarp(model_path="/m.warp", api_key="nope")
    llm, _ = llm_for("x")
    with pytest.raises(TypeError, match="unexpected call arguments"):
        llm.invoke("x", logit_bias={1: 5.0})
    with pytest.raises(ValidationError):
        ChatWarp(model_path="/m.warp", temperature=-1)


def test_weights_load_lazily_once_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[str, dict[str, Any]]] = []
    engine = ScriptedEngine(["Loaded."])

    def shared_session(path: str, **options: Any) -> ChatSession:
        opened.append((path, options))
        return ChatSession(engine)

    # ChatWarp takes the registry from warp_providers' public names (bound at import).
    import langchain_warp.chat_models

    monkeypatch.setattr(langchain_warp.chat_models, "shared_session", shared_session)
    llm = ChatWarp(
        model_path="/models/m.warp",
        budget="6G",
        threads=4,
        ctx=2048,
        engine_options={"cache_policy": "lru"},
    )
    assert opened == []
    assert llm.invoke("x").content == "Loaded."
    llm.invoke("y")
    assert opened == [
        ("/models/m.warp", {"cache_policy": "lru", "budget": "6G", "threads": 4, "ctx": 2048})
    ]


def test_env_model_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARP_MODEL_PATH", "/models/from-env.warp")
    assert ChatWarp().model_path == "/models/from-env.warp"


def test_no_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARP_MODEL_PATH", raising=False)
    with pytest.raises(ValueError, match="needs model_path"):
        ChatWarp().invoke("x")


def test_concurrent_first_use_builds_one_session() -> None:
    llm = ChatWarp(engine=ScriptedEngine(["ok"]))
    sessions: list[Any] = []
    threads = [
        threading.Thread(target=lambda: sessions.append(llm._get_session())) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(s) for s in sessions}) == 1


# --------------------------------------------------------------------------- agent
def _agent_script(prompt_ids: list[int]) -> str:
    prompt = _TOK.decode(prompt_ids)
    results = prompt.count("<tool_response>")
    if results == 0:
        return THINK + tool_call_text("get_weather", {"city": "Paris"})
    if results == 1:
        return THINK + tool_call_text("get_time", {"city": "Paris"})
    return THINK + "In Paris it is sunny, 21 C, and the time is 14:05."


def test_agent_completes_a_two_tool_task() -> None:
    from langchain.agents import create_agent

    calls: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(f"weather:{city}")
        return "sunny, 21 C"

    @tool
    def get_time(city: str) -> str:
        """Local time in a city."""
        calls.append(f"time:{city}")
        return "14:05"

    engine = ScriptedEngine(_agent_script)
    agent = create_agent(ChatWarp(engine=engine), tools=[get_weather, get_time])
    state = agent.invoke({"messages": [HumanMessage("What's the weather and the time in Paris?")]})
    assert calls == ["weather:Paris", "time:Paris"]
    final = state["messages"][-1]
    assert isinstance(final, AIMessage)
    assert final.content == "In Paris it is sunny, 21 C, and the time is 14:05."
    assert final.additional_kwargs["reasoning_content"] == "Let me think."
    for m in state["messages"]:
        if isinstance(m, AIMessage):
            no_markers(str(m.content), *(json.dumps(c["args"]) for c in m.tool_calls))
    # The second turn saw the first tool's result.
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt_text(engine, 1)


def test_parallel_tool_calls_flag_reaches_the_request() -> None:
    llm, _ = llm_for("x")
    bound = llm.bind_tools([Weather], tool_choice="Weather", parallel_tool_calls=False)
    assert bound.kwargs["parallel_tool_calls"] is False  # type: ignore[attr-defined]
    call = llm._prepare(llm._get_session(), [HumanMessage("x")], None, dict(bound.kwargs))  # type: ignore[attr-defined]
    assert call.request["parallel_tool_calls"] is False
    assert call.request["tool_choice"] == {"type": "function", "function": {"name": "Weather"}}
    structured = llm.with_structured_output(Joke, method="function_calling")
    assert structured.first.kwargs["parallel_tool_calls"] is False  # type: ignore[attr-defined]


# ----------------------------------------------------------------- token counting, profile
def test_token_ids_come_from_the_models_own_tokenizer() -> None:
    llm, _ = llm_for("x")
    text = "héllo <|im_end|> wörld"
    # The scripted vocabulary is byte-level, one id per byte; a marker spelled in text
    # stays text, so it is counted byte by byte too.
    assert llm.get_num_tokens(text) == len(text.encode())
    assert llm.get_token_ids(text) == _TOK.encode_content(text)


def test_message_counts_are_the_rendered_prompt() -> None:
    llm, _ = llm_for("x")
    # ChatML as the scripted template renders it (its `{%-` eats the newline after each
    # turn): two control tokens, every other byte one token.
    rendered = "<|im_start|>user\nabc<|im_end|>"
    expected = 2 + len(rendered.encode()) - len("<|im_start|>") - len("<|im_end|>")
    assert llm.get_num_tokens_from_messages([HumanMessage("abc")]) == expected

    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    with_tools = llm.get_num_tokens_from_messages([HumanMessage("abc")], tools=[lookup])
    assert with_tools > expected + len("lookup")


def test_trim_messages_counts_with_the_model() -> None:
    from langchain_core.messages import trim_messages

    llm, _ = llm_for("x")
    # 16 letters: one id per byte here, so the turn takes 2 markers + 21 bytes = 23 tokens,
    # over the limit alone; GPT-2's tokenizer (LangChain's fallback) makes it a handful, and
    # offline that fallback counts 0, so either would keep it.
    dense = HumanMessage("a" * 16)
    assert llm.get_num_tokens_from_messages([dense]) == 23
    kept = trim_messages([dense, HumanMessage("hi")], max_tokens=20, token_counter=llm,
                         strategy="last")
    assert [m.content for m in kept] == ["hi"]


def test_profile_of_an_injected_engine() -> None:
    llm, engine = llm_for("x")
    assert llm.profile is not None
    assert llm.profile["max_input_tokens"] == engine.info()["ctx_tokens"]
    # The scripted template carries Hermes tool markers and <think>.
    assert llm.profile["tool_calling"] is True and llm.profile["reasoning_output"] is True


def test_profile_follows_the_chat_format() -> None:
    class NoToolsEngine(ScriptedEngine):
        def chat_metadata(self) -> dict[str, str | None]:
            return {"format": None, "template": PLAIN_CHATML}

    llm = ChatWarp(engine=NoToolsEngine(["x"], ctx_tokens=1234))
    assert llm.profile is not None and llm.profile["max_input_tokens"] == 1234
    assert llm.profile["tool_calling"] is False and llm.profile["reasoning_output"] is False


def test_profile_of_a_path_is_read_without_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import langchain_warp.chat_models

    seen: list[tuple[str, Any, Any]] = []

    def capabilities(path: str, *, ctx: Any = None, chat_format: Any = None) -> dict[str, Any]:
        seen.append((path, ctx, chat_format))
        return {"ctx_tokens": 777, "tools": False, "reasoning": True, "format": "hf_template"}

    def no_load(*a: Any, **k: Any) -> Any:
        raise AssertionError("the profile must not load the model")

    monkeypatch.setattr(langchain_warp.chat_models, "model_capabilities", capabilities)
    monkeypatch.setattr(langchain_warp.chat_models, "shared_session", no_load)
    monkeypatch.setattr(langchain_warp.chat_models, "shared_engine", no_load)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "manifest.json").write_text("{}")
        llm = ChatWarp(model_path=d, ctx=777)
    assert seen == [(d, 777, None)]
    assert llm.profile is not None and llm.profile["max_input_tokens"] == 777
    assert llm.profile["tool_calling"] is False and llm.profile["reasoning_output"] is True
    assert ChatWarp(model_path="/no/such/container.warp").profile is None


PLAIN_CHATML = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- endif %}"
)


# ----------------------------------------------------------------- usage details
def test_usage_details_cached_prompt_and_reasoning_tokens() -> None:
    llm, engine = llm_for(THINK + "Hello!")
    first = llm.invoke([HumanMessage("Say hello.")])
    usage = first.usage_metadata
    assert usage is not None
    assert usage["input_token_details"]["cache_read"] == 0  # nothing held yet
    # Reasoning: the think block before the answer, each marker one token, each byte one.
    think_tokens = 2 + len(THINK.encode()) - len("<think>") - len("</think>")
    assert usage["output_token_details"]["reasoning"] == think_tokens
    second = llm.invoke([HumanMessage("Say hello."), first, HumanMessage("Again.")])
    cached = second.usage_metadata["input_token_details"]["cache_read"]
    assert cached == engine.last_result.cached_tokens
    # The second prompt starts with the first one, so at least that much is reused.
    assert len(engine.prompts[0]) - 1 <= cached < len(engine.prompts[1])


def test_streamed_usage_carries_the_details() -> None:
    llm, _ = llm_for(THINK + "Hi")
    chunks = list(llm.stream("x"))
    usage = chunks[-1].usage_metadata
    assert usage is not None and usage["output_token_details"]["reasoning"] > 0
    assert "cache_read" in usage["input_token_details"]
