"""The `warp` stats on SmolLM2: each reply's own, measured one way on both endpoints.

Prompts of different lengths follow each other, so a reply that carried the previous
request's stats breaks `prefill_tokens + cached_tokens == usage.prompt_tokens`.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["Name a colour.", "Name three rivers of Europe, please, in one short line.",
           "Say hi.", "Which planet is the largest one in our solar system? Answer briefly."]


@pytest.fixture(scope="module")
def client(smol_path):
    from warp_openai import warp_openai_client

    c = warp_openai_client(smol_path)
    yield c
    c.close()


def _check(warp: dict, prompt_tokens: int) -> None:
    assert warp["prefill_tokens"] >= 1
    assert warp["prefill_tokens"] + warp["cached_tokens"] == prompt_tokens, warp
    assert warp["prefill_ms"] > 0 and warp["prefill_tok_s"] > 0
    # one definition everywhere: the tokens evaluated over the seconds they took
    assert warp["prefill_tok_s"] == pytest.approx(
        warp["prefill_tokens"] / (warp["prefill_ms"] / 1000.0), rel=0.02)


@pytest.mark.parametrize("stop", [None, [" "]], ids=["plain", "stop_string"])
def test_chat_stats_are_this_replys(client, stop):
    for i, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        if i % 2 == 0:
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=6,
                                               stop=stop)
            _check(r.model_extra["warp"], r.usage.prompt_tokens)
            continue
        chunks = list(client.chat.completions.create(
            model="m", messages=messages, max_tokens=6, stop=stop, stream=True,
            stream_options={"include_usage": True}))
        _check(chunks[-1].model_extra["warp"], chunks[-1].usage.prompt_tokens)


def test_completions_stats_are_this_replys(client):
    for i, prompt in enumerate(PROMPTS):
        if i % 2 == 0:
            r = client.completions.create(model="m", prompt=prompt, max_tokens=4, stop=[" "])
            _check(r.model_extra["warp"], r.usage.prompt_tokens)
            continue
        chunks = list(client.completions.create(
            model="m", prompt=prompt, max_tokens=4, stream=True,
            stream_options={"include_usage": True}))
        last = chunks[-1]
        assert last.choices == [] and "warp" in last.model_extra
        _check(last.model_extra["warp"], last.usage.prompt_tokens)


def test_a_repeated_prompt_reads_as_a_cache_hit(client):
    """The same prompt twice: the second evaluates one token, and says so."""
    messages = [{"role": "user", "content": "Tell me one fact about owls."}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
    chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=2,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    again = chunks[-1].model_extra["warp"]
    assert first.model_extra["warp"]["prefill_tokens"] > 1
    assert again["prefill_tokens"] == 1
    assert again["cached_tokens"] == chunks[-1].usage.prompt_tokens - 1
