"""Every surface submits to the scheduler: concurrent calls are batched, never serialised.

Each surface (the OpenAI transport sync and async, ChatWarp, the LlamaIndex LLM) sends
concurrent requests to one engine over the multi-sequence Context double; each reply must
equal the same request answered alone, and the double's record must show steps that
evaluated several sequences at once (a lock above the engine would leave one per step).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from fake_context import FakeBatchContext
from fake_context import engine_on as engine
from fake_engine import make_tokenizer

V = make_tokenizer().vocab_size
V_SEQ = 8


def questions(n: int) -> list[str]:
    return [f"question {i}: {'why ' * (i % 5)}?" for i in range(n)]


def batched(ctx: FakeBatchContext) -> int:
    return max(ctx.batch_sizes())


def run_threads(fn, n: int) -> list:
    start = threading.Barrier(n)

    def one(i: int):
        start.wait(10)
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=60) for f in [pool.submit(one, i) for i in range(n)]]


def test_openai_transport_threads_and_tasks_are_batched_and_correct():
    from warp_openai import warp_async_openai_client, warp_openai_client

    ctx = FakeBatchContext(V, max_sequences=V_SEQ, step_seconds=0.003)
    eng = engine(ctx)
    alone = warp_openai_client(engine=engine(FakeBatchContext(V, max_sequences=1)))
    qs = questions(64)

    def body(i: int) -> dict:
        return {"model": "fake", "messages": [{"role": "user", "content": qs[i]}],
                "max_tokens": 6 + i % 4}

    want = [alone.chat.completions.create(**body(i)).choices[0].message.content
            for i in range(64)]
    client = warp_openai_client(engine=eng)
    from_threads = run_threads(
        lambda i: client.chat.completions.create(**body(i)).choices[0].message.content, 32)

    async def task(aclient, i: int) -> str:
        if i % 2:
            stream = await aclient.chat.completions.create(**body(i), stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
        reply = await aclient.chat.completions.create(**body(i))
        return reply.choices[0].message.content

    async def tasks() -> list[str]:
        aclient = warp_async_openai_client(engine=eng)
        try:
            return list(await asyncio.wait_for(
                asyncio.gather(*[task(aclient, i) for i in range(32, 64)]), 60))
        finally:
            await aclient.close()

    from_tasks = asyncio.run(tasks())
    assert from_threads + from_tasks == want
    assert batched(ctx) >= 4, ctx.batch_sizes()


def test_chat_warp_concurrent_invokes_are_batched_and_correct():
    from langchain_warp import ChatWarp

    ctx = FakeBatchContext(V, max_sequences=V_SEQ, step_seconds=0.003)
    llm = ChatWarp(engine=engine(ctx), max_tokens=8)
    alone = ChatWarp(engine=engine(FakeBatchContext(V, max_sequences=1)), max_tokens=8)
    qs = questions(8)
    want = [alone.invoke(q).content for q in qs]
    assert run_threads(lambda i: llm.invoke(qs[i]).content, 8) == want
    assert batched(ctx) >= 2, ctx.batch_sizes()

    async def together() -> list[str]:
        return [m.content for m in await asyncio.gather(*[llm.ainvoke(q) for q in qs])]

    n = len(ctx.calls)
    assert asyncio.run(together()) == want
    assert max(len(c) for c in ctx.calls[n:]) >= 2


def test_llamaindex_warp_concurrent_calls_are_batched_and_correct():
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.warp import Warp

    ctx = FakeBatchContext(V, max_sequences=V_SEQ, step_seconds=0.003)
    llm = Warp(engine=engine(ctx), max_tokens=8)
    alone = Warp(engine=engine(FakeBatchContext(V, max_sequences=1)), max_tokens=8)
    qs = questions(8)
    want = [alone.chat([ChatMessage(role="user", content=q)]).message.content for q in qs]
    got = run_threads(
        lambda i: llm.chat([ChatMessage(role="user", content=qs[i])]).message.content, 8)
    assert got == want
    assert batched(ctx) >= 2, ctx.batch_sizes()
