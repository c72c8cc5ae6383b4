"""XTML: Kimi K3's prompt format (PROTOCOLS §2) and its reply reader, "regions" (§3).

Owns: rendering a request into XTML segments (tags, attributes with `&`/`"`
escaping, tool declarations, tool-result re-sorting and numbering, synthetic
request notes, media blocks, the generation prompt) and `XtmlParser`, which
reads a reply by token id (§3.2) or, for hosts without ids, by text (§3.10).

Refuses (ChatFormatError, param `messages` unless stated): tool calls that are
not objects or lack a name, arguments that are not a JSON object, tool results
whose name cannot be resolved, image/placeholder count mismatches, effort
`medium` (param `reasoning_effort`), images on a vocabulary without media
markers.
Called by: the registry (name `xtml`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    _Call,
    apply_named_tool_choice,
    deep_sort,
    dumps_compact,
    dumps_py,
    function_of,
    request_dict,
    resolve_reasoning,
)
from warp_providers.types import ChatRequest

__all__ = ["XtmlFormat", "XtmlParser", "parse_header"]

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
MARKERS = (OPEN, CLOSE, SEP, EOM)
MEDIA_MARKERS = ("<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>")
PLACEHOLDER = "<|kimi_image_placeholder|>"
_RAW = "\x00xtml_raw_json"  # private member carrying an unparseable arguments string (§2.4.2)

TOOLS_HEADER = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
LAZY_TOOLS_HEADER = (
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\nHere are the specs for the extended "
    "tools.\n\n```json\n"
)
EFFORT_NOTE = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including "
    "the response "
    "channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={}`."
)
TOOL_CHOICE_NOTES = {
    "required": "The system is invoked with `tool_choice=required`.\n"
    "You MUST call tools in the next message.",
    "none": "The system is invoked with `tool_choice=none`.\n"
    "You MUST NOT call any tools in the next message.",
}
_JSON_ONLY = (
    "Your response must be raw JSON data without markdown code blocks (```json) "
    "or any additional formatting."
)
JSON_OBJECT_NOTE = f"The system is invoked with `response_format=json_object`.\n{_JSON_ONLY}"
JSON_SCHEMA_NOTE = (
    f"The system is invoked with `response_format=json_schema`.\n{_JSON_ONLY}\n"
    "The JSON data must match the following schema:\n```json\n{}\n```"
)
UNRESOLVED_TOOL = (
    "Kimi K3 tool messages need a resolvable tool name: carry `tool`/`name`, "
    "or match a preceding assistant tool_call by order."
)


def _err(message: str) -> ChatFormatError:
    return ChatFormatError(message, param="messages")


def escape_attr(value: str) -> str:
    """Attribute escaping (§2.2): `&` first, then `"`."""
    return value.replace("&", "&amp;").replace('"', "&quot;")


def unescape_attr(value: str) -> str:
    """Attribute unescaping (§3.7): `&quot;` first, then `&amp;`."""
    return value.replace("&quot;", '"').replace("&amp;", "&")


def argument_type_and_text(value: Any) -> tuple[str, str]:
    """Return the `type` attribute and body text of one call argument (§2.4.1 table)."""
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if value is None:
        return "null", "null"
    if isinstance(value, (int, float)):
        return "number", json.dumps(value)
    if isinstance(value, str):
        return "string", value
    if isinstance(value, Mapping):
        return "object", dumps_py(value)
    return "array", dumps_py(value)


def normalise_arguments(arguments: Any, present: bool) -> tuple[dict[str, Any], str | None]:
    """Normalise a history call's `arguments` into (mapping, raw JSON block or None) (§2.4.2)."""
    if not present or arguments is None:
        return {}, None
    if isinstance(arguments, Mapping):
        return dict(arguments), None
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}, None
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return {}, arguments
        if not isinstance(parsed, dict):
            raise _err("Kimi K3 tool call arguments must be a JSON object.")
        return parsed, None
    raise _err("Kimi K3 tool call arguments must be a dict or a JSON object string.")


def resort_tool_results(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Re-order and rename runs of tool results by `tool_call_id` (§2.6.1); never mutates."""
    out: list[Mapping[str, Any]] = []
    index: dict[str, tuple[int, Any]] = {}
    i = 0
    while i < len(messages):
        msg = messages[i]
        role = msg.get("role")
        if role == "assistant":
            index = {}
            calls = msg.get("tool_calls")
            for pos, call in enumerate(calls if isinstance(calls, list) else [], 1):
                if (
                    not isinstance(call, Mapping)
                    or call.get("id") is None
                    or str(call["id"]) in index
                ):
                    continue
                fn = function_of(call)
                index[str(call["id"])] = (pos, fn.get("name") if isinstance(fn, Mapping) else None)
        if role != "tool":
            out.append(msg)
            i += 1
            continue
        j = i
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        run = messages[i:j]
        keys = [m["tool_call_id"] if "tool_call_id" in m else m.get("id") for m in run]
        if all(k is not None and str(k) in index for k in keys):
            for m, k in sorted(zip(run, keys), key=lambda mk: index[str(mk[1])][0]):
                name = index[str(k)][1]
                copy = {**m, "tool": name}
                if "name" in copy:
                    copy["name"] = name
                out.append(copy)
        else:
            out.extend(run)
        i = j
    return out


class _Renderer:
    """One render pass: segment list plus the media-block queue."""

    def __init__(self, blocks: list[str] | None) -> None:
        self.segs: list[Segment] = []
        self.blocks = blocks
        self.consumed = 0

    def open(self, name: str, attrs: Sequence[tuple[str, Any]] = ()) -> None:
        self.segs += [M(OPEN), T(name)]
        for key, value in attrs:
            text = escape_attr(str(value))
            self.segs += [T(f" {key}"), T('="')]
            if text:
                self.segs.append(T(text))
            self.segs.append(T('"'))
        self.segs.append(M(SEP))

    def close(self, name: str) -> None:
        self.segs += [M(CLOSE), T(name), M(SEP)]

    def message(self, attrs: Sequence[tuple[str, Any]], body: str) -> None:
        self.open("message", attrs)
        self.segs.append(T(body))
        self.close("message")
        self.segs.append(M(EOM))

    def media(self) -> None:
        if self.blocks is None:
            self.segs.append(M(PLACEHOLDER))
            return
        if self.consumed >= len(self.blocks):
            raise _err("More image placeholders than image prompts.")
        self.segs.append(M(self.blocks[self.consumed]))
        self.consumed += 1

    def text(self, text: str) -> None:
        if self.blocks is not None and PLACEHOLDER in text:
            pieces = text.split(PLACEHOLDER)
            for n, piece in enumerate(pieces):
                if n:
                    self.media()
                if piece:
                    self.segs.append(T(piece))
        elif text:
            self.segs.append(T(text))

    def content(self, content: Any) -> None:
        if isinstance(content, str):
            self.text(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") in ("image", "image_url"):
                    self.media()
                elif isinstance(part.get("text"), str):
                    self.text(part["text"])


class XtmlFormat(ChatFormat):
    """Kimi K3's XTML format.

    Args:
        default_thinking: Thinking for requests that do not say (server default: on).

    """

    name = "xtml"

    def __init__(self, *, default_thinking: bool = True) -> None:
        """Create the format."""
        super().__init__()
        self._default_thinking = default_thinking
        self._has_media = False

    def required_markers(self) -> tuple[str, ...]:
        """OPEN, CLOSE, SEP and EOM."""
        return MARKERS

    def _on_bind(self, tokenizer: Any) -> None:
        self._has_media = all(tokenizer.marker_id(m) is not None for m in MEDIA_MARKERS)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """EOM."""
        return (self.marker_id(EOM),)

    @property
    def default_thinking(self) -> bool:
        """On unless constructed otherwise."""
        return self._default_thinking

    def render(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        images: Sequence[ImageInfo] | None = None,
        add_generation_prompt: bool = True,
    ) -> Prompt:
        """Render per §2.11 (see `ChatFormat.render`)."""
        req = request_dict(request)
        messages, tool_choice = apply_named_tool_choice(req["messages"], req.get("tool_choice"))
        thinking, effort = resolve_reasoning(
            req.get("reasoning_effort"), req.get("thinking"), self.default_thinking
        )
        if images is not None and self._tokenizer is not None and not self._has_media:
            raise _err(
                "this model's vocabulary has no media markers, so it cannot be shown an image"
            )
        blocks = None if images is None else [_media_block(img) for img in images]
        r = _Renderer(blocks)

        convo = [_normalise_message(m) for m in resort_tool_results(messages)]
        tools = req.get("tools") or []
        if tools:
            r.message(
                [("role", "system"), ("type", "tool-declare")],
                TOOLS_HEADER + dumps_compact(deep_sort(tools)) + "\n```",
            )
        if thinking and effort:
            r.message(
                [("role", "system"), ("type", "thinking-effort")],
                EFFORT_NOTE.format(effort).strip(),
            )
        self._conversation(r, convo, thinking)
        note = TOOL_CHOICE_NOTES.get(tool_choice) if isinstance(tool_choice, str) else None
        if note:
            r.message([("role", "system"), ("type", "tool-choice")], note)
        rf_note = _response_format_note(req.get("response_format"))
        if rf_note:
            r.message([("role", "system"), ("type", "response-format")], rf_note.strip())
        if add_generation_prompt:
            r.open("message", [("role", "assistant")])
            r.open("think" if thinking else "response")
        if blocks is not None and r.consumed != len(blocks):
            raise _err(
                f"image prompt count {len(blocks)} != consumed placeholder count {r.consumed}"
            )
        return Prompt(
            r.segs,
            reasoning_open=thinking and add_generation_prompt,
            tools=tools,
            thinking=thinking,
        )

    def _conversation(
        self, r: _Renderer, messages: Sequence[Mapping[str, Any]], thinking: bool
    ) -> None:
        n = 0
        last_calls: list[Any] = []
        for msg in messages:
            if not isinstance(msg, Mapping):
                continue
            role = msg.get("role")
            if role == "assistant":
                n = 0
                calls = msg.get("tool_calls")
                last_calls = calls if isinstance(calls, list) else []
                r.open("message", [("role", "assistant"), *_name_attr(msg)])
                self._assistant_body(r, msg, thinking)
                r.close("message")
                r.segs.append(M(EOM))
            elif role == "tool":
                n += 1
                name = msg["tool"] if "tool" in msg else msg.get("name")
                if name is None and len(last_calls) >= n:
                    fn = function_of(last_calls[n - 1])
                    name = fn.get("name") if isinstance(fn, Mapping) else None
                if name is None:
                    raise _err(UNRESOLVED_TOOL)
                r.open("message", [("role", "tool"), ("tool", name), ("index", n)])
                r.content(msg.get("content"))
                r.close("message")
                r.segs.append(M(EOM))
            elif role == "system" and msg.get("tools"):
                body = LAZY_TOOLS_HEADER + dumps_compact(deep_sort(msg["tools"])) + "\n```"
                r.message([("role", "system"), ("type", "tool-declare")], body)
            elif role in ("system", "user"):
                r.open("message", [("role", role), *_name_attr(msg)])
                r.content(msg.get("content"))
                r.close("message")
                r.segs.append(M(EOM))

    def _assistant_body(self, r: _Renderer, msg: Mapping[str, Any], thinking: bool) -> None:
        if thinking:
            r.open("think")
            reasoning = msg.get("reasoning_content")
            if reasoning is None or reasoning == "":
                reasoning = msg.get("reasoning")
            if reasoning is not None and str(reasoning).strip():
                r.text(str(reasoning))
            r.close("think")
        r.open("response")
        r.content(msg.get("content"))
        r.close("response")
        calls = msg.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            return
        r.open("tools")
        for j, call in enumerate(calls, 1):
            fn = function_of(call)
            r.open("call", [("tool", fn["name"]), ("index", j)])
            raw = fn.get(_RAW)
            if raw is not None:
                r.open("json", [("type", "object")])
                r.text(raw)
                r.close("json")
            else:
                for key, value in fn.get("arguments", {}).items():
                    kind, text = argument_type_and_text(value)
                    r.open("argument", [("key", key), ("type", kind)])
                    r.text(text)
                    r.close("argument")
            r.close("call")
        r.close("tools")

    def new_parser(self, prompt: Prompt | None = None) -> XtmlParser:
        """Return a regions parser opened on the channel the prompt left open."""
        thinking = prompt.thinking if prompt is not None else self.default_thinking
        ids = {self.marker_id(m): m for m in MARKERS}
        return XtmlParser(ids, initial="think" if thinking else "response")


def _media_block(img: ImageInfo) -> str:
    return (
        f"<|media_begin|>image {img.width}x{img.height}<|media_content|><|media_pad|><|media_end|>"
    )


def _name_attr(msg: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [("name", msg["name"])] if msg.get("name") else []


def _normalise_message(msg: Mapping[str, Any]) -> Mapping[str, Any]:
    calls = msg.get("tool_calls")
    if msg.get("role") != "assistant" or not isinstance(calls, list):
        return msg
    out: list[Any] = []
    for call in calls:
        if not isinstance(call, Mapping):
            raise _err("Kimi K3 tool calls must be objects.")
        fn = function_of(call)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _err("Kimi K3 tool calls require a non-empty function name.")
        args, raw = normalise_arguments(fn.get("arguments"), "arguments" in fn)
        new_fn = {k: v for k, v in fn.items() if k != _RAW}
        new_fn["arguments"] = args
        if raw is not None:
            new_fn[_RAW] = raw
        out.append({**call, "function": new_fn})
    return {**msg, "tool_calls": out}


def _response_format_note(rf: Any) -> str | None:
    kind = rf.get("type") if isinstance(rf, Mapping) and "type" in rf else rf
    if kind == "json_object":
        return JSON_OBJECT_NOTE
    if kind != "json_schema":
        return None
    spec = rf.get("json_schema") if isinstance(rf, Mapping) else None
    if isinstance(spec, Mapping):
        if "schema" in spec:
            schema = spec["schema"]
        elif "json_schema" in spec:
            schema = spec["json_schema"]
        else:
            schema = spec
    else:
        schema = spec
    return JSON_SCHEMA_NOTE.format(dumps_compact(deep_sort(schema)))


# --------------------------------------------------------------------------- reading replies
def parse_header(header: str) -> tuple[str, dict[str, str]]:
    """Split a tag header into its name and attributes (§3.7)."""
    header = header.strip()
    if not header:
        return "", {}
    space = header.find(" ")
    if space < 0:
        return header, {}
    name, rest = header[:space], header[space + 1 :]
    attrs: dict[str, str] = {}
    pos = 0
    while True:
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        eq = rest.find("=", pos)
        if eq < 0:
            break
        key = rest[pos:eq].strip()
        pos = eq + 1
        if pos < len(rest) and rest[pos] == '"':
            end = rest.find('"', pos + 1)
            value, pos = (rest[pos + 1 :], len(rest)) if end < 0 else (rest[pos + 1 : end], end + 1)
        else:
            end = rest.find(" ", pos)
            value, pos = (rest[pos:], len(rest)) if end < 0 else (rest[pos:end], end)
        if key:
            attrs[key] = unescape_attr(value)
    return name, attrs


def decode_argument(text: str, declared: str) -> Any:
    """Decode a filed argument from its text and declared type, a hint only (§3.8)."""
    if declared == "string":
        return text
    if declared == "null":
        return None
    if declared == "boolean":
        low = text.strip().lower()
        return True if low == "true" else False if low == "false" else text
    try:
        return json.loads(text.strip())
    except ValueError:
        return text


class XtmlParser(ReplyParser):
    """The regions reader (§3). `feed` is the token path; `feed_text` the text path.

    Args:
        marker_ids: Control-token id -> XTML marker spelling.
        initial: Channel the generation prompt left open (`think`,
            `response`, or None for an empty stack).

    """

    _LONGEST = max(len(m) for m in MARKERS)

    def __init__(self, marker_ids: Mapping[int, str], initial: str | None = None) -> None:
        """Create the parser."""
        super().__init__()
        self._markers = dict(marker_ids)
        self._stack: list[str] = [initial] if initial else []
        self._header: str | None = None
        self._header_kind = OPEN
        self._arg: list[str] | None = None  # [key, declared type, text]
        self._json: str | None = None
        self._buffer = ""

    def _on_token(self, token_id: int, piece: str) -> None:
        marker = self._markers.get(token_id)
        if marker is not None:
            self._marker(marker)
        elif piece:
            self._text(piece)

    def feed_text(self, chunk: str) -> Any:
        """Text path (§3.10): find marker spellings in text. Ambiguous; not for servers.

        Returns:
            The `Delta` this chunk added.

        """
        if self._finished or self._flushed:
            return self._take()
        self._buffer += chunk
        while not self._finished:
            hits = [(self._buffer.find(m), m) for m in MARKERS]
            hits = [(pos, m) for pos, m in hits if pos >= 0]
            if not hits:
                break
            pos, marker = min(hits)
            self._text(self._buffer[:pos])
            self._buffer = self._buffer[pos + len(marker) :]
            self._marker(marker)
        if self._finished:
            self._buffer = ""
            return self._take()
        hold = 0
        for k in range(min(len(self._buffer), self._LONGEST - 1), 0, -1):
            if any(m.startswith(self._buffer[-k:]) for m in MARKERS):
                hold = k
                break
        self._text(self._buffer[: len(self._buffer) - hold])
        self._buffer = self._buffer[len(self._buffer) - hold :]
        return self._take()

    def _marker(self, marker: str) -> None:
        if marker == EOM:
            self._finished = True
        elif marker in (OPEN, CLOSE):
            self._header, self._header_kind = "", marker
        elif self._header is not None:
            header, self._header = self._header, None
            (self._open if self._header_kind == OPEN else self._close)(header)

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._header is not None:
            self._header += text
        else:
            self._route(text)

    def _route(self, text: str) -> None:
        top = self._stack[-1] if self._stack else ""
        if self._json is not None:
            self._json += text
        elif self._arg is not None and self._arg[0]:
            self._arg[2] += text
        elif top == "think":
            self._add_reasoning(text)
        elif top in ("tools", "call"):
            return
        else:
            self._add_content(text)

    def _open(self, header: str) -> None:
        name, attrs = parse_header(header)
        if name == "call":
            if self._calls:
                self._seal(self._calls[-1])
            try:
                index = int(attrs["index"])
            except (KeyError, ValueError):
                index = len(self._calls) + 1
            call = self._new_call(attrs.get("id") or f"call_{index}", attrs.get("tool", ""))
            call.extra.update(args={}, raw=None)
            self._announce(call)
        elif name == "argument":
            self._arg = [attrs.get("key", ""), attrs.get("type", ""), ""]
        elif name == "json":
            self._json = ""
        self._stack.append(name)

    def _close(self, header: str) -> None:
        name, _ = parse_header(header)
        if name == "argument":
            self._file_argument()
        elif name == "json":
            self._file_json()
        if name in self._stack:
            top = len(self._stack) - 1 - self._stack[::-1].index(name)
            del self._stack[top:]
        elif name == "" and self._stack:
            self._stack.pop()

    def _file_argument(self) -> None:
        arg, self._arg = self._arg, None
        if arg is not None and arg[0] and self._calls:
            self._calls[-1].extra["args"][arg[0]] = decode_argument(arg[2], arg[1])

    def _file_json(self) -> None:
        if self._calls:
            self._calls[-1].extra["raw"] = self._json if self._json is not None else ""
        self._json = None

    def _on_flush(self) -> None:
        if self._buffer:
            buffered, self._buffer = self._buffer, ""
            self._text(buffered)
        if self._header is not None:
            text = self._header_kind + self._header
            self._header = None
            self._route(text)
        if self._json is not None:
            self._file_json()
        if self._arg is not None and self._arg[0]:
            self._file_argument()

    def _seal(self, call: _Call) -> None:
        if not call.ended:
            raw = call.extra.get("raw")
            call.arguments = raw if raw is not None else dumps_py(call.extra.get("args", {}))
        super()._seal(call)
