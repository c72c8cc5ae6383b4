"""The scheduler behind `Engine.stream`, against the multi-sequence Context double.

The double's logits are a function of each sequence's token history, so the oracle is the
maths written out: greedy decoding takes argmax(logits_after(prompt + generated)). A
request that saw another's tokens, sampler or constraint would reply differently, and the
double's record of evaluations shows what was batched and what each sequence prefilled.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fake_context import FakeBatchContext, FakeSingleContext, logits_after
from fake_context import engine_on as engine
from fake_engine import make_tokenizer

from warp_providers import Engine
from warp_providers.errors import MemoryBudgetError
from warp_providers.session import ChatSession

V = make_tokenizer().vocab_size


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def greedy(ids: Sequence[int], n: int) -> list[int]:
    """The oracle: n greedy tokens after ids."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits_after(list(ids) + out, V))))
    return out


def together(eng: Engine, prompts: list[list[int]], n: int, **kw) -> list:
    """Results of generating every prompt at once, one thread each."""
    start = threading.Barrier(len(prompts))

    def one(p: list[int]):
        start.wait(10)
        return eng.generate(p, max_tokens=n, stop_ids=[], **kw)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(one, p) for p in prompts]]


def test_batched_replies_equal_the_oracle_and_replies_alone():
    prompts = [prompt(i, 3 + 17 * i) for i in range(8)]
    ctx = FakeBatchContext(V, max_sequences=8, step_seconds=0.002)
    got = together(engine(ctx), prompts, 12)
    alone_eng = engine(FakeBatchContext(V, max_sequences=1))
    for p, r in zip(prompts, got):
        alone = alone_eng.generate(p, max_tokens=12, stop_ids=[])
        assert r.token_ids == greedy(p, 12) == alone.token_ids
        assert r.finish_reason == "length" and r.prompt_tokens == len(p)
        assert r.stats["tokens"] == len(p) + 11  # its own share: prompt + decoded tokens
    sizes = ctx.batch_sizes()
    assert max(sizes) >= 4, sizes  # the requests really were evaluated together
    assert len(sizes) < sum(len(p) > 0 for p in prompts) * 12, sizes


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_decode_steps():
    ctx = FakeBatchContext(V, max_sequences=4, step_seconds=0.003)
    eng = engine(ctx, prefill_chunk=16)
    short = [prompt(i, 4) for i in range(3)]
    long = prompt(99, 120)
    results: dict[str, object] = {}

    def run_short(i: int) -> None:
        results[f"s{i}"] = eng.generate(short[i], max_tokens=40, stop_ids=[])

    threads = [threading.Thread(target=run_short, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    while eng._sched.counts()[0] < 3:
        time.sleep(0.001)
    results["long"] = eng.generate(long, max_tokens=3, stop_ids=[])
    for t in threads:
        t.join(30)
    assert results["long"].token_ids == greedy(long, 3)
    for i in range(3):
        assert results[f"s{i}"].token_ids == greedy(short[i], 40)
    # the long prompt's chunks (16 tokens) shared their steps with the others' decode tokens
    mixed = [c for c in ctx.calls if any(len(t) == 16 for _, t in c) and len(c) > 1]
    assert len(mixed) >= 120 // 16 - 1, ctx.batch_sizes()
    assert all(len(t) <= 16 for c in ctx.calls for _, t in c if len(c) > 1)


def test_cancelled_and_failing_requests_leave_the_others_unchanged():
    ctx = FakeBatchContext(V, max_sequences=8, step_seconds=0.002, refuse=frozenset({260}))
    eng = engine(ctx)
    prompts = [prompt(40 + i, 5 + i) for i in range(6)]
    bad_input = [1, 2, 260, 3]
    outcome: dict[str, object] = {}
    start = threading.Barrier(10)

    def good(i: int) -> None:
        start.wait(10)
        outcome[f"good{i}"] = eng.generate(prompts[i], max_tokens=16, stop_ids=[])

    def closes_early() -> None:
        start.wait(10)
        events = eng.stream(prompt(7, 9), max_tokens=50, stop_ids=[])
        for i, _ in enumerate(events):
            if i == 2:
                break
        events.close()
        outcome["closed"] = eng.last_result

    def should_stop() -> None:
        start.wait(10)
        seen: list[int] = []
        for ev in eng.stream(prompt(8, 6), max_tokens=50, stop_ids=[],
                             should_stop=lambda: len(seen) >= 4):
            seen.append(ev.token_id)
        outcome["stopped"] = eng.last_result

    def raising_processor() -> None:
        start.wait(10)

        def proc(generated, logits):
            if len(generated) == 3:
                raise RuntimeError("grammar broke")

        try:
            eng.generate(prompt(9, 7), max_tokens=20, stop_ids=[], processors=[proc])
        except RuntimeError as exc:
            outcome["raised"] = exc

    def refused_input() -> None:
        start.wait(10)
        try:
            eng.generate(bad_input, max_tokens=5, stop_ids=[])
        except ValueError as exc:
            outcome["refused"] = exc

    workers = [threading.Thread(target=good, args=(i,)) for i in range(6)] + [
        threading.Thread(target=f) for f in (closes_early, should_stop, raising_processor,
                                             refused_input)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    for i in range(6):
        assert outcome[f"good{i}"].token_ids == greedy(prompts[i], 16)
    closed = outcome["closed"]
    assert closed.finish_reason == "cancelled" and len(closed.token_ids) == 3
    assert closed.token_ids == greedy(prompt(7, 9), 3)
    stopped = outcome["stopped"]
    assert stopped.finish_reason == "cancelled" and len(stopped.token_ids) == 4
    assert str(outcome["raised"]) == "grammar broke"
    assert "refused" in str(outcome["refused"])
    assert max(ctx.batch_sizes()) > 1
    # the engine still serves after all that
    assert eng.generate(prompts[0], max_tokens=4, stop_ids=[]).token_ids == greedy(prompts[0], 4)


def test_64_concurrent_callers_threads_and_asyncio_tasks_all_correct():
    ctx = FakeBatchContext(V, max_sequences=8, step_seconds=0.001)
    eng = engine(ctx)
    session = ChatSession(eng)
    requests = [[{"role": "user", "content": f"question {i}: {'x' * (i % 7)}"}]
                for i in range(64)]
    alone_session = ChatSession(engine(FakeBatchContext(V, max_sequences=1)))
    want = [alone_session.complete(r, max_tokens=10 + i % 5) for i, r in enumerate(requests)]

    def in_thread(i: int):
        return session.complete(requests[i], max_tokens=10 + i % 5)

    async def in_task(i: int):
        text, result = "", None
        async for chunk in session.astream(requests[i], max_tokens=10 + i % 5):
            text += chunk.delta.content
            result = chunk.result or result
        assert text == (result.message.content or "")
        return result

    async def tasks():
        return await asyncio.wait_for(asyncio.gather(*[in_task(i) for i in range(32, 64)]), 60)

    t0 = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(in_thread, i) for i in range(32)]
        from_tasks = asyncio.run(tasks())
        from_threads = [f.result(timeout=60) for f in futures]
    assert time.monotonic() - t0 < 60
    for i, got in enumerate(from_threads + from_tasks):
        assert got.message == want[i].message, i
        assert got.usage.completion_tokens == want[i].usage.completion_tokens, i
    assert max(ctx.batch_sizes()) >= 4
    assert eng.idle(5)


def test_requests_beyond_max_sequences_wait_first_come_first_served():
    ctx = FakeBatchContext(V, max_sequences=2, step_seconds=0.002)
    eng = engine(ctx)
    prompts = [[200 + i] + prompt(60 + i, 5) for i in range(7)]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = eng.generate(prompts[i], max_tokens=6 + 3 * (i % 2), stop_ids=[])

    threads = []
    for i in range(7):  # submitted one after the other: 2 run, the rest queue in order
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
        while sum(eng._sched.counts()) + len(results) < i + 1:
            time.sleep(0.0005)
    for t in threads:
        t.join(30)
    assert all(results[i].token_ids == greedy(prompts[i], 6 + 3 * (i % 2)) for i in range(7))
    first_seen = []
    for call in ctx.calls:
        for _, toks in call:
            if len(toks) > 1 and toks[0] >= 200 and toks[0] not in first_seen:
                first_seen.append(toks[0])
    assert first_seen == [200 + i for i in range(7)]
    assert max(ctx.batch_sizes()) == 2


def test_a_shared_200_token_prefix_is_prefilled_once_across_sequences():
    shared = prompt(1, 200)
    first, second = shared + prompt(2, 7), shared + prompt(3, 9)
    other = [250] + prompt(4, 150)
    ctx = FakeBatchContext(V, max_sequences=4, step_seconds=0.002)
    eng = engine(ctx)
    a, c = together(eng, [first, other], 8)
    n_calls = len(ctx.calls)
    b = eng.generate(second, max_tokens=8, stop_ids=[])
    assert a.cached_tokens == c.cached_tokens == 0
    assert b.cached_tokens == 200 and b.stats["prompt_tokens_evaluated"] == 9
    assert b.stats["tokens"] == 9 + 7
    later = [t for call in ctx.calls[n_calls:] for _, t in call]
    assert later[0] == second[200:] and all(len(t) == 1 for t in later[1:])
    alone = engine(FakeBatchContext(V, max_sequences=1)).generate(second, max_tokens=8,
                                                                   stop_ids=[])
    assert b.token_ids == alone.token_ids == greedy(second, 8)


def test_a_request_copies_the_state_of_a_running_sequence_sharing_its_prefix():
    shared = prompt(21, 120)
    first, second = shared + prompt(22, 6), shared + prompt(23, 4)
    ctx = FakeBatchContext(V, max_sequences=3, step_seconds=0.002)
    eng = engine(ctx)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(a=eng.generate(first, max_tokens=40,
                                                                  stop_ids=[])))
    t.start()
    while sum(len(toks) for call in ctx.calls for _, toks in call) < len(first) + 3:
        time.sleep(0.0005)  # the first request is decoding
    n_calls = len(ctx.calls)
    b = eng.generate(second, max_tokens=6, stop_ids=[])
    t.join(30)
    assert b.cached_tokens == 120 and b.token_ids == greedy(second, 6)
    assert box["a"].token_ids == greedy(first, 40)  # the donor is untouched
    later = [len(toks) for call in ctx.calls[n_calls:] for _, toks in call]
    assert max(later) == 4  # its prefill: only the tokens after the shared prefix


def _beside_a_decoding_request(sequences: int, p: list[int], boundary: int):
    """`p` (snapshot boundary at `boundary`) generated while another request decodes on an
    engine of `sequences` sequences; returns its result, its rows and the calls they were in."""
    ctx = FakeBatchContext(V, max_sequences=sequences, step_seconds=0.002)
    eng = engine(ctx)
    other = [251] + prompt(31, 10)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(a=eng.generate(other, max_tokens=60,
                                                                  stop_ids=[])))
    t.start()
    while sum(len(toks) for call in ctx.calls for _, toks in call) < len(other) + 3:
        time.sleep(0.0005)  # the other request is decoding
    n_calls = len(ctx.calls)
    r = eng.generate(p, max_tokens=6, stop_ids=[], prefixes=[boundary])
    t.join(30)
    assert box["a"].token_ids == greedy(other, 60)
    later = ctx.calls[n_calls:]
    mine = [(call, toks) for call in later for _, toks in call if len(toks) > 1]
    return r, mine


def test_a_prefill_goes_past_a_boundary_when_no_sequence_is_free_for_its_snapshot():
    p = prompt(32, 40)
    # three sequences: the two with a handle busy, and sequence 0 cannot hold a copy, so
    # no snapshot could be taken at the boundary: the whole prompt is evaluated in one
    # row of a step, beside the other's decode row
    r, mine = _beside_a_decoding_request(3, p, 25)
    assert [toks for _, toks in mine] == [p]
    assert len(mine[0][0]) == 2
    assert r.token_ids == greedy(p, 6) and r.cached_tokens == 0
    # the control: with a free sequence the prefill stops at the boundary for a snapshot
    r, mine = _beside_a_decoding_request(4, p, 25)
    assert [toks for _, toks in mine] == [p[:25], p[25:]]
    assert r.token_ids == greedy(p, 6)


def test_idle_sequences_are_evicted_least_recently_used_first():
    ctx = FakeBatchContext(V, max_sequences=2)
    eng = engine(ctx)
    p = {k: [k] + prompt(k, 30) for k in (10, 20, 30)}
    for k in (10, 20, 30):  # 30 takes the sequence 10 left longest ago
        assert eng.generate(p[k] + [1], max_tokens=2, stop_ids=[]).cached_tokens == 0
    assert eng.generate(p[20] + [2], max_tokens=2, stop_ids=[]).cached_tokens == 31
    assert eng.generate(p[30] + [2], max_tokens=2, stop_ids=[]).cached_tokens == 31
    assert eng.generate(p[10] + [2], max_tokens=2, stop_ids=[]).cached_tokens == 0


def test_a_recurrent_state_reuses_a_prefix_only_when_nothing_follows_it():
    ctx = FakeBatchContext(V, max_sequences=2, recurrent=True)
    eng = engine(ctx)
    base = prompt(5, 40)
    r1 = eng.generate(base, max_tokens=4, stop_ids=[])
    # the next turn extends what the sequence holds (prompt + 3 evaluated reply tokens)
    turn = base + r1.token_ids + prompt(6, 5)
    r2 = eng.generate(turn, max_tokens=4, stop_ids=[])
    assert r2.cached_tokens == 40 + 3 and r2.token_ids == greedy(turn, 4)
    branch = base[:20] + prompt(7, 10)  # would need a rewind: starts over instead
    r3 = eng.generate(branch, max_tokens=4, stop_ids=[])
    assert r3.cached_tokens == 0 and r3.token_ids == greedy(branch, 4)


def test_without_eval_batch_requests_run_one_at_a_time_on_the_single_state():
    ctx = FakeSingleContext(V, step_seconds=0.001)
    eng = engine(ctx)
    assert eng.info()["max_sequences"] == 1
    prompts = [prompt(70 + i, 6 + i) for i in range(5)]
    got = together(eng, prompts, 7)
    assert [r.token_ids for r in got] == [greedy(p, 7) for p in prompts]
    assert set(ctx.batch_sizes()) == {1}
    again = eng.generate(prompts[0] + [9], max_tokens=2, stop_ids=[])
    assert again.cached_tokens in (0, len(prompts[0]))  # whichever ran last is held


def test_low_level_calls_act_on_sequence_0_between_steps():
    ctx = FakeBatchContext(V, max_sequences=3, step_seconds=0.002)
    eng = engine(ctx)
    p = prompt(11, 12)
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(r=eng.generate(p, max_tokens=30,
                                                                  stop_ids=[])))
    t.start()
    while not ctx.calls:
        time.sleep(0.0005)
    ids = prompt(12, 5)
    rows = eng.prompt_logits(ids)  # sequence 0, while the other request decodes
    t.join(30)
    assert np.array_equal(rows[-1], logits_after(ids, V))
    assert box["r"].token_ids == greedy(p, 30)
    # the next stream of a prompt starting with those ids reuses sequence 0
    assert eng.generate(ids + [3], max_tokens=2, stop_ids=[]).cached_tokens == 5


def test_close_cancels_the_generations_in_progress():
    ctx = FakeBatchContext(V, max_sequences=2, step_seconds=0.002)
    eng = engine(ctx)
    got: list[int] = []
    box: dict[str, object] = {}

    def consume() -> None:
        for ev in eng.stream(prompt(13, 4), max_tokens=10_000, stop_ids=[]):
            got.append(ev.token_id)
        box["r"] = eng.last_result

    t = threading.Thread(target=consume)
    t.start()
    while len(got) < 3:
        time.sleep(0.001)
    eng.close()
    t.join(10)
    assert not t.is_alive() and box["r"].finish_reason == "cancelled"
    assert 3 <= len(box["r"].token_ids) < 10_000
    with pytest.raises(ValueError, match="closed"):
        eng.generate([1, 2], max_tokens=1)


class _Binding:
    """A binding whose Context holds at most `fits` sequences in its budget."""

    def __init__(self, fits: int, sequences: bool = True) -> None:
        self.opened: list[dict] = []
        binding = self

        class Context:
            def __init__(self, where: str, opts: dict) -> None:
                binding.opened.append(dict(opts))
                if opts.get("max_sequences", 1) > fits:
                    raise MemoryBudgetError(f"{opts['max_sequences']} states exceed it")

        if sequences:
            Context.seq_open = lambda self: None  # type: ignore[attr-defined]
        self.Context = Context


def test_the_default_sequences_shrink_to_what_the_budget_holds():
    from warp_providers.engine import DEFAULT_SEQUENCES, _open_context

    b = _Binding(fits=2)
    _open_context(b, "m.warp", {"budget_bytes": None})
    assert [o["max_sequences"] for o in b.opened] == [DEFAULT_SEQUENCES, 2]
    with pytest.raises(MemoryBudgetError, match="max_sequences=3.*lower max_sequences"):
        _open_context(_Binding(fits=2), "m.warp", {"max_sequences": 3})
    none = _Binding(fits=0)
    with pytest.raises(MemoryBudgetError, match="1 states"):
        _open_context(none, "m.warp", {})
    assert [o["max_sequences"] for o in none.opened] == [DEFAULT_SEQUENCES, 2, 1]


def test_a_binding_without_sequences_opens_one_and_refuses_more():
    from warp_providers.engine import _open_context

    b = _Binding(fits=1, sequences=False)
    _open_context(b, "m.warp", {"max_sequences": 1})
    assert b.opened == [{}]  # the option never reaches a binding that does not know it
    with pytest.raises(ValueError, match="max_sequences=2: this build"):
        _open_context(b, "m.warp", {"max_sequences": 2})


def test_the_worker_thread_ends_when_idle_and_restarts_for_the_next_request():
    from warp_providers.scheduler import IDLE_EXIT_SECONDS

    eng = engine(FakeBatchContext(V, max_sequences=2))
    p = prompt(31, 6)
    assert eng.generate(p, max_tokens=3, stop_ids=[]).token_ids == greedy(p, 3)
    deadline = time.monotonic() + 10 * IDLE_EXIT_SECONDS
    while eng._sched._worker is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert eng._sched._worker is None
    assert eng.generate(p + [1], max_tokens=3, stop_ids=[]).token_ids == greedy(p + [1], 3)
    assert eng._sched._worker is not None and eng._sched._worker.is_alive()
