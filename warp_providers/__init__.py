"""warp-providers: huge mixture-of-experts models in-process, experts streamed from disk.

The whole public Python surface is `__all__` below. Integrations (LangChain, LlamaIndex,
the OpenAI transport) import only these names.
"""

from warp_providers.engine import (
    Engine,
    EngineLike,
    GenerationResult,
    TokenEvent,
    parse_size,
    plan_memory,
)
from warp_providers.errors import (
    Cancelled,
    ContextOverflowError,
    EngineIOError,
    ImageError,
    MemoryBudgetError,
    ModelFormatError,
    ModelNotFoundError,
    StateMismatchError,
    UnsupportedModelError,
    WarpError,
)
from warp_providers.chat.base import (
    ChatFormatError,
    Delta,
    DeltaAccumulator,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)
from warp_providers.constrain import close_objects
from warp_providers.paths import cache_dir
from warp_providers.progress import Progress
from warp_providers.models import model_capabilities, release, shared_engine, shared_session
from warp_providers.sampling import LogitsProcessor, Sampler, SamplingParams
from warp_providers.session import ChatChunk, ChatResult, ChatSession
from warp_providers.tokenizer import Tokenizer
from warp_providers.types import AssistantMessage, ChatRequest, ToolCall, Usage

__version__ = "0.1.0"

__all__ = [
    "AssistantMessage",
    "Cancelled",
    "ChatChunk",
    "ChatFormatError",
    "ChatRequest",
    "ChatResult",
    "ChatSession",
    "Delta",
    "DeltaAccumulator",
    "ImageError",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallStart",
    "Usage",
    "model_capabilities",
    "release",
    "shared_engine",
    "shared_session",
    "ContextOverflowError",
    "Engine",
    "EngineIOError",
    "EngineLike",
    "GenerationResult",
    "LogitsProcessor",
    "MemoryBudgetError",
    "ModelFormatError",
    "ModelNotFoundError",
    "Sampler",
    "SamplingParams",
    "StateMismatchError",
    "TokenEvent",
    "Tokenizer",
    "UnsupportedModelError",
    "WarpError",
    "__version__",
    "close_objects",
    "parse_size",
    "cache_dir",
    "plan_memory",
    "Progress",
]
