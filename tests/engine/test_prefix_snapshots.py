"""Prefix snapshots on the real engine: a request's prefill stops at the prefixes it names
(`Engine.stream(prefixes=...)`), each one's state is copied into a free sequence, and a
later prompt that starts with it copies that state instead of prefilling it again.

On a recurrent state (kimi_k3: KDA layers) the longest common prefix of an idle sequence
cannot be rewound, so without snapshots a second request sharing only a system prompt
evaluates all of it (checked here as the control); with them it evaluates only its own
tokens. The attention model (a tiny Qwen3-MoE) must behave the same. Replies are greedy,
so "equals its reply alone" is exact.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tiny import tiny_kimi_k3, tiny_moe
from warp_providers import Engine

SYSTEM = 200


@pytest.fixture(scope="module", params=["kimi_k3", "qwen3_moe"])
def model(request, tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp(f"snap-{request.param}")
    if request.param == "kimi_k3":
        return request.param, tiny_kimi_k3(root, experts="f32")
    return request.param, tiny_moe(root, experts="f32", trunk="f32")


def tokens(v: int, n: int, a: int, b: int) -> list[int]:
    return [(a * t + b) % (v - 20) + 10 for t in range(n)]


def alone(path: Path, prompt: list[int], max_tokens: int = 8) -> list[int]:
    with Engine.open(path, max_sequences=4) as eng:
        return eng.generate(prompt, max_tokens=max_tokens, stop_ids=[]).token_ids


def test_a_shared_system_prompt_is_prefilled_once_beside_another_request(model):
    name, path = model
    with Engine.open(path, max_sequences=4) as eng:
        v = eng.vocab_size
    system = tokens(v, SYSTEM, 13, 5)
    first, second = system + [11, 12, 13], system + [21, 22, 23, 24]
    other = tokens(v, 150, 17, 3)
    want = alone(path, second)
    with Engine.open(path, max_sequences=4) as eng:
        a = eng.generate(first, max_tokens=8, stop_ids=[], prefixes=[SYSTEM])
        done = threading.Event()
        third = threading.Thread(target=lambda: (
            eng.generate(other, max_tokens=32, stop_ids=[], prefixes=[100]), done.set()))
        third.start()
        b = eng.generate(second, max_tokens=8, stop_ids=[], prefixes=[SYSTEM])
        third.join(120)
        assert done.is_set()
    assert a.cached_tokens == 0
    assert b.cached_tokens == SYSTEM
    assert b.stats["prompt_tokens_evaluated"] == len(second) - SYSTEM
    assert b.token_ids == want
    if name == "kimi_k3":  # the control: without a snapshot the recurrent state reuses nothing
        with Engine.open(path, max_sequences=4) as eng:
            eng.generate(first, max_tokens=8, stop_ids=[])
            assert eng.generate(second, max_tokens=8, stop_ids=[]).cached_tokens == 0


def test_the_next_turn_of_a_conversation_reuses_the_turn_before(model):
    _, path = model
    with Engine.open(path, max_sequences=4) as eng:
        v = eng.vocab_size
    system, hand_over = tokens(v, 60, 13, 5), [7, 8]
    turn1 = system + tokens(v, 40, 19, 2)  # the conversation before the hand-over
    prompt1 = turn1 + hand_over
    with Engine.open(path, max_sequences=4) as eng:
        r1 = eng.generate(prompt1, max_tokens=6, stop_ids=[], prefixes=[60, len(turn1)])
        # the reply as the next prompt renders it is not the generated ids (a template
        # rewrites it): only the conversation before the hand-over is a shared prefix
        turn2 = turn1 + tokens(v, 9, 23, 1) + tokens(v, 30, 29, 4)
        prompt2 = turn2 + hand_over
        r2 = eng.generate(prompt2, max_tokens=6, stop_ids=[], prefixes=[60, len(turn2)])
        prompt3 = turn2 + tokens(v, 12, 31, 6) + hand_over
        r3 = eng.generate(prompt3, max_tokens=6, stop_ids=[], prefixes=[60])
    assert r1.cached_tokens == 0
    assert r2.cached_tokens == len(turn1)
    assert r2.stats["prompt_tokens_evaluated"] == len(prompt2) - len(turn1)
    assert r3.cached_tokens == len(turn2)
    assert r1.token_ids == alone(path, prompt1, 6)
    assert r2.token_ids == alone(path, prompt2, 6)
    assert r3.token_ids == alone(path, prompt3, 6)


def test_snapshots_are_evicted_least_recently_used_and_never_change_a_reply(model):
    """Three sequences: two can hold snapshots (sequence 0 has no handle to copy), so of
    three system prompts seen in turn only the latest stays; a hit keeps its snapshot."""
    _, path = model
    with Engine.open(path, max_sequences=4) as eng:
        v = eng.vocab_size
    systems = [tokens(v, SYSTEM, 13 + 4 * k, 5 + k) for k in range(3)]
    got = []
    with Engine.open(path, max_sequences=3) as eng:
        for k, s in enumerate(systems):
            got.append((s + [11 + k], eng.generate(s + [11 + k], max_tokens=4, stop_ids=[],
                                                   prefixes=[SYSTEM])))
        for p in (systems[2] + [40], systems[2] + [41], systems[0] + [42]):
            got.append((p, eng.generate(p, max_tokens=4, stop_ids=[], prefixes=[SYSTEM])))
    assert [r.cached_tokens for _, r in got] == [0, 0, 0, SYSTEM, SYSTEM, 0]
    for p, r in got:
        assert r.token_ids == alone(path, p, 4)
