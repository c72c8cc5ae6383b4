"""The chat-format layer: requests to prompt segments, generated tokens to replies.

Owns the public names of `warp_providers.chat`: the format contract
(`ChatFormat`, `ReplyParser`, `Delta` and tool-call events, `Segment`,
`Prompt`), `ChatFormatError`, and the registry (`available`, `resolve`,
`create`, `get`, `register`). Formats live in `chat/formats/<name>.py`.

Refuses: importing any framework; formats import lazily.
Called by: the engine wrapper, the generation loop and every adapter.
"""

from warp_providers.chat.base import (
    ChatFormat,
    ChatFormatError,
    Delta,
    DeltaAccumulator,
    ImageInfo,
    Prompt,
    ReplyParser,
    Segment,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallEvent,
    ToolCallStart,
    resolve_reasoning,
)
from warp_providers.chat.registry import available, create, get, register, resolve

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
    "available",
    "create",
    "get",
    "register",
    "resolve",
    "resolve_reasoning",
]
