"""Concurrency on one shared real model: 32 threads + 32 asyncio tasks at once.

Every request has its own prompt and kind (blocking, streamed, JSON-constrained, a forced
tool call), so a request that saw another's context (the prompt cache), grammar state,
sampler or result would reply differently from when it runs alone. Greedy decoding makes
"the same reply" exact: content, tool calls, finish reason and token counts. The engine's
scheduler must have batched them (steps of several sequences), in-process and over HTTP.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

N = 32
PAINT = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "glossy": {"type": "boolean"}},
    "required": ["color", "glossy"],
    "additionalProperties": False,
}
COUNT = {
    "type": "function",
    "function": {
        "name": "count",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["n"],
            "additionalProperties": False,
        },
    },
}


def request(i: int, model: str) -> dict:
    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {i}: describe item {i * 7}."}],
        "max_tokens": 24 + i % 5,
    }
    kind = i % 4
    if kind == 1:
        body.update(stream=True, stream_options={"include_usage": True})
    elif kind == 2:
        body.update(
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PAINT}},
            max_tokens=400,
        )
    elif kind == 3:
        body.update(tools=[COUNT], tool_choice="required", max_tokens=400)
    return body


def summary(body: dict, reply) -> tuple:
    """What a reply said: content, tool calls, finish reason, usage."""
    if body.get("stream"):
        chunks = list(reply) if not isinstance(reply, list) else reply
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c for c in chunks if c.choices][-1].choices[0].finish_reason
        usage = chunks[-1].usage
        return (text, (), finish, usage.prompt_tokens, usage.completion_tokens)
    msg = reply.choices[0].message
    calls = tuple((c.function.name, c.function.arguments) for c in msg.tool_calls or [])
    return (
        msg.content,
        calls,
        reply.choices[0].finish_reason,
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )


def test_threads_and_tasks_at_once_match_alone(connect, moe_path, via):
    from warp_providers.models import shared_engine

    target = connect(moe_path, via)
    assert target.engine is shared_engine(moe_path)  # every client below shares it
    bodies = [request(i, target.model_id) for i in range(2 * N)]
    alone = [summary(b, target.client.chat.completions.create(**b)) for b in bodies]
    texts = [a[0] for i, a in enumerate(alone) if i % 4 < 2]
    assert len(set(texts)) > len(texts) // 2, "the text replies should mostly differ"

    start = threading.Event()

    def in_thread(i: int) -> tuple:
        start.wait(30)
        return summary(bodies[i], target.client.chat.completions.create(**bodies[i]))

    async def in_task(client, i: int) -> tuple:
        b = bodies[i]
        reply = await client.chat.completions.create(**b)
        if b.get("stream"):
            reply = [c async for c in reply]
        return summary(b, reply)

    async def tasks() -> list[tuple]:
        client = target.aclient()
        pending = [asyncio.ensure_future(in_task(client, i)) for i in range(N, 2 * N)]
        await asyncio.sleep(0)
        start.set()  # the threads and the tasks go together
        out = await asyncio.gather(*pending)
        await client.close()
        return list(out)

    before = target.engine.batching()
    with ThreadPoolExecutor(N) as pool:
        futures = [pool.submit(in_thread, i) for i in range(N)]
        from_tasks = asyncio.run(asyncio.wait_for(tasks(), 120))
        from_threads = [f.result(timeout=120) for f in futures]
    together = from_threads + from_tasks
    after = target.engine.batching()
    assert after["widest"] > 1, "the concurrent requests were never batched"
    steps = after["steps"] - before["steps"]
    mean = (after["sequences"] - before["sequences"]) / steps
    assert mean > 1.5, f"{steps} steps averaged {mean:.2f} sequences: hardly batched"
    for i, (got, want) in enumerate(zip(together, alone)):
        assert got == want, f"request {i} ({bodies[i]}) changed when run concurrently"
