"""The scheduler on the real engine: concurrent generations batched on one context.

Greedy decoding makes "the same reply as alone" exact. Each test checks that the engine
really batched (`Engine.batching()`: steps of more than one sequence), so a scheduler that
fell back to one request at a time would fail here even when its replies are right.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from real_models import smollm2
from tiny import tiny_moe
from warp_providers import Engine, plan_memory

N = 8


def prompts(vocab: int, n: int = N) -> list[list[int]]:
    """n prompts of different lengths (3 .. 3 + 9(n-1) tokens), none a prefix of another."""
    return [[(31 * i + 7 * t + 11) % (vocab - 20) + 10 for t in range(3 + 9 * i)]
            for i in range(n)]


def run_together(eng: Engine, bodies: list[dict]) -> list:
    start = threading.Barrier(len(bodies))

    def one(body: dict):
        start.wait(30)
        return eng.generate(**body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return [f.result(timeout=300) for f in [pool.submit(one, b) for b in bodies]]


def check_batched_equals_alone(path: Path, max_tokens: int) -> None:
    with Engine.open(path, max_sequences=N) as eng:
        bodies = [dict(prompt=p, max_tokens=max_tokens, stop_ids=[])
                  for p in prompts(eng.vocab_size)]
        alone = [eng.generate(**b).token_ids for b in bodies]
        before = eng.batching()
        together = run_together(eng, bodies)
        after = eng.batching()
    assert [r.token_ids for r in together] == alone
    assert all(len(r.token_ids) == max_tokens for r in together)
    assert after["widest"] >= 4, after
    steps = after["steps"] - before["steps"]
    assert (after["sequences"] - before["sequences"]) / steps > 2, (before, after)


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    return tiny_moe(tmp_path_factory.mktemp("sched"), experts="f32", trunk="f32")


def test_eight_concurrent_requests_batched_equal_alone_on_a_tiny_moe(moe):
    check_batched_equals_alone(moe, max_tokens=12)


def test_eight_concurrent_requests_batched_equal_alone_on_smollm2(tmp_path):
    check_batched_equals_alone(smollm2(tmp_path), max_tokens=12)


def test_cancelled_and_failing_requests_leave_the_others_unchanged(moe):
    with Engine.open(moe, max_sequences=N) as eng:
        ps = prompts(eng.vocab_size)
        alone = [eng.generate(p, max_tokens=16, stop_ids=[]).token_ids for p in ps]
        seen = {"n": 0}

        def explode(ids, logits):
            if len(ids) == 5:
                raise RuntimeError("a processor that fails at its sixth token")

        def stop_after_four() -> bool:
            seen["n"] += 1
            return seen["n"] > 4

        bodies = [dict(prompt=p, max_tokens=16, stop_ids=[]) for p in ps]
        bodies[2]["should_stop"] = stop_after_four
        bodies[5]["processors"] = [explode]
        start = threading.Barrier(N)

        def one(i: int):
            start.wait(30)
            try:
                return eng.generate(**bodies[i])
            except RuntimeError as exc:
                return exc

        with ThreadPoolExecutor(N) as pool:
            got = [f.result(timeout=300) for f in [pool.submit(one, i) for i in range(N)]]
        assert eng.batching()["widest"] > 2
    assert isinstance(got[5], RuntimeError) and "sixth token" in str(got[5])
    assert got[2].finish_reason == "cancelled"
    assert got[2].token_ids == alone[2][:len(got[2].token_ids)] and len(got[2].token_ids) < 16
    for i in set(range(N)) - {2, 5}:
        assert got[i].token_ids == alone[i], f"request {i} changed beside a cancel and a failure"


def test_a_shared_prefix_is_prefilled_once_beside_another_request(moe):
    with Engine.open(moe, max_sequences=4) as eng:
        v = eng.vocab_size
        prefix = [(13 * t + 5) % (v - 20) + 10 for t in range(200)]
        first, second = prefix + [11, 12, 13], prefix + [21, 22, 23, 24]
        other = [(17 * t + 3) % (v - 20) + 10 for t in range(150)]
        want = eng.generate(second, max_tokens=8, stop_ids=[]).token_ids
    with Engine.open(moe, max_sequences=4) as eng:
        a = eng.generate(first, max_tokens=8, stop_ids=[])
        done = threading.Event()
        third = threading.Thread(
            target=lambda: (eng.generate(other, max_tokens=64, stop_ids=[]), done.set()))
        third.start()
        b = eng.generate(second, max_tokens=8, stop_ids=[])
        third.join(120)
        assert done.is_set()
    assert a.cached_tokens == 0
    assert b.cached_tokens == 200
    assert b.stats["prompt_tokens_evaluated"] == len(second) - 200
    assert b.token_ids == want


RSS_CHILD = r"""
import json, sys, threading
from warp_providers import Engine
from warp_providers.tokenizer import Tokenizer
path, budget = sys.argv[1], int(sys.argv[2])
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
base = rss()
# the tokenizer is the Python side's (the `tokenizers` vocabulary), not the engine's: the
# engine loads its own copy, of the size measured here
kept = Tokenizer.from_dir(path)
tokenizer = rss() - base
with Engine.open(path, budget=budget, ctx=1024, max_sequences=8) as eng:
    prompts = [[(31 * i + 7 * t + 11) % 4000 + 10 for t in range(40 + 30 * i)] for i in range(8)]
    ts = [threading.Thread(target=eng.generate, args=(p,), kwargs=dict(max_tokens=24))
          for p in prompts]
    [t.start() for t in ts]
    [t.join() for t in ts]
    widest = eng.batching()["widest"]
    peak_engine = eng.stats()["peak_bytes"]
# VmHWM, this process's own high-water mark: ru_maxrss would carry the forking parent's
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
print(json.dumps({"base": base, "peak": peak, "widest": widest, "engine": peak_engine,
                  "tokenizer": tokenizer}))
"""


def test_eight_sequences_at_their_floor_stay_within_the_budget(tmp_path):
    path = smollm2(tmp_path)
    floor = plan_memory(path, ctx=1024, max_sequences=8)["floor_bytes"]
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path), str(floor)],
                         capture_output=True, text=True, timeout=600, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["widest"] > 1
    assert r["engine"] <= floor
    # what the process gained over the interpreter and its imports, less the two
    # tokenizers (the test's own and the engine's copy)
    assert r["peak"] - r["base"] - 2 * r["tokenizer"] <= floor + (64 << 20), r


def test_reset_forgets_the_prefixes_every_idle_sequence_holds(moe):
    with Engine.open(moe, max_sequences=4) as eng:
        p = prompts(eng.vocab_size)[3]
        first = eng.generate(p, max_tokens=4, stop_ids=[])
        assert eng.generate(p, max_tokens=4, stop_ids=[]).cached_tokens == len(p) - 1
        eng.reset()
        again = eng.generate(p, max_tokens=4, stop_ids=[])
    assert again.cached_tokens == 0
    assert again.stats["prompt_tokens_evaluated"] == len(p)
    assert again.token_ids == first.token_ids
