"""LlamaIndex LLM over warp_providers: `Warp`, a `FunctionCallingLLM` running in-process.

Owns: LlamaIndex messages and tools -> the core's OpenAI-shaped chat request; ONE
streaming path (`_Fold` over `ChatSession.stream` / `astream`) that chat, complete,
their streaming and async twins all consume; reasoning as `ThinkingBlock` plus
`thinking_delta`; tool calls as `ToolCallBlock` / `ToolSelection`; structured output
through `response_format` json_schema (the core constrains decoding to the schema);
`raw` = model, finish reason, usage and the engine's expert stats.
Refuses: content blocks the core has no shape for (audio, video, documents) with a
ValueError naming the block. Core errors (`ChatFormatError`, `WarpError`) propagate.
Called by: LlamaIndex query engines, chat engines, agents and programs.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    ImageBlock,
    LLMMetadata,
    LogProb,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.utils import process_streaming_objects
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode

from warp_providers import (
    AssistantMessage,
    ChatChunk,
    ChatSession,
    DeltaAccumulator,
    EngineLike,
    SamplingParams,
    Usage,
    close_objects,
    model_capabilities,
    shared_engine,
)

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["Warp"]

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "developer",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}
# Keys of chat()/complete() kwargs that belong to the request rather than to generation.
_REQUEST_KEYS = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "reasoning_effort",
    "thinking",
)
# Generation keys accepted per call; they override the instance's fields for that call.
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


class Warp(FunctionCallingLLM):
    """A local mixture-of-experts model, run in-process by warp_providers, as a LlamaIndex LLM.

    Setup:
        ``pip install llama-index-llms-warp`` then convert a checkpoint once with
        ``warp convert <gguf-or-hf-dir> model.warp``.

    Instantiate:
        .. code-block:: python

            from llama_index.llms.warp import Warp

            llm = Warp(model_path="model.warp", engine_options={"budget": "6G"})

        The model opens on first use and is shared with every other adapter (LangChain,
        the OpenAI transport) that names the same path and options.

    Invoke:
        .. code-block:: python

            from llama_index.core.llms import ChatMessage

            llm.chat([ChatMessage(role="user", content="Name a prime.")]).message.content
            llm.complete("Name a prime.").text

    Stream:
        .. code-block:: python

            for r in llm.stream_chat([ChatMessage(role="user", content="Count to 3.")]):
                print(r.delta, end="")   # r.additional_kwargs.get("thinking_delta") for reasoning

    Async:
        .. code-block:: python

            r = await llm.achat(messages)
            async for r in await llm.astream_chat(messages): ...

    Tool calling:
        .. code-block:: python

            from llama_index.core.tools import FunctionTool

            add = FunctionTool.from_defaults(fn=lambda a, b: a + b, name="add")
            r = llm.chat_with_tools([add], user_msg="What is 2 + 3?")
            llm.get_tool_calls_from_response(r)  # [ToolSelection(tool_name="add", ...)]

    Structured output (constrained decoding to the schema):
        .. code-block:: python

            from llama_index.core.prompts import PromptTemplate

            llm.structured_predict(City, PromptTemplate("Describe {name}."), name="Paris")
            llm.as_structured_llm(City).complete("Describe Paris.").raw  # a City
    """

    model_path: str | None = Field(
        default=None,
        description="Container directory (`warp convert` output); opened on first use.",
    )
    engine_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for opening the model: budget ('6G'), threads, ctx, cache_policy, ...",
    )
    chat_format: str | None = Field(
        default=None,
        description="Chat-format registry name to force; None resolves it from the model.",
    )
    model_name: str | None = Field(
        default=None,
        description="Name reported in metadata and `raw` (default: the model's own name).",
    )
    context_window: int | None = Field(
        default=None, gt=0, description="Context size in tokens (default: the engine's context)."
    )
    max_tokens: int = Field(
        default=512, gt=0, description="Upper bound on generated tokens per reply."
    )
    temperature: float = Field(
        default=0.0, ge=0.0, description="Sampling temperature; 0 is greedy."
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus mass kept (1 = off).")
    top_k: int = Field(default=0, ge=0, description="Tokens kept by rank (0 = off).")
    min_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Relative probability floor (0 = off)."
    )
    seed: int | None = Field(default=None, description="Sampling seed (None = random).")
    repetition_penalty: float = Field(
        default=1.0, gt=0.0, description="Repetition penalty (1 = off)."
    )
    stop: list[str] = Field(default_factory=list, description="Strings that end the answer text.")
    reasoning_effort: str | None = Field(
        default=None,
        description="Reasoning level ('low', 'high', 'none', ...), as the model's format accepts.",
    )
    thinking: bool | None = Field(
        default=None,
        description="Turn the reasoning channel on or off (None: the format's default).",
    )
    is_function_calling_model: bool | None = Field(
        default=None,
        description="Whether agents may send tools (None: whether the model's chat format "
        "carries a tool protocol; False makes LlamaIndex agents fall back to ReAct).",
    )

    _session: ChatSession | None = PrivateAttr(default=None)
    _engine: EngineLike | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, *, engine: EngineLike | None = None, **data: Any) -> None:
        """Create the LLM; nothing is loaded until the first call.

        Args:
            engine: an open engine to use instead of `model_path` (tests inject the
                scripted engine here).
            **data: the fields above.

        Raises:
            ValueError: neither or both of `engine` and `model_path` were given.

        """
        super().__init__(**data)
        if (engine is None) == (self.model_path is None):
            raise ValueError("give exactly one of model_path= (a warp container) or engine=")
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        """Return the name LlamaIndex (de)serializes this component under."""
        return "Warp"

    # ------------------------------------------------------------------ the model
    @property
    def session(self) -> ChatSession:
        """Return the chat session over the model, opened on first access (thread-safe)."""
        with self._lock:
            if self._session is None:
                engine = self._engine
                if engine is None:
                    assert self.model_path is not None  # checked in __init__
                    engine = shared_engine(self.model_path, **self.engine_options)
                self._session = ChatSession(
                    engine, chat_format=self.chat_format, model_name=self.model_name
                )
            return self._session

    @property
    def metadata(self) -> LLMMetadata:
        """Return the context window, output budget and capabilities.

        Opens the model only when `context_window` was not given.
        """
        window = self.context_window
        calls = self.is_function_calling_model
        if window is None or calls is None:
            caps = self._capabilities()
            if window is None:
                window = caps["ctx_tokens"] or DEFAULT_CONTEXT_WINDOW
            calls = calls if calls is not None else caps["tools"]
        return LLMMetadata(
            context_window=window,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=calls,
            model_name=self._name(),
            system_role=MessageRole.SYSTEM,
        )

    def _capabilities(self) -> dict[str, Any]:
        """The model's capabilities; from the container without loading it when not open."""
        if self._session is None and self._engine is None:
            assert self.model_path is not None  # checked in __init__
            ctx = self.engine_options.get("ctx")
            return model_capabilities(self.model_path, ctx=ctx, chat_format=self.chat_format)
        return self.session.capabilities

    def _name(self) -> str:
        if self.model_name:
            return self.model_name
        if self._session is not None or self._engine is not None:
            return self.session.model_name
        return Path(str(self.model_path)).name.removesuffix(".warp")

    # ------------------------------------------------------------------ the one path
    def _call(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split call kwargs into the core's request and its generation options."""
        kwargs = dict(kwargs)
        request: dict[str, Any] = {"messages": [_to_request_message(m) for m in messages]}
        for key in _REQUEST_KEYS:
            value = kwargs.pop(key, getattr(self, key, None))
            if value is not None:
                request[key] = value
        knobs = {k: kwargs.pop(k, getattr(self, k, None)) for k in _SAMPLING_KEYS}
        sampling = SamplingParams(**{k: v for k, v in knobs.items() if v is not None})
        stop = kwargs.pop("stop", None)
        options = {
            "max_tokens": kwargs.pop("max_tokens", self.max_tokens),
            "sampling": sampling,
            "stop": list(
                self.stop if stop is None else ([stop] if isinstance(stop, str) else stop)
            ),
        }
        if kwargs:
            raise TypeError(f"Warp got unexpected keyword argument(s): {sorted(kwargs)}")
        return request, options

    def _responses(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> ChatResponseGen:
        request, options = self._call(messages, kwargs)
        fold = _Fold()
        for chunk in self.session.stream(request, **options):
            yield fold.step(chunk)

    async def _aresponses(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> ChatResponseAsyncGen:
        request, options = self._call(messages, kwargs)
        fold = _Fold()
        async for chunk in self.session.astream(request, **options):
            yield fold.step(chunk)

    # ------------------------------------------------------------------ LLM surface
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Reply to a conversation."""
        return _last(self._responses(messages, kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the reply; each response holds the message so far and its `delta`."""
        return self._responses(messages, kwargs)

    def _raw(self, prompt: str, kwargs: dict[str, Any]) -> CompletionResponseGen:
        """Continue `prompt` as it is: plain text, no chat template, no control tokens."""
        _, options = self._call([], kwargs)
        engine = self.session.engine
        ids = engine.tokenizer.encode_content(prompt)
        text = ""
        events = engine.stream(ids, max_tokens=options["max_tokens"],
                               sampling=options["sampling"], stop=options["stop"])
        try:
            for ev in events:
                text += ev.text
                yield CompletionResponse(text=text, delta=ev.text)
        finally:
            getattr(events, "close", lambda: None)()
        gen = engine.last_result
        n = len(gen.token_ids) if gen is not None else 0
        usage = Usage(prompt_tokens=len(ids), completion_tokens=n, total_tokens=len(ids) + n,
                      cached_tokens=min(gen.cached_tokens, len(ids)) if gen is not None else 0)
        finish = gen.finish_reason if gen is not None else "stop"
        yield CompletionResponse(text=gen.text if gen is not None else text, delta="", raw={
            "model": self._name(),
            "finish_reason": "length" if finish == "length" else "stop",
            "usage": usage.model_dump(),
            "stats": dict(gen.stats) if gen is not None else {},
        })

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer `prompt` as one user turn; with `formatted=True` continue it as it is.

        `formatted=True` means the caller already formatted the prompt: it goes to the
        model as plain text, with no chat template.
        """
        if formatted:
            return _last_completion(self._raw(prompt, kwargs))
        return _completion(_last(self._responses(_user(prompt), kwargs)))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """Stream the answer to `prompt` as one user turn (`formatted`: see `complete`)."""
        if formatted:
            return self._raw(prompt, kwargs)
        return (_completion(r) for r in self._responses(_user(prompt), kwargs))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async `chat` (generation runs on a worker thread)."""
        return await _alast(self._aresponses(messages, kwargs))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async `stream_chat`; closing the iterator cancels the generation."""
        return self._aresponses(messages, kwargs)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async `complete` (`formatted=True` runs the raw path on a worker thread)."""
        if formatted:
            return await asyncio.to_thread(lambda: _last_completion(self._raw(prompt, kwargs)))
        return _completion(await _alast(self._aresponses(_user(prompt), kwargs)))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async `stream_complete`."""

        async def gen() -> CompletionResponseAsyncGen:
            async for r in self._aresponses(_user(prompt), kwargs):
                yield _completion(r)

        async def raw() -> CompletionResponseAsyncGen:
            steps = self._raw(prompt, kwargs)
            try:
                while (step := await asyncio.to_thread(next, steps, None)) is not None:
                    yield step
            finally:
                steps.close()

        return raw() if formatted else gen()

    # ------------------------------------------------------------------ tools
    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Build chat() arguments offering `tools` (OpenAI tool entries) to the model.

        `tool_choice` may be "auto", "none", "required", a tool name, or an OpenAI
        named-function object; `tool_required=True` means "required". A forced call is
        enforced by the core's grammar, limited to one call unless
        `allow_parallel_tool_calls`.
        """
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(user_msg if isinstance(user_msg, ChatMessage) else _user(user_msg)[0])
        specs = [t.metadata.to_openai_tool(skip_length_check=True) for t in tools]
        if tool_choice is None and tool_required:
            tool_choice = "required"
        if isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
            tool_choice = {"type": "function", "function": {"name": tool_choice}}
        out: dict[str, Any] = {"messages": messages, **kwargs}
        if specs:
            out["tools"] = specs
            out["parallel_tool_calls"] = allow_parallel_tool_calls  # the core's grammar reads it
            if tool_choice is not None:
                out["tool_choice"] = tool_choice
        return out

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keep only the first tool call unless parallel calls were allowed."""
        if not allow_parallel_tool_calls:
            calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
            for extra in calls[1:]:
                response.message.blocks.remove(extra)
        return response

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """Return the tool calls of a reply, in order.

        Arguments that are not a JSON object (a call still streaming, or a malformed
        one) become `{}`; the message keeps their raw text in `ToolCallBlock.tool_kwargs`.

        Raises:
            ValueError: no tool call and `error_on_no_tool_call`.

        """
        calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call, got: {response.message.content!r}")
        return [
            ToolSelection(
                tool_id=b.tool_call_id or "",
                tool_name=b.tool_name,
                tool_kwargs=b.tool_kwargs if isinstance(b.tool_kwargs, dict) else {},
            )
            for b in calls
        ]

    # ------------------------------------------------------------------ structured output
    def _structured_call(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        schema = {
            "name": output_cls.__name__,
            "schema": close_objects(output_cls.model_json_schema()),
            "strict": True,
        }
        kwargs = {
            **(llm_kwargs or {}),
            "response_format": {"type": "json_schema", "json_schema": schema},
        }
        return self._get_messages(prompt, **prompt_args), kwargs

    def _uses_constraints(self) -> bool:
        return self.pydantic_program_mode == PydanticProgramMode.DEFAULT

    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Return an `output_cls` instance, decoded under the class's JSON schema.

        Other `pydantic_program_mode`s than DEFAULT use LlamaIndex's own programs.

        Raises:
            ValueError: the reply was cut at `max_tokens` before the JSON closed.
            pydantic.ValidationError: the reply does not validate.

        """
        if not self._uses_constraints():
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        return _parse_structured(output_cls, self.chat(messages, **kwargs))

    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Async `structured_predict`."""
        if not self._uses_constraints():
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        return _parse_structured(output_cls, await self.achat(messages, **kwargs))

    def stream_structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Any, None, None]:
        """Yield partial objects as the constrained JSON streams in; the last one is complete."""
        if not self._uses_constraints():
            yield from super().stream_structured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
            return
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)
        current = None
        for r in self.stream_chat(messages, **kwargs):
            current = process_streaming_objects(
                r, output_cls, cur_objects=_listed(current), llm=self
            )
            yield current

    async def astream_structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Any, None]:
        """Async `stream_structured_predict`."""
        if not self._uses_constraints():
            return await super().astream_structured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        messages, kwargs = self._structured_call(output_cls, prompt, llm_kwargs, prompt_args)

        async def gen() -> AsyncGenerator[Any, None]:
            current = None
            async for r in await self.astream_chat(messages, **kwargs):
                current = process_streaming_objects(
                    r, output_cls, cur_objects=_listed(current), llm=self
                )
                yield current

        return gen()


# ---------------------------------------------------------------------- the fold
class _Fold:
    """Turn the core's chunks into ChatResponses: the message so far, plus this step's deltas.

    The last chunk carries the core's finished `ChatResult`, whose message is
    authoritative (parsed tool calls, finish reason), with usage and stats in `raw`.
    """

    def __init__(self) -> None:
        self.acc = DeltaAccumulator()

    def step(self, chunk: ChatChunk) -> ChatResponse:
        delta = chunk.delta
        self.acc.add(delta)
        extra: dict[str, Any] = {}
        if delta.reasoning:
            extra["thinking_delta"] = delta.reasoning
        raw = None
        message = self.acc.message()
        if chunk.result is not None:
            result = chunk.result
            message = result.message
            raw = {
                "model": result.model,
                "finish_reason": message.finish_reason,
                "usage": result.usage.model_dump(),
                "stats": dict(result.stats),
            }
        logprobs = None
        if chunk.logprob is not None:
            logprobs = [[LogProb(token=delta.content or delta.reasoning, logprob=chunk.logprob)]]
        return ChatResponse(
            message=_to_chat_message(message),
            delta=delta.content,
            raw=raw,
            logprobs=logprobs,
            additional_kwargs=extra,
        )


# ---------------------------------------------------------------------- conversions
def _to_chat_message(msg: AssistantMessage) -> ChatMessage:
    """Convert the core's reply to a LlamaIndex assistant message (thinking, text, calls)."""
    blocks: list[Any] = []
    if msg.reasoning:
        blocks.append(ThinkingBlock(content=msg.reasoning))
    if msg.content:
        blocks.append(TextBlock(text=msg.content))
    for call in msg.tool_calls:
        args = call.parsed_arguments()
        blocks.append(
            ToolCallBlock(
                tool_call_id=call.id,
                tool_name=call.name,
                tool_kwargs=args if args is not None else call.arguments,
            )
        )
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)


def _to_request_message(message: ChatMessage) -> dict[str, Any]:
    """Convert one LlamaIndex message to the core's OpenAI-shaped message."""
    role = _ROLES.get(MessageRole(message.role))
    if role is None:
        raise ValueError(f"Warp cannot send a message with role {message.role!r}")
    parts: list[dict[str, Any]] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            detail = getattr(block, "detail", None)
            ref = {"url": _image_url(block), **({"detail": detail} if detail else {})}
            parts.append({"type": "image_url", "image_url": ref})
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.content or "")
        elif isinstance(block, ToolCallBlock):
            args = block.tool_kwargs
            calls.append(
                {
                    "id": block.tool_call_id or f"call_{len(calls)}",
                    "type": "function",
                    "function": {
                        "name": block.tool_name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        elif isinstance(block, CachePoint):
            continue  # a provider caching hint; the engine's prompt cache needs none
        else:
            raise ValueError(f"Warp cannot send a {block.block_type!r} content block")
    out: dict[str, Any] = {"role": role}
    if all(p["type"] == "text" for p in parts):
        out["content"] = "".join(p["text"] for p in parts) if parts else None
    else:
        out["content"] = parts
    kw = message.additional_kwargs
    if role == "assistant":
        if reasoning:
            out["reasoning_content"] = "".join(reasoning)
        calls = calls or [c for c in kw.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            out["tool_calls"] = calls
    if role == "tool":
        if kw.get("tool_call_id"):
            out["tool_call_id"] = kw["tool_call_id"]
        if kw.get("name"):
            out["name"] = kw["name"]
    return out


def _image_url(block: ImageBlock) -> str:
    if block.url is not None:
        return str(block.url)
    if block.path is not None:
        return str(block.path)
    if isinstance(block.image, bytes):  # stored base64-encoded by ImageBlock
        return f"data:{block.image_mimetype or 'image/png'};base64,{block.image.decode('ascii')}"
    raise ValueError("an ImageBlock needs url, path or image bytes")


def _completion(r: ChatResponse) -> CompletionResponse:
    extra = dict(r.additional_kwargs)
    thinking = "".join(b.content or "" for b in r.message.blocks if isinstance(b, ThinkingBlock))
    if r.raw is not None and thinking:
        extra["thinking"] = thinking
    return CompletionResponse(
        text=r.message.content or "",
        delta=r.delta,
        raw=r.raw,
        logprobs=r.logprobs,
        additional_kwargs=extra,
    )


def _parse_structured(output_cls: type[BaseModel], response: ChatResponse) -> Any:
    text = response.message.content or ""
    if response.raw is not None and response.raw.get("finish_reason") == "length":
        raise ValueError(
            f"the {output_cls.__name__} JSON was cut at the token limit before it closed "
            f"(pass a larger max_tokens): {text!r}"
        )
    return output_cls.model_validate_json(text)


def _user(prompt: str) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, content=prompt)]


def _listed(current: Any) -> list[Any] | None:
    if current is None:
        return None
    return current if isinstance(current, list) else [current]


def _last_completion(responses: Iterator[CompletionResponse]) -> CompletionResponse:
    last = None
    for last in responses:
        pass
    assert last is not None  # the raw path always ends with its usage step
    return last


def _last(responses: Iterator[ChatResponse]) -> ChatResponse:
    last = None
    for last in responses:
        pass
    assert last is not None  # the core always ends with a result chunk
    return last


async def _alast(responses: AsyncIterator[ChatResponse]) -> ChatResponse:
    last = None
    async for last in responses:
        pass
    assert last is not None
    return last
