"""The Responses API on the real engine, through the real `openai` client.

SmolLM2 (trained weights): text blocking, streamed and async give one greedy reply, and
`responses.parse` returns a schema-valid object. The tiny random MoE (Hermes tool
markers): a forced function call is constrained to its tool's schema, in-process and
over HTTP, and its output fed back as a `function_call_output` item is answered.
"""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.slow

PAINT_SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "glossy": {"type": "boolean"}},
    "required": ["color", "glossy"],
    "additionalProperties": False,
}
PAINT = {"type": "function", "name": "paint", "parameters": PAINT_SCHEMA}


class Paint(BaseModel):
    color: Literal["red", "green", "blue"]
    glossy: bool


def test_text_blocking_streamed_and_async_agree(connect, smol_path):
    target = connect(smol_path)
    r = target.client.responses.create(model=target.model_id, input="Name a color.",
                                       max_output_tokens=6)
    assert r.status in ("completed", "incomplete") and r.output_text
    assert 0 < r.usage.output_tokens <= 6 and r.usage.input_tokens > 0
    events = list(target.client.responses.create(model=target.model_id, input="Name a color.",
                                                 max_output_tokens=6, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text
    assert events[-1].response.status == r.status
    # the repeat reused the cached prompt prefix
    assert events[-1].response.usage.input_tokens_details.cached_tokens == (
        r.usage.input_tokens - 1)

    async def run() -> str:
        client = target.aclient()
        async with client:
            a = await client.responses.create(model=target.model_id, input="Name a color.",
                                              max_output_tokens=6)
        return a.output_text

    assert asyncio.run(run()) == r.output_text


def test_parse_gives_a_schema_valid_object(connect, smol_path):
    target = connect(smol_path)
    r = target.client.responses.parse(model=target.model_id, text_format=Paint,
                                      input="Paint the wall: which color, glossy or not?",
                                      max_output_tokens=200)
    assert isinstance(r.output_parsed, Paint)


@pytest.mark.parametrize("via", ["inproc", pytest.param("http", marks=pytest.mark.enable_socket)])
def test_forced_function_call_and_its_output(connect, moe_path, via):
    target = connect(moe_path, via)
    client = target.client
    r = client.responses.create(model=target.model_id, input="Paint the wall.", tools=[PAINT],
                                tool_choice={"type": "function", "name": "paint"},
                                parallel_tool_calls=False, max_output_tokens=600)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "paint"
    jsonschema.validate(json.loads(calls[0].arguments), PAINT_SCHEMA)
    with client.responses.stream(model=target.model_id, input="Paint the wall.", tools=[PAINT],
                                 tool_choice="required", parallel_tool_calls=False,
                                 max_output_tokens=600) as stream:
        kinds = {e.type for e in stream}
        final = stream.get_final_response()
    assert {"response.function_call_arguments.delta", "response.output_item.done"} <= kinds
    [call] = [o for o in final.output if o.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), PAINT_SCHEMA)
    after = client.responses.create(
        model=target.model_id, previous_response_id=final.id, tools=[PAINT],
        tool_choice="none", max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert after.status in ("completed", "incomplete")
    assert not [o for o in after.output if o.type == "function_call"]
    alone = client.responses.create(model=target.model_id, tools=[PAINT], tool_choice="none",
                                    max_output_tokens=1, input="done")
    assert after.usage.input_tokens > alone.usage.input_tokens + 5  # the history came along
