"""ChatSession over the scripted engine: what the chat core itself does with a reply.

The scripted engine writes one token per character (chat markers as one control token),
ends a reply with its end-of-turn id and, like the engine, reuses the longest common
prefix of the previous prompt and generation. Expected counts below come from the reply
texts and that documented tokenization, never from the session's own arithmetic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from fake_engine import MARKERS, ScriptedEngine, tool_call_text

from warp_providers import WarpError
from warp_providers.chat import ChatFormatError
from warp_providers.errors import ContextOverflowError
from warp_providers.session import ChatSession

USER = [{"role": "user", "content": "hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
LONG = "".join(chr(ord("a") + i % 26) for i in range(200))


def n_tokens(text: str) -> int:
    """Tokens the scripted engine writes for text: one per marker, one per UTF-8 byte."""
    n = i = 0
    while i < len(text):
        marker = next((m for m in MARKERS if text.startswith(m, i)), None)
        if marker:
            n, i = n + 1, i + len(marker)
        else:
            n, i = n + len(text[i].encode()), i + 1
    return n


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def chunks_of(session: ChatSession, request: Any, **kw: Any) -> tuple[str, Any]:
    """(the streamed answer text, the result) of one streamed reply."""
    text, result = "", None
    for chunk in session.stream(request, **kw):
        text += chunk.delta.content
        result = chunk.result or result
    return text, result


# --------------------------------------------------------------------------- usage


def test_usage_counts_prompt_completion_and_end_of_turn():
    reply = "Hello there!"
    eng = ScriptedEngine([reply])
    s = ChatSession(eng)
    r = s.complete(USER)
    assert r.message.content == reply and r.message.finish_reason == "stop"
    assert r.usage.prompt_tokens == len(eng.prompts[0]) == len(s.prompt_ids(USER))
    assert r.usage.completion_tokens == n_tokens(reply) + 1  # the end-of-turn id counts
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.reasoning_tokens == 0 and r.usage.cached_tokens == 0
    assert r.stats["bytes_read"] == 4096 * n_tokens(reply)  # this generation's counters
    assert r.model == "scripted"


def test_reasoning_tokens_are_those_before_the_answer():
    head = "<think>\nstep one\n</think>\n\n"
    eng = ScriptedEngine([head + "Answer"])
    r = ChatSession(eng).complete(USER)
    assert r.message.reasoning == "step one" and r.message.content == "Answer"
    assert r.usage.reasoning_tokens == n_tokens(head)
    assert r.usage.completion_tokens == n_tokens(head + "Answer") + 1


def test_reasoning_only_reply_counts_every_token_as_reasoning():
    eng = ScriptedEngine(["<think>\nstill thinking"])
    r = ChatSession(eng).complete(USER, max_tokens=10)
    assert r.message.content is None and r.message.reasoning
    assert r.usage.completion_tokens == 10 == r.usage.reasoning_tokens


# --------------------------------------------------------------------------- prefix reuse


def test_follow_up_turn_reports_the_reused_prefix():
    eng = ScriptedEngine(["Hello!", "Again."])
    s = ChatSession(eng)
    first = s.complete(USER)
    held = eng.prompts[0] + eng.last_result.token_ids
    follow = USER + [{"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "more"}]
    second = s.complete(follow)
    want = common_prefix(held, eng.prompts[1])
    assert first.usage.cached_tokens == 0
    # the whole first prompt and the reply the engine still holds are reused
    assert want > len(eng.prompts[0]) and second.usage.cached_tokens == want
    assert second.usage.prompt_tokens == len(eng.prompts[1])


def test_cached_tokens_never_exceed_the_prompt():
    class OverReporting(ScriptedEngine):
        def stream(self, prompt: Any, **kw: Any):  # type: ignore[override]
            try:
                yield from super().stream(prompt, **kw)
            finally:
                self.last_result = dataclasses.replace(self.last_result,
                                                       cached_tokens=10**6)

    r = ChatSession(OverReporting(["ok"])).complete(USER)
    assert r.usage.cached_tokens == r.usage.prompt_tokens


def test_result_after_a_stop_string_is_this_requests():
    """A stop string leaves the engine's generator early; usage and stats must still be
    those of this generation, not of the request before it."""
    eng = ScriptedEngine(["Hello!", "one two three four"])
    s = ChatSession(eng)
    s.complete(USER)
    follow = USER + [{"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "count"}]
    held = eng.prompts[0] + eng.last_result.token_ids
    r = s.complete(follow, stop=["three"])
    assert r.message.content == "one two "
    assert r.usage.cached_tokens == common_prefix(held, eng.prompts[1]) > 0
    assert r.stats["prompt_tokens_evaluated"] == len(eng.prompts[1])
    assert r.stats["bytes_read"] == 4096 * n_tokens("one two three")


# --------------------------------------------------------------------------- stop strings


def test_stop_string_ends_the_answer_and_the_generation():
    reply = "Hello, world! Bye"
    eng = ScriptedEngine([reply])
    text, r = chunks_of(ChatSession(eng), USER, stop=["world"])
    # nothing of the stop string was streamed before it was recognised
    assert text == r.message.content == "Hello, "
    assert r.message.finish_reason == "stop"
    assert len(eng.last_result.token_ids) == n_tokens("Hello, world")
    assert r.usage.completion_tokens == n_tokens("Hello, world")


def test_first_stop_string_in_the_text_wins():
    _, r = chunks_of(ChatSession(ScriptedEngine(["Hello, world! Bye"])), USER,
                     stop=["Bye", ","])
    assert r.message.content == "Hello"


def test_held_back_prefix_that_never_completes_is_released():
    reply = "a wok, a worm, ends wo"
    text, r = chunks_of(ChatSession(ScriptedEngine([reply])), USER, stop=["world"])
    assert text == r.message.content == reply
    assert r.message.finish_reason == "stop"


def test_stop_strings_apply_to_the_answer_not_the_reasoning():
    eng = ScriptedEngine(["<think>\nthe world\n</think>\n\nHello world"])
    r = ChatSession(eng).complete(USER, stop=["world"])
    assert r.message.reasoning == "the world"
    assert r.message.content == "Hello "


# --------------------------------------------------------------------------- tool calls


def test_tool_call_reply_finishes_with_tool_calls():
    eng = ScriptedEngine([tool_call_text("get_weather", {"city": "Paris"})])
    r = ChatSession(eng).complete({"messages": USER, "tools": [WEATHER_TOOL]})
    assert r.message.finish_reason == "tool_calls"
    (call,) = r.message.tool_calls
    assert call.name == "get_weather" and not call.malformed
    assert call.arguments == '{"city": "Paris"}'
    assert r.message.content is None


def test_markers_are_read_from_their_ids_not_the_event_text():
    """An engine may hold an event's text back (""), as `TokenEvent` allows; a chat marker
    is structure by its control-token id, so the reply still parses."""

    class HoldsMarkerText(ScriptedEngine):
        def stream(self, prompt: Any, **kw: Any):  # type: ignore[override]
            for ev in super().stream(prompt, **kw):
                control = self.tokenizer.is_control(ev.token_id)
                yield dataclasses.replace(ev, text="") if control else ev

    eng = HoldsMarkerText(["<think>\nhm\n</think>\n\n"
                           + tool_call_text("get_weather", {"city": "Rome"})])
    r = ChatSession(eng).complete({"messages": USER, "tools": [WEATHER_TOOL]})
    assert r.message.reasoning == "hm"
    assert [c.name for c in r.message.tool_calls] == ["get_weather"]
    assert r.message.finish_reason == "tool_calls"


def test_tool_call_then_a_stop_string_still_finishes_with_tool_calls():
    reply = tool_call_text("get_weather", {"city": "Oslo"}) + "\nEND of turn"
    eng = ScriptedEngine([reply])
    r = ChatSession(eng).complete({"messages": USER, "tools": [WEATHER_TOOL]}, stop=["END"])
    assert [c.name for c in r.message.tool_calls] == ["get_weather"]
    assert r.message.finish_reason == "tool_calls"
    assert "END" not in (r.message.content or "")


# --------------------------------------------------------------------------- limits


def test_max_tokens_ends_with_length():
    eng = ScriptedEngine([LONG])
    r = ChatSession(eng).complete(USER, max_tokens=5)
    assert r.message.content == LONG[:5]
    assert r.message.finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert eng.calls[-1]["max_tokens"] == 5


def test_max_tokens_is_clamped_to_the_room_in_the_context():
    n_prompt = len(ChatSession(ScriptedEngine()).prompt_ids(USER))
    eng = ScriptedEngine([LONG], ctx_tokens=n_prompt + 4)
    s = ChatSession(eng)
    assert s.prepare(USER, max_tokens=100).max_tokens == 4
    assert s.prepare(USER).max_tokens == 4
    assert s.prepare(USER, max_tokens=0).max_tokens == 1
    r = s.complete(USER, max_tokens=100)
    assert r.message.content == LONG[:4] and r.message.finish_reason == "length"
    assert r.usage.completion_tokens == 4


# --------------------------------------------------------------------------- cancellation


def test_closing_the_stream_stops_the_generation():
    eng = ScriptedEngine([LONG])
    it = ChatSession(eng).stream(USER)
    first = next(it)
    assert first.delta.content == LONG[0]
    it.close()
    assert eng.last_result.finish_reason == "cancelled"
    assert len(eng.last_result.token_ids) == 1


def test_should_stop_ends_the_reply_early_as_stop():
    eng = ScriptedEngine([LONG])
    seen: list[str] = []
    text, r = "", None
    for chunk in ChatSession(eng).stream(USER, should_stop=lambda: len(seen) >= 3):
        seen.append(chunk.delta.content)
        text += chunk.delta.content
        r = chunk.result or r
    assert text == LONG[:3] == r.message.content
    assert r.message.finish_reason == "stop"
    assert eng.last_result.finish_reason == "cancelled"
    assert r.usage.completion_tokens == 3


# --------------------------------------------------------------------------- astream


async def astreamed(session: ChatSession, request: Any, **kw: Any) -> tuple[str, Any]:
    """(the streamed answer text, the result) of one astream reply; a hang fails."""

    async def run() -> tuple[str, Any]:
        text, result = "", None
        async for chunk in session.astream(request, **kw):
            text += chunk.delta.content
            result = chunk.result or result
        return text, result

    return await asyncio.wait_for(run(), timeout=60)


async def test_astream_yields_what_stream_yields():
    head = "<think>\nhmm\n</think>\n\n"
    reply = head + "The answer."
    sync = ChatSession(ScriptedEngine([reply])).complete(USER)
    text, result = await astreamed(ChatSession(ScriptedEngine([reply])), USER)
    assert text == "The answer." == result.message.content
    assert result.message == sync.message and result.usage == sync.usage
    acomplete = ChatSession(ScriptedEngine([reply])).acomplete(USER)
    assert (await asyncio.wait_for(acomplete, timeout=60)).usage == sync.usage


async def test_closing_astream_stops_the_generation_within_a_token_or_two():
    """The worker runs at most one chunk ahead: while the consumer holds the first chunk
    (here for 0.3 s) the generation waits, and the close ends it."""
    eng = ScriptedEngine([LONG])
    agen = ChatSession(eng).astream(USER)
    first = await asyncio.wait_for(agen.__anext__(), timeout=60)
    assert first.delta.content == LONG[0]
    await asyncio.sleep(0.3)
    await agen.aclose()
    deadline = time.monotonic() + 10
    while eng.last_result is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert eng.last_result is not None, "the generation did not end after the close"
    assert eng.last_result.finish_reason == "cancelled"
    assert len(eng.last_result.token_ids) <= 3


async def test_astream_raises_the_requests_error():
    eng = ScriptedEngine(ctx_tokens=8)
    with pytest.raises(ContextOverflowError):
        await astreamed(ChatSession(eng), USER)
    assert eng.prompts == []


# --------------------------------------------------------------------------- bad requests


def test_prompt_that_fills_the_context_is_refused_before_generation():
    n_prompt = len(ChatSession(ScriptedEngine()).prompt_ids(USER))
    eng = ScriptedEngine(ctx_tokens=n_prompt)
    s = ChatSession(eng)
    with pytest.raises(ContextOverflowError) as err:
        s.prepare(USER)
    assert isinstance(err.value, WarpError) and isinstance(err.value, ValueError)
    assert str(n_prompt) in str(err.value)
    stream = s.stream(USER)  # a generator: the refusal comes at the first next
    with pytest.raises(ContextOverflowError):
        next(stream)
    assert eng.prompts == []
    # one token of room is enough
    assert ChatSession(ScriptedEngine(ctx_tokens=n_prompt + 1)).prepare(USER).max_tokens == 1


def test_request_the_format_cannot_express_names_its_field():
    eng = ScriptedEngine()
    with pytest.raises(ChatFormatError) as err:
        ChatSession(eng).complete({"messages": USER, "reasoning_effort": "extreme"})
    assert err.value.param == "reasoning_effort"
    assert err.value.type == "invalid_request_error"
    assert eng.prompts == []


def test_unknown_chat_format_is_refused_by_name():
    with pytest.raises(ChatFormatError) as err:
        ChatSession(ScriptedEngine(), chat_format="no-such-format")
    assert err.value.param == "chat_format"
    assert "no-such-format" in str(err.value)


def test_the_system_prompt_and_the_conversation_so_far_are_offered_as_snapshot_prefixes():
    """Each prefix the session names is where the next request's prompt stops agreeing:
    the system prompt is shared with another user's request, the conversation before
    the hand-over with this conversation's next turn (whatever the reply renders as)."""
    system = {"role": "system", "content": LONG}
    first = [system, {"role": "user", "content": "what is up"}]
    other_user = [system, {"role": "user", "content": "tell me more"}]
    next_turn = first + [{"role": "assistant", "content": "Fine."},
                         {"role": "user", "content": "and then"}]
    eng = ScriptedEngine(["Fine."])
    s = ChatSession(eng)
    s.complete(first)
    sys_at, conv_at = eng.calls[0]["prefixes"]
    ids, other, nxt = s.prompt_ids(first), s.prompt_ids(other_user), s.prompt_ids(next_turn)
    # the system turn ends where the user turn's header (shared too) begins
    assert n_tokens(LONG) < sys_at < common_prefix(ids, other) < sys_at + 8
    assert ids[:conv_at] == nxt[:conv_at] and sys_at < conv_at < len(ids)
    short = ScriptedEngine(["x"])
    ChatSession(short).complete(USER)  # nothing long enough to be worth a snapshot
    assert "prefixes" not in short.calls[0]
