"""Shared request and response types for every adapter (LangChain, LlamaIndex, OpenAI shim).

Owns: the pydantic v2 models of an OpenAI-shaped chat request (`ChatRequest`,
`Message`, content parts, tool definitions, tool_choice, response_format,
reasoning effort) and of a parsed reply (`AssistantMessage`, `ToolCall`,
`Usage`). Field names follow the OpenAI wire shape so the shim can validate a
JSON body directly with `ChatRequest.model_validate(body)`.

Refuses: nothing beyond structural validation. Whether a format can express a
request (tools, reasoning, images) is decided by `warp_providers.chat`.
Unknown message members are kept (`extra="allow"`) because formats read some
of them (`tool`, `id` on tool results, `reasoning`).

Called by: the chat formats (`warp_providers/chat`), the generation loop and
the three adapters.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "AssistantMessage",
    "ChatRequest",
    "ContentPart",
    "FunctionCall",
    "FunctionDefinition",
    "ImagePart",
    "ImageUrl",
    "JsonSchemaSpec",
    "Message",
    "MessageToolCall",
    "NamedFunction",
    "NamedToolChoice",
    "ResponseFormat",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "Usage",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
"""Message roles accepted on input; `developer` is rendered as `system`."""

_IMAGE_TYPES = ("image", "image_url")


class TextPart(BaseModel):
    """A text content part. Any part type other than an image type counts as text."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        default="text", min_length=1, description="Part type, e.g. `text` or `input_text`."
    )
    text: str = Field(description="The text of the part.")


class ImageUrl(BaseModel):
    """Where an image comes from: a `data:` URL, or a path when the host allows local files."""

    model_config = ConfigDict(extra="allow")

    url: str = Field(min_length=1, description="A base64 `data:` URL or a local path.")
    detail: str | None = Field(
        default=None,
        description="`low`, `high` or `auto`: the image's patch budget (see docs/IMAGES.md).",
    )


class ImagePart(BaseModel):
    """An image content part (`image_url` or `image`); formats place it as a media block."""

    model_config = ConfigDict(extra="allow")

    type: Literal["image_url", "image"] = Field(default="image_url", description="Part type.")
    image_url: ImageUrl | str | None = Field(default=None, description="The image reference.")


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "image" if kind in _IMAGE_TYPES else "text"


ContentPart = Annotated[
    Union[Annotated[TextPart, Tag("text")], Annotated[ImagePart, Tag("image")]],
    Discriminator(_part_tag),
]
"""One element of a list-valued message `content`."""


class FunctionCall(BaseModel):
    """The function half of a tool call carried in conversation history."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="Function name; must be non-empty.")
    arguments: str | dict[str, Any] | None = Field(
        default=None, description="A JSON object string, an object, or null (no arguments)."
    )


class MessageToolCall(BaseModel):
    """A tool call of an earlier assistant turn (OpenAI shape; a flat call is accepted)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(
        default=None, description="The call id results refer to via `tool_call_id`."
    )
    type: str = Field(default="function", description="Always `function`.")
    function: FunctionCall = Field(description="Name and arguments of the call.")

    @model_validator(mode="before")
    @classmethod
    def _accept_flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "function" not in data and "name" in data:
            data = dict(data)
            function = {"name": data.pop("name")}
            if "arguments" in data:
                function["arguments"] = data.pop("arguments")
            data["function"] = function
        if isinstance(data, dict) and "type" not in data:
            data = {**data, "type": "function"}
        return data


class FunctionDefinition(BaseModel):
    """A callable function offered to the model."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="Function name the model calls it by.")
    description: str | None = Field(default=None, description="What the function does.")
    parameters: dict[str, Any] | None = Field(
        default=None, description="JSON Schema of the arguments object."
    )
    strict: bool | None = Field(
        default=None, description="OpenAI strict-schema flag (not enforced)."
    )


class ToolDefinition(BaseModel):
    """A tool entry of `ChatRequest.tools` (OpenAI `{"type": "function", "function": {...}}`)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = Field(default="function", description="Always `function`.")
    function: FunctionDefinition = Field(description="The function definition.")

    @model_validator(mode="before")
    @classmethod
    def _set_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and "type" not in data:
            data = {"type": "function", **data}
        return data


class Message(BaseModel):
    """One conversation message.

    `reasoning_content` carries an assistant turn's reasoning; `tool_calls` its
    calls; `tool_call_id` binds a `tool` result to a call. A `system` message
    may carry `tools` (a mid-conversation tool declaration, XTML only).
    """

    model_config = ConfigDict(extra="allow")

    role: Role = Field(description="Who speaks.")
    content: str | list[ContentPart] | None = Field(
        default=None, description="Text, parts, or null."
    )
    name: str | None = Field(
        default=None, description="Optional speaker name (or tool name on results)."
    )
    tool_calls: list[MessageToolCall] | None = Field(
        default=None, description="Assistant tool calls."
    )
    tool_call_id: str | None = Field(
        default=None, description="On tool results: the call answered."
    )
    reasoning_content: str | None = Field(
        default=None, description="Assistant reasoning in history."
    )
    tools: list[ToolDefinition] | None = Field(
        default=None, description="Lazy tool declaration (system)."
    )

    @field_validator("tool_calls")
    @classmethod
    def _calls_only_on_assistant(
        cls, calls: list[MessageToolCall] | None, info: ValidationInfo
    ) -> list[MessageToolCall] | None:
        # A field validator, so the error names `messages[i].tool_calls` (§4.7 #10, §7.5).
        if calls is not None and info.data.get("role", "assistant") != "assistant":
            raise ValueError("tool_calls is only valid for assistant messages")
        return calls


class NamedFunction(BaseModel):
    """The function named by a `NamedToolChoice`."""

    name: str = Field(min_length=1, description="Function the model must call.")


class NamedToolChoice(BaseModel):
    """Force one named function: `{"type": "function", "function": {"name": ...}}`."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = Field(default="function", description="Always `function`.")
    function: NamedFunction = Field(description="The function to call.")


ToolChoice = Union[Literal["auto", "none", "required"], NamedToolChoice]
"""`auto`, `none`, `required`, or a named function."""


class JsonSchemaSpec(BaseModel):
    """The `json_schema` member of a `json_schema` response format."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str | None = Field(default=None, description="Schema name.")
    description: str | None = Field(default=None, description="Schema description.")
    schema_: dict[str, Any] | None = Field(
        default=None, alias="schema", description="The JSON Schema."
    )
    strict: bool | None = Field(default=None, description="OpenAI strict flag (not enforced).")


class ResponseFormat(BaseModel):
    """Requested answer shape: plain text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"] | None = Field(
        default=None,
        description="Kind of response format; without one, formats treat it as plain text "
        "(PROTOCOLS §2.7). Other kinds are refused rather than dropped.",
    )
    json_schema: JsonSchemaSpec | Any = Field(
        default=None,
        description="Schema for `json_schema`; any other JSON value is itself the schema (§2.7).",
    )


class ChatRequest(BaseModel):
    """Everything a chat format needs to build a prompt.

    `reasoning_effort` is resolved with `thinking` by
    `warp_providers.chat.resolve_reasoning` (`none`/`minimal`/`off` turn
    thinking off; other values are format-specific levels).
    """

    model_config = ConfigDict(extra="allow")

    messages: list[Message] = Field(min_length=1, description="The conversation, oldest first.")
    tools: list[ToolDefinition] | None = Field(
        default=None, description="Functions the model may call."
    )
    tool_choice: ToolChoice | None = Field(
        default=None, description="Whether/which tool must be called."
    )
    response_format: ResponseFormat | None = Field(
        default=None, description="Requested answer shape."
    )
    reasoning_effort: str | None = Field(
        default=None, description="Reasoning level, e.g. `low`, `high`, `none`."
    )
    thinking: bool | None = Field(default=None, description="Turn the reasoning channel on or off.")


class ToolCall(BaseModel):
    """A tool call parsed from a model reply.

    `arguments` is always a string (OpenAI shape). `malformed` is true when
    it is not a JSON object; the text is then exactly what the model wrote
    (kept, never dropped), and `raw` holds the model's undecoded call text
    where the format could not even find a name.
    """

    index: int = Field(ge=0, description="0-based position in the reply's call list.")
    id: str = Field(description="Call id (the model's own, else `call_<n>`).")
    name: str = Field(description="Function name ('' when the model gave none).")
    arguments: str = Field(
        description="Arguments as a JSON object string (or the raw text when malformed)."
    )
    malformed: bool = Field(
        default=False,
        description="True when `arguments` is not a JSON object, or the call was undecodable.",
    )
    raw: str | None = Field(
        default=None, description="Undecodable call text, when the call itself was malformed."
    )

    def parsed_arguments(self) -> dict[str, Any] | None:
        """Return the arguments as a dict, or None when they are not a JSON object."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


class AssistantMessage(BaseModel):
    """A complete parsed reply: the fold of every `Delta` a `ReplyParser` emitted."""

    role: Literal["assistant"] = Field(default="assistant", description="Always `assistant`.")
    content: str | None = Field(default=None, description="Answer text, None when empty.")
    reasoning: str | None = Field(default=None, description="Reasoning text, None when empty.")
    tool_calls: list[ToolCall] = Field(
        default_factory=list, description="Parsed tool calls, in order."
    )
    finish_reason: Literal["stop", "length", "tool_calls"] | None = Field(
        default=None, description="Why generation ended (`tool_calls` wins over the others)."
    )


class Usage(BaseModel):
    """Token accounting of one request."""

    prompt_tokens: int = Field(ge=0, description="Tokens in the prompt.")
    completion_tokens: int = Field(
        ge=0, description="Tokens the engine generated (markers included)."
    )
    total_tokens: int = Field(ge=0, description="prompt_tokens + completion_tokens.")
    cached_tokens: int = Field(
        default=0, ge=0,
        description="Prompt tokens reused from the engine's prefix cache (not evaluated again).",
    )
    reasoning_tokens: int = Field(
        default=0, ge=0,
        description="Completion tokens of the reasoning channel (its markers included).",
    )

    @model_validator(mode="after")
    def _total(self) -> Usage:
        if self.total_tokens != self.prompt_tokens + self.completion_tokens:
            raise ValueError("total_tokens must equal prompt_tokens + completion_tokens")
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError("cached_tokens cannot exceed prompt_tokens")
        if self.reasoning_tokens > self.completion_tokens:
            raise ValueError("reasoning_tokens cannot exceed completion_tokens")
        return self
