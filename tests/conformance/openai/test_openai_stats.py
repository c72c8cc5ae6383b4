"""The `warp` stats object on every endpoint, in both modes, however the generation ended.

Each case runs after a request of another length, on the scripted engine whose counters
depend on the generation (`bytes_read` per generated token, `prefill_tokens` the prompt's
length): a reply carrying the previous request's stats, or none, fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_engine import BYTES_PER_TOKEN, PREFILL_TOK_S, ScriptedEngine, tool_call_text
from openai_cases import WEATHER

ENDINGS = ["length", "stop_string", "eos", "tool_call", "cancel"]


def _request(route: str, ending: str, stream: bool) -> dict[str, Any]:
    responses = route == "/v1/responses"
    if route == "/v1/chat/completions":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "tell me a story"}]}
    elif responses:
        body = {"input": "tell me a story"}
    else:
        body = {"prompt": "Once upon a time there was"}
    body["stream"] = stream
    if stream and not responses:
        body["stream_options"] = {"include_usage": True}
    if ending == "length":
        body["max_output_tokens" if responses else "max_tokens"] = 5
    elif ending == "stop_string":
        body["stop"] = ["END"]
    elif ending == "tool_call":
        fn = WEATHER["function"]
        body["tools"] = [{"type": "function", **fn} if responses else WEATHER]
    return body


def _warm(route: str) -> dict[str, Any]:
    if route == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": "hi"}]}
    return {"input": "hi"} if route == "/v1/responses" else {"prompt": "hi"}


def _reply(ending: str) -> str:
    if ending == "tool_call":
        return tool_call_text("get_weather", {"city": "Lima"})
    return "a long reply that goes on END and on past the stop string"


def _run(api: Any, route: str, body: dict[str, Any], should_stop: Any = None
         ) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(warp stats, usage, finish_reason) of one request through the request core."""
    status, out = api.handle("POST", route, json.dumps(body), should_stop=should_stop)
    assert status == 200, out
    if route == "/v1/responses":
        if body.get("stream"):
            events = list(out)
            assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
            out = events[-1]["response"]
        u = out["usage"]
        finish = "length" if out["status"] == "incomplete" else (
            "tool_calls" if any(i["type"] == "function_call" for i in out["output"]) else "stop")
        return out["warp"], {"prompt_tokens": u["input_tokens"],
                             "completion_tokens": u["output_tokens"]}, finish
    if not body.get("stream"):
        return out["warp"], out["usage"], out["choices"][0]["finish_reason"]
    chunks = list(out)
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1, chunks[-3:]
    assert chunks[-1]["choices"] == [] and chunks[-1]["warp"] == finals[0]["warp"]
    return finals[0]["warp"], chunks[-1]["usage"], finals[0]["choices"][0]["finish_reason"]


CASES = [(route, ending)
         for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses")
         for ending in ENDINGS if not (ending == "tool_call" and route == "/v1/completions")]
"""Every ending on every endpoint (raw completions have no tools, so no tool call)."""


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "streamed"])
@pytest.mark.parametrize("route,ending", CASES)
def test_stats_belong_to_this_generation(route, ending, stream):
    from warp_openai import WarpAPI

    engine = ScriptedEngine(["a short warm-up", _reply(ending)])
    api = WarpAPI(engine=engine)
    _run(api, route, _warm(route))  # the previous request: another prompt, another length
    before = engine.last_result
    polls = 0

    def cancel_after_8() -> bool:
        nonlocal polls
        polls += 1
        return polls > 8

    stop = cancel_after_8 if ending == "cancel" else None
    warp, usage, finish = _run(api, route, _request(route, ending, stream), stop)
    gen = engine.last_result
    assert gen is not before
    assert warp["bytes_read"] == BYTES_PER_TOKEN * len(gen.token_ids) > 0
    assert warp["prefill_tokens"] == len(engine.prompts[-1]) == usage["prompt_tokens"]
    assert warp["prefill_tokens"] != len(engine.prompts[-2])  # the warm-up's differs
    assert warp["prefill_tok_s"] == PREFILL_TOK_S
    assert warp["tokens_generated"] == usage["completion_tokens"]
    assert (warp["experts_hit"], warp["experts_missed"]) == (3, 1)
    expected = {"length": "length", "stop_string": "stop", "eos": "stop", "cancel": "stop",
                "tool_call": "tool_calls"}[ending]
    assert finish == expected
    if ending == "stop_string":
        assert gen.finish_reason == "cancelled"  # closed by the consumer that matched it
        assert len(gen.token_ids) < len(_reply(ending))
    if ending == "cancel":
        assert gen.finish_reason == "cancelled" and len(gen.token_ids) <= 8


def test_stop_string_reply_reports_its_own_stats_over_the_sdk(make_client):
    """The reported bug: a stop-string reply carried the previous request's stats."""
    engine = ScriptedEngine(["warm", "abc STOP def"])
    client = make_client(engine)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    r = client.chat.completions.create(model="m", stop=["STOP"],
                                       messages=[{"role": "user", "content": "longer one"}])
    warp = r.model_extra["warp"]
    assert r.choices[0].message.content == "abc "
    assert warp["bytes_read"] == BYTES_PER_TOKEN * len(engine.last_result.token_ids)
    assert warp["prefill_tokens"] == r.usage.prompt_tokens
    c = client.completions.create(model="m", prompt="hello there", max_tokens=3)
    assert c.model_extra["warp"]["tokens_generated"] == c.usage.completion_tokens == 3
    assert c.model_extra["warp"]["bytes_read"] == 3 * BYTES_PER_TOKEN
