"""The one table of chat formats, and how a model's format is chosen.

Owns: `FORMATS` (name -> "module:Class", imported lazily on first use),
aliases, the marker fingerprint table, `available()`, `get()`, `create()`,
`register()` and `resolve()`. Resolution order: explicit name -> the
container's metadata format key -> fingerprint (XTML markers in the
vocabulary; a container chat.json; Kimi / GLM marker sets in the vocabulary
or template; any jinja chat template) -> ChatFormatError listing the valid
names and why each candidate failed.

Refuses: guessing. There is never a silent fallback to ChatML.
Called by: the engine wrapper and adapters when a model is loaded.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from warp_providers.chat.base import ChatFormat, ChatFormatError

if TYPE_CHECKING:
    from warp_providers.tokenizer import Tokenizer

__all__ = [
    "ALIASES",
    "FINGERPRINTS",
    "FORMATS",
    "available",
    "create",
    "get",
    "register",
    "resolve",
]

FORMATS: dict[str, str] = {
    "xtml": "warp_providers.chat.formats.xtml:XtmlFormat",
    "kimi": "warp_providers.chat.formats.kimi:KimiFormat",
    "glm": "warp_providers.chat.formats.glm:GlmFormat",
    "chatjson": "warp_providers.chat.formats.chatjson:ChatJsonFormat",
    "hf_template": "warp_providers.chat.formats.hf_template:HfTemplateFormat",
}
"""Format name -> "module:Class". Adding a format is one file and one line here."""

ALIASES: dict[str, str] = {
    "kimi_k3": "xtml",
    "kimi_k2": "kimi",
    "kimi_linear": "kimi",
    "glm4_moe": "glm",
    "glm5_next": "glm",
    "glm5_next_text": "glm",
    "chat.json": "chatjson",
    "jinja": "hf_template",
}
"""Other spellings (family names, container keys) accepted for a format."""

FINGERPRINTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("xtml", ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")),
    (
        "kimi",
        (
            "<|im_assistant|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_call_begin|>",
        ),
    ),
    ("glm", ("[gMASK]", "<|assistant|>", "<|observation|>", "<arg_key>", "<arg_value>")),
)
"""Marker sets that identify a native format (all must be present)."""


def available() -> list[str]:
    """Return the registered format names, sorted."""
    return sorted(FORMATS)


def register(name: str, target: str) -> None:
    """Register an out-of-tree format as "module:Class" (replaces an existing entry)."""
    if ":" not in target:
        raise ValueError(f"format target must be 'module:Class', got {target!r}")
    FORMATS[name] = target


def _canonical(name: str) -> str:
    return ALIASES.get(name, name)


def get(name: str) -> type[ChatFormat]:
    """Return the format class registered under `name` (or an alias).

    Raises:
        ChatFormatError: Unknown name (the message lists the valid ones).

    """
    key = _canonical(name)
    if key not in FORMATS:
        raise ChatFormatError(
            f"unknown chat format {name!r}; valid names are {available()}",
            param="chat_format",
            code="unsupported_chat_format",
        )
    module, _, cls = FORMATS[key].partition(":")
    found = getattr(importlib.import_module(module), cls)
    if not (isinstance(found, type) and issubclass(found, ChatFormat)):
        raise TypeError(f"{FORMATS[key]} is not a ChatFormat")
    return found


def create(
    name: str,
    *,
    chat_template: str | None = None,
    chat_json: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    **options: Any,
) -> ChatFormat:
    """Construct a format by name from the model's sources (not yet bound).

    Args:
        name: Format name or alias.
        chat_template: The model's jinja2 template (`hf_template` needs it).
        chat_json: The container's chat.json (`chatjson` needs it; `glm`/`kimi` override their own).
        **options: Format options (e.g. `default_thinking` for `xtml`).

    Raises:
        ChatFormatError: Unknown name, or a source the format needs is missing or broken.

    """
    key = _canonical(name)
    cls = get(key)
    if key == "hf_template":
        if not chat_template:
            raise ChatFormatError(
                "the hf_template chat format needs the model's chat template", param="model"
            )
        return cls(chat_template, **options)  # type: ignore[call-arg]
    if key in ("chatjson", "glm", "kimi"):
        return cls(chat_json, **options)  # type: ignore[call-arg]
    return cls(**options)


def resolve(
    name: str | None = None,
    metadata_format: str | None = None,
    chat_template: str | None = None,
    tokenizer: Tokenizer | None = None,
    *,
    chat_json: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    **options: Any,
) -> ChatFormat:
    """Choose, construct and (with a tokenizer) bind the model's chat format.

    Args:
        name: Explicit choice; wins over everything.
        metadata_format: The container's format key.
        chat_template: The model's jinja2 chat template, if any.
        tokenizer: The model's tokenizer; the result is bound to it.
        chat_json: The container's chat.json, if any.
        **options: Passed to the format's constructor.

    Returns:
        The format, bound when `tokenizer` was given.

    Raises:
        ChatFormatError: An explicit or metadata choice that does not fit, or
            nothing fits (the message lists valid names and each reason).

    """
    chosen = name or metadata_format
    if chosen:
        fmt = create(chosen, chat_template=chat_template, chat_json=chat_json, **options)
        return fmt.bind(tokenizer) if tokenizer is not None else fmt

    candidates: list[str] = []
    for fp_name, markers in FINGERPRINTS:
        in_vocab = tokenizer is not None and all(
            tokenizer.marker_id(m) is not None for m in markers
        )
        in_template = bool(chat_template) and all(m in chat_template for m in markers)  # type: ignore[operator]
        if in_vocab or in_template:
            candidates.append(fp_name)
    if chat_json is not None:
        candidates.insert(1 if candidates[:1] == ["xtml"] else 0, "chatjson")
    if chat_template:
        candidates.append("hf_template")

    reasons: dict[str, str] = {}
    for candidate in candidates:
        try:
            fmt = create(candidate, chat_template=chat_template, chat_json=chat_json, **options)
            return fmt.bind(tokenizer) if tokenizer is not None else fmt
        except ChatFormatError as exc:
            reasons[candidate] = exc.message
    if tokenizer is not None:
        # §4.4 step 3: both reasons, XTML's first; then what the other candidates said.
        xtml = reasons.pop("xtml", None) or _xtml_reason(tokenizer)
        chat = reasons.pop("chatjson", None) or _chat_json_reason(chat_json)
        others = "".join(f"; {name}: {why}" for name, why in reasons.items())
        message = f"{xtml}; and {chat}{others}; name one of {available()}"
    else:
        detail = (
            "; ".join(f"{name}: {why}" for name, why in reasons.items())
            or "no known markers in its vocabulary or template, no chat.json, no chat template"
        )
        message = f"cannot tell this model's chat format ({detail}); name one of {available()}"
    raise ChatFormatError(message, param="chat_format", code="unsupported_chat_format")


def _xtml_reason(tokenizer: Tokenizer) -> str:
    """Name the first of OPEN, CLOSE, SEP, EOM that is not one control token (§4.4).

    WARP appends the engine's status name; tokenization here is not an engine
    call, so there is no status to append.
    """
    for marker in FINGERPRINTS[0][1]:
        if tokenizer.marker_id(marker) is None:
            return (
                f"{marker} is not a single token in this container "
                f"(got {tokenizer.markup_count(marker)}): its specials.json does not carry "
                "K3's XTML markers"
            )
    return ""


def _chat_json_reason(chat_json: str | os.PathLike[str] | Mapping[str, Any] | None) -> str:
    """Return the §4.2 message of a chat.json that was never a candidate (it is missing)."""
    try:
        create("chatjson", chat_json=chat_json)
    except ChatFormatError as exc:
        return exc.message
    return ""
