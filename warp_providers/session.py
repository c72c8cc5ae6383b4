"""The chat request core shared by every adapter: request -> prompt ids -> reply deltas.

Owns: choosing and binding the model's chat format (explicit name, container metadata,
template fingerprint — never a silent fallback), rendering a request to segments and ids,
driving `EngineLike.stream` and feeding each (token id, piece) to the format's reply
parser, stop strings on the answer text, usage, constrained decoding applied from the
request (response_format json_object/json_schema, a forced tool call: `constrain.py`),
the context check, and the async bridge (a worker thread that runs at most one chunk
ahead; the event loop never blocks; closing the stream cancels the generation).
Refuses: what the chat format cannot express (ChatFormatError with `param`), a prompt
that leaves no room in the context (ContextOverflowError).
Called by: langchain_warp, llama_index.llms.warp, warp_openai and the CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from warp_providers import constrain, vision
from warp_providers.chat import registry
from warp_providers.chat.base import (
    ChatFormat,
    ChatFormatError,
    Delta,
    DeltaAccumulator,
    ImageInfo,
    Prompt,
    ReplyParser,
    apply_named_tool_choice,
    request_dict,
)
from warp_providers.engine import EngineLike
from warp_providers.errors import ContextOverflowError
from warp_providers.sampling import LogitsProcessor, SamplingParams
from warp_providers.types import AssistantMessage, ChatRequest, Usage

PREFIX_MIN = 32
"""Shortest prompt prefix worth a snapshot (a shorter one is cheaper to prefill again)."""

__all__ = ["ChatChunk", "ChatResult", "ChatSession", "PreparedChat", "format_capabilities"]


@dataclass
class ChatResult:
    """A finished chat reply.

    Attributes:
        message: content, reasoning, tool calls and finish reason.
        usage: prompt and completion token counts (cached and reasoning tokens among them).
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
        allow_local_images: str | os.PathLike[str] | None = None,
    ) -> None:
        """Binds the engine's chat format.

        Args:
            engine: an `Engine` (or the scripted test engine).
            chat_format: a registry name to force; None resolves from the container.
            model_name: the name reported in results (default: the container's name).
            allow_local_images: a directory image parts may name files in (paths or
                `file://` URLs, resolved inside it); None refuses local paths.

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
        self.allow_local_images = allow_local_images

    @property
    def vision(self) -> bool:
        """Whether this model reads images (its engine has a vision tower loaded)."""
        fn = getattr(self.engine, "vision_info", None)
        return fn is not None and fn() is not None

    def load_images(self, request: Any) -> list[Any]:
        """Decodes and preprocesses the request's images (`vision.PreparedImage`s, in order).

        Raises:
            ChatFormatError: The request carries images and the model has no vision tower
                (code `vision_disabled`).
            ImageError: An image cannot be read or used.

        """
        messages = request.get("messages") if isinstance(request, Mapping) else getattr(
            request, "messages", None)
        if messages is not None and not isinstance(messages, list):
            messages = list(messages)
        if messages and not isinstance(messages[0], Mapping):
            messages = [m.model_dump(exclude_unset=True) if hasattr(m, "model_dump") else m
                        for m in messages]
        refs = vision.image_refs(messages or [])
        if not refs:
            return []
        proc = self.engine.image_processor() if self.vision else None
        if proc is None:
            raise ChatFormatError(
                "this model was loaded without a vision tower, so it cannot read images; "
                "send the conversation as text", param="messages", code="vision_disabled"
            )
        return [
            proc.prepare(vision.load_image_ref(ref, allow_local=self.allow_local_images),
                         detail=detail)
            for ref, detail in refs
        ]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a reply in this format."""
        return tuple(self.format.stop_ids)

    def prompt_ids(
        self, request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]]
    ) -> list[int]:
        """Renders a request (or a bare message list) and encodes it segment by segment."""
        if isinstance(request, list):
            request = {"messages": request}
        return self.format.encode(self.format.render(request))

    def count_tokens(
        self,
        request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]],
    ) -> int:
        """Tokens a conversation takes in this model's prompt, as its chat format renders it.

        The hand-over to the assistant is left out, so counts of consecutive slices of a
        conversation add up to about the count of the whole (what trimming needs).

        Raises:
            ChatFormatError: the format cannot express the request.

        """
        if isinstance(request, list):
            request = {"messages": request}
        images = self.load_images(request)
        infos = [ImageInfo(im.width, im.height) for im in images] or None
        ids = self.format.encode(
            self.format.render(request, images=infos, add_generation_prompt=False))
        return len(ids) + sum(im.n_tokens - 1 for im in images)

    @property
    def capabilities(self) -> dict[str, Any]:
        """What this model and its chat format offer.

        Keys: `ctx_tokens` (context size, 0 when unknown), `tools` (requests may declare
        tools), `reasoning` (replies can carry a reasoning channel), `format` (the chat
        format's registry name), `images` (the engine has a vision tower loaded).
        """
        caps = format_capabilities(self.format, int(self.engine.info().get("ctx_tokens", 0) or 0))
        caps["images"] = self.vision
        return caps

    def prepare(
        self,
        request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        constrain_output: bool = True,
    ) -> PreparedChat:
        """Renders, encodes and checks a request without touching the engine.

        Every refusal happens here, so a server can answer it before streaming starts.

        Args:
            request: messages, tools, tool_choice, response_format, reasoning effort.
            max_tokens: completion token limit (None = until the context is full); it is
                clamped to the room the context leaves.
            constrain_output: enforce response_format / a forced tool call with a grammar.

        Raises:
            ChatFormatError: the format cannot express the request, or a schema feature
                cannot be enforced (`param` names the field).
            ContextOverflowError: the prompt fills the context.

        """
        if isinstance(request, list):
            request = {"messages": request}
        images = self.load_images(request)
        infos = [ImageInfo(im.width, im.height) for im in images] or None
        prompt = self._render(request, constrain_output, infos)
        ids = self.format.encode(prompt)
        if images:
            ph = int(self.engine.vision_info()["placeholder_token_id"])
            try:
                ids = vision.expand_placeholders(ids, ph, [im.n_tokens for im in images])
            except ValueError as exc:
                raise ChatFormatError(
                    f"this chat format does not place each image once: {exc}", param="messages"
                ) from None
        ctx = int(self.engine.info().get("ctx_tokens", 0) or 0)
        if ctx and len(ids) >= ctx:
            raise ContextOverflowError(
                f"prompt is {len(ids)} tokens, and this model's context is {ctx}"
            )
        room = self._room(len(ids))
        limit = room if max_tokens is None else max(1, min(max_tokens, room))
        processor = (
            constrain.processor_for_request(self.format, prompt, request)
            if constrain_output else None
        )
        return PreparedChat(prompt, ids, limit, processor, images,
                            self._prefixes(request, ids))

    def _prefixes(self, request: Any, ids: list[int]) -> tuple[int, ...]:
        """Prompt prefixes later requests are likely to share, as token counts of `ids`.

        The leading system messages with the tools (what requests of one application
        share), and the whole conversation before the hand-over to the assistant (what the
        next turn of this conversation starts with, whatever the reply's tokens become).
        Each is rendered alone and kept only when its ids begin `ids` exactly.
        """
        try:
            req = request_dict(request)
        except (ChatFormatError, ValueError, TypeError):
            return ()
        msgs = list(req.get("messages") or [])
        lead = next((i for i, m in enumerate(msgs) if m.get("role") != "system"), len(msgs))
        parts = [msgs[:lead]] if 0 < lead < len(msgs) else []
        out: list[int] = []
        for part in parts + [msgs]:
            try:
                got = self.format.encode(self.format.render(
                    {**req, "messages": part}, add_generation_prompt=False))
            except (ChatFormatError, ValueError, TypeError):
                continue
            n = len(got)
            if PREFIX_MIN <= n < len(ids) and ids[:n] == got and n not in out:
                out.append(n)
        return tuple(out)

    def _render(self, request: Any, constrain_output: bool,
                images: list[ImageInfo] | None = None) -> Prompt:
        try:
            return self.format.render(request, images=images)
        except ChatFormatError as exc:
            if not constrain_output or exc.param not in ("tool_choice", "response_format"):
                raise
            rewritten = _without_forcing(request)
            if rewritten is None:
                raise
            # The format cannot ask for it in the prompt; the grammar will enforce it.
            prompt = self.format.render(rewritten, images=images)
            if constrain.processor_for_request(self.format, prompt, request) is None:
                raise
            return prompt

    def stream(
        self,
        request: ChatRequest | Mapping[str, Any] | list[dict[str, Any]] | PreparedChat,
        *,
        max_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        processors: Sequence[LogitsProcessor] = (),
        should_stop: Callable[[], bool] | None = None,
        constrain_output: bool = True,
    ) -> Iterator[ChatChunk]:
        """Generates a reply, yielding deltas; the last chunk carries the `ChatResult`.

        Args:
            request: messages, tools, tool_choice, response_format, reasoning effort; or
                the result of `prepare` (then `max_tokens` and `constrain_output` were
                given there).
            max_tokens: completion token limit (None = until the context is full).
            sampling: sampling knobs (default greedy).
            stop: strings that end the answer text (excluded from it).
            processors: logit hooks, applied after the request's own constraint.
            should_stop: polled before each token; True ends the reply early.
            constrain_output: enforce response_format / a forced tool call (see `prepare`).

        Raises:
            ChatFormatError, ContextOverflowError: see `prepare` (at the first `next`).

        """
        prep = request if isinstance(request, PreparedChat) else self.prepare(
            request, max_tokens=max_tokens, constrain_output=constrain_output)
        procs = ([prep.processor] if prep.processor is not None else []) + list(processors)
        parser = self.format.new_parser(prep.prompt)
        kw: dict[str, Any] = {"images": prep.images} if prep.images else {}
        if prep.prefixes:
            kw["prefixes"] = prep.prefixes
        events = self.engine.stream(
            prep.ids, max_tokens=prep.max_tokens, sampling=sampling, stop_ids=self.stop_ids,
            processors=procs, should_stop=should_stop, **kw,
        )
        try:
            yield from self._run(prep, parser, events, stop)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def _run(
        self, prep: PreparedChat, parser: ReplyParser, events: Iterator[Any], stop: Sequence[str]
    ) -> Iterator[ChatChunk]:
        tokenizer = self.engine.tokenizer
        stopper = _StopStrings(list(stop))
        acc = DeltaAccumulator()
        n_tokens = 0
        answer_at: int | None = None
        saw_reasoning = False
        stopped = False
        for ev in events:
            n_tokens += 1
            control = tokenizer.is_control(ev.token_id)
            piece = tokenizer.id_to_piece(ev.token_id) if control else ev.text
            delta = parser.feed(ev.token_id, piece)
            # Reasoning tokens: those before the answer's first token, when they wrote
            # reasoning (markers of the reasoning block included).
            if answer_at is None and (delta.content or delta.tool_calls):
                answer_at = n_tokens - 1
            saw_reasoning = saw_reasoning or (answer_at is None and bool(delta.reasoning))
            delta, stopped = stopper.apply(delta)
            if not delta.empty:
                acc.add(delta)
                yield ChatChunk(delta, ev.token_id, ev.logprob)
            if stopped:
                break
        if stopped:
            # The generation this loop left is finished (and its result recorded) only when
            # its generator is closed; reading `last_result` before would read the previous
            # request's.
            close = getattr(events, "close", None)
            if close is not None:
                close()
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
        message = final
        if stopped:
            message = AssistantMessage(content=acc.content or None, reasoning=acc.reasoning or None,
                                       tool_calls=final.tool_calls,
                                       finish_reason="tool_calls" if final.tool_calls else "stop")
        n_prompt = len(prep.ids)
        cached = min(int(getattr(gen, "cached_tokens", 0) or 0), n_prompt)
        n_reasoning = (n_tokens if answer_at is None else answer_at) if saw_reasoning else 0
        usage = Usage(prompt_tokens=n_prompt, completion_tokens=n_tokens,
                      total_tokens=n_prompt + n_tokens, cached_tokens=cached,
                      reasoning_tokens=min(n_reasoning, n_tokens))
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
        """`stream` on a worker thread; closing or cancelling this iterator stops it.

        The worker runs at most one chunk ahead of the consumer, so a consumer that stops
        early stops the engine within a token or two.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        credit = threading.Semaphore(0)
        user_stop = kwargs.pop("should_stop", None)

        def should_stop() -> bool:
            return cancel.is_set() or bool(user_stop and user_stop())

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                cancel.set()

        def work() -> None:
            try:
                gen = self.stream(request, should_stop=should_stop, **kwargs)
                try:
                    for chunk in gen:
                        put(chunk)
                        credit.acquire()
                        if cancel.is_set():
                            break
                finally:
                    gen.close()
                put(_END)
            except BaseException as e:  # handed to the consumer, never swallowed
                put(_Failure(e))

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
                credit.release()
        finally:
            cancel.set()
            credit.release()

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
class PreparedChat:
    """A request rendered and checked by `ChatSession.prepare`, ready to generate.

    Attributes:
        prompt: the rendered segments (and the channel they leave open).
        ids: the prompt token ids.
        max_tokens: the completion limit, clamped to the room left in the context.
        processor: the request's output constraint, or None.
        images: the request's images (`vision.PreparedImage`), one per placeholder run
            of `ids`, in order.
        prefixes: lengths of the prompt's prefixes worth a snapshot (`Engine.stream`'s
            `prefixes`): its system prompt and tools, the conversation before the reply.

    """

    prompt: Prompt
    ids: list[int]
    max_tokens: int
    processor: constrain.GrammarProcessor | None = None
    images: list[Any] = field(default_factory=list)
    prefixes: tuple[int, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        """Number of prompt tokens."""
        return len(self.ids)


def format_capabilities(fmt: ChatFormat, ctx_tokens: int) -> dict[str, Any]:
    """The `ChatSession.capabilities` dict of a bound chat format and a context size."""
    return {
        "ctx_tokens": ctx_tokens,
        "tools": bool(fmt.supports_tools),
        "reasoning": bool(fmt.supports_reasoning),
        "format": fmt.name,
    }


def _without_forcing(request: Any) -> dict[str, Any] | None:
    """The request with tool_choice/response_format turned into prompt notes (or None).

    For formats whose prompt cannot express them; the grammar then enforces them.
    """
    if isinstance(request, ChatRequest):
        req = request.model_dump(mode="python", exclude_unset=True, by_alias=True)
    elif isinstance(request, Mapping):
        req = dict(request)
    else:
        return None
    messages = list(req.get("messages") or [])
    notes: list[str] = []
    choice = req.get("tool_choice")
    if isinstance(choice, Mapping) or choice == "required":
        messages, _ = apply_named_tool_choice(messages, choice)
        named = messages[len(req.get("messages") or []):]
        messages = messages[: len(req.get("messages") or [])]
        notes += [m["content"] for m in named] or ["You must call a tool in your next message."]
        req["tool_choice"] = "auto"
    rf = req.get("response_format")
    if isinstance(rf, Mapping) and rf.get("type") in ("json_object", "json_schema"):
        note = "Answer with raw JSON only, without markdown code fences."
        spec = rf.get("json_schema")
        if isinstance(spec, Mapping) and isinstance(spec.get("schema"), Mapping):
            note += " The JSON must match this schema: " + json.dumps(spec["schema"])
        notes.append(note)
        req.pop("response_format")
    if not notes:
        return None
    text = "\n\n".join(notes)
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") in ("system", "developer") and isinstance(
        first.get("content"), str
    ):
        messages[0] = {**first, "content": f"{first['content']}\n\n{text}"}
    else:
        messages.insert(0, {"role": "system", "content": text})
    req["messages"] = messages
    return req


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
