"""The shared model registry: one loaded engine per (model path, options), process-wide.

Owns: `shared_engine` (opens a container lazily, once, under a lock; every later call
with the same real path and options gets the same `Engine`), `shared_session` (one
`ChatSession` per shared engine) and the reference count behind them: each
`shared_engine` call takes one reference, `release(engine)` gives one back, and the last
release closes the engine and forgets it (the next `shared_engine` opens it afresh). Any
number of transports and adapters on one path thus share one model in memory; concurrent
requests on it are batched by the engine's scheduler.
Refuses: nothing beyond what `Engine.open` refuses; `release` of an engine it does not
hold raises ValueError.
Called by: warp_openai, langchain_warp, llama_index.llms.warp and the CLI.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from warp_providers.chat import registry
from warp_providers.engine import Engine, container_chat_metadata, plan_memory
from warp_providers.errors import ModelNotFoundError
from warp_providers.session import ChatSession, format_capabilities
from warp_providers.tokenizer import Tokenizer

__all__ = [
    "clear", "model_capabilities", "references", "release", "shared_engine", "shared_session",
]

_LOCK = threading.Lock()
_ENGINES: dict[tuple[str, str], Engine] = {}
_OPENING: dict[tuple[str, str], threading.Lock] = {}
_SESSIONS: dict[int, ChatSession] = {}
_REFS: dict[int, int] = {}


def _key(path: str | os.PathLike[str], options: dict[str, Any]) -> tuple[str, str]:
    real = os.path.realpath(os.fspath(path))
    return real, repr(sorted((k, repr(v)) for k, v in options.items()))


def shared_engine(path: str | os.PathLike[str], **options: Any) -> Engine:
    """The process-wide `Engine` for `path` opened with `options` (opened on first use).

    Each call takes one reference; give it back with `release` when done (a caller
    that never releases keeps the engine open for the life of the process).

    Args:
        path: the container directory; symlinks and relative spellings share one engine.
        **options: `Engine.open` keywords (budget, threads, ctx, cache_policy, ...).

    Raises:
        Whatever `Engine.open` raises (the next call tries again).

    """
    key = _key(path, options)
    with _LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            _REFS[id(engine)] += 1
            return engine
        opening = _OPENING.setdefault(key, threading.Lock())
    with opening:  # one opener per key; other keys open concurrently
        with _LOCK:
            engine = _ENGINES.get(key)
            if engine is not None:
                _REFS[id(engine)] += 1
                return engine
        engine = Engine.open(key[0], **options)
        with _LOCK:
            _ENGINES[key] = engine
            _REFS[id(engine)] = 1
        return engine


def release(engine: Engine) -> bool:
    """Gives back one reference taken by `shared_engine`; the last one closes the engine.

    Returns:
        True when this release closed the engine.

    Raises:
        ValueError: `engine` is not a shared engine (or all its references are back).

    """
    with _LOCK:
        count = _REFS.get(id(engine))
        if count is None:
            raise ValueError("release() of an engine the registry does not hold")
        if count > 1:
            _REFS[id(engine)] = count - 1
            return False
        del _REFS[id(engine)]
        _SESSIONS.pop(id(engine), None)
        for key, held in list(_ENGINES.items()):
            if held is engine:
                del _ENGINES[key]
    engine.close()  # waits for a generation in progress
    return True


def references(engine: Engine) -> int:
    """How many references to `engine` are out (0 if the registry does not hold it)."""
    with _LOCK:
        return _REFS.get(id(engine), 0)


def shared_session(path: str | os.PathLike[str], **options: Any) -> ChatSession:
    """The `ChatSession` over `shared_engine(path, **options)` (one per engine).

    Raises:
        ChatFormatError: the model has no usable chat format.

    """
    engine = shared_engine(path, **options)
    with _LOCK:
        session = _SESSIONS.get(id(engine))
        if session is None:
            session = ChatSession(engine)
            _SESSIONS[id(engine)] = session
        return session


def model_capabilities(
    path: str | os.PathLike[str], *, ctx: int | None = None, chat_format: str | None = None
) -> dict[str, Any]:
    """What a container's model offers, read without loading its weights.

    Returns the `ChatSession.capabilities` dict the model would have once opened with
    this `ctx`: context size, tools, reasoning, chat format name.

    Args:
        path: the container directory.
        ctx: the context length it would be opened with (None = the engine's default).
        chat_format: a chat format name to force, as `ChatSession` takes it.

    Raises:
        ModelNotFoundError: `path` is not a container.
        ChatFormatError: the model has no usable chat format.
        OSError, WarpError: the container cannot be read.

    """
    if not (Path(path) / "manifest.json").is_file():
        raise ModelNotFoundError(f"not a warp container (no manifest.json): {os.fspath(path)}")
    tokenizer = Tokenizer.from_dir(path)
    meta = container_chat_metadata(path, tokenizer)
    fmt = registry.resolve(
        name=chat_format, metadata_format=meta["format"], chat_template=meta["template"],
        tokenizer=tokenizer,
    )
    return format_capabilities(fmt, int(plan_memory(path, ctx=ctx)["ctx_tokens"]))


def clear() -> None:
    """Closes and forgets every shared engine (tests; process shutdown)."""
    with _LOCK:
        engines = list(_ENGINES.values())
        _ENGINES.clear()
        _SESSIONS.clear()
        _OPENING.clear()
        _REFS.clear()
    for engine in engines:
        engine.close()
