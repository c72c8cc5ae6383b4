"""Streaming over the transport: SSE invariants, tool-call deltas, cancellation, timeouts."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from fake_engine import ScriptedEngine
from openai_cases import (
    TIME,
    USER,
    WEATHER,
    CountingEngine,
    check_invariants,
    tool_call_text,
)


@pytest.mark.parametrize("usage", [False, True])
def test_text_stream(make_client, usage):
    client = make_client(ScriptedEngine(["<think>hmm</think>Hello, world"]))
    kw = {"stream_options": {"include_usage": True}} if usage else {}
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True, **kw))
    check_invariants(chunks, usage=usage)
    body = [c for c in chunks if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in body)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in body
    )
    assert (content, reasoning) == ("Hello, world", "hmm")
    assert len(body) > 5  # incremental: one character per token
    assert body[-1].choices[0].finish_reason == "stop"
    assert body[-1].model_extra["warp"]["tokens_generated"] > 0
    if usage:
        assert chunks[-1].usage.completion_tokens == 1 + 3 + 1 + len("Hello, world") + 1


def test_tool_call_deltas_parallel(make_client):
    reply = tool_call_text("get_weather", {"city": "Paris"}) + tool_call_text(
        "get_time", {"tz": "CET"}
    )
    client = make_client(ScriptedEngine([reply]))
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=USER,
            tools=[WEATHER, TIME],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    check_invariants(chunks, usage=True)
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.id is not None:  # the announcement: index, id, type and name first
                assert d.index not in calls and d.function.name and d.type == "function"
                calls[d.index] = {
                    "id": d.id,
                    "name": d.function.name,
                    "args": d.function.arguments or "",
                }
            else:
                assert d.index in calls and d.function.name is None
                calls[d.index]["args"] += d.function.arguments
    assert sorted(calls) == [0, 1]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == {"city": "Paris"}
    assert calls[1]["name"] == "get_time" and json.loads(calls[1]["args"]) == {"tz": "CET"}
    assert calls[0]["id"] != calls[1]["id"]
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "tool_calls"


def test_stream_helper(make_client):
    client = make_client(ScriptedEngine(['{"a": 1}']))
    with client.chat.completions.stream(
        model="m", messages=USER, response_format={"type": "json_object"}
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "content.delta" in events
    assert final.choices[0].message.content == '{"a": 1}'


def test_first_chunk_before_generation_ends(make_client):
    gate = threading.Event()
    engine = CountingEngine(["abcdefgh"], gate=gate)
    client = make_client(engine)
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    it = iter(stream)
    first = next(it)
    assert first.choices[0].delta.role == "assistant"
    assert engine.produced < len("abcdefgh")  # the engine is held at its second token
    gate.set()
    rest = "".join(c.choices[0].delta.content or "" for c in it if c.choices)
    assert rest == "abcdefgh"


def test_close_stops_generation(make_client):
    engine = CountingEngine(["x" * 200])
    client = make_client(engine)
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) == 2:
            break
    stream.close()
    assert engine.produced <= 3
    # The engine is free: the next request succeeds.
    engine._replies = ["next"]
    assert (
        client.chat.completions.create(model="m", messages=USER).choices[0].message.content
        == "next"
    )


def test_context_manager_exit_stops_generation(make_client):
    engine = CountingEngine(["y" * 200])
    client = make_client(engine)
    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:
        next(iter(stream))
    assert engine.produced <= 3


def test_timeout_stops_generation(make_client):
    import openai

    gate = threading.Event()
    engine = CountingEngine(["z" * 50], gate=gate)
    client = make_client(engine)
    release = threading.Timer(1.0, gate.set)  # the engine stalls for a second
    release.start()
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=USER, timeout=0.2)
    release.join()
    assert engine.saw_should_stop and engine.produced < 50


def test_async_stream_and_cancel(make_async_client):
    async def go() -> None:
        reply = tool_call_text("get_weather", {"city": "Oslo"})
        client = make_async_client(ScriptedEngine(["<think>a</think>Hey", reply]))
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=USER, stream=True, stream_options={"include_usage": True}
            )
        ]
        check_invariants(chunks, usage=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hey"
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=USER, tools=[WEATHER], stream=True
            )
        ]
        check_invariants(chunks, usage=False)
        async with client.chat.completions.stream(model="m", messages=USER) as s:
            final = await s.get_final_completion()
        assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
        await client.close()

        engine = CountingEngine(["w" * 300])
        client = make_async_client(engine)
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n == 2:
                break
        await stream.close()
        await asyncio.sleep(0.05)
        assert engine.produced <= 3
        engine._replies = ["after"]
        r = await client.chat.completions.create(model="m", messages=USER)
        assert r.choices[0].message.content == "after"
        await client.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_async_task_cancellation(make_async_client):
    async def go() -> None:
        gate = threading.Event()
        engine = CountingEngine(["v" * 100], gate=gate)
        client = make_async_client(engine)
        task = asyncio.ensure_future(client.chat.completions.create(model="m", messages=USER))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await asyncio.sleep(0.2)
        assert engine.saw_should_stop and engine.produced <= 3
        await client.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_event_loop_not_blocked(make_async_client):
    async def go() -> int:
        gate = threading.Event()
        client = make_async_client(CountingEngine(["slow"], gate=gate))
        ticks = 0
        task = asyncio.ensure_future(client.chat.completions.create(model="m", messages=USER))
        while ticks < 5:
            await asyncio.sleep(0.01)
            ticks += 1
        gate.set()
        r = await task
        await client.close()
        assert r.choices[0].message.content == "slow"
        return ticks

    assert asyncio.run(asyncio.wait_for(go(), 30)) == 5


def test_concurrent_threads_and_tasks(make_client, make_async_client):
    from concurrent.futures import ThreadPoolExecutor

    engine = ScriptedEngine(lambda ids: f"reply to {len(ids)}")
    client = make_client(engine)
    alone = client.chat.completions.create(model="m", messages=USER).choices[0].message.content

    def one(_: int) -> str:
        return client.chat.completions.create(model="m", messages=USER).choices[0].message.content

    async def tasks() -> list[str]:
        aclient = make_async_client(engine)
        rs = await asyncio.gather(
            *[aclient.chat.completions.create(model="m", messages=USER) for _ in range(16)]
        )
        await aclient.close()
        return [r.choices[0].message.content for r in rs]

    with ThreadPoolExecutor(16) as pool:
        futs = [pool.submit(one, i) for i in range(16)]
        async_out = asyncio.run(tasks())
        sync_out = [f.result() for f in futs]
    assert sync_out == [alone] * 16 and async_out == [alone] * 16


def _flavors() -> list[str]:
    import openai

    # openai 2.x takes only httpx clients; 3.x takes httpx2 and (given it) httpx.
    return ["httpx", "httpx2"] if int(openai.__version__.split(".")[0]) >= 3 else ["httpx"]


@pytest.mark.parametrize("http", _flavors())
def test_no_socket_is_opened(make_client, make_async_client, monkeypatch, http, no_remote):
    """No network: pytest-socket blocks inet sockets suite-wide (asserted here), and a
    guard records every inet socket, DNS lookup and connect while each call style runs."""
    import socket

    import pytest_socket

    with pytest.warns(UserWarning), pytest.raises(pytest_socket.SocketBlockedError):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # the suite-wide block is on

    opened: list[object] = []
    real = socket.socket

    class Guard(real):  # type: ignore[misc, valid-type]
        def __init__(self, family=-1, *a, **kw):
            if family in (socket.AF_INET, socket.AF_INET6, -1):  # not the loop's AF_UNIX pair
                opened.append(("socket", family))
            super().__init__(family, *a, **kw)

    def refuse(name):
        def call(*a, **kw):
            opened.append((name, a))
            raise OSError(f"{name} called in-process")

        return call

    monkeypatch.setattr(socket, "socket", Guard)
    for name in ("getaddrinfo", "create_connection", "gethostbyname"):
        monkeypatch.setattr(socket, name, refuse(name))

    client = make_client(ScriptedEngine(["quiet"]), http=http)
    list(client.chat.completions.create(model="m", messages=USER, stream=True))
    client.chat.completions.create(model="m", messages=USER)
    client.models.list()

    async def go() -> None:
        aclient = make_async_client(ScriptedEngine(["quiet"]), http=http)
        stream = await aclient.chat.completions.create(model="m", messages=USER, stream=True)
        [c async for c in stream]
        await aclient.chat.completions.create(model="m", messages=USER)
        await aclient.close()

    asyncio.run(go())
    assert opened == []
    import httpx  # the guard does see a real client's attempt (past the respx routers)

    no_remote.httpx.route(host="warp.invalid").pass_through()
    with pytest.raises(httpx.ConnectError):
        httpx.get("http://warp.invalid/")
    assert opened
