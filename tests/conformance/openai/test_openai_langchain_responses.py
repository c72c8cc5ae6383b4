"""LangChain's `ChatOpenAI(use_responses_api=True)` over the in-process transport.

langchain-openai drives the Responses API through the real `openai` client; the scripted
engine answers: text, streaming, async, a tool loop with `bind_tools`, structured output
and usage details, end to end.
"""

from __future__ import annotations

import asyncio

from fake_engine import ScriptedEngine, tool_call_text


def _llm(engine: ScriptedEngine, **kw):
    from langchain_openai import ChatOpenAI
    from warp_openai import async_warp_transport, warp_transport

    return ChatOpenAI(model="local", api_key="unused", use_responses_api=True, max_retries=0,
                      http_socket_options=(),  # no socket-option probe: nothing connects
                      http_client=warp_transport(engine=engine),
                      http_async_client=async_warp_transport(engine=engine), **kw)


def test_invoke_with_reasoning_and_usage():
    llm = _llm(ScriptedEngine(["<think>Let me see.</think>Four."]))
    msg = llm.invoke("2+2?")
    assert msg.text == "Four."
    assert msg.response_metadata["id"].startswith("resp_")
    reasoning = [b for b in msg.content if isinstance(b, dict) and b.get("type") == "reasoning"]
    assert reasoning and reasoning[0]["summary"][0]["text"] == "Let me see."
    usage = msg.usage_metadata
    # the two think markers (one token each) and the bytes between: the reasoning channel
    assert usage["output_token_details"]["reasoning"] == 2 + len("Let me see.")
    assert usage["input_token_details"]["cache_read"] == 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_stream_and_async():
    engine = ScriptedEngine(["streamed reply"])
    llm = _llm(engine)
    chunks = list(llm.stream("hi"))
    assert len(chunks) > 3 and "".join(c.text for c in chunks) == "streamed reply"

    async def run() -> tuple[str, str]:
        a = await llm.ainvoke("hi")
        parts = [c.text async for c in llm.astream("hi")]
        return a.text, "".join(parts)

    assert asyncio.run(run()) == ("streamed reply", "streamed reply")


def test_tool_loop_with_bind_tools():
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return "sunny"

    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Paris"}), "Sunny."])
    llm = _llm(engine).bind_tools([get_weather])
    ask = HumanMessage("Weather in Paris?")
    first = llm.invoke([ask])
    [call] = first.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    result = get_weather.invoke(call["args"])
    final = llm.invoke([ask, first, ToolMessage(result, tool_call_id=call["id"])])
    assert final.text == "Sunny."
    prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_structured_output():
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    engine = ScriptedEngine(['{"name": "Ada", "age": 36}'])
    llm = _llm(engine).with_structured_output(Person, method="json_schema")
    assert llm.invoke("who?") == Person(name="Ada", age=36)
    assert engine.calls[-1]["processors"]  # constrained to the schema
