"""The model's own jinja2 chat template (tokenizer_config.json / GGUF metadata) as a chat format.

Owns: rendering a request through the template in jinja2's immutable sandbox
so that template text becomes markup segments and every caller string
(content, names, ids, arguments, tool schemas) becomes a plain segment; and
`HfTemplateParser`, which reads Hermes/Qwen-style `<tool_call>{json}</tool_call>`
calls and `<think>...</think>` reasoning when the vocabulary and template
carry those markers, plain content otherwise.

How caller text is kept apart: each caller string enters the template as
`_Plain`, a `str` whose value is wrapped in per-render nonce sentinels and
whose string methods work on (and re-wrap) the unwrapped text; `tojson` output
containing caller data is wrapped whole. After rendering, the output is split
at the sentinels; unbalanced or damaged sentinels are refused, never guessed.

Refuses: tool_choice `required`/named, JSON response formats, tools when the
template has no Hermes markers, thinking the template cannot switch, efforts
the template does not read, images the template does not place.
Called by: the registry (`hf_template`).
"""

from __future__ import annotations

import contextvars
import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from warp_providers.chat.base import (
    ChatFormat,
    ChatFormatError,
    ImageInfo,
    Prompt,
    ReplyParser,
    Segment,
    dumps_py,
    has_images,
    request_dict,
    resolve_reasoning,
)
from warp_providers.types import ChatRequest

__all__ = ["HfTemplateFormat", "HfTemplateParser"]

_MARKS: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "warp_hf_template_marks", default=("", "")
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
END_MARKERS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|return|>",
    "<|end_of_text|>",
    "</s>",
)
"""End-of-turn spellings honoured when the template uses them and they are control tokens."""
_STRING_METHODS = (
    "capitalize",
    "casefold",
    "center",
    "count",
    "endswith",
    "expandtabs",
    "find",
    "index",
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isspace",
    "istitle",
    "isupper",
    "join",
    "ljust",
    "lower",
    "lstrip",
    "partition",
    "removeprefix",
    "removesuffix",
    "replace",
    "rfind",
    "rindex",
    "rjust",
    "rpartition",
    "rsplit",
    "rstrip",
    "split",
    "splitlines",
    "startswith",
    "strip",
    "swapcase",
    "title",
    "upper",
    "zfill",
)


class _Plain(str):
    """Caller text inside a template: sentinel-wrapped value, methods see the bare text."""

    _inner: str
    _marks: tuple[str, str]

    def __new__(cls, inner: str, marks: tuple[str, str]) -> _Plain:
        obj = super().__new__(cls, marks[0] + inner + marks[1])
        obj._inner = inner
        obj._marks = marks
        return obj

    def _rewrap(self, value: Any) -> Any:
        if isinstance(value, str):
            return value if isinstance(value, _Plain) else _Plain(value, self._marks)
        if isinstance(value, (list, tuple)):
            return type(value)(self._rewrap(v) for v in value)
        return value

    def __len__(self) -> int:
        return len(self._inner)

    def __eq__(self, other: object) -> bool:
        return bool(self._inner == _bare(other))

    def __ne__(self, other: object) -> bool:
        return bool(self._inner != _bare(other))

    def __lt__(self, other: object) -> bool:
        return bool(self._inner < _bare(other))

    def __le__(self, other: object) -> bool:
        return bool(self._inner <= _bare(other))

    def __gt__(self, other: object) -> bool:
        return bool(self._inner > _bare(other))

    def __ge__(self, other: object) -> bool:
        return bool(self._inner >= _bare(other))

    def __hash__(self) -> int:
        return hash(self._inner)

    def __contains__(self, item: object) -> bool:
        return bool(_bare(item) in self._inner)

    def __getitem__(self, key: Any) -> Any:
        return self._rewrap(self._inner[key])

    def __iter__(self) -> Any:
        return iter([self._rewrap(ch) for ch in self._inner])


def _method(name: str) -> Callable[..., Any]:
    def call(self: _Plain, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_bare(a) for a in args)
        if name == "join":
            args = ([_bare(a) for a in args[0]],)
        return self._rewrap(getattr(self._inner, name)(*args, **kwargs))

    call.__name__ = name
    return call


for _name in _STRING_METHODS:
    setattr(_Plain, _name, _method(_name))


def _bare(value: Any) -> Any:
    return value._inner if isinstance(value, _Plain) else value


class HfTemplateFormat(ChatFormat):
    """A model's own jinja2 chat template.

    Args:
        chat_template: The jinja2 source.
        bos_token: `bos_token` template variable (default: the bound tokenizer's).
        eos_token: `eos_token` template variable (default: the bound tokenizer's).
        template_kwargs: Extra variables for every render.

    """

    name = "hf_template"

    def __init__(
        self,
        chat_template: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Compile the template (ChatFormatError, param `model`, when it does not compile)."""
        super().__init__()
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = chat_template
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = self._tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(chat_template)
        except jinja2.TemplateError as exc:
            raise ChatFormatError(
                f"the model's chat template does not compile: {exc}", param="model"
            ) from None
        self._jinja_error = jinja2.TemplateError
        self._bos, self._eos = bos_token, eos_token
        self._kwargs = dict(template_kwargs or {})
        self._think = self._calls = False
        self._end_ids: tuple[int, ...] = ()

    def _uses(self, marker: str) -> bool:
        return marker in self.source and self.tokenizer.marker_id(marker) is not None

    @property
    def supports_tools(self) -> bool:
        """Whether the template and vocabulary carry the Hermes call markers."""
        return self._calls

    @property
    def supports_reasoning(self) -> bool:
        """Whether the template and vocabulary carry the think markers."""
        return self._think

    def _on_bind(self, tokenizer: Any) -> None:
        self._think = self._uses(THINK_OPEN) and self._uses(THINK_CLOSE)
        self._calls = self._uses(CALL_OPEN) and self._uses(CALL_CLOSE)
        ends = list(tokenizer.eos_ids)
        for marker in END_MARKERS:
            tid = tokenizer.marker_id(marker)
            if marker in self.source and tid is not None and tid not in ends:
                ends.append(tid)
        if not ends:
            raise ChatFormatError(
                "the model's chat template ends turns with no control token this vocabulary knows, "
                "so a reply would never end",
                param="model",
                code="unsupported_chat_format",
            )
        self._end_ids = tuple(ends)
        if self._bos is None and tokenizer.bos_id is not None:
            self._bos = tokenizer.id_to_piece(tokenizer.bos_id)
        if self._eos is None and tokenizer.eos_ids:
            self._eos = tokenizer.id_to_piece(tokenizer.eos_ids[0])

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """EOS ids plus the end-of-turn markers the template uses."""
        self.tokenizer  # noqa: B018 - raises when unbound
        return self._end_ids

    @property
    def default_thinking(self) -> bool:
        """On when the template and vocabulary carry `<think>`/`</think>`."""
        return self._think

    def render(
        self,
        request: ChatRequest | Mapping[str, Any],
        *,
        images: Sequence[ImageInfo] | None = None,
        add_generation_prompt: bool = True,
    ) -> Prompt:
        """Render through the template (see `ChatFormat.render`)."""
        self.tokenizer  # noqa: B018 - markers are known only once bound
        req = request_dict(request)
        messages = req["messages"]
        tools = list(req.get("tools") or [])
        choice = req.get("tool_choice")
        if isinstance(choice, Mapping) or choice == "required":
            raise ChatFormatError(
                "the model's chat template cannot express a forced tool_choice", param="tool_choice"
            )
        if choice == "none":
            tools = []
        if tools and not self._calls:
            raise ChatFormatError(
                "the model's chat template has no <tool_call> markers this vocabulary carries, "
                "so tool calls could not be read back",
                param="tools",
            )
        rf = req.get("response_format")
        if isinstance(rf, Mapping) and rf.get("type") != "text":
            raise ChatFormatError(
                f"the model's chat template cannot express response_format {rf.get('type')!r}",
                param="response_format",
            )
        reads_effort = "reasoning_effort" in self.source
        thinking, effort = resolve_reasoning(
            req.get("reasoning_effort"),
            req.get("thinking"),
            self.default_thinking,
            accepted=("low", "medium", "high") if reads_effort else (),
            unsupported_message="reasoning_effort={v} is not supported by this model's "
            "chat template",
        )
        if thinking and not self._think:
            raise ChatFormatError(
                "this model's chat template has no reasoning channel, so it cannot think on "
                "request; "
                "pass reasoning_effort 'none' or thinking false",
                param="reasoning_effort",
            )
        if not thinking and self._think and "enable_thinking" not in self.source:
            raise ChatFormatError(
                "this model's chat template cannot turn its reasoning channel off",
                param="reasoning_effort",
            )
        if has_images(messages) and "image" not in self.source:
            raise ChatFormatError(
                "this model's chat template does not say how to place an image", param="messages"
            )

        # Private-use characters: filters that edit ASCII (`replace`) cannot touch the nonce.
        nonce = "".join(chr(0xE000 + b) for b in secrets.token_bytes(8))
        marks = (f"\ufdd0{nonce}\ufdd1", f"\ufdd2{nonce}\ufdd3")
        kwargs: dict[str, Any] = {
            **self._kwargs,
            "messages": [self._message(m, marks) for m in messages],
            "tools": [_wrap(t, marks) for t in tools] or None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos or "",
            "eos_token": self._eos or "",
        }
        if self._think:
            kwargs["enable_thinking"] = thinking
            kwargs["thinking"] = thinking
        if effort is not None:
            kwargs["reasoning_effort"] = effort
        token = _MARKS.set(marks)
        try:
            out = self._template.render(**kwargs)
        except ChatFormatError:
            raise
        except self._jinja_error as exc:
            raise ChatFormatError(
                f"the model's chat template failed: {exc}", param="messages"
            ) from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError,
                RecursionError) as exc:  # what template expressions can raise on a request
            raise ChatFormatError(
                f"the model's chat template failed: {exc!r}", param="messages"
            ) from None
        finally:
            _MARKS.reset(token)
        segs = _split(out, marks, nonce)
        markup_tail = "".join(s.text for s in segs if s.markup).rstrip()
        opened = self._think and add_generation_prompt and markup_tail.endswith(THINK_OPEN)
        return Prompt(segs, reasoning_open=opened, tools=tools, thinking=thinking)

    def _message(self, msg: Mapping[str, Any], marks: tuple[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {"role": msg["role"]}
        for key, value in msg.items():
            if key in ("role", "tool_calls"):
                continue
            if key == "content" and isinstance(value, list):
                out[key] = [
                    {"type": "image"}
                    if p.get("type") in ("image", "image_url")
                    else {**p, "text": _wrap(p.get("text", ""), marks)}
                    for p in value
                ]
            else:
                out[key] = _wrap(value, marks)
        calls = msg.get("tool_calls")
        if calls:
            wrapped = []
            for call in calls:
                fn = call.get("function", {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                    except ValueError:
                        parsed = args
                    args = parsed if isinstance(parsed, dict) else args
                function = {
                    "name": _wrap(fn.get("name", ""), marks),
                    "arguments": _wrap(args if args is not None else {}, marks),
                }
                entry = {"type": "function", "function": function, **function}
                if call.get("id") is not None:
                    entry["id"] = _wrap(call["id"], marks)
                wrapped.append(entry)
            out["tool_calls"] = wrapped
        return out

    def _tojson(
        self,
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        marks = _MARKS.get()
        bare, tainted = _unwrap(value, marks)
        text = json.dumps(
            bare,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )
        return _Plain(text, marks) if tainted else text

    def new_parser(self, prompt: Prompt | None = None) -> HfTemplateParser:
        """Return a reader, opened in reasoning when the prompt ended inside `<think>`."""
        tok = self.tokenizer
        return HfTemplateParser(
            end_ids=self._end_ids,
            think_ids=(tok.marker_id(THINK_OPEN), tok.marker_id(THINK_CLOSE))
            if self._think
            else None,
            call_ids=(tok.marker_id(CALL_OPEN), tok.marker_id(CALL_CLOSE)) if self._calls else None,
            reasoning_open=prompt.reasoning_open if prompt is not None else False,
        )


def _raise(message: str) -> None:
    raise ChatFormatError(
        f"the model's chat template refused the request: {message}", param="messages"
    )


def _wrap(value: Any, marks: tuple[str, str]) -> Any:
    if isinstance(value, str):
        return _Plain(value, marks)
    if isinstance(value, Mapping):
        return {_wrap(k, marks): _wrap(v, marks) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wrap(v, marks) for v in value]
    return value


def _unwrap(value: Any, marks: tuple[str, str]) -> tuple[Any, bool]:
    if isinstance(value, _Plain):
        return value._inner, True
    if isinstance(value, str):
        if marks[0] in value or marks[1] in value:
            return value.replace(marks[0], "").replace(marks[1], ""), True
        return value, False
    if isinstance(value, Mapping):
        tainted = False
        out = {}
        for k, v in value.items():
            (bk, tk), (bv, tv) = _unwrap(k, marks), _unwrap(v, marks)
            out[bk] = bv
            tainted = tainted or tk or tv
        return out, tainted
    if isinstance(value, (list, tuple)):
        pairs = [_unwrap(v, marks) for v in value]
        return [p[0] for p in pairs], any(p[1] for p in pairs)
    return value, False


def _split(out: str, marks: tuple[str, str], nonce: str) -> list[Segment]:
    """Cut rendered text at the sentinels: outside = markup, inside = plain. Damage is refused."""
    segs: list[Segment] = []
    depth = 0
    for piece in re.split(f"({re.escape(marks[0])}|{re.escape(marks[1])})", out):
        if piece == marks[0]:
            depth += 1
        elif piece == marks[1]:
            depth -= 1
            if depth < 0:
                break
        elif piece:
            markup = depth == 0
            if segs and segs[-1].markup == markup:
                segs[-1] = Segment(segs[-1].text + piece, markup)
            else:
                segs.append(Segment(piece, markup))
    if depth != 0 or any(nonce in s.text for s in segs):
        raise ChatFormatError(
            "the model's chat template cut caller text in a way that cannot be kept apart "
            "from its markup",
            param="messages",
        )
    return segs


class HfTemplateParser(ReplyParser):
    """Reads Hermes-style replies by token id.

    Whitespace the usual templates put around structure is not content: one
    newline at each edge of reasoning, newlines opening the answer after
    `</think>`, the newline before a `<tool_call>`, whitespace between calls.

    Args:
        end_ids: Ids that end the turn.
        think_ids: (open, close) ids of the reasoning markers, or None.
        call_ids: (open, close) ids of the tool-call markers, or None.
        reasoning_open: The reply starts inside reasoning.

    """

    def __init__(
        self,
        *,
        end_ids: Sequence[int],
        think_ids: tuple[int | None, int | None] | None,
        call_ids: tuple[int | None, int | None] | None,
        reasoning_open: bool = False,
    ) -> None:
        """Create the reader."""
        super().__init__()
        self._end = frozenset(end_ids)
        self._think = think_ids or (None, None)
        self._call = call_ids or (None, None)
        self._in_reasoning = reasoning_open
        self._reasoning_started = False
        self._held_reasoning = ""
        self._content_started = not reasoning_open
        self._held_content = ""
        self._after_call = False
        self._body: str | None = None

    def _on_token(self, token_id: int, piece: str) -> None:
        if token_id in self._end:
            self._finished = True
        elif token_id == self._think[0] and self._body is None:
            self._in_reasoning, self._reasoning_started, self._held_reasoning = True, False, ""
        elif token_id == self._think[1] and self._body is None and self._in_reasoning:
            self._in_reasoning, self._held_reasoning = False, ""
            self._content_started = False
        elif token_id == self._call[0]:
            if self._body is not None:
                self._file_call(self._body)
            self._held_content = (
                self._held_content[:-1] if self._held_content.endswith("\n") else self._held_content
            )
            if self._after_call and not self._held_content.strip():
                self._held_content = ""
            self._add_content(self._held_content)
            self._held_content = ""
            self._body = ""
        elif token_id == self._call[1] and self._body is not None:
            self._file_call(self._body)
            self._body = None
            self._after_call = True
        elif piece:
            self._text(piece)

    def _text(self, text: str) -> None:
        if self._body is not None:
            self._body += text
        elif self._in_reasoning:
            if not self._reasoning_started:
                text = text.lstrip("\n")
                self._reasoning_started = bool(text)
            text = self._held_reasoning + text
            kept = text.rstrip("\n")
            self._held_reasoning = text[len(kept) :]
            self._add_reasoning(kept)
        else:
            if not self._content_started:
                text = text.lstrip("\n")
                self._content_started = bool(text)
            text = self._held_content + text
            if self._after_call and not text.strip():
                self._held_content = text
                return
            self._after_call = False
            kept = text.rstrip("\n")
            self._held_content = text[len(kept) :]
            self._add_content(kept)

    def _file_call(self, body: str) -> None:
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        name = value.get("name") if isinstance(value, dict) else None
        if not isinstance(name, str):
            # unusable (cut by the token limit, or not JSON): kept raw, with the function
            # name when the model wrote it first, so the caller can tell which call broke
            call = self._new_call(name=_leading_name(body) if value is None else "")
            call.arguments, call.raw, call.malformed = body, body, True
            self._seal(call)
            return
        args = value.get("arguments", value.get("parameters", {}))
        call = self._new_call(
            value["id"] if isinstance(value.get("id"), str) and value["id"] else None, name
        )
        call.arguments = args if isinstance(args, str) else dumps_py(args)
        self._seal(call)

    def _on_flush(self) -> None:
        if self._body is not None:
            self._file_call(self._body)
            self._body = None
        if self._in_reasoning:
            self._add_reasoning(self._held_reasoning)
        self._held_reasoning = ""
        if not (self._after_call and not self._held_content.strip()):
            self._add_content(self._held_content)
        self._held_content = ""


_LEADING_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')


def _leading_name(body: str) -> str:
    """The `"name"` a call object starts with, from text that is not whole JSON ("" if none)."""
    m = _LEADING_NAME.match(body)
    if m is None:
        return ""
    try:
        name = json.loads(m.group(1))
    except ValueError:
        return ""
    return name if isinstance(name, str) else ""
