"""The chat-format contract and the helpers every format shares.

Owns: `ChatFormatError`; the segment model (`Segment`, `Prompt`, PROTOCOLS §1);
the `ChatFormat` base (marker validation in `bind`, `render`, `new_parser`);
the `ReplyParser` base (reasoning/content accumulation, tool-call events with
one start, argument fragments and one end per call) and `Delta`; request
normalisation (validation into plain dicts, named tool_choice §7.7, reasoning
resolution §7.6); JSON helpers (Python-default and compact dumps, deep sort,
JSON-or-raw decode) written once for all formats.

Refuses: nothing by itself; formats refuse what they cannot express by raising
`ChatFormatError` with `param` naming the request field at fault.
Parsers are pure: no I/O, no logging, never raise on model output.
Called by: `chat/formats/*`, the registry, the generation loop and adapters.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Union

from pydantic import ValidationError

from warp_providers.types import AssistantMessage, ChatRequest, ToolCall

if TYPE_CHECKING:
    from warp_providers.tokenizer import Tokenizer

__all__ = [
    "ChatFormat",
    "ChatFormatError",
    "Delta",
    "DeltaAccumulator",
    "ImageInfo",
    "Prompt",
    "ReplyParser",
    "Segment",
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallEvent",
    "ToolCallStart",
    "deep_sort",
    "dumps_compact",
    "dumps_py",
    "loads_or_raw",
    "request_dict",
    "resolve_reasoning",
]

K3_EFFORTS = ("low", "high", "max")
"""Efforts Kimi K3's encoder accepts; `medium` is refused although advertised (§2.8) [quirk]."""
NO_REASONING_EFFORTS = ("minimal", "none", "off")
"""Effort spellings that turn thinking off (§7.6)."""


class ChatFormatError(ValueError):
    """A request the chat format cannot express, or a format that does not fit the model.

    Attributes:
        message: Human-readable reason (also `str(err)`).
        param: The request field at fault (`messages[2].tool_calls[0].id`), or None.
        code: A machine-readable code (`unsupported_chat_format`), or None.
        type: OpenAI error type; always `invalid_request_error`.

    """

    type: str = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        """Create the error; `param` names the request field at fault."""
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


# --------------------------------------------------------------------------- segments
@dataclass(frozen=True)
class Segment:
    """One piece of a rendered prompt: template markup, or caller text (§0.3)."""

    text: str
    """The text of the segment."""
    markup: bool = False
    """True: encoded with the markup tokenizer. False: plain text, never a control token."""


def M(text: str) -> Segment:  # noqa: N802 - the spec's notation
    """Make a markup segment (`M"..."` in PROTOCOLS.md)."""
    return Segment(text, True)


def T(text: str) -> Segment:  # noqa: N802 - the spec's notation
    """Make a plain segment (`T"..."` in PROTOCOLS.md)."""
    return Segment(text, False)


class Prompt(list[Segment]):
    """A rendered prompt: the segment list plus what its reply parser must know."""

    def __init__(
        self,
        segments: Iterable[Segment] = (),
        *,
        reasoning_open: bool = False,
        tools: Sequence[Mapping[str, Any]] = (),
        thinking: bool = False,
    ) -> None:
        """Create a prompt.

        Args:
            segments: The segments, in order.
            reasoning_open: The generation prompt left the reasoning channel open.
            tools: The request's tool entries (parsers type arguments by them).
            thinking: The resolved thinking flag.

        """
        super().__init__(segments)
        self.reasoning_open = reasoning_open
        self.tools: list[Mapping[str, Any]] = list(tools)
        self.thinking = thinking

    @property
    def text(self) -> str:
        """All segments joined (for display; never tokenize this)."""
        return "".join(s.text for s in self)


@dataclass(frozen=True)
class ImageInfo:
    """An image the host already encoded, as the renderer needs it."""

    width: int
    """Source width in pixels."""
    height: int
    """Source height in pixels."""


# --------------------------------------------------------------------------- deltas
@dataclass(frozen=True)
class ToolCallStart:
    """A call's name is known: announce it (once per call)."""

    index: int
    """0-based position in the reply's call list."""
    id: str
    """The call id reported to clients."""
    name: str
    """The function name."""


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of a call's arguments string; fragments concatenate to `ToolCall.arguments`."""

    index: int
    """0-based position in the reply's call list."""
    fragment: str
    """The next part of the arguments string."""


@dataclass(frozen=True)
class ToolCallEnd:
    """A call is complete; nothing more will change it."""

    index: int
    """0-based position in the reply's call list."""
    malformed: bool = False
    """True when the arguments string is not a JSON object."""


ToolCallEvent = Union[ToolCallStart, ToolCallArguments, ToolCallEnd]
"""One tool-call event of a `Delta`."""


@dataclass(frozen=True)
class Delta:
    """What one fed token (or `flush`) added to the reply. Only increments."""

    reasoning: str = ""
    """Reasoning text added."""
    content: str = ""
    """Answer text added."""
    tool_calls: tuple[ToolCallEvent, ...] = ()
    """Tool-call events, in order."""

    @property
    def empty(self) -> bool:
        """True when the delta adds nothing."""
        return not (self.reasoning or self.content or self.tool_calls)


class DeltaAccumulator:
    """Fold a stream of `Delta`s back into an `AssistantMessage`, as a streaming client does."""

    def __init__(self) -> None:
        """Start empty."""
        self.reasoning = ""
        self.content = ""
        self.calls: dict[int, dict[str, Any]] = {}

    def add(self, delta: Delta) -> None:
        """Apply one delta."""
        self.reasoning += delta.reasoning
        self.content += delta.content
        for ev in delta.tool_calls:
            if isinstance(ev, ToolCallStart):
                self.calls[ev.index] = {
                    "id": ev.id,
                    "name": ev.name,
                    "arguments": "",
                    "malformed": False,
                }
            elif isinstance(ev, ToolCallArguments):
                self.calls[ev.index]["arguments"] += ev.fragment
            else:
                self.calls[ev.index]["malformed"] = ev.malformed

    def message(self, finish_reason: str | None = None) -> AssistantMessage:
        """Return the message the deltas so far describe."""
        calls = [
            ToolCall(
                index=i,
                id=c["id"],
                name=c["name"],
                arguments=c["arguments"],
                malformed=c["malformed"],
            )
            for i, c in sorted(self.calls.items())
        ]
        return AssistantMessage(
            content=self.content or None,
            reasoning=self.reasoning or None,
            tool_calls=calls,
            finish_reason=finish_reason,  # type: ignore[arg-type]
        )


@dataclass
class _Call:
    index: int
    id: str
    name: str = ""
    arguments: str = ""
    raw: str | None = None
    streamed: str = ""
    started: bool = False
    ended: bool = False
    malformed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class ReplyParser(abc.ABC):
    """Turns a generated token stream into reasoning, content and tool calls.

    Structure is decided from token ids alone (§1.3). Model output never
    raises; what cannot be parsed is kept as text or as a flagged call.
    Call `feed` per token, then `flush` for the last delta, then `finish`.
    """

    def __init__(self) -> None:
        """Start an empty reply."""
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []
        self._d_reasoning: list[str] = []
        self._d_content: list[str] = []
        self._events: list[ToolCallEvent] = []
        self._finished = False
        self._flushed = False

    @property
    def finished(self) -> bool:
        """True once the model ended its turn (the stop marker arrived)."""
        return self._finished

    def feed(self, token_id: int, piece: str) -> Delta:
        """Take one generated token.

        Args:
            token_id: The token id (decides whether it is a marker).
            piece: Its text piece (from `IncrementalDecoder.feed`).

        Returns:
            What the token added.

        """
        if not self._finished and not self._flushed:
            self._on_token(token_id, piece)
        return self._take()

    def flush(self) -> Delta:
        """End of stream: file anything half-finished and complete every call. Idempotent."""
        if not self._flushed:
            self._on_flush()
            self._flushed = True
            for call in self._calls:
                self._seal(call)
        return self._take()

    def finish(self, *, hit_limit: bool = False) -> AssistantMessage:
        """Return the whole reply (calls `flush` first if needed).

        Args:
            hit_limit: Generation stopped at the token limit.

        Returns:
            The message; `finish_reason` is `tool_calls` if any call was
            parsed, else `length` if the limit was hit before the turn ended,
            else `stop`.

        """
        self.flush()
        calls = [
            ToolCall(
                index=c.index,
                id=c.id,
                name=c.name,
                arguments=c.arguments,
                malformed=c.malformed,
                raw=c.raw,
            )
            for c in self._calls
        ]
        reason = (
            "tool_calls" if calls else ("length" if hit_limit and not self._finished else "stop")
        )
        return AssistantMessage(
            content="".join(self._content) or None,
            reasoning="".join(self._reasoning) or None,
            tool_calls=calls,
            finish_reason=reason,  # type: ignore[arg-type]
        )

    # ---------------------------------------------------------------- for subclasses
    @abc.abstractmethod
    def _on_token(self, token_id: int, piece: str) -> None:
        """Apply one token (never called after the turn finished or flush)."""

    def _on_flush(self) -> None:
        """File half-finished structures at end of stream."""

    def _add_reasoning(self, text: str) -> None:
        if text:
            self._reasoning.append(text)
            self._d_reasoning.append(text)

    def _add_content(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._d_content.append(text)

    def _new_call(self, call_id: str | None = None, name: str = "") -> _Call:
        index = len(self._calls)
        call = _Call(index=index, id=call_id or f"call_{index}", name=name)
        self._calls.append(call)
        return call

    def _announce(self, call: _Call) -> None:
        if not call.started:
            call.started = True
            self._events.append(ToolCallStart(call.index, call.id, call.name))

    def _stream_arguments(self, call: _Call, fragment: str) -> None:
        """Append to a call whose arguments are its raw text, streaming the fragment."""
        self._announce(call)
        call.arguments += fragment
        if fragment:
            call.streamed += fragment
            self._events.append(ToolCallArguments(call.index, fragment))

    def _seal(self, call: _Call) -> None:
        """Emit a call's remaining arguments and its end; it can no longer change."""
        if call.ended:
            return
        self._announce(call)
        rest = (
            call.arguments[len(call.streamed) :]
            if call.arguments.startswith(call.streamed)
            else call.arguments
        )
        if rest:
            self._events.append(ToolCallArguments(call.index, rest))
            call.streamed += rest
        call.malformed = call.malformed or not _is_json_object(call.arguments)
        call.ended = True
        self._events.append(ToolCallEnd(call.index, call.malformed))

    def _take(self) -> Delta:
        if not (self._d_reasoning or self._d_content or self._events):
            return Delta()
        delta = Delta("".join(self._d_reasoning), "".join(self._d_content), tuple(self._events))
        self._d_reasoning.clear()
        self._d_content.clear()
        self._events.clear()
        return delta


# --------------------------------------------------------------------------- formats
class ChatFormat(abc.ABC):
    """One conversation format: renders requests to segments and reads replies by token id.

    Subclasses list the markers that must be single control tokens; `bind`
    checks them against a vocabulary before anything is rendered.
    """

    name: ClassVar[str] = ""
    """Registry name of the format."""

    def __init__(self) -> None:
        """Create an unbound format."""
        self._tokenizer: Tokenizer | None = None
        self._ids: dict[str, int] = {}

    def required_markers(self) -> tuple[str, ...]:
        """Marker spellings that must each markup-encode to one control token."""
        return ()

    def bind(self, tokenizer: Tokenizer) -> ChatFormat:
        """Check this format against a vocabulary and remember it.

        Args:
            tokenizer: The model's tokenizer.

        Returns:
            self, bound.

        Raises:
            ChatFormatError: A marker is not one control token (the message
                names it and how many ids it encodes to).

        """
        ids: dict[str, int] = {}
        for marker in self.required_markers():
            tid = tokenizer.marker_id(marker)
            if tid is None:
                count = tokenizer.markup_count(marker)
                found = (
                    "has it only as an ordinary token, which caller text can produce"
                    if count == 1
                    else f"encodes it to {count} ids"
                )
                raise ChatFormatError(
                    f"the {self.name} chat format needs {marker} as one control token, but "
                    f"this vocabulary {found}: the tokenizer and the chat format disagree",
                    param="model",
                    code="unsupported_chat_format",
                )
            ids[marker] = tid
        self._tokenizer = tokenizer
        self._ids = ids
        self._on_bind(tokenizer)
        return self

    def _on_bind(self, tokenizer: Tokenizer) -> None:
        """Probe the vocabulary further (hook for formats)."""

    @property
    def tokenizer(self) -> Tokenizer:
        """The bound tokenizer."""
        if self._tokenizer is None:
            raise RuntimeError(
                f"chat format {self.name!r} is not bound to a tokenizer; call bind() first"
            )
        return self._tokenizer

    def marker_id(self, marker: str) -> int:
        """Control-token id of a marker checked at `bind`."""
        if self._tokenizer is None:
            raise RuntimeError(
                f"chat format {self.name!r} is not bound to a tokenizer; call bind() first"
            )
        return self._ids[marker]

    @property
    @abc.abstractmethod
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end generation (hand them to the engine)."""

    @property
    def default_thinking(self) -> bool:
        """Whether a request that says nothing about reasoning thinks."""
        return False

    @property
    def supports_tools(self) -> bool:
        """Whether a request may declare tools (the bound vocabulary carries a tool protocol)."""
        return True

    @property
    def supports_reasoning(self) -> bool:
        """Whether replies can carry a reasoning channel."""
        return True

    @abc.abstractmethod
    def render(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        images: Sequence[ImageInfo] | None = None,
        add_generation_prompt: bool = True,
    ) -> Prompt:
        """Render a request into segments.

        Args:
            request: The request (a dict is validated as `ChatRequest`).
            images: The request's images, encoded by the host, in
                conversation order; None when it carries none.
            add_generation_prompt: End with the hand-over to the assistant.

        Returns:
            The prompt.

        Raises:
            ChatFormatError: The format cannot express the request.

        """

    @abc.abstractmethod
    def new_parser(self, prompt: Prompt | None = None) -> ReplyParser:
        """Return a parser for the reply to `prompt` (channel and tool schemas come from it)."""

    def encode(self, prompt: Iterable[Segment]) -> list[int]:
        """Token ids of a rendered prompt (per-segment, §1.2)."""
        return self.tokenizer.encode_segments(prompt)


# --------------------------------------------------------------------------- request helpers
def request_dict(request: ChatRequest | Mapping[str, Any]) -> dict[str, Any]:
    """Validate a request and return it as plain dicts, keeping only members that were set.

    `developer` turns become `system` (§7.5). Absent and null stay distinct.

    Raises:
        ChatFormatError: The request does not validate (`param` = the field).

    """
    if not isinstance(request, ChatRequest):
        try:
            request = ChatRequest.model_validate(request)
        except ValidationError as exc:
            # A union reports one error per branch; the deepest location is the useful one.
            err = max(exc.errors(), key=lambda e: len(_loc_to_param(e.get("loc", ())) or ""))
            param = _loc_to_param(err.get("loc", ()))
            raise ChatFormatError(
                f"{param or 'request'}: {err.get('msg', 'invalid')}", param=param
            ) from None
    out = request.model_dump(mode="python", exclude_unset=True, by_alias=True)
    for msg in out["messages"]:
        if msg.get("role") == "developer":
            msg["role"] = "system"
    return out


def _loc_to_param(loc: Sequence[Any]) -> str | None:
    parts: list[str] = []
    items = list(loc)
    for pos, item in enumerate(items):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        text = str(item)
        after_index = pos > 0 and isinstance(items[pos - 1], int)
        if (
            "[" in text
            or "-" in text
            or text == "str"
            or (after_index and text in ("text", "image") and pos + 1 < len(items))
        ):
            continue
        parts.append(("." if parts else "") + text)
    return "".join(parts) or None


def apply_named_tool_choice(
    messages: list[dict[str, Any]], tool_choice: Any
) -> tuple[list[dict[str, Any]], Any]:
    """Turn a named tool_choice into a trailing system message plus `required` (§7.7)."""
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if name:
            note = f"You must call the tool `{name}` in your next message, and no other."
            messages = [*messages, {"role": "system", "content": note}]
        return messages, "required"
    return messages, tool_choice


def resolve_reasoning(
    effort: Any,
    thinking: Any,
    default: bool,
    *,
    accepted: Sequence[str] = K3_EFFORTS,
    unsupported_message: str | None = None,
) -> tuple[bool, str | None]:
    """Resolve `reasoning_effort` and `thinking` into (thinking, effort) (§7.6).

    Args:
        effort: The requested effort, or None.
        thinking: The requested thinking flag, or None.
        default: The format's default thinking.
        accepted: Efforts the format accepts (lower case).
        unsupported_message: Refusal text for another effort (`{v}` = repr);
            defaults to K3's text.

    Returns:
        (thinking on?, lower-cased effort or None).

    Raises:
        ChatFormatError: With param `thinking` or `reasoning_effort`.

    """
    if thinking is not None and not isinstance(thinking, bool):
        raise ChatFormatError("'thinking' must be a boolean", param="thinking")
    if effort is None:
        return (default if thinking is None else thinking), None
    if not isinstance(effort, str):
        raise ChatFormatError("'reasoning_effort' must be a string", param="reasoning_effort")
    level = effort.lower()
    if level in NO_REASONING_EFFORTS:
        return False, None
    if level not in accepted:
        template = unsupported_message or (
            "reasoning_effort={v} is not supported by this model. Kimi K3 accepts ['high', "
            "'low', 'max'], "
            "or ['minimal', 'none', 'off'] to answer without reasoning. "
            "(K3's own encoder documents 'medium' and then rejects it.)"
        )
        raise ChatFormatError(template.format(v=repr(effort)), param="reasoning_effort")
    if thinking is False:
        raise ChatFormatError(
            "'thinking' is false but 'reasoning_effort' asks for reasoning \u2014 pick one",
            param="reasoning_effort",
        )
    return True, level


def function_of(call: Any) -> Any:
    """Return a history call's function object: its `function` member, else the call itself."""
    if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
        return call["function"]
    return call


def has_images(messages: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any message carries an image part."""
    return any(
        isinstance(p, Mapping) and p.get("type") in ("image", "image_url")
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
    )


# --------------------------------------------------------------------------- JSON helpers
def dumps_py(value: Any, *, ascii_only: bool = False) -> str:
    """JSON as Python's `json.dumps` writes it by default (`", "`, `": "`), non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ascii_only)


def dumps_compact(value: Any, *, ascii_only: bool = False) -> str:
    """Compact JSON (`,` and `:`), non-ASCII kept unless `ascii_only`."""
    return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))


def deep_sort(value: Any) -> Any:
    """Sort the keys of every object at any depth; list order is kept."""
    if isinstance(value, Mapping):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def loads_or_raw(text: str) -> Any:
    """Parse JSON (NaN/Infinity accepted, duplicate keys: last wins); the text itself on failure."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
