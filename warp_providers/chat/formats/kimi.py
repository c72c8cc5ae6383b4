"""Kimi K2's tool protocol and the Kimi-Linear chat format (PROTOCOLS §6).

Owns: the five-marker section/call grammar: the `tool_declare` turn (§6.2,
ASCII-escaped compact JSON), assistant calls in history with verbatim ids and
arguments (§6.3), tool results as renamed system turns whose name is a PLAIN
segment (§6.4, a deviation from WARP that closes a turn-forging hole), and
the reply reader (§6.5) that reports calls by list position. `KimiFormat` is
the chat.json format with Kimi-Linear's `chat.json` and this protocol required.

Refuses (ChatFormatError): history calls without an id; tool results without
`tool_call_id`, or on a chat.json without a system pair; everything chat.json
refuses (thinking, effort, images with Kimi-Linear's chat.json).
Called by: `ChatJsonFormat` (protocol discovery) and the registry (`kimi`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from warp_providers.chat.base import (
    ChatFormatError,
    M,
    ReplyParser,
    Segment,
    T,
    _Call,
    dumps_compact,
)
from warp_providers.chat.formats.chatjson import (
    ChatJsonFormat,
    ChatJsonSpec,
    ToolProtocol,
    ToolReader,
)

__all__ = ["KIMI_CHAT_JSON", "KimiFormat", "KimiProtocol", "KimiReader", "parse_call_header"]

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)

KIMI_CHAT_JSON: dict[str, Any] = {
    "system": ["<|im_system|>system<|im_middle|>", "<|im_end|>"],
    "user": ["<|im_user|>user<|im_middle|>", "<|im_end|>"],
    "assistant": ["<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"],
    "open": "<|im_assistant|>assistant<|im_middle|>",
}
"""Kimi-Linear's chat.json, verbatim (§4.1)."""


def parse_call_header(header: str, position: int) -> tuple[str, int]:
    """Parse a `functions.NAME:IDX` call header into (name, index) (§6.5).

    `position` is the index used when the header carries none.
    """
    text = header.strip()
    if text.startswith("functions."):
        text = text[len("functions.") :]
    name, index = text, position
    if ":" in text:
        left, _, right = text.rpartition(":")
        if left:
            name = left
        try:
            index = int(right)
        except ValueError:
            pass
    return name, index


class KimiProtocol(ToolProtocol):
    """Kimi K2's native tool grammar."""

    name = "kimi"
    markers = MARKERS

    def declaration(self, tools: list[Mapping[str, Any]]) -> list[Segment]:
        """Render the `tool_declare` system turn with ASCII-escaped compact JSON (§6.2)."""
        return [
            M("<|im_system|>tool_declare<|im_middle|>"),
            T(dumps_compact(tools, ascii_only=True)),
            M("<|im_end|>"),
        ]

    def calls(self, i: int, calls: list[Any]) -> list[Segment]:
        """One section with every call: verbatim id, verbatim string arguments (§6.3)."""
        segs = [M(SECTION_BEGIN)]
        for j, call in enumerate(calls):
            call_id = call.get("id") if isinstance(call, Mapping) else None
            if call_id is None or call_id == "":
                raise ChatFormatError(
                    f"messages[{i}].tool_calls[{j}] has no id",
                    param=f"messages[{i}].tool_calls[{j}].id",
                )
            fn = call.get("function", {})
            args = fn.get("arguments", "") if isinstance(fn, Mapping) else ""
            text = args if isinstance(args, str) else dumps_compact(args, ascii_only=True)
            segs += [M(CALL_BEGIN), T(str(call_id)), M(ARGUMENT_BEGIN), T(text), M(CALL_END)]
        segs.append(M(SECTION_END))
        return segs

    def result(
        self,
        i: int,
        msg: Mapping[str, Any],
        previous_role: str | None,
        spec: ChatJsonSpec,
        body: list[Segment],
    ) -> list[Segment]:
        """Render a system turn renamed for the tool; the name is plain (§6.4 [deviation])."""
        if "system" not in spec.pairs:
            raise ChatFormatError(
                f"messages[{i}] is a tool result, but this container's chat.json has no "
                f"system turn",
                param=f"messages[{i}].role",
            )
        call_id = msg.get("tool_call_id")
        if not call_id:
            raise ChatFormatError(
                f"messages[{i}] is a tool result without tool_call_id",
                param=f"messages[{i}].tool_call_id",
            )
        prefix, suffix = spec.pairs["system"]
        name = msg.get("name") or "tool"
        a = prefix.find("|>") + 2 if "|>" in prefix else -1
        b = prefix.rfind("<|")
        if prefix.endswith("|>") and b > 0 and 0 <= a <= b:
            opener = [M(prefix[:a]), T(name), M(prefix[b:])]
        else:
            opener = [M(prefix), T(name)]
        return [*opener, T(f"## Return of {call_id}\n"), *body, M(suffix)]

    def reader(self, host: ReplyParser, tools: Sequence[Mapping[str, Any]]) -> KimiReader:
        """Return a §6.5 reader."""
        return KimiReader(host)


class KimiReader(ToolReader):
    """Reads Kimi tool-call sections out of a reply (§6.5)."""

    def __init__(self, host: ReplyParser) -> None:
        """Start in the content state."""
        super().__init__(host)
        self.current: _Call | None = None
        self.header = ""
        self.state = "content"

    def _from_header(self) -> _Call:
        position = len(self.host._calls)
        name, index = parse_call_header(self.header, position)
        call = self.host._new_call(f"call_{index}", name)
        self.host._announce(call)
        return call

    def claim_marker(self, marker: str) -> bool:
        """Apply the §6.5 marker table; all five are claimed."""
        if marker == SECTION_BEGIN:
            self.state = "section"
        elif marker == CALL_BEGIN:
            if self.current is not None:
                self.host._seal(self.current)
            self.header, self.current, self.state = "", None, "header"
        elif marker == ARGUMENT_BEGIN:
            if self.state == "header":
                self.current = self._from_header()
                self.state = "arguments"
        elif marker in (CALL_END, SECTION_END):
            if self.state == "header":
                self.host._seal(self._from_header())
            if self.current is not None:
                self.host._seal(self.current)
            self.current = None
            self.state = "section" if marker == CALL_END else "content"
        else:
            return False
        return True

    def claim_text(self, text: str) -> bool:
        """Header and argument text is claimed; text inside a section is dropped."""
        if self.state == "header":
            self.header += text
        elif self.state == "arguments":
            if self.current is not None:
                self.host._stream_arguments(self.current, text)
        elif self.state != "section":
            return False
        return True

    def flush(self) -> None:
        """Create a call cut off in its header (arguments `""`)."""
        if self.state == "header":
            self.host._seal(self._from_header())
            self.state = "section"


class KimiFormat(ChatJsonFormat):
    """Kimi-Linear: its chat.json with the Kimi K2 tool protocol required.

    Args:
        chat_json: Override the built-in chat.json (a container's own).

    """

    name = "kimi"

    def __init__(self, chat_json: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> None:
        """Create the format."""
        super().__init__(KIMI_CHAT_JSON if chat_json is None else chat_json, protocol="kimi")
