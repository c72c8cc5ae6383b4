"""The LlamaIndex LLM contract of `Warp`, run against the scripted engine and the real one.

The same invariants hold for both: every method answers; streamed deltas fold to the final
message; the last response carries usage and expert stats in `raw`; LlamaIndex's own
consumers (prompt helpers, chat engine, token counter, structured LLM) work on top.
The real engine runs SmolLM2-135M-Instruct, whose template has no tool markers: asking it
for tools is refused by name.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from fake_engine import ScriptedEngine, make_tokenizer, tool_call_text
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import ChatMessage, ChatResponse, CompletionResponse
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.warp import Warp
from pydantic import BaseModel

QUESTION = "What is the capital of France? Answer in one sentence."
SCRIPTED_ANSWER = "Paris is the capital of France."


class Capital(BaseModel):
    """A capital city."""

    city: str
    country: str


def scripted_llm(**fields: Any) -> Warp:
    decode = make_tokenizer().decode  # the scripted engine's vocabulary

    def reply(prompt: list[int]) -> str:
        text = decode(prompt)
        if "raw JSON" in text:
            return json.dumps({"city": "Paris", "country": "France"})
        if "get_weather" in text:
            return tool_call_text("get_weather", {"city": "Paris"})
        return "<think>Easy.</think>" + SCRIPTED_ANSWER

    return Warp(engine=ScriptedEngine(reply), max_tokens=200, **fields)


@pytest.fixture(params=["scripted", "smollm2"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def llm(kind: str, request: pytest.FixtureRequest) -> Warp:
    if kind == "scripted":
        return scripted_llm()
    return request.getfixturevalue("smollm2_llm")


def messages() -> list[ChatMessage]:
    return [ChatMessage(role="user", content=QUESTION)]


def check_final(kind: str, llm: Warp, final: ChatResponse | CompletionResponse, text: str) -> None:
    assert text.strip(), "empty answer"
    if kind == "scripted":
        assert text == SCRIPTED_ANSWER
    raw = final.raw
    assert raw["finish_reason"] in ("stop", "length")
    usage = raw["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= llm.max_tokens + 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert {"expert_hits", "expert_misses", "hit_rate"} <= set(raw["stats"])


def check_stream(kind: str, llm: Warp, responses: list[Any]) -> None:
    assert len(responses) >= 2
    final = responses[-1]
    text = final.message.content if isinstance(final, ChatResponse) else final.text
    assert "".join(r.delta or "" for r in responses) == text
    assert all(r.raw is None for r in responses[:-1])
    check_final(kind, llm, final, text or "")


def test_metadata(kind: str, llm: Warp) -> None:
    meta = llm.metadata
    assert meta.is_chat_model
    # SmolLM2's template has no tool markers: agents must take the ReAct path.
    assert meta.is_function_calling_model is (kind == "scripted")
    assert meta.context_window >= 2048
    assert meta.num_output == llm.max_tokens
    assert meta.model_name == ("scripted" if kind == "scripted" else "smollm2")


def test_chat(kind: str, llm: Warp) -> None:
    r = llm.chat(messages())
    check_final(kind, llm, r, r.message.content or "")


def test_stream_chat(kind: str, llm: Warp) -> None:
    check_stream(kind, llm, list(llm.stream_chat(messages())))


def test_complete(kind: str, llm: Warp) -> None:
    r = llm.complete(QUESTION)
    check_final(kind, llm, r, r.text)


def test_stream_complete(kind: str, llm: Warp) -> None:
    check_stream(kind, llm, list(llm.stream_complete(QUESTION)))


def test_async_twins(kind: str, llm: Warp) -> None:
    async def run() -> None:
        r = await llm.achat(messages())
        check_final(kind, llm, r, r.message.content or "")
        check_stream(kind, llm, [x async for x in await llm.astream_chat(messages())])
        c = await llm.acomplete(QUESTION)
        check_final(kind, llm, c, c.text)
        check_stream(kind, llm, [x async for x in await llm.astream_complete(QUESTION)])

    asyncio.run(run())


def test_greedy_is_deterministic(kind: str, llm: Warp) -> None:
    assert llm.complete(QUESTION).text == llm.complete(QUESTION).text


def test_llama_index_prompt_helpers(kind: str, llm: Warp) -> None:
    prompt = PromptTemplate("What is the capital of {country}? Answer in one sentence.")
    text = llm.predict(prompt, country="France")
    assert text.strip()
    streamed = "".join(llm.stream(prompt, country="France"))
    assert streamed == text
    assert asyncio.run(llm.apredict(prompt, country="France")) == text
    if kind == "scripted":
        assert text == SCRIPTED_ANSWER


def test_chat_engine_and_token_counter(kind: str, llm: Warp) -> None:
    counter = TokenCountingHandler()
    llm.callback_manager = CallbackManager([counter])
    engine = SimpleChatEngine.from_defaults(llm=llm)
    r = engine.chat(QUESTION)
    assert str(r).strip()
    assert counter.llm_token_counts, "the token counter saw no LLM event"
    event = counter.llm_token_counts[-1]
    # counts come from raw["usage"], i.e. the engine's own token counts
    assert event.prompt_token_count > 0 and event.completion_token_count > 0
    streamed = engine.stream_chat("And of Italy?")
    assert "".join(streamed.response_gen).strip()


def test_structured_predict_and_structured_llm(kind: str, llm: Warp) -> None:
    llm.max_tokens = 200
    out = llm.structured_predict(
        Capital, PromptTemplate("Give the capital of {country} and the country."), country="France"
    )
    assert isinstance(out, Capital) and out.city.strip()
    sllm = llm.as_structured_llm(Capital)
    r = sllm.chat(messages())
    assert isinstance(r.raw, Capital)
    assert Capital.model_validate_json(r.message.content)
    if kind == "scripted":
        assert out == Capital(city="Paris", country="France")


def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"Sunny in {city}"


def test_tools(kind: str, llm: Warp) -> None:
    tool = FunctionTool.from_defaults(fn=get_weather)
    if kind == "smollm2":
        from warp_providers.chat.base import ChatFormatError

        with pytest.raises(ChatFormatError) as err:
            llm.chat_with_tools([tool], user_msg="Weather in Paris?")
        assert err.value.param == "tools"
        return
    r = llm.chat_with_tools([tool], user_msg="Weather in Paris?")
    calls = llm.get_tool_calls_from_response(r)
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("get_weather", {"city": "Paris"})]
    out = llm.predict_and_call([tool], user_msg="Weather in Paris?")
    assert str(out) == "Sunny in Paris"


def test_models_are_shared_through_the_core_registry(smollm2_container: Any) -> None:
    """Warp and LangChain's ChatWarp on one container path load the model once."""
    from support import has_module, requires

    requires(has_module("langchain_core"), "langchain-core (pip install ./integrations/langchain)")
    from langchain_warp import ChatWarp

    from warp_providers import shared_engine

    path = str(smollm2_container)
    warp_engine = Warp(model_path=path).session.engine
    assert ChatWarp(model_path=path)._get_session().engine is warp_engine
    assert shared_engine(path) is warp_engine  # what the OpenAI transport opens too
    # A relative spelling of the same directory is the same model.
    relative = os.path.relpath(path)
    assert Warp(model_path=relative).session.engine is warp_engine
    # Other open options are another engine, again shared by both adapters.
    other = Warp(model_path=path, engine_options={"ctx": 1024}).session.engine
    assert other is not warp_engine
    assert ChatWarp(model_path=path, ctx=1024)._get_session().engine is other
