"""chat.json formats: a container's declarative turn strings (PROTOCOLS §4).

Owns: loading and validating `chat.json` (§4.2, in the spec's order and
texts), the marker vocabulary check, native tool-protocol discovery (§4.5:
Kimi's five markers first, then GLM's nine), rendering (§4.6) and the
token-driven reply reader (§4.8). The tool protocols themselves live in
`glm.py` and `kimi.py` behind the `ToolProtocol` interface defined here.

Refuses (§4.7, ChatFormatError with the spec's param and text): tools without
a protocol, any tool_choice, any response_format, thinking the format cannot
honour, an effort without an `effort` template, images without an `image`
block, roles without a pair, tool turns without a protocol.
Called by: the registry (`chatjson`), and `GlmFormat` / `KimiFormat`.
"""

from __future__ import annotations

import abc
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from warp_providers.chat.base import (
    ChatFormat,
    ChatFormatError,
    ImageInfo,
    M,
    Prompt,
    ReplyParser,
    Segment,
    T,
    apply_named_tool_choice,
    request_dict,
    resolve_reasoning,
)
from warp_providers.types import ChatRequest

__all__ = [
    "ChatJsonFormat",
    "ChatJsonParser",
    "ChatJsonSpec",
    "ToolProtocol",
    "ToolReader",
    "load_chat_json",
]

MARKER_PATTERN = re.compile(r"<\|[^|>]+\|>|<think>|</think>")
"""A control-token spelling inside chat.json strings (§4.3)."""
IM_END = "<|im_end|>"
_ROLES = ("system", "user", "assistant")


def _bad(message: str) -> ChatFormatError:
    return ChatFormatError(message, param="model", code="unsupported_chat_format")


class ChatJsonSpec:
    """A validated chat.json (§4.1). Build with `ChatJsonSpec.parse`."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        """Store validated fields; use `parse`."""
        self.pairs: dict[str, tuple[str, str]] = {
            r: (data[r][0], data[r][1]) for r in _ROLES if data.get(r) is not None
        }
        self.open: str = data["open"]
        self.prelude: str = data.get("prelude") or ""
        think = data.get("think")
        self.think: tuple[str, str] | None = (think[0], think[1]) if think is not None else None
        self.effort: str = data.get("effort") or ""
        self.image: str = data.get("image") or ""
        self.stop_marker: str = _stop_marker(data)

    @classmethod
    def parse(cls, data: Any) -> ChatJsonSpec:
        """Validate a decoded chat.json (§4.2 rules 3-12, in order).

        Raises:
            ChatFormatError: The spec's message for the first broken rule.

        """
        if not isinstance(data, Mapping):
            raise _bad("chat.json must be a JSON object")
        for role in _ROLES:
            pair = data.get(role)
            if pair is not None and not (
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
            ):
                raise _bad(f'chat.json "{role}" must be a [prefix, suffix] pair of strings')
        if not isinstance(data.get("open"), str) or not data["open"]:
            raise _bad(
                'chat.json has no "open", so there is nothing to hand the model the floor with'
            )
        if data.get("user") is None:
            raise _bad('chat.json has no "user" turn, so a request cannot be put to the model')
        if data.get("stop") is not None and not isinstance(data["stop"], str):
            raise _bad('chat.json "stop" must be a string')
        _stop_marker(data)
        if data.get("prelude") and not isinstance(data["prelude"], str):
            raise _bad('chat.json "prelude" must be a string')
        think = data.get("think")
        if think is not None and not (
            isinstance(think, list)
            and len(think) == 2
            and all(isinstance(t, str) and t for t in think)
        ):
            raise _bad('chat.json "think" must be an [open, close] pair of non-empty strings')
        for key in ("effort", "image"):
            if data.get(key) and not isinstance(data[key], str):
                raise _bad(f'chat.json "{key}" must be a string')
        if data.get("effort") and "{}" not in data["effort"]:
            raise _bad('chat.json "effort" must contain {} where the level goes')
        return cls(data)

    def markers(self) -> list[str]:
        """Every distinct marker spelling of the markup strings, sorted (§4.2 rule 13)."""
        sources = [s for pair in self.pairs.values() for s in pair]
        sources += [self.open, self.prelude, self.effort, self.image, *(self.think or ())]
        return sorted({m.group(0) for s in sources for m in MARKER_PATTERN.finditer(s)})


def _stop_marker(data: Mapping[str, Any]) -> str:
    assistant = data.get("assistant")
    source = data.get("stop") or (assistant[1] if assistant is not None else "")
    found = MARKER_PATTERN.search(source)
    if found is None:
        raise _bad(
            "chat.json carries no control token that ends a generated turn: "
            'give it a "stop", or an "assistant" suffix that has one'
        )
    return found.group(0)


def load_chat_json(source: str | os.PathLike[str] | Mapping[str, Any] | Any) -> ChatJsonSpec:
    """Load and validate a chat.json (§4.2 rules 1-12).

    Args:
        source: The decoded JSON value, a path to the file, or None (missing).

    Returns:
        The validated spec.

    Raises:
        ChatFormatError: The spec's message (param `model`).

    """
    path = Path(source) if isinstance(source, (str, os.PathLike)) else None
    if source is None or (path is not None and not path.is_file()):
        raise _bad(
            "the container has no chat.json describing its conversation format "
            "(examples/ has one per supported architecture)"
        )
    if path is not None:
        try:
            source = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _bad(f"chat.json cannot be read: {exc}") from None
    return ChatJsonSpec.parse(source)


# --------------------------------------------------------------------------- tool protocols
class ToolReader:
    """A protocol's reply reader, driven by `ChatJsonParser` (§4.8). The default claims nothing."""

    def __init__(self, host: ReplyParser) -> None:
        """Attach to the parser whose calls it fills."""
        self.host = host

    def claim_marker(self, marker: str) -> bool:
        """Handle a protocol marker; False means "not mine" (the turn ends)."""
        return False

    def claim_text(self, text: str) -> bool:
        """Handle text; False means it is reasoning or content."""
        return False

    def flush(self) -> None:
        """File a half-finished call at end of stream."""


class ToolProtocol(abc.ABC):
    """A native tool grammar a chat.json container can carry (GLM, Kimi)."""

    name: str = ""
    markers: tuple[str, ...] = ()

    @abc.abstractmethod
    def declaration(self, tools: list[Mapping[str, Any]]) -> list[Segment]:
        """Render the tool declaration turn (validates the tools)."""

    @abc.abstractmethod
    def calls(self, i: int, calls: list[Any]) -> list[Segment]:
        """Render an assistant turn's tool calls (message index i, for params)."""

    @abc.abstractmethod
    def result(
        self,
        i: int,
        msg: Mapping[str, Any],
        previous_role: str | None,
        spec: ChatJsonSpec,
        body: list[Segment],
    ) -> list[Segment]:
        """One tool-result message; `body` is its rendered content."""

    @abc.abstractmethod
    def reader(self, host: ReplyParser, tools: Sequence[Mapping[str, Any]]) -> ToolReader:
        """Return a reader for one reply to a request declaring `tools`."""


def _protocols() -> list[ToolProtocol]:
    from warp_providers.chat.formats.glm import GlmProtocol
    from warp_providers.chat.formats.kimi import KimiProtocol

    return [KimiProtocol(), GlmProtocol()]


# --------------------------------------------------------------------------- the format
class ChatJsonFormat(ChatFormat):
    """A container's chat.json, with the native tool protocol its vocabulary carries.

    Args:
        chat_json: The decoded chat.json, or a path to it.
        protocol: `"auto"` (discover at bind, §4.5), `"kimi"`, `"glm"` (must
            be present), or None (no tools).

    """

    name = "chatjson"

    def __init__(
        self,
        chat_json: str | os.PathLike[str] | Mapping[str, Any] | None,
        *,
        protocol: str | None = "auto",
    ) -> None:
        """Load and validate the chat.json (ChatFormatError when it is broken)."""
        super().__init__()
        self.spec = load_chat_json(chat_json)
        self._protocol_choice = protocol
        self.protocol: ToolProtocol | None = None
        self._table: dict[int, str] = {}

    def required_markers(self) -> tuple[str, ...]:
        """Every marker of the chat.json strings, plus a forced protocol's markers."""
        extra: tuple[str, ...] = ()
        for proto in _protocols():
            if proto.name == self._protocol_choice:
                extra = proto.markers
        return (*self.spec.markers(), *extra)

    def bind(self, tokenizer: Any) -> ChatFormat:
        """Check the markers (§4.2 rule 13) and discover the tool protocol (§4.5)."""
        for marker in self.spec.markers():
            if tokenizer.marker_id(marker) is None:
                raise _bad(
                    f"chat.json uses {marker}, which is not a single token in this container "
                    f"(got {tokenizer.markup_count(marker)}): the tokenizer and the chat "
                    f"format disagree"
                )
        super().bind(tokenizer)
        self.protocol = None
        for proto in _protocols():
            if self._protocol_choice not in ("auto", proto.name):
                continue
            if all(tokenizer.marker_id(m) is not None for m in proto.markers):
                self.protocol = proto
                break
        table = {tokenizer.marker_id(self.spec.stop_marker): self.spec.stop_marker}
        if self.protocol is not None:
            table.update({tokenizer.marker_id(m): m for m in self.protocol.markers})
        self._table = table
        return self

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The stop marker's id."""
        return (self.marker_id(self.spec.stop_marker),)

    @property
    def default_thinking(self) -> bool:
        """On when the format has a `think` pair (§4.4)."""
        return self.spec.think is not None

    @property
    def supports_tools(self) -> bool:
        """Whether bind found a native tool protocol in the vocabulary."""
        return self.protocol is not None

    @property
    def supports_reasoning(self) -> bool:
        """Whether the chat.json declares a `think` pair."""
        return self.spec.think is not None

    def render(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        images: Sequence[ImageInfo] | None = None,
        add_generation_prompt: bool = True,
    ) -> Prompt:
        """Render per §4.6 (see `ChatFormat.render`)."""
        spec = self.spec
        req = request_dict(request)
        messages, tool_choice = apply_named_tool_choice(req["messages"], req.get("tool_choice"))
        thinking, effort = resolve_reasoning(
            req.get("reasoning_effort"), req.get("thinking"), self.default_thinking
        )
        segs: list[Segment] = []
        if spec.prelude:
            segs.append(M(spec.prelude))
        tools = req.get("tools") or []
        if tools:
            if self.protocol is None:
                raise ChatFormatError(
                    "this container is served from its chat.json, which cannot express tool "
                    "definitions because "
                    "its tokenizer carries neither the Kimi K2 native tool markers nor GLM's "
                    "<tool_call> XML protocol",
                    param="tools",
                )
            segs += self.protocol.declaration(tools)
        for key in ("tool_choice", "response_format"):
            if (tool_choice if key == "tool_choice" else req.get(key)) is not None:
                raise ChatFormatError(
                    f"this container is served from its chat.json, which cannot express '{key}'",
                    param=key,
                )
        if thinking and spec.think is None:
            raise ChatFormatError(
                "this container has no reasoning channel in its tokenizer, so it cannot think "
                "on request; "
                "pass reasoning_effort 'none' or thinking false",
                param="reasoning_effort",
            )
        if not thinking and spec.think is not None:
            raise ChatFormatError(
                "this container's chat format always opens a reasoning channel, so it cannot "
                "answer without one; "
                "drop 'thinking'/'reasoning_effort' or use a container whose format does not",
                param="reasoning_effort",
            )
        if effort and not spec.effort:
            raise ChatFormatError(
                "this container's chat.json does not say how to ask for a reasoning effort",
                param="reasoning_effort",
            )
        if images and not spec.image:
            raise ChatFormatError(
                "this container is served from its chat.json, which does not say how to place "
                "an image",
                param="messages",
            )
        if effort:
            segs.append(M(spec.effort.replace("{}", effort.capitalize())))
        blocks = [spec.image] * len(images or ())
        used = 0
        for i, msg in enumerate(messages):
            role = msg.get("role")
            body, used = self._content(i, msg.get("content"), blocks, used)
            if role == "tool":
                if self.protocol is None:
                    raise _no_tool_turns(i)
                previous = messages[i - 1].get("role") if i > 0 else None
                segs += self.protocol.result(i, msg, previous, spec, body)
                continue
            if role not in spec.pairs:
                raise ChatFormatError(
                    f'messages[{i}] is a "{role}" turn, and this container\'s chat.json does '
                    f"not describe one",
                    param=f"messages[{i}].role",
                )
            prefix, suffix = spec.pairs[role]
            segs += [M(prefix), *body]
            calls = msg.get("tool_calls")
            if calls:
                if role != "assistant":
                    raise ChatFormatError(
                        f"messages[{i}] carries tool_calls on a non-assistant turn",
                        param=f"messages[{i}].tool_calls",
                    )
                if self.protocol is None:
                    raise _no_tool_turns(i)
                segs += self.protocol.calls(i, calls)
            segs.append(M(suffix))
        if used < len(blocks):
            raise ChatFormatError(
                "more images were encoded than the conversation places", param="messages"
            )
        reasoning_open = False
        if add_generation_prompt:
            segs.append(M(spec.open))
            if spec.think is not None:
                segs.append(M(spec.think[0]))
                reasoning_open = thinking
        segs = [s for s in segs if s.text]
        return Prompt(segs, reasoning_open=reasoning_open, tools=tools, thinking=thinking)

    def _content(
        self, i: int, content: Any, blocks: list[str], used: int
    ) -> tuple[list[Segment], int]:
        if isinstance(content, str):
            return [T(content)], used
        out: list[Segment] = []
        for part in content if isinstance(content, list) else []:
            if part.get("type") in ("image", "image_url"):
                if not self.spec.image:
                    raise ChatFormatError(
                        f"messages[{i}] carries an image, and this container is served from "
                        f"its chat.json, "
                        "which does not say how to place one",
                        param=f"messages[{i}].content",
                    )
                if used >= len(blocks):
                    raise ChatFormatError(
                        f"messages[{i}] carries more images than the request encoded",
                        param=f"messages[{i}].content",
                    )
                out.append(M(blocks[used]))
                used += 1
            else:
                out.append(T(part.get("text") or ""))
        return out, used

    def new_parser(self, prompt: Prompt | None = None) -> ChatJsonParser:
        """Return the §4.8 reader, with the protocol's tool reader."""
        open_channel = prompt.reasoning_open if prompt is not None else self.default_thinking
        think_close = self.marker_id(self.spec.think[1]) if self.spec.think is not None else -1
        tools = prompt.tools if prompt is not None else []
        return ChatJsonParser(self._table, think_close, open_channel, self.protocol, tools)


def _no_tool_turns(i: int) -> ChatFormatError:
    return ChatFormatError(
        "this container is served from its chat.json, which cannot express a tool call or its "
        "result",
        param=f"messages[{i}]",
    )


class ChatJsonParser(ReplyParser):
    """Token-driven reader for chat.json formats (§4.8).

    Args:
        table: Marker id -> spelling (stop marker and protocol markers).
        think_close_id: Id that closes the reasoning channel (-1: none).
        channel_open: The reply starts in the reasoning channel.
        protocol: The tool protocol, or None.
        tools: The request's tools (GLM types arguments by them).

    """

    def __init__(
        self,
        table: Mapping[int, str],
        think_close_id: int,
        channel_open: bool,
        protocol: ToolProtocol | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Create the reader."""
        super().__init__()
        self._table = dict(table)
        self._think_close = think_close_id
        self._channel = channel_open
        self._reader = protocol.reader(self, tools) if protocol is not None else ToolReader(self)

    def _on_token(self, token_id: int, piece: str) -> None:
        marker = self._table.get(token_id)
        if marker == IM_END:
            self._finished = True
        elif self._channel and token_id == self._think_close:
            self._channel = False
        elif marker is not None:
            if not self._reader.claim_marker(marker):
                self._finished = True
        elif not piece or self._reader.claim_text(piece):
            return
        elif self._channel:
            self._add_reasoning(piece)
        else:
            self._add_content(piece)

    def _on_flush(self) -> None:
        self._reader.flush()
