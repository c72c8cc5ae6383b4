"""`llama_index.llms.warp.Warp` against the scripted engine: every method, one path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fake_engine import ScriptedEngine, tool_call_text
from llama_index.core.base.llms.types import (
    AudioBlock,
    ChatMessage,
    ChatResponse,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.warp import Warp
from pydantic import BaseModel

REASONED = "<think>Two words.</think>Hello there"
STATS_KEYS = {"expert_hits", "expert_misses", "expert_lookups", "bytes_read", "hit_rate"}


def user(text: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=text)]


def make(replies: Any = (REASONED,), **fields: Any) -> tuple[Warp, ScriptedEngine]:
    engine = ScriptedEngine(replies)
    return Warp(engine=engine, **fields), engine


def spy_requests(llm: Warp) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Records every (request, options) the adapter hands to the core."""
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    session = llm.session
    real = session.stream

    def stream(request: Any, **options: Any) -> Any:
        seen.append((request, options))
        return real(request, **options)

    session.stream = stream  # type: ignore[method-assign]
    return seen


def prompt_text(engine: ScriptedEngine, turn: int = -1) -> str:
    return engine.tokenizer.decode(engine.prompts[turn])


def collect(agen: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [r async for r in await agen]

    return asyncio.run(run())


# ---------------------------------------------------------------- construction and metadata
def test_is_a_function_calling_llm_with_class_name() -> None:
    llm, _ = make()
    assert isinstance(llm, FunctionCallingLLM)
    assert Warp.class_name() == "Warp"


def test_metadata_from_the_engine() -> None:
    llm, _ = make(max_tokens=77)
    meta = llm.metadata
    assert meta.context_window == 8192
    assert meta.num_output == 77
    assert meta.is_chat_model and meta.is_function_calling_model
    assert meta.model_name == "scripted"


def test_metadata_overrides() -> None:
    llm, _ = make(context_window=1024, model_name="tiny")
    assert llm.metadata.context_window == 1024
    assert llm.metadata.model_name == "tiny"


def test_needs_exactly_one_of_engine_and_model_path() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Warp()
    with pytest.raises(ValueError, match="exactly one"):
        Warp(engine=ScriptedEngine(), model_path="x.warp")


def test_model_path_is_opened_lazily_through_the_registry(tmp_path: Any) -> None:
    from warp_providers import ModelNotFoundError

    missing = tmp_path / "absent.warp"
    llm = Warp(model_path=str(missing), context_window=4096, is_function_calling_model=True)
    assert llm.metadata.context_window == 4096  # no open needed
    assert llm.metadata.model_name == "absent"
    with pytest.raises(ModelNotFoundError):
        llm.chat(user("hi"))
    with pytest.raises(ModelNotFoundError):  # deriving a capability reads the container
        Warp(model_path=str(missing), context_window=4096).metadata


def test_field_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Warp(engine=ScriptedEngine(), max_tokens=0)
    with pytest.raises(ValueError):
        Warp(engine=ScriptedEngine(), temperature=-1.0)


# ---------------------------------------------------------------- chat and complete
def test_chat_gives_thinking_and_text_blocks_and_raw() -> None:
    llm, engine = make()
    r = llm.chat(user("Say hello"))
    assert r.message.role == MessageRole.ASSISTANT
    assert r.message.content == "Hello there"
    thinking = [b for b in r.message.blocks if isinstance(b, ThinkingBlock)]
    assert [b.content for b in thinking] == ["Two words."]
    assert r.raw["model"] == "scripted"
    assert r.raw["finish_reason"] == "stop"
    usage = r.raw["usage"]
    assert usage["prompt_tokens"] == len(engine.prompts[-1])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert STATS_KEYS <= set(r.raw["stats"])
    assert "Say hello" in prompt_text(engine)


def test_stream_chat_deltas_fold_to_the_message() -> None:
    llm, _ = make()
    responses = list(llm.stream_chat(user("Say hello")))
    assert len(responses) > 3
    assert "".join(r.delta or "" for r in responses) == "Hello there"
    thinking = "".join(r.additional_kwargs.get("thinking_delta", "") for r in responses)
    assert thinking == "Two words."
    # every response holds the message so far; only the last carries raw
    assert all(r.raw is None for r in responses[:-1])
    assert responses[-1].raw is not None
    assert responses[-1].message.content == "Hello there"
    mid = next(r for r in responses if r.delta == "H")
    assert mid.message.content == "H"
    assert any(r.logprobs for r in responses)


def test_complete_and_stream_complete() -> None:
    llm, engine = make()
    c = llm.complete("Say hello")
    assert c.text == "Hello there"
    assert c.additional_kwargs["thinking"] == "Two words."
    assert c.raw["usage"]["completion_tokens"] > 0
    assert "Say hello" in prompt_text(engine)
    chunks = list(llm.stream_complete("Say hello"))
    assert "".join(ch.delta or "" for ch in chunks) == "Hello there"
    assert chunks[-1].text == "Hello there"
    assert "".join(ch.additional_kwargs.get("thinking_delta", "") for ch in chunks) == "Two words."


def test_async_twins_match_the_sync_path() -> None:
    llm, _ = make()
    r = asyncio.run(llm.achat(user("x")))
    assert r.message.content == "Hello there" and r.raw["stats"]
    streamed = collect(llm.astream_chat(user("x")))
    assert "".join(s.delta or "" for s in streamed) == "Hello there"
    assert "".join(s.additional_kwargs.get("thinking_delta", "") for s in streamed) == "Two words."
    c = asyncio.run(llm.acomplete("x"))
    assert c.text == "Hello there"
    chunks = collect(llm.astream_complete("x"))
    assert chunks[-1].text == "Hello there" and chunks[-1].raw is not None


def test_generation_options_reach_the_core() -> None:
    llm, engine = make(max_tokens=40, temperature=0.5, top_k=7, stop=["there"])
    seen = spy_requests(llm)
    r = llm.chat(user("x"))
    assert r.message.content == "Hello "  # stop string excluded
    _, options = seen[-1]
    assert options["max_tokens"] == 40
    assert options["sampling"].temperature == 0.5 and options["sampling"].top_k == 7
    assert engine.calls[-1]["max_tokens"] == 40
    llm.chat(user("x"), max_tokens=5, temperature=0.0, stop="Hel")
    _, options = seen[-1]
    assert options["max_tokens"] == 5 and options["sampling"].temperature == 0.0
    assert options["stop"] == ["Hel"]


def test_max_tokens_cut_reports_length() -> None:
    llm, _ = make(("abcdefghij",))
    r = llm.chat(user("x"), max_tokens=3)
    assert r.message.content == "abc"
    assert r.raw["finish_reason"] == "length"


def test_reasoning_options_go_into_the_request_and_refusals_propagate() -> None:
    from warp_providers.chat.base import ChatFormatError

    llm, _ = make(reasoning_effort="high")
    seen = spy_requests(llm)
    # the scripted ChatML template does not read an effort: the core refuses it by name
    with pytest.raises(ChatFormatError) as err:
        llm.chat(user("x"))
    assert err.value.param == "reasoning_effort"
    assert seen[-1][0]["reasoning_effort"] == "high"
    with pytest.raises(ChatFormatError):
        asyncio.run(llm.achat(user("x")))
    llm.chat(user("x"), reasoning_effort=None, thinking=None)
    assert "reasoning_effort" not in seen[-1][0] and "thinking" not in seen[-1][0]


def test_unknown_kwargs_are_refused() -> None:
    llm, _ = make()
    with pytest.raises(TypeError, match="bogus"):
        llm.chat(user("x"), bogus=1)


def test_engine_errors_propagate_sync_and_async() -> None:
    def boom(prompt: list[int]) -> str:
        raise RuntimeError("engine broke")

    llm, _ = make(boom)
    with pytest.raises(RuntimeError, match="engine broke"):
        llm.chat(user("x"))
    with pytest.raises(RuntimeError, match="engine broke"):
        collect(llm.astream_chat(user("x")))


def test_closing_a_stream_early_stops_generation() -> None:
    llm, engine = make(("a" * 200,))
    stream = llm.stream_chat(user("x"))
    first = next(stream)
    assert first.delta == "a"
    stream.close()
    assert engine.last_result is None or len(engine.last_result.token_ids) < 200


# ---------------------------------------------------------------- message conversion
def test_history_is_sent_openai_shaped() -> None:
    llm, engine = make()
    seen = spy_requests(llm)
    history = [
        ChatMessage(role=MessageRole.SYSTEM, content="Be terse."),
        ChatMessage(role=MessageRole.USER, content="Weather in Oslo?"),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            blocks=[
                ThinkingBlock(content="Need the tool."),
                ToolCallBlock(
                    tool_call_id="call_7", tool_name="weather", tool_kwargs={"city": "Oslo"}
                ),
            ],
        ),
        ChatMessage(
            role=MessageRole.TOOL, content="Sunny", additional_kwargs={"tool_call_id": "call_7"}
        ),
        ChatMessage(
            role=MessageRole.USER, blocks=[TextBlock(text="And "), TextBlock(text="tomorrow?")]
        ),
    ]
    llm.chat(history)
    messages = seen[-1][0]["messages"]
    assert messages[0] == {"role": "system", "content": "Be terse."}
    assert messages[2]["role"] == "assistant"
    assert messages[2]["reasoning_content"] == "Need the tool."
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_7",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert messages[3] == {"role": "tool", "content": "Sunny", "tool_call_id": "call_7"}
    assert messages[4] == {"role": "user", "content": "And tomorrow?"}
    text = prompt_text(engine)
    assert "Sunny" in text and "Be terse." in text


def test_images_become_image_url_parts() -> None:
    llm, _ = make()
    seen = spy_requests(llm)
    msg = ChatMessage(
        role=MessageRole.USER,
        blocks=[
            TextBlock(text="What is this?"),
            ImageBlock(image=b"\x89PNG\r\n\x1a\nfake", image_mimetype="image/png"),
        ],
    )
    try:
        llm.chat([msg])
    except ValueError:
        pass  # the format may refuse images; the request shape is what is checked here
    parts = seen[-1][0]["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "What is this?"}
    assert parts[1]["type"] == "image_url"
    assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_unsupported_blocks_are_refused_by_name() -> None:
    llm, _ = make()
    msg = ChatMessage(role=MessageRole.USER, blocks=[AudioBlock(audio=b"RIFF0000WAVE")])
    with pytest.raises(ValueError, match="'audio'"):
        llm.chat([msg])


# ---------------------------------------------------------------- tools
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [FunctionTool.from_defaults(fn=add), FunctionTool.from_defaults(fn=multiply)]
TWO_CALLS = (
    "<think>Both at once.</think>"
    + tool_call_text("add", {"a": 2, "b": 3})
    + tool_call_text("multiply", {"a": 4, "b": 5})
)


def test_prepare_chat_with_tools() -> None:
    llm, _ = make()
    out = llm._prepare_chat_with_tools(TOOLS, user_msg="2+3?", chat_history=user("hi"))
    assert [m.content for m in out["messages"]] == ["hi", "2+3?"]
    assert [t["function"]["name"] for t in out["tools"]] == ["add", "multiply"]
    assert out["tools"][0]["function"]["parameters"]["properties"].keys() == {"a", "b"}
    assert "tool_choice" not in out
    assert (
        llm._prepare_chat_with_tools(TOOLS, user_msg="x", tool_required=True)["tool_choice"]
        == "required"
    )
    named = llm._prepare_chat_with_tools(TOOLS, user_msg="x", tool_choice="add")["tool_choice"]
    assert named == {"type": "function", "function": {"name": "add"}}
    assert (
        llm._prepare_chat_with_tools(TOOLS, user_msg="x", tool_choice="none")["tool_choice"]
        == "none"
    )


def test_chat_with_tools_single_call() -> None:
    llm, engine = make((tool_call_text("add", {"a": 2, "b": 3}),))
    seen = spy_requests(llm)
    r = llm.chat_with_tools(TOOLS, user_msg="What is 2 + 3?", tool_required=True)
    request, _ = seen[-1]
    assert request["tool_choice"] == "required"
    assert request["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in request["tools"]] == ["add", "multiply"]
    assert "multiply" in prompt_text(engine)  # the tools were rendered
    calls = llm.get_tool_calls_from_response(r)
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("add", {"a": 2, "b": 3})]
    assert calls[0].tool_id
    assert r.raw["finish_reason"] == "tool_calls"


def test_parallel_tool_calls() -> None:
    llm, _ = make((TWO_CALLS,))
    seen = spy_requests(llm)
    r = llm.chat_with_tools(TOOLS, user_msg="2+3 and 4*5?", allow_parallel_tool_calls=True)
    assert seen[-1][0]["parallel_tool_calls"] is True
    calls = llm.get_tool_calls_from_response(r)
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [
        ("add", {"a": 2, "b": 3}),
        ("multiply", {"a": 4, "b": 5}),
    ]
    assert len({c.tool_id for c in calls}) == 2
    assert [b.content for b in r.message.blocks if isinstance(b, ThinkingBlock)] == [
        "Both at once."
    ]


def test_without_parallel_calls_only_the_first_is_kept() -> None:
    llm, _ = make((TWO_CALLS,))
    r = llm.chat_with_tools(TOOLS, user_msg="2+3 and 4*5?", allow_parallel_tool_calls=False)
    assert [c.tool_name for c in llm.get_tool_calls_from_response(r)] == ["add"]


def test_streamed_tool_calls_and_async() -> None:
    llm, _ = make((TWO_CALLS,))
    responses = list(
        llm.stream_chat_with_tools(TOOLS, user_msg="go", allow_parallel_tool_calls=True)
    )
    final = llm.get_tool_calls_from_response(responses[-1])
    assert [c.tool_name for c in final] == ["add", "multiply"]
    partial = [llm.get_tool_calls_from_response(r, error_on_no_tool_call=False) for r in responses]
    assert partial[0] == []  # thinking came first
    r = asyncio.run(llm.achat_with_tools(TOOLS, user_msg="go", allow_parallel_tool_calls=True))
    assert len(llm.get_tool_calls_from_response(r)) == 2
    streamed = collect(
        llm.astream_chat_with_tools(TOOLS, user_msg="go", allow_parallel_tool_calls=True)
    )
    assert [c.tool_name for c in llm.get_tool_calls_from_response(streamed[-1])] == [
        "add",
        "multiply",
    ]


def test_no_tool_call() -> None:
    llm, _ = make(("Just text",))
    r = llm.chat_with_tools(TOOLS, user_msg="hi")
    assert llm.get_tool_calls_from_response(r, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="Just text"):
        llm.get_tool_calls_from_response(r)


def test_malformed_arguments_are_kept_raw_in_the_message() -> None:
    llm, _ = make(('<tool_call>\n{"name": "add", "arguments": "a=2"}\n</tool_call>',))
    r = llm.chat_with_tools(TOOLS, user_msg="x")
    block = next(b for b in r.message.blocks if isinstance(b, ToolCallBlock))
    assert block.tool_name == "add"
    assert isinstance(block.tool_kwargs, str)  # not a JSON object: kept as text
    assert llm.get_tool_calls_from_response(r)[0].tool_kwargs == {}


def test_predict_and_call_runs_the_tools() -> None:
    llm, _ = make((TWO_CALLS,))
    out = llm.predict_and_call(TOOLS, user_msg="2+3 and 4*5?", allow_parallel_tool_calls=True)
    assert [s.raw_output for s in out.sources] == [5, 20]
    out = asyncio.run(llm.apredict_and_call(TOOLS, user_msg="2+3?", allow_parallel_tool_calls=True))
    assert [s.raw_output for s in out.sources] == [5, 20]


# ---------------------------------------------------------------- structured output
class City(BaseModel):
    """A city."""

    name: str
    population: int


CITY_JSON = json.dumps({"name": "Paris", "population": 2100000})
CITY_PROMPT = PromptTemplate("Describe the city {name} as JSON.")


def test_structured_predict_asks_the_core_for_the_schema() -> None:
    llm, engine = make((CITY_JSON,))
    seen = spy_requests(llm)
    city = llm.structured_predict(City, CITY_PROMPT, name="Paris")
    assert city == City(name="Paris", population=2100000)
    request, _ = seen[-1]
    fmt = request["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "City"
    assert fmt["json_schema"]["schema"] == {
        **City.model_json_schema(),
        "additionalProperties": False,
    }
    assert "tools" not in request  # not the tool-calling program
    assert "Describe the city Paris" in prompt_text(engine)


def test_structured_schema_closes_every_object() -> None:
    class Place(BaseModel):
        city: City
        tags: list[City]
        extra: dict[str, int]

    llm, _ = make((json.dumps({"city": json.loads(CITY_JSON), "tags": [], "extra": {"a": 1}}),))
    seen = spy_requests(llm)
    assert llm.structured_predict(Place, CITY_PROMPT, name="x").extra == {"a": 1}
    schema = seen[-1][0]["response_format"]["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["City"]["additionalProperties"] is False
    assert schema["properties"]["extra"]["additionalProperties"] == {"type": "integer"}


def test_astructured_predict_and_llm_kwargs() -> None:
    llm, _ = make((CITY_JSON,))
    seen = spy_requests(llm)
    city = asyncio.run(
        llm.astructured_predict(City, CITY_PROMPT, llm_kwargs={"max_tokens": 99}, name="P")
    )
    assert city.population == 2100000
    assert seen[-1][1]["max_tokens"] == 99


def test_stream_structured_predict_yields_growing_objects() -> None:
    llm, _ = make((CITY_JSON,))
    parts = list(llm.stream_structured_predict(City, CITY_PROMPT, name="Paris"))
    assert len(parts) > 3
    assert parts[-1] == City(name="Paris", population=2100000)
    assert any(
        getattr(p, "name", None) == "Paris" and getattr(p, "population", None) is None
        for p in parts
    )


def test_astream_structured_predict() -> None:
    llm, _ = make((CITY_JSON,))

    async def run() -> list[Any]:
        return [
            p async for p in await llm.astream_structured_predict(City, CITY_PROMPT, name="Paris")
        ]

    assert asyncio.run(run())[-1] == City(name="Paris", population=2100000)


def test_as_structured_llm() -> None:
    llm, _ = make((CITY_JSON,))
    sllm = llm.as_structured_llm(City)
    r = sllm.chat(user("Describe Paris"))
    assert r.raw == City(name="Paris", population=2100000)
    assert json.loads(r.message.content) == {"name": "Paris", "population": 2100000}
    assert sllm.complete("Describe Paris").raw.name == "Paris"
    streamed = list(sllm.stream_chat(user("Describe Paris")))
    assert streamed[-1].raw == City(name="Paris", population=2100000)
    assert asyncio.run(sllm.achat(user("Describe Paris"))).raw.population == 2100000


def test_structured_predict_invalid_reply_raises() -> None:
    from pydantic import ValidationError

    llm, _ = make(('{"name": "Paris"}',))
    with pytest.raises(ValidationError):
        llm.structured_predict(City, CITY_PROMPT, name="Paris")


def test_structured_predict_cut_at_the_limit_says_so() -> None:
    llm, _ = make((CITY_JSON,))
    with pytest.raises(ValueError, match="cut at the token limit"):
        llm.structured_predict(City, CITY_PROMPT, llm_kwargs={"max_tokens": 5}, name="Paris")


def test_other_program_modes_use_llama_index_programs() -> None:
    llm, _ = make((CITY_JSON,), pydantic_program_mode=PydanticProgramMode.LLM)
    seen = spy_requests(llm)
    assert llm.structured_predict(City, CITY_PROMPT, name="Paris").name == "Paris"
    assert "response_format" not in seen[-1][0]


def test_chat_response_type() -> None:
    llm, _ = make()
    assert isinstance(llm.chat(user("x")), ChatResponse)


# ---------------------------------------------------------------------- capabilities
PLAIN_CHATML = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- endif %}"
)


class NoToolsEngine(ScriptedEngine):
    """The scripted engine with a template that has no tool markers."""

    def chat_metadata(self) -> dict[str, str | None]:
        return {"format": None, "template": PLAIN_CHATML}


def test_function_calling_follows_the_chat_format() -> None:
    assert Warp(engine=ScriptedEngine()).metadata.is_function_calling_model is True
    assert Warp(engine=NoToolsEngine()).metadata.is_function_calling_model is False
    forced = Warp(engine=NoToolsEngine(), is_function_calling_model=True)
    assert forced.metadata.is_function_calling_model is True


def test_an_agent_on_a_model_without_tool_markers_falls_back_to_react() -> None:
    from llama_index.core.agent.workflow import AgentWorkflow, ReActAgent

    def weather(city: str) -> str:
        """Current weather of a city."""
        return "sunny"

    def reply(prompt: list[int]) -> str:
        text = NoToolsEngine().tokenizer.decode(prompt)
        if "Observation: sunny" in text:
            return "Thought: I can answer without using any more tools.\nAnswer: It is sunny."
        return ('Thought: I need the weather.\nAction: weather\n'
                'Action Input: {"city": "Oslo"}\n')

    engine = NoToolsEngine(reply)
    workflow = AgentWorkflow.from_tools_or_functions([weather], llm=Warp(engine=engine))
    assert isinstance(workflow.agents[workflow.root_agent], ReActAgent)

    async def run() -> Any:
        return await workflow.run(user_msg="Weather in Oslo?")

    result = asyncio.run(run())
    assert "It is sunny." in str(result)
    # ReAct sends no tools to the core: the template could not have rendered them.
    assert all("tools" not in call for call in engine.calls)
    assert "Observation: sunny" in prompt_text(engine)


# ---------------------------------------------------------------------- formatted prompts
def test_complete_formatted_sends_the_prompt_raw() -> None:
    llm, engine = make(("Paris.",))
    prompt = "Q: capital of France?\nA:"
    r = llm.complete(prompt, formatted=True)
    assert r.text == "Paris."
    # No chat template: exactly the prompt's own tokens, no markers around it.
    assert engine.prompts[-1] == engine.tokenizer.encode_content(prompt)
    assert r.raw["usage"]["prompt_tokens"] == len(engine.prompts[-1])
    assert r.raw["usage"]["completion_tokens"] == len("Paris.")
    assert r.raw["finish_reason"] == "stop" and STATS_KEYS <= set(r.raw["stats"])
    # Unformatted, the same prompt is wrapped as a user turn.
    llm.complete(prompt)
    assert "<|im_start|>user" in prompt_text(engine)


def test_stream_and_async_complete_formatted_are_raw_too() -> None:
    llm, engine = make(("Paris.",))
    steps = list(llm.stream_complete("A:", formatted=True))
    assert "".join(s.delta or "" for s in steps) == "Paris." == steps[-1].text
    assert steps[-1].raw is not None and all(s.raw is None for s in steps[:-1])
    assert engine.prompts[-1] == engine.tokenizer.encode_content("A:")
    r = asyncio.run(llm.acomplete("B:", formatted=True))
    assert r.text == "Paris." and engine.prompts[-1] == engine.tokenizer.encode_content("B:")
    steps = collect(llm.astream_complete("C:", formatted=True))
    assert steps[-1].text == "Paris."
    assert engine.prompts[-1] == engine.tokenizer.encode_content("C:")


def test_complete_formatted_honours_max_tokens_and_stop() -> None:
    llm, engine = make(("one two three",))
    r = llm.complete("x", formatted=True, max_tokens=3)
    assert r.text == "one" and r.raw["finish_reason"] == "length"
    llm.complete("x", formatted=True, stop=[" two"], temperature=0.5, seed=3)
    # The engine ends at stop strings itself (the scripted one only records them).
    assert engine.calls[-1]["stop"] == [" two"]
    assert engine.calls[-1]["sampling"].temperature == 0.5


# ---------------------------------------------------------------------- usage details
def test_raw_usage_has_cached_and_reasoning_tokens() -> None:
    llm, engine = make((REASONED,))
    first = llm.chat(user("hi"))
    usage = first.raw["usage"]
    assert usage["cached_tokens"] == 0
    # "<think>Two words.</think>": two markers and the bytes between, before the answer.
    assert usage["reasoning_tokens"] == 2 + len("Two words.")
    second = llm.chat(user("hi") + [first.message] + user("again"))
    assert second.raw["usage"]["cached_tokens"] == engine.last_result.cached_tokens > 0
