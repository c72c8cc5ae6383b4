"""The chat request core shared by every adapter: request -> prompt ids -> reply deltas.

Owns: choosing and binding the model's chat format (explicit name, container metadata,
template fingerprint — never a silent fallback), rendering a request to segments and ids,
driving `EngineLike.stream` and feeding each (token id, piece) to the format's reply
parser, stop strings on the answer text, usage, and the async bridge (a worker thread;
the event loop never blocks; closing the stream cancels the generation).
Refuses: what the chat format cannot express (ChatFormatError with `param`).
Called by: langchain_warp, llama_index.llms.warp, warp_openai and the CLI.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warp_providers.chat import registry
from warp_providers.chat.base import ChatFormat, Delta, DeltaAccumulator
from warp_providers.engine import EngineLike
from warp_providers.sampling import LogitsProcessor, SamplingParams
from warp_providers.types import AssistantMessage, ChatRequest, Usage

__all__ = ["ChatChunk", "ChatResult", "ChatSession"]


@dataclass
class ChatResult:
    """A finished chat reply.

    Attributes:
        message: content, reasoning, tool calls and finish reason.
        usage: prompt and completion token counts.
        stats: engine counters and timings of this reply (expert hits, bytes, tok/s).
        model: the model name reported to clients.
    """

    message: AssistantMessage
    usage: Usage
    stats: dict[str, Any] = field(default_factory=dict)
    model: str = ""


@dataclass
class ChatChunk:
    """One step of a streamed reply: a delta, and on the last chunk the result."""

    delta: Delta
    token_id: int | None = None
    logprob: float | None = None
    result: ChatResult | None = None


def _format_hint(engine: EngineLike) -> tuple[str | None, str | None]:
    meta = getattr(engine, "chat_metadata", None)
    if callable(meta):
        meta = meta()
    meta = meta or {}
    return meta.get("format"), meta.get("template")


class ChatSession:
    """Chat over one engine with the model's own chat format."""

    def __init__(
        self,
        engine: EngineLike,
        *,
        chat_format: str | None = None,
        model_name: str | None = None,
    ) -> None:
        """Binds the engine's chat format.

        Args:
            engine: an `Engine` (or the scripted test engine).
            chat_format: a registry name to force; None resolves from the container.
            model_name: the name reported in results (default: the container's name).

        Raises:
            ChatFormatError: no format fits this model (the message lists the formats).
        """
        self.engine = engine
        meta_format, template = _format_hint(engine)
        fmt = registry.resolve(
            name=chat_format, metadata_format=meta_format, chat_template=template,
            tokenizer=engine.tokenizer,
        )
        self.format: ChatFormat = fmt
        self.model_name = model_name or str(engine.info().get("name") or "warp")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a reply in this format."""
        return tuple(self.format.stop_ids)

    def prompt_ids(self, request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]]) -> list[int]:
        """Renders a request (or a bare message list) and encodes it segment by segment."""
        if isinstance(request, list):
            request = {"messages": request}
        return self.format.encode(self.format.render(request))

    def stream(
        self,
        request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        processors: Sequence[LogitsProcessor] = (),
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[ChatChunk]:
        """Generates a reply, yielding deltas; the last chunk carries the `ChatResult`.

        Args:
            request: messages, tools, tool_choice, response_format, reasoning effort.
            max_tokens: completion token limit (None = until the context is full).
            sampling: sampling knobs (default greedy).
            stop: strings that end the answer text (excluded from it).
            processors: logit hooks (constrained decoding).
            should_stop: polled before each token; True ends the reply early.
        """
        if isinstance(request, list):
            request = {"messages": request}
        prompt = self.format.render(request)
        ids = self.format.encode(prompt)
        parser = self.format.new_parser(prompt)
        limit = max_tokens if max_tokens is not None else self._room(len(ids))
        stopper = _StopStrings(list(stop))
        acc = DeltaAccumulator()
        n_tokens = 0
        stopped = False
        events = self.engine.stream(
            ids, max_tokens=max(1, limit), sampling=sampling, stop_ids=self.stop_ids,
            processors=processors, should_stop=should_stop,
        )
        for ev in events:
            n_tokens += 1
            delta = parser.feed(ev.token_id, self.engine.tokenizer.id_to_piece(ev.token_id)
                                if self.engine.tokenizer.is_control(ev.token_id) else ev.text)
            delta, stopped = stopper.apply(delta)
            if not delta.empty:
                acc.add(delta)
                yield ChatChunk(delta, ev.token_id, ev.logprob)
            if stopped:
                events.close()
                break
        gen = getattr(self.engine, "last_result", None)
        tail = parser.flush() if not stopped else Delta()
        tail, _ = stopper.apply(tail, final=True)
        if not tail.empty:
            acc.add(tail)
            yield ChatChunk(tail)
        finish = "stop"
        if gen is not None and not stopped:
            finish = {"length": "length", "cancelled": "stop"}.get(gen.finish_reason, "stop")
            n_tokens = len(gen.token_ids) + (1 if gen.finish_reason == "stop" else 0)
        final = parser.finish(hit_limit=finish == "length")
        message = final if not stopped else acc.message("stop")
        if stopped:
            message = AssistantMessage(content=acc.content or None, reasoning=acc.reasoning or None,
                                       tool_calls=message.tool_calls, finish_reason="stop")
        usage = Usage(prompt_tokens=len(ids), completion_tokens=n_tokens,
                      total_tokens=len(ids) + n_tokens)
        stats = dict(gen.stats) if gen is not None else {}
        yield ChatChunk(Delta(), result=ChatResult(message, usage, stats, self.model_name))

    def complete(self, request: Any, **kwargs: Any) -> ChatResult:
        """Runs `stream` to the end and returns its `ChatResult`."""
        result = None
        for chunk in self.stream(request, **kwargs):
            result = chunk.result or result
        assert result is not None
        return result

    async def astream(self, request: Any, **kwargs: Any) -> AsyncIterator[ChatChunk]:
        """`stream` on a worker thread; closing or cancelling this iterator stops it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        user_stop = kwargs.pop("should_stop", None)

        def should_stop() -> bool:
            return cancel.is_set() or bool(user_stop and user_stop())

        def work() -> None:
            try:
                for chunk in self.stream(request, should_stop=should_stop, **kwargs):
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
                    if cancel.is_set():
                        break
                loop.call_soon_threadsafe(queue.put_nowait, _END)
            except BaseException as e:  # handed to the consumer, never swallowed
                loop.call_soon_threadsafe(queue.put_nowait, _Failure(e))

        worker = threading.Thread(target=work, name="warp-chat", daemon=True)
        worker.start()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            cancel.set()

    async def acomplete(self, request: Any, **kwargs: Any) -> ChatResult:
        """Async `complete`."""
        result = None
        async for chunk in self.astream(request, **kwargs):
            result = chunk.result or result
        assert result is not None
        return result

    def reply(
        self,
        messages: list[dict[str, Any]],
        *,
        on_text: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> _Reply:
        """A convenience for REPLs: streams the answer text to on_text."""
        result = None
        for chunk in self.stream(messages, **kwargs):
            if on_text is not None and chunk.delta.content:
                on_text(chunk.delta.content)
            result = chunk.result or result
        assert result is not None
        return _Reply(result.message.content or "", result.stats)

    def _room(self, n_prompt: int) -> int:
        ctx = int(self.engine.info().get("ctx_tokens", 0) or 0)
        return max(1, ctx - n_prompt) if ctx else 4096


@dataclass
class _Reply:
    text: str
    stats: dict[str, Any]


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class _StopStrings:
    """Ends the answer at the first stop string, holding back a possible prefix."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.held = ""

    def apply(self, delta: Delta, final: bool = False) -> tuple[Delta, bool]:
        if not self.stop:
            return delta, False
        text = self.held + delta.content
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                self.held = ""
                return Delta(delta.reasoning, text[:i], delta.tool_calls), True
        keep = 0
        if not final:
            for k in range(min(len(text), max(map(len, self.stop)) - 1), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.stop):
                    keep = k
                    break
        self.held = text[len(text) - keep:] if keep else ""
        return Delta(delta.reasoning, text[: len(text) - keep], delta.tool_calls), False
