"""Constrained decoding: a request's required output shape -> a `LogitsProcessor`.

Owns: turning `response_format` (json_object, json_schema) and a forced tool call
(`tool_choice` "required" or a named function) into an llguidance grammar over the
whole reply (the reasoning channel stays free text; the answer or the call must match),
the llguidance tokenizer built from our `Tokenizer`, and `GrammarProcessor`, which masks
the logits so every sampled reply parses, validates, and then ends (only stop ids are
allowed once the grammar is complete); and the converse, `TokenBan`: with `tool_choice`
"none" or no tools, a format whose calls open with one control token (Hermes
`<tool_call>`) may not emit it, so such a reply never carries a tool call.
Refuses: a schema feature llguidance cannot enforce (ChatFormatError, HTTP 400, naming
the feature and `param`); never silently drops a constraint.
Does not: write a JSON-schema grammar engine (llguidance does that).
Called by: `ChatSession.stream` (automatically, from the request) and adapters that want
a grammar of their own (`GrammarProcessor.from_grammar`).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from warp_providers.chat.base import ChatFormatError

if TYPE_CHECKING:
    import llguidance

    from warp_providers.chat.base import ChatFormat, Prompt
    from warp_providers.tokenizer import Tokenizer

__all__ = [
    "GrammarProcessor",
    "TokenBan",
    "answer_grammar",
    "check_schema",
    "close_objects",
    "llg_tokenizer",
    "processor_for_request",
    "tool_call_grammar",
]

log = logging.getLogger(__name__)

#: JSON the grammar accepts has one fixed layout and no free whitespace: ", " between
#: items and ": " after keys (the layout of `json.dumps`, which is how models saw JSON in
#: training; forcing the spaceless form shifts what a small model writes) and nothing
#: else between tokens. A sampler then cannot spend its budget on blanks (SmolLM2 at
#: temperature 1 wrote runs of newlines inside objects until `max_tokens` cut them), and
#: the object closes in the fewest tokens that layout allows.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                 "lenient": False}

_HERMES_MARKERS = ("<tool_call>", "</tool_call>")
_THINK_MARKERS = ("<think>", "</think>")
_XTML_MARKERS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ImportError(
            "constrained decoding needs the `llguidance` package: pip install llguidance"
        ) from exc
    return llguidance


# --------------------------------------------------------------------------- tokenizer
_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], Any]] = (
    weakref.WeakKeyDictionary()
)
_TOK_LOCK = threading.Lock()


class _TiktokenView:
    """What llguidance's `TokenizerWrapper` reads from a tokenizer: bytes of every id."""

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        self._tok = tokenizer
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        n = tokenizer.vocab_size
        self.tokens = [tokenizer._token_bytes(i) or b"" for i in range(n)]
        self.special_token_ids = sorted(tokenizer.control_ids)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode_content(text)


def llg_tokenizer(tokenizer: Tokenizer, stop_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """The llguidance view of `tokenizer`, with `stop_ids` as its end-of-sequence ids.

    Built once per (tokenizer, stop ids): construction walks the vocabulary (about a
    second for a 150k vocabulary).

    Args:
        tokenizer: the model's tokenizer (a `tokenizer.json` or tiktoken vocabulary).
        stop_ids: ids that end a reply in the chat format (allowed once a grammar is done).

    Returns:
        An `llguidance.LLTokenizer`.

    """
    llg = _llg()
    key = tuple(stop_ids) or tuple(tokenizer.eos_ids)
    if not key:
        raise ValueError("constrained decoding needs at least one stop id")
    with _TOK_LOCK:
        per = _TOKENIZERS.setdefault(tokenizer, {})
        if key in per:
            return per[key]
        backend = getattr(tokenizer, "_backend", None)
        hf = getattr(backend, "markup_tok", None)
        if hf is not None:
            lt = llg.LLTokenizer(hf.to_str(), n_vocab=tokenizer.vocab_size, eos_token=list(key))
        else:
            wrapper = llg.TokenizerWrapper(_TiktokenView(tokenizer, key[0]))
            lt = llg.LLTokenizer(wrapper, n_vocab=tokenizer.vocab_size, eos_token=list(key))
        per[key] = lt
        return lt


# --------------------------------------------------------------------------- schemas
def check_schema(schema: Any, *, param: str) -> dict[str, Any]:
    """Checks that llguidance can enforce a JSON schema exactly.

    Args:
        schema: the JSON schema (an object; `true` means any JSON value).
        param: the request field to blame in an error.

    Returns:
        The schema as a dict, with the grammar's whitespace options under `x-guidance`.

    Raises:
        ChatFormatError: not an object, or a feature the grammar engine cannot express
            (the message names it; nothing is ever silently ignored).

    """
    llg = _llg()
    if schema is True:
        schema = {}
    if not isinstance(schema, Mapping):
        raise ChatFormatError(f"'{param}' must be a JSON schema object", param=param)
    out = copy.deepcopy(dict(schema))
    guidance = dict(out.get("x-guidance") or {})
    guidance.update(_JSON_OPTIONS)
    out["x-guidance"] = guidance
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(out))
    except (ValueError, TypeError) as exc:
        raise ChatFormatError(f"{param} is not a usable JSON schema: {exc}", param=param) from None
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        detail = "; ".join(messages) or "invalid schema"
        raise ChatFormatError(
            f"{param} uses a JSON-schema feature constrained decoding cannot enforce: {detail}",
            param=param,
        )
    return out


def _json_rule(schema: Mapping[str, Any]) -> str:
    return "%json" + json.dumps(schema, ensure_ascii=False)


def _lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _tok(tokenizer: Tokenizer, marker: str) -> str:
    tid = tokenizer.marker_id(marker)
    if tid is None:
        raise ValueError(f"{marker} is not a control token of this vocabulary")
    return f"<[{tid}]>"


def _family(fmt: ChatFormat) -> str:
    """How replies of this format are shaped, as far as grammars are concerned."""
    tok = fmt.tokenizer
    if fmt.name == "xtml" or all(tok.marker_id(m) is not None for m in _XTML_MARKERS):
        return "xtml"
    if all(tok.marker_id(m) is not None for m in _HERMES_MARKERS):
        return "hermes"
    return "plain"


def _think_prefix(fmt: ChatFormat, prompt: Prompt) -> str:
    """Lark for the optional reasoning that may precede the answer ('' when none)."""
    tok = fmt.tokenizer
    if _family(fmt) == "xtml":
        if not prompt.reasoning_open:
            return ""
        close, sep, open_ = (_tok(tok, m) for m in ("<|close|>", "<|sep|>", "<|open|>"))
        return f'THINK {close} "think" {sep} {open_} "response" {sep} '
    if all(tok.marker_id(m) is not None for m in _THINK_MARKERS):
        start, end = (_tok(tok, m) for m in _THINK_MARKERS)
        if prompt.reasoning_open:
            return f"THINK {end} GAP "
        return f"({start} THINK {end} GAP)? "
    if prompt.reasoning_open:
        raise ChatFormatError(
            "this chat format leaves the reasoning channel open and has no marker that closes "
            "it, so its answer cannot be constrained; pass reasoning_effort 'none'",
            param="response_format",
        )
    return ""


_TERMINALS = 'THINK: /(?s:.*)/\nGAP: /[ \\n]{0,4}/\n'


def answer_grammar(fmt: ChatFormat, prompt: Prompt, schema: Mapping[str, Any]) -> str:
    """Lark grammar of a whole reply whose answer text is JSON matching `schema`.

    Args:
        fmt: the bound chat format.
        prompt: the rendered prompt (which channel it left open).
        schema: a schema returned by `check_schema`.

    """
    tok = fmt.tokenizer
    body = "answer"
    if _family(fmt) == "xtml":
        close, sep = _tok(tok, "<|close|>"), _tok(tok, "<|sep|>")
        body = f'answer {close} "response" {sep} {close} "message" {sep}'
    return (
        f"start: {_think_prefix(fmt, prompt)}{body}\n"
        f"answer: {_json_rule(schema)}\n{_TERMINALS}"
    )


_ARGS = "/properties/arguments"
"""Where a tool's parameter schema sits inside the Hermes call object's schema."""


def _nested(schema: Any, at: str) -> Any:
    """Return `schema` with its local `$ref`s rewritten for its place at JSON pointer `at`.

    A parameter schema refers to its own root (`#/$defs/Point`, as pydantic writes nested
    models, or `#` for recursion); inside the call object that root is `#` + `at`.
    """
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                out[key] = "#" + at + value[1:]
            else:
                out[key] = _nested(value, at)
        return out
    if isinstance(schema, list):
        return [_nested(v, at) for v in schema]
    return schema


def close_objects(schema: Any, *, free_form: bool = True) -> Any:
    """Return `schema` with its objects closed to undeclared keys.

    JSON Schema leaves an object open unless it says `additionalProperties`; a function
    or a pydantic model takes only its declared fields, and an open object lets a small
    model invent keys inside a forced call (SmolLM2 copies `title`/`type` out of the
    schema) until the token limit. Every object that lists `properties` is closed; with
    `free_form=False` (OpenAI strict mode) so is every `"type": "object"`. An object that
    states `additionalProperties` itself is kept as it is.
    """
    if isinstance(schema, list):
        return [close_objects(s, free_form=free_form) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_TABLES and isinstance(value, Mapping):
            # name -> schema tables: close each schema, never the table itself
            out[key] = {n: close_objects(v, free_form=free_form) for n, v in value.items()}
        else:
            out[key] = close_objects(value, free_form=free_form)
    if "properties" in out or (not free_form and out.get("type") == "object"):
        out.setdefault("additionalProperties", False)
    return out


_SCHEMA_TABLES = ("properties", "$defs", "definitions", "patternProperties")


def _call_schema(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        checked = check_schema(params, param=f"tools[{i}].function.parameters")
        out.append((name, close_objects(checked)))
    return out


def tool_call_grammar(
    fmt: ChatFormat,
    prompt: Prompt,
    tools: Sequence[Mapping[str, Any]],
    *,
    name: str | None = None,
    parallel: bool = True,
) -> str | None:
    """Lark grammar of a reply that is one or more tool calls with valid arguments.

    Args:
        fmt: the bound chat format.
        prompt: the rendered prompt.
        tools: the request's tool entries.
        name: the function the call must name (None: any of `tools`).
        parallel: allow more than one call.

    Returns:
        The grammar, or None when this format's call syntax is not known here (the
        call is then requested by the prompt alone).

    Raises:
        ChatFormatError: the named function is not among `tools`, or a parameter schema
            uses a feature the grammar engine cannot enforce.

    """
    family = _family(fmt)
    if family == "plain":
        return None
    entries = _call_schema(tools)
    if name is not None:
        entries = [e for e in entries if e[0] == name]
        if not entries:
            raise ChatFormatError(
                f"tool_choice names the function `{name}`, which is not among 'tools'",
                param="tool_choice",
            )
    if not entries:
        raise ChatFormatError("tool_choice requires a tool call, but 'tools' is empty",
                              param="tool_choice")
    tok = fmt.tokenizer
    rules = []
    if family == "hermes":
        open_, close = (_tok(tok, m) for m in _HERMES_MARKERS)
        for k, (fname, params) in enumerate(entries):
            call = {
                "type": "object",
                "properties": {"name": {"const": fname}, "arguments": _nested(params, _ARGS)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
                "x-guidance": dict(_JSON_OPTIONS),
            }
            rules.append(f'call{k}: {open_} "\\n" {_json_rule(call)} "\\n" {close}')
        more = ' ("\\n"? call)*' if parallel else ""
        start = f"start: {_think_prefix(fmt, prompt)}call{more}\n"
    else:
        o, c, s = (_tok(tok, m) for m in ("<|open|>", "<|close|>", "<|sep|>"))
        for k, (fname, params) in enumerate(entries):
            head = _lark_str(f'call tool="{_xml_attr(fname)}" index="')
            rules.append(
                f'call{k}: {o} {head} INDEX "\\"" {s} {o} "json type=\\"object\\"" {s} '
                f'{_json_rule(params)} {c} "json" {s} {c} "call" {s}'
            )
        more = " call*" if parallel else ""
        lead = ""
        if prompt.reasoning_open:
            lead = f'THINK {c} "think" {s} {o} "response" {s} '
        start = (
            f'start: {lead}{c} "response" {s} {o} "tools" {s} call{more} '
            f'{c} "tools" {s} {c} "message" {s}\nINDEX: /[1-9][0-9]{{0,2}}/\n'
        )
    alts = " | ".join(f"call{k}" for k in range(len(entries)))
    return start + f"call: {alts}\n" + "\n".join(rules) + "\n" + _TERMINALS


def _xml_attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


# --------------------------------------------------------------------------- processor
class GrammarProcessor:
    """A `LogitsProcessor` that keeps a reply inside an llguidance grammar.

    Stateful, one per generation: it replays the ids it has not seen into its matcher,
    then sets every logit the grammar forbids to -inf. Once the grammar is complete only
    the stop ids stay allowed, so generation ends there.
    """

    def __init__(
        self, lltok: llguidance.LLTokenizer, grammar: str, stop_ids: Sequence[int]
    ) -> None:
        """Compiles `grammar` (llguidance JSON or lark) against `lltok`.

        Raises:
            ValueError: the grammar does not compile (the llguidance message).

        """
        llg = _llg()
        self._llg = llg
        self.grammar = grammar
        self._matcher = llg.LLMatcher(lltok, grammar, log_level=0)
        if self._matcher.is_error():
            raise ValueError(f"grammar does not compile: {self._matcher.get_error()}")
        self._stop = np.asarray(sorted(set(stop_ids)), dtype=np.int64)
        self._seen = 0
        self._n_vocab = int(lltok.vocab_size)

    @classmethod
    def from_grammar(
        cls, tokenizer: Tokenizer, grammar: str, stop_ids: Sequence[int]
    ) -> GrammarProcessor:
        """A processor for a lark (or llguidance JSON) grammar over `tokenizer`."""
        if not grammar.lstrip().startswith("{"):
            grammar = _llg().LLMatcher.grammar_from_lark(grammar)
        return cls(llg_tokenizer(tokenizer, stop_ids), grammar, stop_ids)

    @property
    def done(self) -> bool:
        """True once the grammar accepts the reply so far."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str:
        """The matcher's error ('' when none)."""
        return str(self._matcher.get_error())

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> None:
        """Masks `logits` in place given the ids `generated` so far in this reply."""
        if len(generated) < self._seen:  # a new reply on the same processor
            self._matcher.reset()
            self._seen = 0
        for tok in generated[self._seen:]:
            if not self._matcher.consume_token(int(tok)):
                log.debug("grammar refused token %d: %s", tok, self._matcher.get_error())
                break
        self._seen = len(generated)
        if self._matcher.is_error():
            # The reply left the grammar (a token forced from outside): only ending is left.
            allowed = np.zeros(logits.shape[-1], dtype=bool)
            allowed[self._stop[self._stop < allowed.size]] = True
        else:
            bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
            allowed = np.unpackbits(bits, bitorder="little").astype(bool)
            n = logits.shape[-1]
            if allowed.size < n:
                allowed = np.concatenate([allowed, np.zeros(n - allowed.size, dtype=bool)])
            allowed = allowed[:n]
        logits[~allowed] = -np.inf


class TokenBan:
    """A `LogitsProcessor` that forbids a fixed set of ids at every position."""

    def __init__(self, ids: Sequence[int], reason: str = "") -> None:
        """Forbid `ids` (`reason` says why, for logs and tests)."""
        self.ids = np.asarray(sorted(set(int(i) for i in ids)), dtype=np.int64)
        self.reason = reason

    def __call__(self, generated: Sequence[int], logits: np.ndarray) -> None:
        """Set the banned logits to -inf in place."""
        logits[self.ids[self.ids < logits.shape[-1]]] = -np.inf


def _tool_call_ban(fmt: ChatFormat) -> TokenBan | None:
    """Forbids opening a tool call, where the format opens calls with one control token."""
    if _family(fmt) != "hermes":
        return None
    tid = fmt.tokenizer.marker_id(_HERMES_MARKERS[0])
    return None if tid is None else TokenBan([tid], reason="no tool may be called")


# --------------------------------------------------------------------------- requests
def _get(request: Any, key: str) -> Any:
    if isinstance(request, Mapping):
        return request.get(key)
    value = getattr(request, key, None)
    if value is None and getattr(request, "model_extra", None):
        value = request.model_extra.get(key)
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="python", exclude_unset=True, by_alias=True)
    elif isinstance(value, list):
        value = [v.model_dump(mode="python", exclude_unset=True, by_alias=True)
                 if hasattr(v, "model_dump") else v for v in value]
    return value


def response_schema(response_format: Any) -> dict[str, Any] | None:
    """The schema a `response_format` asks for (None: plain text).

    Raises:
        ChatFormatError: an unknown type, or a `json_schema` that is not usable.

    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ChatFormatError("'response_format' must be an object", param="response_format")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return check_schema({"type": "object"}, param="response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ChatFormatError("'response_format.json_schema' must be an object",
                                  param="response_format.json_schema")
        schema = spec.get("schema", {"type": "object"})
        if schema is None:
            schema = {"type": "object"}
        return check_schema(schema, param="response_format.json_schema.schema")
    raise ChatFormatError(
        f"response_format type {kind!r} is not supported; use 'text', 'json_object' or "
        "'json_schema'",
        param="response_format.type",
    )


def processor_for_request(
    fmt: ChatFormat, prompt: Prompt, request: Any
) -> GrammarProcessor | TokenBan | None:
    """The constraint a request implies, or None when its output is free.

    A forced tool call (`tool_choice` "required" or a named function, with tools) wins
    over `response_format`; `tool_choice` "none" with a response_format constrains the
    answer. A request that may not call a tool (`tool_choice` "none", or no tools) and
    has no grammar gets a `TokenBan` of the call-opening marker where the format has one,
    so even a model that emits markers at random never returns `tool_calls`.

    Args:
        fmt: the bound chat format.
        prompt: the rendered prompt of `request`.
        request: a `ChatRequest` or an OpenAI-shaped dict.

    Raises:
        ChatFormatError: see `response_schema`, `check_schema` and `tool_call_grammar`.

    """
    tools = _get(request, "tools") or []
    choice = _get(request, "tool_choice")
    parallel = _get(request, "parallel_tool_calls")
    name = None
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        choice = "required"
    schema = response_schema(_get(request, "response_format"))
    grammar = None
    if choice == "required" and tools:
        grammar = tool_call_grammar(fmt, prompt, tools, name=name, parallel=parallel is not False)
    if grammar is None and schema is not None:
        grammar = answer_grammar(fmt, prompt, schema)
    if grammar is None:
        return _tool_call_ban(fmt) if choice == "none" or not tools else None
    return GrammarProcessor.from_grammar(fmt.tokenizer, grammar, fmt.stop_ids)
