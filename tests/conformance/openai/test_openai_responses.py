"""The Responses API through the real `openai` client: create, stream, tools, store.

On the scripted engine (shapes, event order, the tool loop, refusals) in-process, async
and over `warp serve`; the real engine's version is in test_openai_real_responses.py.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from fake_engine import ScriptedEngine, tool_call_text
from openai_cases import CountingEngine
from pydantic import BaseModel

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def _prompt(engine: ScriptedEngine) -> str:
    """The last prompt without whitespace (the template's `{%-` trims some of it)."""
    return "".join(engine.tokenizer.decode(engine.prompts[-1]).split())


def _sq(text: str) -> str:
    return "".join(text.split())


def test_create_with_text_input_and_instructions(make_client):
    engine = ScriptedEngine(["Hello there!"])
    client = make_client(engine)
    r = client.responses.create(model="m", input="hi", instructions="Answer briefly.")
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "completed" and r.model == "scripted"
    assert r.output_text == "Hello there!"
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text"
    assert _sq("<|im_start|>system\nAnswer briefly.<|im_end|>") in _prompt(engine)
    assert _sq("<|im_start|>user\nhi<|im_end|>") in _prompt(engine)
    assert r.instructions == "Answer briefly."
    u = r.usage
    assert u.input_tokens == len(engine.prompts[-1])
    assert u.output_tokens == len("Hello there!") + 1  # the end marker counts
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0


def test_message_items_and_content_parts(make_client):
    engine = ScriptedEngine(["ok"])
    client = make_client(engine)
    client.responses.create(model="m", input=[
        {"role": "developer", "content": "Rules here."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "part one, "},
                     {"type": "input_text", "text": "part two"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "earlier answer"}]},
        {"role": "user", "content": "again"},
    ])
    prompt = _prompt(engine)
    assert _sq("<|im_start|>system\nRules here.<|im_end|>") in prompt
    assert _sq("part one, part two<|im_end|>") in prompt
    assert _sq("<|im_start|>assistant\nearlier answer<|im_end|>") in prompt
    assert prompt.endswith(_sq("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"))


# "<think>Let me see.</think>": the reasoning channel is its two markers (one token each)
# and the bytes between (one token each), everything before the answer.
THINK_TOKENS = 2 + len("Let me see.")


def test_reasoning_becomes_a_reasoning_item(make_client):
    client = make_client(ScriptedEngine(["<think>Let me see.</think>Four."]))
    r = client.responses.create(model="m", input="2+2?")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].summary[0].text == "Let me see."
    assert r.output_text == "Four."
    assert r.usage.output_tokens_details.reasoning_tokens == THINK_TOKENS


def _events(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_stream_event_sequence(make_client):
    client = make_client(ScriptedEngine(["<think>Hm.</think>Hi you."]))
    blocking = client.responses.create(model="m", input="x")
    events = _events(client.responses.create(model="m", input="x", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    # the reasoning item, then the message item, each opened and closed in order
    expect = ["response.output_item.added", "response.reasoning_summary_part.added",
              *["response.reasoning_summary_text.delta"] * 3,
              "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
              "response.output_item.done",
              "response.output_item.added", "response.content_part.added",
              *["response.output_text.delta"] * len("Hi you."),
              "response.output_text.done", "response.content_part.done",
              "response.output_item.done"]
    assert types[2:-1] == expect
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events
                        if e.type == "response.reasoning_summary_text.delta")
    assert (text, reasoning) == ("Hi you.", "Hm.")
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    final = events[-1].response
    assert final.output_text == blocking.output_text == "Hi you."
    assert final.usage.output_tokens == blocking.usage.output_tokens
    assert [o.type for o in final.output] == [o.type for o in blocking.output]


def test_stream_helper_and_text_deltas(make_client):
    client = make_client(ScriptedEngine(["streamed text"]))
    with client.responses.stream(model="m", input="x") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "streamed text"


def test_function_tool_loop(make_client):
    """A call, its output sent back as input items (no stored state), then the answer."""
    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Lima"}), "Sunny in Lima."])
    client = make_client(engine)
    r = client.responses.create(model="m", input="weather in Lima?", tools=[WEATHER],
                                store=False)
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Lima"} and call.call_id
    assert _sq('"name": "get_weather"') in _prompt(engine)  # the tool reached the template
    r2 = client.responses.create(model="m", tools=[WEATHER], input=[
        {"role": "user", "content": "weather in Lima?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "22C, sunny"},
    ])
    assert r2.output_text == "Sunny in Lima."
    prompt = _prompt(engine)
    assert _sq('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}') in prompt
    assert _sq("<tool_response>\n22C, sunny\n</tool_response>") in prompt


def test_streamed_function_call_arguments(make_client):
    args = {"city": "Oslo"}
    client = make_client(ScriptedEngine([tool_call_text("get_weather", args)]))
    events = _events(client.responses.create(model="m", input="x", tools=[WEATHER],
                                             stream=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [a.item.type for a in added] == ["function_call"]
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads("".join(fragments)) == json.loads(done.arguments) == args
    assert events[-1].response.output[0].arguments == done.arguments


@pytest.mark.parametrize("choice", [
    "required", {"type": "function", "name": "get_weather"},
])
def test_tool_choice_reaches_the_chat_core(make_client, choice):
    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Rome"})])
    client = make_client(engine)
    r = client.responses.create(model="m", input="x", tools=[WEATHER], tool_choice=choice)
    assert r.output[0].type == "function_call"
    processors = engine.calls[-1]["processors"]
    assert processors  # a forced call is constrained by a grammar, as in chat
    if isinstance(choice, dict):
        assert _sq("You must call the tool `get_weather`") in _prompt(engine)


def test_tool_choice_none_hides_nothing_but_forbids_calls(make_client):
    engine = ScriptedEngine(["no call"])
    client = make_client(engine)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="x", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "nope"})
    assert err.value.body["param"] == "tool_choice"


class Person(BaseModel):
    name: str
    age: int


def test_text_format_json_schema_and_parse(make_client):
    engine = ScriptedEngine(['{"name": "Ada", "age": 36}'])
    client = make_client(engine)
    r = client.responses.parse(model="m", input="who?", text_format=Person)
    assert r.output_parsed == Person(name="Ada", age=36)
    assert engine.calls[-1]["processors"]  # decoding is constrained to the schema
    r2 = client.responses.create(model="m", input="who?", text={"format": {
        "type": "json_schema", "name": "person", "schema": Person.model_json_schema(),
        "strict": True}})
    assert json.loads(r2.output_text) == {"name": "Ada", "age": 36}
    assert r2.text.format.type == "json_schema"


def test_previous_response_id_continues_the_conversation(make_client):
    engine = ScriptedEngine(["I am Bob.", "You asked my name."])
    client = make_client(engine)
    first = client.responses.create(model="m", input="Your name?", instructions="Be Bob.")
    second = client.responses.create(model="m", input="What did I ask?",
                                     previous_response_id=first.id)
    prompt = _prompt(engine)
    assert all(_sq(t) in prompt for t in ("Your name?", "I am Bob.", "What did I ask?"))
    assert _sq("Be Bob.") not in prompt  # instructions do not carry over (as OpenAI's API)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == "I am Bob."
    items = client.responses.input_items.list(second.id).data
    assert [i.type for i in items] == ["message"] and items[0].content[0].text == \
        "What did I ask?"
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="x", previous_response_id=first.id)
    assert err.value.body["param"] == "previous_response_id"


def test_store_false_is_not_kept(make_client):
    client = make_client(ScriptedEngine(["x"]))
    r = client.responses.create(model="m", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_the_store_is_bounded_least_recently_used_first():
    from warp_openai import WarpAPI
    from warp_openai.responses import Responses

    api = WarpAPI(engine=ScriptedEngine(["x"]))
    api.responses = Responses(api, store_size=2)
    ids = []
    for _ in range(2):
        status, body = api.handle("POST", "/v1/responses", {"input": "x"})
        ids.append(body["id"])
    assert api.handle("GET", f"/v1/responses/{ids[0]}")[0] == 200  # now the most recent
    status, body = api.handle("POST", "/v1/responses", {"input": "x"})
    assert api.handle("GET", f"/v1/responses/{ids[1]}")[0] == 404  # evicted
    assert api.handle("GET", f"/v1/responses/{ids[0]}")[0] == 200
    assert api.handle("GET", f"/v1/responses/{body['id']}")[0] == 200


class EffortEngine(ScriptedEngine):
    def chat_metadata(self) -> dict[str, str | None]:
        from fake_engine import CHATML_TEMPLATE

        return {"format": None, "template": CHATML_TEMPLATE.replace(
            "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if reasoning_effort %}<think>effort {{ reasoning_effort }}\n{%- endif %}"
            "{%- endif %}")}


def test_reasoning_effort_and_sampling_reach_the_core(make_client):
    engine = EffortEngine(["a long reply"])
    client = make_client(engine)
    r = client.responses.create(model="m", input="x", reasoning={"effort": "low"},
                                temperature=0.5, top_p=0.8, max_output_tokens=3)
    assert _prompt(engine).endswith(_sq("<think>effort low"))
    s = engine.calls[-1]["sampling"]
    assert (s.temperature, s.top_p) == (0.5, 0.8)
    assert engine.calls[-1]["max_tokens"] == 3
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    assert (r.temperature, r.top_p, r.max_output_tokens) == (0.5, 0.8, 3)


@pytest.mark.parametrize("fields,param", [
    ({"input": None}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]},
     "input[0].name"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": -1}, "top_p"),
    ({"stream": "yes"}, "stream"),
    ({"store": 1}, "store"),
    ({"background": True}, "background"),
    ({"instructions": 5}, "instructions"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"reasoning": "high"}, "reasoning"),
])
def test_refusals_name_the_param(make_client, fields, param):
    client = make_client(ScriptedEngine(["x"]))
    body = {"model": "m", "input": "hi", **fields}
    with pytest.raises(openai.BadRequestError) as err:
        client.post("/responses", body=body, cast_to=object)
    assert err.value.status_code == 400
    error = err.value.body
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] and "max_tokens" not in error["message"]


def test_an_image_input_is_refused_as_chat_refuses_it(make_client):
    client = make_client(ScriptedEngine(["x"]))
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert err.value.body["code"] == "vision_disabled"


def test_unknown_response_is_404(make_client):
    client = make_client(ScriptedEngine(["x"]))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_nope")


def test_async_create_and_stream(make_async_client):
    engine = ScriptedEngine([tool_call_text("get_weather", {"city": "Kyiv"}), "async text"])

    async def main():
        client = make_async_client(engine)
        async with client:
            r = await client.responses.create(model="m", input="x", tools=[WEATHER])
            stream = await client.responses.create(model="m", input="x", stream=True)
            events = [e async for e in stream]
            async with client.responses.stream(model="m", input="x") as s:
                async for _ in s:
                    pass
                final = await s.get_final_response()
            return r, events, final

    r, events, final = asyncio.run(main())
    assert r.output[0].type == "function_call" and json.loads(r.output[0].arguments) == {
        "city": "Kyiv"}
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "async text" == final.output_text


def test_closing_a_stream_stops_generation(make_client):
    engine = CountingEngine(["x" * 200])
    client = make_client(engine)
    stream = client.responses.create(model="m", input="x", stream=True)
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    stream.close()
    assert engine.produced <= 3
    engine._replies = ["next"]
    assert client.responses.create(model="m", input="x").output_text == "next"  # engine free


@pytest.mark.enable_socket
def test_over_http(make_client):
    import threading

    from warp_openai import WarpAPI
    from warp_openai.server import make_server

    engine = ScriptedEngine(["<think>t</think>over http", tool_call_text("get_weather", {})])
    httpd = make_server(WarpAPI(engine=engine), "127.0.0.1", 0, api_key="k")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        client = openai.OpenAI(api_key="k", base_url=url, max_retries=0)
        r = client.responses.create(model="m", input="x")
        assert r.output_text == "over http"
        events = _events(client.responses.create(model="m", input="x", tools=[WEATHER],
                                                 stream=True))
        assert events[-1].type == "response.completed"
        assert events[-1].response.output[0].type == "function_call"
        assert client.responses.retrieve(r.id).id == r.id
        client.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(api_key="bad", base_url=url, max_retries=0).responses.delete(r.id)
        client.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
