"""Cancellation on the real engine, asserted from its own counters.

`Engine.stats()["tokens"]` counts every position the engine evaluated (prompt and
decode). With the context reset first, a request evaluates its whole prompt, then one
position per generated token after the first (which comes from the prompt's logits):
tokens produced = evaluated - prompt + 1. SmolLM2 (a real BPE vocabulary, greedy English)
gives one chunk per token, so "2 chunks" is one token; the bound allows the one-chunk
read-ahead of the async bridge.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from warp_providers.session import ChatSession

pytestmark = pytest.mark.slow

LONG = [{"role": "user", "content": "Tell me a long story about the sea."}]


def _prompt_tokens(engine, messages) -> int:
    return len(ChatSession(engine).prepare({"messages": messages}).ids)


def _idle(engine, timeout: float = 10.0) -> None:
    """Waits until no request is running or waiting on the engine."""
    assert engine.idle(timeout), "the engine stayed busy"


class Counter:
    """Tokens the engine produced for one request, from `Engine.stats()` deltas."""

    def __init__(self, engine, messages) -> None:
        self.engine = engine
        self.prompt = _prompt_tokens(engine, messages)
        engine.reset()  # the whole prompt is evaluated: no prefix from an earlier request
        self.before = engine.stats()["tokens"]

    def produced(self) -> int:
        _idle(self.engine)
        return self.engine.stats()["tokens"] - self.before - self.prompt + 1


def _next_request_succeeds(client, model_id) -> None:
    r = client.chat.completions.create(model=model_id, messages=LONG, max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2


def test_close_after_two_chunks(connect, smol_path):
    target = connect(smol_path)
    count = Counter(target.engine, LONG)
    stream = target.client.chat.completions.create(
        model=target.model_id, messages=LONG, max_tokens=200, stream=True
    )
    got = []
    for chunk in stream:
        got.append(chunk)
        if len(got) == 2:
            break
    stream.close()
    assert got[0].choices[0].delta.role == "assistant" and got[1].choices[0].delta.content
    assert 1 <= count.produced() <= 3
    _next_request_succeeds(target.client, target.model_id)


def test_async_close_after_two_chunks(connect, smol_path):
    target = connect(smol_path)

    async def go() -> int:
        client = target.aclient()
        count = Counter(target.engine, LONG)
        stream = await client.chat.completions.create(
            model=target.model_id, messages=LONG, max_tokens=200, stream=True
        )
        n = 0
        async for _ in stream:
            n += 1
            if n == 2:
                break
        await stream.close()
        produced = await asyncio.to_thread(count.produced)
        r = await client.chat.completions.create(model=target.model_id, messages=LONG, max_tokens=2)
        assert r.usage.completion_tokens == 2
        await client.close()
        return produced

    assert 1 <= asyncio.run(asyncio.wait_for(go(), 60)) <= 3


def test_async_task_cancellation(connect, smol_path):
    """Cancelling the task of a blocking create stops the engine at its next token."""
    target = connect(smol_path)
    limit = 1000

    async def go() -> tuple[int, int, float]:
        client = target.aclient()
        count = Counter(target.engine, LONG)
        task = asyncio.ensure_future(
            client.chat.completions.create(model=target.model_id, messages=LONG, max_tokens=limit)
        )
        await asyncio.sleep(0.6)
        # the engine's counter at the moment of cancelling (read without waiting for it)
        at_cancel = target.engine.stats()["tokens"] - count.before - count.prompt + 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t0 = time.monotonic()
        produced = await asyncio.to_thread(count.produced)
        await client.close()
        return at_cancel, produced, time.monotonic() - t0

    at_cancel, produced, freed_after = asyncio.run(asyncio.wait_for(go(), 60))
    # no decode speed assumed: after the cancel, at most the token in flight is finished
    assert at_cancel < limit and produced - max(at_cancel, 0) <= 2, (at_cancel, produced)
    assert freed_after < 2.0
    _next_request_succeeds(target.client, target.model_id)


# --------------------------------------------------------------------------- server
def _send(url: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer sk-warp-test\r\n"
        b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
    )
    return s


@pytest.mark.enable_socket
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "blocking"])
def test_server_client_disconnect_stops_generation(connect, smol_path, stream):
    target = connect(smol_path, "http")
    count = Counter(target.engine, LONG)
    limit = 1000  # far more than this model decodes in the half second before hanging up
    s = _send(target.url, {"messages": LONG, "max_tokens": limit, "stream": stream})
    if stream:  # the status line and the first event, then hang up
        assert s.recv(64).startswith(b"HTTP/1.1 200")
    else:  # the reply is not written before generation ends: hang up mid-generation
        time.sleep(0.5)
    at_close = target.engine.stats()["tokens"] - count.before - count.prompt + 1
    s.close()
    t0 = time.monotonic()
    produced = count.produced()
    # generation stopped promptly (no decode speed assumed): the server notices the
    # hang-up between two tokens, so only a few more are produced after it
    assert time.monotonic() - t0 < 2.0 and produced - max(at_close, 0) <= 4, (at_close, produced)
    _next_request_succeeds(target.client, target.model_id)
