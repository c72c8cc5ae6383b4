"""`ChatWarp`: a LangChain chat model over warp-providers' in-process chat core.

Owns: turning LangChain messages, tools, tool_choice and structured-output
requests into the core's OpenAI-shaped request dict, and the core's reply
chunks back into `AIMessageChunk`s / `AIMessage`s (content, reasoning in
`additional_kwargs["reasoning_content"]`, tool calls and tool-call chunks,
usage on the last chunk, finish reason, model name and the engine's expert
statistics). Sync, async, blocking and streaming calls run the same path: a
request is prepared once, the core's chunk stream is converted chunk by chunk,
and the blocking calls fold that stream.
Refuses: content the core cannot carry (audio, files, video) with a ValueError,
and unknown constructor or call arguments. Errors of the core (chat format,
context overflow, memory budget) propagate unchanged; only unusable tool
arguments are translated, into `invalid_tool_calls` and, for structured
output, `OutputParserException`.
Called by: LangChain runnables, agents and the langchain-tests suites.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.base import BaseGenerationOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, Generation
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils import from_env
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic import ValidationError as _ValidationError

from warp_providers import (
    ChatChunk,
    ChatFormatError,
    ChatSession,
    SamplingParams,
    ToolCallArguments,
    ToolCallStart,
    close_objects,
    model_capabilities,
    shared_engine,
    shared_session,
)
from warp_providers import ChatResult as WarpResult

__all__ = ["ChatWarp"]

_CALL_KWARGS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "top_k",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "max_tokens",
        "seed",
        "timeout",
        "reasoning_effort",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "stream",
    }
)
"""Keyword arguments a call (invoke/stream/bind) may carry."""

_HAS_CHUNK_POSITION = "chunk_position" in AIMessageChunk.model_fields


# --------------------------------------------------------------------------- messages
def _text_of(content: str | list[Any]) -> str:
    """Return the text of a message content: the string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type") in (
            "text",
            "input_text",
            "output_text",
        ):
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """Build an OpenAI `image_url` part from a LangChain image block (OpenAI/v1/Anthropic)."""
    detail = block.get("detail")
    if block.get("type") == "image_url":
        ref = block.get("image_url")
        url = ref.get("url") if isinstance(ref, Mapping) else ref
        if isinstance(ref, Mapping):
            detail = ref.get("detail", detail)
    elif isinstance(block.get("source"), Mapping):  # Anthropic {"source": {"type": "base64", ...}}
        src = block["source"]
        url = (
            src.get("url")
            or f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
        )
    elif block.get("base64") or block.get("data"):
        data = block.get("base64") or block.get("data")
        url = f"data:{block.get('mime_type') or 'image/png'};base64,{data}"
    else:
        url = block.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError("ChatWarp: an image content block carries no url or base64 data")
    ref = {"url": url, **({"detail": detail} if detail else {})}
    return {"type": "image_url", "image_url": ref}


_SKIPPED_BLOCKS = ("tool_use", "tool_call", "tool_call_chunk", "function_call")
"""Assistant blocks that restate `tool_calls`; the calls are sent from `tool_calls`."""
_REASONING_BLOCKS = ("reasoning", "thinking")


def _content_parts(content: str | list[Any], where: str) -> str | list[dict[str, Any]]:
    """Convert user or tool content for the core: a string, or text and image parts."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
            continue
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind in ("text", "input_text", "output_text"):
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind in ("image", "image_url"):
            parts.append(_image_part(block))
        elif kind in _SKIPPED_BLOCKS or kind in _REASONING_BLOCKS:
            continue
        else:
            raise ValueError(
                f"ChatWarp cannot send a {kind!r} content block ({where}): the chat core carries "
                "text and images only"
            )
    if parts and all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _reasoning_of(message: AIMessage) -> str | None:
    """Return an assistant turn's reasoning: `reasoning_content`, else its reasoning blocks."""
    text = message.additional_kwargs.get("reasoning_content")
    if isinstance(text, str) and text:
        return text
    if isinstance(message.content, list):
        found = [
            str(b.get("reasoning") or b.get("thinking") or "")
            for b in message.content
            if isinstance(b, Mapping) and b.get("type") in _REASONING_BLOCKS
        ]
        return "".join(found) or None
    return None


def _assistant_dict(message: AIMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(message.content) or None}
    reasoning = _reasoning_of(message)
    if reasoning:
        out["reasoning_content"] = reasoning
    calls = [
        {
            "id": c.get("id"),
            "type": "function",
            "function": {
                "name": c["name"],
                "arguments": json.dumps(c.get("args") or {}, ensure_ascii=False),
            },
        }
        for c in message.tool_calls
    ]
    calls += [  # replayed as the model wrote them: the history stays what happened
        {
            "id": c.get("id"),
            "type": "function",
            "function": {"name": c.get("name") or "", "arguments": c.get("args") or ""},
        }
        for c in message.invalid_tool_calls
        if c.get("name")
    ]
    if calls:
        out["tool_calls"] = calls
    if message.name:
        out["name"] = message.name
    return out


def _message_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the core's OpenAI-shaped message dicts."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, SystemMessage):
            out.append({"role": "system", "content": _text_of(m.content)})
        elif isinstance(m, HumanMessage):
            d: dict[str, Any] = {"role": "user", "content": _content_parts(m.content, where)}
            if m.name:
                d["name"] = m.name
            out.append(d)
        elif isinstance(m, AIMessage):
            out.append(_assistant_dict(m))
        elif isinstance(m, ToolMessage):
            d = {
                "role": "tool",
                "tool_call_id": m.tool_call_id,
                "content": _content_parts(m.content, where),
            }
            if m.name:
                d["name"] = m.name
            out.append(d)
        elif isinstance(m, ChatMessage) and m.role in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            out.append({"role": m.role, "content": _content_parts(m.content, where)})
        else:
            raise ValueError(
                f"ChatWarp cannot send {type(m).__name__} ({where}); "
                "use system, human, ai or tool messages"
            )
    return out


# --------------------------------------------------------------------------- tools
def _tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(t.get("function", {}).get("name")) for t in tools]


def _tool_choice(choice: Any, names: Sequence[str]) -> str | dict[str, Any] | None:
    """Spell a LangChain tool_choice the way the core (OpenAI) does.

    `"any"`, `"required"` and True force some call; `"auto"`, `"none"` pass
    through; another string names one tool; a dict is an OpenAI named choice
    (`{"type": "function", "function": {"name": ...}}`) or `{"name": ...}`.
    """
    if choice is None or choice is False:
        return None
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice in ("auto", "none"):
        return str(choice)
    name: Any
    if isinstance(choice, str):
        name = choice
    elif isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_choice {dict(choice)!r} names no function")
    else:
        raise ValueError(
            f"tool_choice must be a string, a dict or a bool, got {type(choice).__name__}"
        )
    if name not in names:
        raise ValueError(
            f"tool_choice names {name!r}, which is not among the bound tools {list(names)}"
        )
    return {"type": "function", "function": {"name": name}}


# --------------------------------------------------------------------------- replies
def _usage(result: WarpResult) -> UsageMetadata:
    u = result.usage
    return UsageMetadata(
        input_tokens=u.prompt_tokens,
        output_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
        input_token_details={"cache_read": u.cached_tokens},
        output_token_details={"reasoning": u.reasoning_tokens},
    )


def _response_metadata(result: WarpResult, model_name: str) -> dict[str, Any]:
    return {
        "finish_reason": result.message.finish_reason or "stop",
        "model_name": model_name,
        "model_provider": "warp",
        "warp_stats": dict(result.stats),
    }


def _split_calls(result: WarpResult) -> tuple[list[Any], list[Any]]:
    """Split the reply's calls into LangChain tool calls and invalid (unusable) tool calls."""
    calls, invalid = [], []
    for c in result.message.tool_calls:
        args = c.parsed_arguments()
        if c.malformed or args is None or not c.name:
            why = (
                "the model gave no function name"
                if not c.name
                else "the call is not complete JSON (cut short by the token limit?)"
                if c.malformed
                else "the arguments are not a JSON object"
            )
            invalid.append(
                invalid_tool_call(
                    name=c.name or None,
                    args=c.raw if c.raw is not None else c.arguments,
                    id=c.id,
                    error=why,
                )
            )
        else:
            calls.append(tool_call(name=c.name, args=args, id=c.id))
    return calls, invalid


def _ai_message(result: WarpResult, model_name: str) -> AIMessage:
    """Build the whole reply as an `AIMessage`."""
    msg = result.message
    calls, invalid = _split_calls(result)
    extra = {"reasoning_content": msg.reasoning} if msg.reasoning else {}
    return AIMessage(
        content=msg.content or "",
        additional_kwargs=extra,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        usage_metadata=_usage(result),
        response_metadata=_response_metadata(result, model_name),
    )


class _Converter:
    """Turns the core's chunks into `ChatGenerationChunk`s; keeps the final result.

    Under output_version="v1" the chunks carry their own content blocks, numbered one
    per run (reasoning, text, each tool call): LangChain would otherwise number text
    blocks from 0 and collide with the tool-call indexes of the same stream.
    """

    def __init__(self, model_name: str, v1: bool = False) -> None:
        self.model_name = model_name
        self.v1 = v1
        self.result: WarpResult | None = None
        self._block = -1
        self._run: Any = None

    def _index(self, run: Any) -> int:
        if run != self._run:
            self._run = run
            self._block += 1
        return self._block

    def feed(self, chunk: ChatChunk) -> ChatGenerationChunk | None:
        if chunk.result is not None:
            self.result = chunk.result
            last: dict[str, Any] = {"chunk_position": "last"} if _HAS_CHUNK_POSITION else {}
            meta = _response_metadata(chunk.result, self.model_name)
            if self.v1:
                meta["output_version"] = "v1"
            return ChatGenerationChunk(
                message=AIMessageChunk(
                    content=[] if self.v1 else "",
                    usage_metadata=_usage(chunk.result),
                    response_metadata=meta,
                    **last,
                )
            )
        delta = chunk.delta
        if delta.empty:
            return None
        blocks: list[dict[str, Any]] = []
        if delta.reasoning:
            blocks.append(
                {
                    "type": "reasoning",
                    "reasoning": delta.reasoning,
                    "index": self._index("reasoning"),
                }
            )
        if delta.content:
            blocks.append({"type": "text", "text": delta.content, "index": self._index("text")})
        # One tool-call chunk per call index in a message: LangChain folds chunks by index.
        by_index: dict[int, Any] = {}
        for ev in delta.tool_calls:
            if isinstance(ev, ToolCallStart):
                by_index[ev.index] = tool_call_chunk(
                    name=ev.name, args="", id=ev.id, index=ev.index
                )
            elif isinstance(ev, ToolCallArguments):
                part = by_index.setdefault(
                    ev.index, tool_call_chunk(name=None, args="", id=None, index=ev.index)
                )
                part["args"] = (part["args"] or "") + ev.fragment
        extra = {"reasoning_content": delta.reasoning} if delta.reasoning else {}
        if not (delta.content or extra or by_index):
            return None  # only call ends: nothing LangChain can show
        if not self.v1:
            return ChatGenerationChunk(
                message=AIMessageChunk(
                    content=delta.content,
                    additional_kwargs=extra,
                    tool_call_chunks=list(by_index.values()),
                )
            )
        for i, part in by_index.items():
            blocks.append({**part, "index": self._index(("call", i))})
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=blocks,  # type: ignore[arg-type]
                additional_kwargs=extra,
                tool_call_chunks=list(by_index.values()),
                response_metadata={"output_version": "v1"},
            )
        )


class _Call:
    """One prepared call: the session, the core request and generation options."""

    def __init__(
        self,
        session: ChatSession,
        request: dict[str, Any],
        options: dict[str, Any],
        model_name: str,
        timeout: float | None,
    ) -> None:
        self.session = session
        self.request = request
        self.options = options
        self.model_name = model_name
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timed_out = False

    def should_stop(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.timed_out = True
        return self.timed_out

    def check(self) -> None:
        if self.timed_out:
            raise TimeoutError(f"ChatWarp: the reply did not finish within timeout={self.timeout}s")


# --------------------------------------------------------------------------- structured output
def _is_pydantic_class(schema: Any) -> bool:
    if not isinstance(schema, type):
        return False
    from pydantic.v1 import BaseModel as BaseModelV1

    return issubclass(schema, (BaseModel, BaseModelV1))


class _ToolArgsParser(BaseGenerationOutputParser[Any]):
    """The arguments of the forced call to `name`, as the schema's class or a dict."""

    name: str
    schema_class: Any = None

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        message = result[0].message if result and isinstance(result[0], ChatGeneration) else None
        if not isinstance(message, AIMessage):
            raise OutputParserException(
                "structured output needs a chat message to read the tool call from"
            )
        for bad in message.invalid_tool_calls:
            if bad.get("name") in (self.name, None, ""):  # a call cut before its name counts too
                raise OutputParserException(
                    f"the model called {self.name} with unusable arguments "
                    f"({bad.get('error')}): {bad.get('args')!r}",
                    llm_output=str(bad.get("args")),
                )
        call = next((c for c in message.tool_calls if c["name"] == self.name), None)
        if call is None:
            raise OutputParserException(
                f"the model answered without calling {self.name}",
                llm_output=_text_of(message.content),
            )
        if self.schema_class is None:
            return call["args"]
        try:
            if issubclass(self.schema_class, BaseModel):
                return self.schema_class.model_validate(call["args"])
            return self.schema_class.parse_obj(call["args"])
        except Exception as exc:  # pydantic v1 and v2 validation errors differ
            if not isinstance(exc, (_ValidationError, ValueError, TypeError)):
                raise
            raise OutputParserException(
                f"the arguments of {self.name} do not fit its schema: {exc}",
                llm_output=json.dumps(call["args"]),
            ) from exc


def _schema_name(json_schema: Mapping[str, Any]) -> str:
    return str(json_schema.get("title") or "output")


# --------------------------------------------------------------------------- the model
class ChatWarp(BaseChatModel):
    r"""A chat model that runs a warp-providers model in this process, experts streamed from disk.

    Setup:
        Install the package and convert a model once, from a local Hugging Face
        checkpoint directory or a .gguf file:

        .. code-block:: bash

            pip install langchain-warp
            warp convert ./Qwen3-30B-A3B ./qwen3-30b-a3b.warp

    Instantiate:
        Weights load on first use and are shared by every `ChatWarp` on the same
        container with the same engine options.

        .. code-block:: python

            from langchain_warp import ChatWarp

            llm = ChatWarp(
                model_path="./qwen3-30b-a3b.warp",
                temperature=0.6,
                max_tokens=512,
                budget="8G",  # RAM for the expert cache
            )

    Invoke:
        .. code-block:: python

            msg = llm.invoke([("system", "Answer in French."), ("human", "I love programming.")])
            msg.content                                   # the answer
            msg.additional_kwargs.get("reasoning_content")  # the model's reasoning, if it thought
            msg.usage_metadata  # tokens; cached prompt and reasoning tokens in the details
            msg.response_metadata["warp_stats"]           # expert cache hits, bytes read, tok/s

    Stream:
        .. code-block:: python

            for chunk in llm.stream("Write a haiku about disks."):
                print(chunk.content, end="", flush=True)

    Async:
        Generation runs on a worker thread; the event loop never blocks.

        .. code-block:: python

            msg = await llm.ainvoke("Hello!")
            async for chunk in llm.astream("Hello!"):
                print(chunk.content, end="")

    Tool calling:
        .. code-block:: python

            from pydantic import BaseModel, Field

            class GetWeather(BaseModel):
                '''Get the current weather in a city.'''

                city: str = Field(description="The city, e.g. Paris")

            llm_with_tools = llm.bind_tools([GetWeather], tool_choice="auto")
            msg = llm_with_tools.invoke("What is the weather in Paris and in Rome?")
            msg.tool_calls  # [{"name": "GetWeather", "args": {"city": "Paris"}, "id": ...}, ...]

        `tool_choice` takes "auto", "none", "any"/"required"/True (some call is
        forced), a tool name, or an OpenAI dict naming one function.

    Structured output:
        The default method, "json_schema", constrains decoding to the schema.

        .. code-block:: python

            class Joke(BaseModel):
                '''A joke.'''

                setup: str
                punchline: str

            structured = llm.with_structured_output(Joke)
            structured.invoke("Tell me a joke about cats.")  # Joke(setup=..., punchline=...)

        `method="function_calling"` forces a call to a tool made from the schema;
        `method="json_mode"` asks for a JSON object (held to the schema when one is given);
        `include_raw=True` returns `{"raw": AIMessage, "parsed": ..., "parsing_error": ...}`.

    Token counting:
        Counts come from the model's own tokenizer (offline), so trimming fits the
        model's context; `profile` holds the context size and what the model offers.

        .. code-block:: python

            from langchain_core.messages import trim_messages

            llm.get_num_tokens("Hello!")
            trim_messages(history, max_tokens=2000, token_counter=llm, strategy="last")
            llm.profile["max_input_tokens"]
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model_path: str | None = Field(default_factory=from_env("WARP_MODEL_PATH", default=None))
    """Path of the converted warp container (default: $WARP_MODEL_PATH)."""
    model: str | None = None
    """Name the model is reported under (response metadata, tracing); default: the container's name.
    A per-call `model=` renames one call's report; it never loads other weights."""
    temperature: float | None = Field(default=None, ge=0.0)
    """Sampling temperature; 0 or None decodes greedily."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus sampling mass (None = off)."""
    top_k: int | None = Field(default=None, ge=0)
    """Sample among the k most likely tokens (None or 0 = off)."""
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """Subtracted once from the logit of every token already generated (None = off)."""
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    """Subtracted from a token's logit per time it was generated (None = off)."""
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    """Divides positive / multiplies negative logits of tokens already seen in the prompt
    or the reply (None or 1.0 = off); keeps greedy decoding of small models out of loops."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate per reply (None = until the context is full)."""
    stop: list[str] | None = None
    """Strings that end the answer (excluded from it); a call's own stop list is added."""
    seed: int | None = None
    """Sampling seed, for reproducible non-greedy replies."""
    timeout: float | None = Field(default=None, gt=0.0)
    """Seconds a reply may take; past it generation is cancelled and TimeoutError raised."""
    streaming: bool = False
    """Make `invoke` stream internally (token callbacks fire as tokens arrive)."""
    reasoning_effort: str | None = None
    """Reasoning level the chat format understands ("low", "high"...; "none": no thinking)."""
    budget: int | str | None = None
    """RAM for the engine's expert cache, bytes or "8G" (None = the engine's plan)."""
    threads: int | None = Field(default=None, ge=0)
    """Compute threads (None or 0 = the engine's choice)."""
    ctx: int | None = Field(default=None, ge=1)
    """Context length in tokens (None = the container's default)."""
    chat_format: str | None = None
    """Chat format name to force (see `warp_providers.chat.registry`); None reads the container."""
    engine_options: dict[str, Any] | None = None
    """Further engine options passed to the model registry (e.g. {"cache_policy": "lru"})."""
    engine: Any = Field(default=None, exclude=True, repr=False)
    """An already open engine (`EngineLike`) to use instead of loading `model_path`."""

    _session: Any = PrivateAttr(default=None)
    _session_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    # ----------------------------------------------------------------- LangChain hooks
    @classmethod
    def is_lc_serializable(cls) -> bool:
        """ChatWarp serializes to its constructor arguments (an injected engine is left out)."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """Return the import path LangChain's loader uses."""
        return ["langchain_warp", "chat_models"]

    @property
    def _llm_type(self) -> str:
        return "warp-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
            "seed": self.seed,
            "reasoning_effort": self.reasoning_effort,
            "budget": self.budget,
            "threads": self.threads,
            "ctx": self.ctx,
            "chat_format": self.chat_format,
        }

    def _default_model_name(self) -> str:
        if self.model:
            return self.model
        if self.engine is not None:
            return str(self.engine.info().get("name") or "warp")
        if self.model_path:
            name = Path(self.model_path).name
            return name[: -len(".warp")] if name.endswith(".warp") else name or "warp"
        return "warp"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="warp",
            ls_model_name=kwargs["model"]
            if isinstance(kwargs.get("model"), str)
            else self._default_model_name(),
            ls_model_type="chat",
        )
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = temperature
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        stops = self._stops(stop)
        if stops:
            params["ls_stop"] = stops
        return params

    def _resolve_model_profile(self) -> ModelProfile | None:
        """Describe the model from its container's tokenizer and plan (no weights load)."""
        if self.engine is not None:
            return _profile(self._get_session().capabilities)
        if not self.model_path or not (Path(self.model_path) / "manifest.json").is_file():
            return None  # nothing to read yet; loading reports the problem on first use
        ctx = self.ctx if self.ctx is not None else (self.engine_options or {}).get("ctx")
        try:
            caps = model_capabilities(self.model_path, ctx=ctx, chat_format=self.chat_format)
        except ChatFormatError:
            return None  # the same error is raised, with its param, on the first call
        return _profile(caps)

    # ----------------------------------------------------------------- token counting
    def get_token_ids(self, text: str) -> list[int]:
        """Return the ids the model's own tokenizer gives `text` (as message content).

        Args:
            text: Plain text; control-token spellings in it stay text.

        """
        return list(self._get_session().engine.tokenizer.encode_content(text))

    def get_num_tokens(self, text: str) -> int:
        """Return the number of the model's tokens in `text`."""
        return len(self.get_token_ids(text))

    def get_num_tokens_from_messages(
        self,
        messages: list[BaseMessage],
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
    ) -> int:
        """Return the prompt tokens of `messages` as the model's chat format renders them.

        The hand-over to the assistant is not counted, so the counts of consecutive slices
        of a conversation add up to about the count of the whole.

        Args:
            messages: The conversation (or a slice of it).
            tools: Tools declared with it, counted in their rendered form.

        Raises:
            ChatFormatError: The model's chat format cannot express the messages or tools.

        """
        request: dict[str, Any] = {"messages": _message_dicts(messages)}
        if tools:
            request["tools"] = [convert_to_openai_tool(t) for t in tools]
        return self._get_session().count_tokens(request)

    # ----------------------------------------------------------------- the model registry
    def _get_session(self) -> ChatSession:
        """Return the chat session, loading the model on first use (through the core's registry)."""
        if self._session is not None:
            return self._session
        with self._session_lock:
            if self._session is None:
                self._session = self._open_session()
        return self._session

    def _open_session(self) -> ChatSession:
        if self.engine is not None:
            return ChatSession(self.engine, chat_format=self.chat_format)
        if not self.model_path:
            raise ValueError("ChatWarp needs model_path (or $WARP_MODEL_PATH, or an open engine)")
        options: dict[str, Any] = dict(self.engine_options or {})
        for key in ("budget", "threads", "ctx"):
            value = getattr(self, key)
            if value is not None:
                options[key] = value
        if self.chat_format is None:
            return shared_session(self.model_path, **options)
        # A forced format gets its own session over the shared engine (same weights).
        return ChatSession(shared_engine(self.model_path, **options), chat_format=self.chat_format)

    # ----------------------------------------------------------------- one request path
    def _stops(self, stop: Sequence[str] | None) -> list[str]:
        out = list(self.stop or [])
        out += [s for s in stop or [] if s not in out]
        return out

    def _prepare(
        self,
        session: ChatSession,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> _Call:
        unknown = sorted(set(kwargs) - _CALL_KWARGS)
        if unknown:
            raise TypeError(
                f"ChatWarp got unexpected call arguments {unknown}; it takes {sorted(_CALL_KWARGS)}"
            )
        request: dict[str, Any] = {"messages": _message_dicts(messages)}
        tools = kwargs.get("tools")
        if tools:
            request["tools"] = [convert_to_openai_tool(t) for t in tools]
        choice = _tool_choice(kwargs.get("tool_choice"), _tool_names(request.get("tools", [])))
        if choice is not None:
            if not tools and choice != "none":
                raise ValueError(
                    "tool_choice was given without tools; bind tools with bind_tools(...)"
                )
            request["tool_choice"] = choice
        if kwargs.get("parallel_tool_calls") is not None:
            request["parallel_tool_calls"] = bool(kwargs["parallel_tool_calls"])
        if kwargs.get("response_format") is not None:
            request["response_format"] = kwargs["response_format"]
        effort = kwargs.get("reasoning_effort", self.reasoning_effort)
        if effort is not None:
            request["reasoning_effort"] = effort

        temperature = kwargs.get("temperature", self.temperature)
        top_p = kwargs.get("top_p", self.top_p)
        top_k = kwargs.get("top_k", self.top_k)
        penalty = {
            k: float(v)
            for k in ("presence_penalty", "frequency_penalty", "repetition_penalty")
            if (v := kwargs.get(k, getattr(self, k))) is not None
        }
        sampling = SamplingParams(
            temperature=float(temperature or 0.0),
            top_p=float(top_p or 1.0),
            top_k=int(top_k or 0),
            seed=kwargs.get("seed", self.seed),
            **penalty,
        )
        options = {
            "max_tokens": kwargs.get("max_tokens", self.max_tokens),
            "sampling": sampling,
            "stop": self._stops(stop),
        }
        model_name = (
            kwargs["model"]
            if isinstance(kwargs.get("model"), str)
            else (self.model or session.model_name)
        )
        call = _Call(session, request, options, model_name, kwargs.get("timeout", self.timeout))
        call.options["should_stop"] = call.should_stop
        return call

    def _iterate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        sink: list[Any],
    ) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(self._get_session(), messages, stop, kwargs)
        conv = _Converter(call.model_name, v1=self.output_version == "v1")
        for chunk in call.session.stream(call.request, **call.options):
            out = conv.feed(chunk)
            if out is not None:
                yield out
        call.check()
        sink.append((conv.result, call.model_name))

    async def _aiterate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        sink: list[Any],
    ) -> AsyncIterator[ChatGenerationChunk]:
        session = self._session or await asyncio.get_running_loop().run_in_executor(
            None, self._get_session
        )
        call = self._prepare(session, messages, stop, kwargs)
        conv = _Converter(call.model_name, v1=self.output_version == "v1")
        stream: Any = call.session.astream(call.request, **call.options)
        try:
            async for chunk in stream:
                out = conv.feed(chunk)
                if out is not None:
                    yield out
        finally:
            await stream.aclose()  # stops the worker thread when the consumer stops early
        call.check()
        sink.append((conv.result, call.model_name))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        sink: list[Any] = []
        for chunk in self._iterate(messages, stop, kwargs, sink):
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        return _final(sink)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        yield from self._iterate(messages, stop, kwargs, [])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        sink: list[Any] = []
        async for chunk in self._aiterate(messages, stop, kwargs, sink):
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        return _final(sink)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in self._aiterate(messages, stop, kwargs, []):
            yield chunk

    # ----------------------------------------------------------------- tools
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the model may call.

        Args:
            tools: Pydantic classes, TypedDicts, functions, LangChain tools or OpenAI tool dicts.
            tool_choice: "auto", "none", "any"/"required"/True (some call is forced),
                a tool name, or {"type": "function", "function": {"name": ...}}.
            strict: Passed to each tool's schema (OpenAI's strict flag: no extra keys).
            parallel_tool_calls: False allows one call per reply. Enforced when the call
                is forced (tool_choice), where decoding is constrained; otherwise a request
                the chat core passes on.
            **kwargs: Further call arguments to bind (e.g. temperature).

        Raises:
            ValueError: tool_choice names a tool that is not bound.

        """
        formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
        choice = _tool_choice(tool_choice, _tool_names(formatted))
        if choice is not None:
            kwargs["tool_choice"] = choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    # ----------------------------------------------------------------- structured output
    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Return a runnable that answers with data shaped by `schema`.

        Args:
            schema: A pydantic class (v1 or v2), a TypedDict, or a JSON Schema dict.
                Optional for json_mode only.
            method: "json_schema" (constrained decoding to the schema), "function_calling"
                (a forced call of a tool made from the schema) or "json_mode" (a JSON
                object; held to `schema` too when one is given: the grammar runs in-process).
            include_raw: Return {"raw", "parsed", "parsing_error"} instead of raising on
                unusable output.
            strict: Passed on as the schema's strict flag.
            **kwargs: Not accepted; present for LangChain's signature.

        Raises:
            ValueError: An unknown method, or a method that needs a schema without one.
            OutputParserException: (when invoked, without include_raw) the reply does not parse.

        """
        if kwargs:
            raise TypeError(f"with_structured_output got unexpected arguments {sorted(kwargs)}")
        is_class = _is_pydantic_class(schema)
        trace = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        if method == "function_calling":
            if schema is None:
                raise ValueError("method='function_calling' needs a schema")
            tool = convert_to_openai_tool(schema, strict=strict)
            name = tool["function"]["name"]
            llm = self.bind_tools(
                [tool],
                tool_choice=name,
                parallel_tool_calls=False,
                ls_structured_output_format=trace,
            )
            parser: Runnable[Any, Any] = _ToolArgsParser(
                name=name, schema_class=schema if is_class else None
            )
        elif method in ("json_schema", "json_mode"):
            if method == "json_schema" and schema is None:
                raise ValueError("method='json_schema' needs a schema")
            # json_mode asks for a JSON object; when the caller gives the schema it will be
            # parsed into, the in-process grammar holds the object to it as well
            if schema is not None:
                # the declared keys only (a pydantic model ignores others, and an open
                # object invites a small model to ramble); strict closes free-form maps too
                json_schema = close_objects(convert_to_json_schema(schema), free_form=not strict)
                spec: dict[str, Any] = {"name": _schema_name(json_schema), "schema": json_schema}
                if strict is not None:
                    spec["strict"] = strict
                response_format: dict[str, Any] = {"type": "json_schema", "json_schema": spec}
            else:
                response_format = {"type": "json_object"}
            bind: dict[str, Any] = {"response_format": response_format}
            if schema is not None:
                bind["ls_structured_output_format"] = trace
            llm = self.bind(**bind)
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if is_class
                else JsonOutputParser()
            )  # type: ignore[arg-type]
        else:
            raise ValueError(
                f"method must be 'json_schema', 'function_calling' or 'json_mode', got {method!r}"
            )
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")


def _profile(caps: Mapping[str, Any]) -> ModelProfile:
    profile = ModelProfile(
        text_inputs=True,
        image_inputs=bool(caps.get("images", False)),
        text_outputs=True,
        tool_calling=caps["tools"],
        tool_choice=caps["tools"],
        tool_call_streaming=caps["tools"],
        structured_output=True,
        reasoning_output=caps["reasoning"],
        temperature=True,
        open_weights=True,
    )
    if caps["ctx_tokens"]:
        profile["max_input_tokens"] = caps["ctx_tokens"]
        profile["max_output_tokens"] = caps["ctx_tokens"]
    return profile


def _final(sink: list[Any]) -> ChatResult:
    result, model_name = sink[0]
    return ChatResult(generations=[ChatGeneration(message=_ai_message(result, model_name))])
