"""A LlamaIndex `FunctionAgent` solving a two-tool task with `Warp` over the scripted engine.

The script answers from what the prompt contains, so the run only ends if each tool result
really reached the model: weather first, then the unit conversion, then the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fake_engine import ScriptedEngine, make_tokenizer, tool_call_text
from llama_index.core.agent.workflow import (
    AgentOutput,
    AgentStream,
    FunctionAgent,
    ToolCall,
    ToolCallResult,
)
from llama_index.core.tools import FunctionTool
from llama_index.llms.warp import Warp

WEATHER = "Sunny, 21 C in Oslo"
FAHRENHEIT = "69.8 F"
ANSWER = "It is sunny in Oslo at 69.8 F."


def get_weather(city: str) -> str:
    """Current weather of a city, in Celsius."""
    return WEATHER if city == "Oslo" else "unknown city"


def celsius_to_fahrenheit(celsius: float) -> str:
    """Convert a temperature from Celsius to Fahrenheit."""
    return f"{celsius * 9 / 5 + 32:.1f} F"


def script() -> Any:
    decode = make_tokenizer().decode  # the scripted engine's vocabulary

    def reply(prompt: list[int]) -> str:
        text = decode(prompt)
        if FAHRENHEIT in text:
            return "<think>I have both results.</think>" + ANSWER
        if WEATHER in text:
            return "<think>Now convert 21 C.</think>" + tool_call_text(
                "celsius_to_fahrenheit", {"celsius": 21}
            )
        return "<think>First the weather.</think>" + tool_call_text("get_weather", {"city": "Oslo"})

    return reply


async def run_agent(agent: FunctionAgent, question: str) -> tuple[list[Any], Any]:
    handler = agent.run(user_msg=question)
    events = [ev async for ev in handler.stream_events()]
    return events, await handler


def make_agent() -> tuple[FunctionAgent, ScriptedEngine]:
    engine = ScriptedEngine(script())
    llm = Warp(engine=engine)
    tools = [
        FunctionTool.from_defaults(fn=get_weather),
        FunctionTool.from_defaults(fn=celsius_to_fahrenheit),
    ]
    return FunctionAgent(
        tools=tools, llm=llm, system_prompt="You answer weather questions."
    ), engine


def test_function_agent_two_tool_task_streams_thinking_and_tool_calls() -> None:
    agent, engine = make_agent()
    events, result = asyncio.run(run_agent(agent, "How warm is it in Oslo, in Fahrenheit?"))

    assert str(result) == ANSWER
    assert len(engine.prompts) == 3  # weather call, conversion call, answer

    streams = [e for e in events if isinstance(e, AgentStream)]
    thinking = "".join(e.thinking_delta or "" for e in streams)
    assert thinking == "First the weather.Now convert 21 C.I have both results."
    assert "".join(e.delta for e in streams) == ANSWER
    streamed_tools = {c.tool_name for e in streams for c in e.tool_calls}
    assert streamed_tools == {"get_weather", "celsius_to_fahrenheit"}

    calls = [e for e in events if isinstance(e, ToolCall) and not isinstance(e, ToolCallResult)]
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("celsius_to_fahrenheit", {"celsius": 21}),
    ]
    results = [e for e in events if isinstance(e, ToolCallResult)]
    assert [r.tool_output.content for r in results] == [WEATHER, FAHRENHEIT]
    assert [r.tool_id for r in results] == [c.tool_id for c in calls]

    outputs = [e for e in events if isinstance(e, AgentOutput)]
    assert outputs[-1].response.content == ANSWER
    assert all(
        o.raw["usage"]["total_tokens"] > 0 and "expert_hits" in o.raw["stats"] for o in outputs
    )

    # the system prompt and every tool result reached the model
    last_prompt = engine.tokenizer.decode(engine.prompts[-1])
    assert "You answer weather questions." in last_prompt
    assert WEATHER in last_prompt and FAHRENHEIT in last_prompt
    assert "First the weather." in last_prompt or "get_weather" in last_prompt


def test_function_agent_without_streaming() -> None:
    agent, engine = make_agent()
    agent.streaming = False
    events, result = asyncio.run(run_agent(agent, "How warm is it in Oslo, in Fahrenheit?"))
    assert str(result) == ANSWER
    assert [r.tool_output.content for r in events if isinstance(r, ToolCallResult)] == [
        WEATHER,
        FAHRENHEIT,
    ]
