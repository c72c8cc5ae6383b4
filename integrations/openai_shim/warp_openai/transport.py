"""httpx / httpx2 transports that answer OpenAI requests in-process, with no socket.

Owns: `WarpTransport` / `AsyncWarpTransport` (the transports, for `httpx` and, through
`transport_classes("httpx2")`, for `httpx2`), SSE framing of `api.ChunkStream`s as
generator-backed response streams (the first event reaches the client before generation
ends; closing the response stops generation), the per-call read timeout from
`request.extensions["timeout"]`, `x-should-retry: false` on every error, and the
constructors `warp_transport` / `async_warp_transport` (an http client for the installed
openai major: httpx2 for openai 3.x, httpx for 2.x) and `warp_openai_client` /
`warp_async_openai_client`.
Refuses: nothing itself; request meaning lives in `api.py`.
Async requests run on one worker thread each (the engine's lock is per thread) that stays
at most one chunk ahead of the reader, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from warp_openai.api import ChunkStream, WarpAPI, error_body

__all__ = [
    "AsyncWarpTransport",
    "WarpTransport",
    "async_warp_transport",
    "transport_classes",
    "warp_async_openai_client",
    "warp_openai_client",
    "warp_transport",
]

BASE_URL = "http://warp.invalid/v1"
"""Base URL of the convenience OpenAI clients; never resolved, never connected to."""
_HTTP_BASE = "http://warp.invalid"
PLACEHOLDER_KEY = "warp-local"
"""The SDK refuses to construct without an API key; in-process nothing checks it."""
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode("utf-8") + b"\n\n"


def _json_headers(status: int, data: bytes) -> list[tuple[str, str]]:
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    if status >= 400:
        headers.append(("x-should-retry", "false"))
    return headers


class _Deadline:
    """A read timeout: expires when no progress was made for `seconds`."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._at: float | None = None
        self.hit = False
        self.arm()

    def arm(self) -> None:
        self._at = None if self.seconds is None else time.monotonic() + self.seconds

    def expired(self) -> bool:
        if self._at is not None and time.monotonic() > self._at:
            self.hit = True
        return self.hit


def _read_timeout(request: Any) -> float | None:
    timeout = request.extensions.get("timeout") or {}
    if isinstance(timeout, dict):
        value = timeout.get("read")
    else:
        value = getattr(timeout, "read", None)
    return None if value is None else float(value)


def _head(stream: ChunkStream) -> tuple[bytes | None, dict[str, Any] | None]:
    """The first SSE event, or the 500 body when generation fails before it."""
    try:
        first = next(stream)
    except StopIteration:
        return b"", None
    except Exception as exc:  # an engine failure before any byte: a plain 500
        stream.close()
        return None, error_body(str(exc) or type(exc).__name__, "engine_error")
    return _sse(first), None


def _frames(stream: ChunkStream, first: bytes, deadline: _Deadline) -> Iterator[bytes]:
    """SSE events after the first one; an engine failure mid-stream becomes an error event."""
    if first:
        yield first
    while True:
        deadline.arm()
        try:
            chunk = next(stream)
        except StopIteration:
            break
        except Exception as exc:
            yield _sse(error_body(str(exc) or type(exc).__name__, "engine_error"))
            return
        yield _sse(chunk)
    if not stream.cancelled:
        yield _DONE


@functools.lru_cache(maxsize=None)
def transport_classes(flavor: str = "httpx") -> tuple[type, type]:
    """The (sync, async) transport classes for `httpx` or `httpx2`.

    Args:
        flavor: "httpx" (openai 2.x, or 3.x given an httpx client) or "httpx2" (openai 3.x).

    """
    hx = importlib.import_module(flavor)

    def timeout_error(request: Any) -> Exception:
        return hx.ReadTimeout("the model did not answer within the read timeout",
                              request=request)

    class SSEStream(hx.SyncByteStream):
        """A generator-backed response body; `close()` stops generation."""

        def __init__(self, stream: ChunkStream, first: bytes, deadline: _Deadline,
                     request: Any) -> None:
            self._stream = stream
            self._frames = _frames(stream, first, deadline)
            self._deadline = deadline
            self._request = request

        def __iter__(self) -> Iterator[bytes]:
            for frame in self._frames:
                yield frame
            if self._deadline.hit:
                raise timeout_error(self._request)

        def close(self) -> None:
            self._stream.close()
            self._frames.close()

    class WarpTransport(hx.BaseTransport):  # type: ignore[name-defined,misc]
        """Answers OpenAI requests in-process (see the module docstring)."""

        def __init__(self, api: WarpAPI) -> None:
            """Serve `api` (a `WarpAPI`)."""
            self.api = api

        def handle_request(self, request: Any) -> Any:
            """Httpx entry point."""
            body = request.read()
            deadline = _Deadline(_read_timeout(request))
            status, out = self.api.handle(request.method, request.url.path, body,
                                          headers=dict(request.headers),
                                          should_stop=deadline.expired)
            if isinstance(out, ChunkStream):
                first, failure = _head(out)
                if failure is not None:
                    return _respond(500, failure)
                if deadline.hit:
                    out.close()
                    raise timeout_error(request)
                return hx.Response(200, headers=_SSE_HEADERS,
                                   stream=SSEStream(out, first or b"", deadline, request),
                                   request=request)
            if deadline.hit:
                raise timeout_error(request)
            return _respond(status, out)

        def close(self) -> None:
            """Called by `Client.close()`: gives back the shared engine's reference."""
            self.api.close()

    def _respond(status: int, body: dict[str, Any]) -> Any:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        return hx.Response(status, headers=_json_headers(status, data), content=data)

    class AsyncSSEStream(hx.AsyncByteStream):
        """Async body fed by the request's worker thread; `aclose()` stops generation."""

        def __init__(self, pump: _Pump, request: Any) -> None:
            self._pump = pump
            self._request = request

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                frame = await self._pump.next_frame()
                if frame is None:
                    break
                yield frame
            if self._pump.deadline.hit:
                raise timeout_error(self._request)

        async def aclose(self) -> None:
            self._pump.cancel()

    class AsyncWarpTransport(hx.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """The asyncio twin of `WarpTransport`; the event loop never blocks on the engine."""

        def __init__(self, api: WarpAPI) -> None:
            """Serve `api` (a `WarpAPI`)."""
            self.api = api

        async def handle_async_request(self, request: Any) -> Any:
            """Httpx entry point."""
            body = await request.aread()
            deadline = _Deadline(_read_timeout(request))
            pump = _Pump(self.api, request.method, request.url.path, body,
                         dict(request.headers), deadline)
            try:
                status, out = await pump.head()
            except asyncio.CancelledError:
                pump.cancel()
                raise
            if deadline.hit:
                pump.cancel()
                raise timeout_error(request)
            if out is None:
                return hx.Response(200, headers=_SSE_HEADERS, stream=AsyncSSEStream(pump, request),
                                   request=request)
            return _respond(status, out)

        async def aclose(self) -> None:
            """Called by `AsyncClient.aclose()`: gives back the shared engine's reference."""
            await asyncio.to_thread(self.api.close)  # closing waits for a generation

    WarpTransport.__qualname__ = WarpTransport.__name__ = "WarpTransport"
    AsyncWarpTransport.__qualname__ = AsyncWarpTransport.__name__ = "AsyncWarpTransport"
    WarpTransport.__module__ = AsyncWarpTransport.__module__ = __name__
    return WarpTransport, AsyncWarpTransport


class _Pump:
    """Runs one request on its own thread; hands SSE frames to the event loop one by one."""

    def __init__(self, api: WarpAPI, method: str, path: str, body: bytes,
                 headers: dict[str, str], deadline: _Deadline) -> None:
        self.deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._credit = threading.Semaphore(0)
        self._cancel = threading.Event()
        self._stream: ChunkStream | None = None
        self._done = False
        args = (api, method, path, body, headers)
        threading.Thread(target=self._work, args=args, name="warp-openai", daemon=True).start()

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # loop closed: nobody reads any more
            self._cancel.set()

    def _stopped(self) -> bool:
        return self._cancel.is_set() or self.deadline.expired()

    def _work(self, api: WarpAPI, method: str, path: str, body: bytes,
              headers: dict[str, str]) -> None:
        try:
            status, out = api.handle(method, path, body, headers=headers,
                                     should_stop=self._stopped)
            if not isinstance(out, ChunkStream):
                self._put(("head", status, out))
                return
            self._stream = out
            first, failure = _head(out)
            if failure is not None:
                self._put(("head", 500, failure))
                return
            self._put(("head", 200, None))
            for frame in _frames(out, first or b"", self.deadline):
                self._put(("frame", frame))
                self._credit.acquire()
                if self._cancel.is_set():
                    break
            out.close()
            self._put(("end",))
        except BaseException as exc:  # handed to the reader, never swallowed
            if self._stream is not None:
                self._stream.close()
            self._put(("error", exc))

    async def head(self) -> tuple[int, dict[str, Any] | None]:
        item = await self._queue.get()
        if item[0] == "error":
            raise item[1]
        return item[1], item[2]

    async def next_frame(self) -> bytes | None:
        if self._done:
            return None
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if item[0] == "frame":
            self._credit.release()
            return item[1]
        self._done = True
        if item[0] == "error":
            raise item[1]
        return None

    def cancel(self) -> None:
        self._cancel.set()
        if self._stream is not None:
            self._stream.cancel()
        self._credit.release()


WarpTransport, AsyncWarpTransport = transport_classes(
    "httpx" if importlib.util.find_spec("httpx") else "httpx2"
)
"""The transports for `httpx` (for `httpx2`, use `transport_classes("httpx2")`)."""


# ---------------------------------------------------------------------- constructors
def _openai_major() -> int | None:
    try:
        from importlib.metadata import version

        return int(version("openai").split(".")[0])
    except Exception:  # openai not installed: the clients are still usable with httpx
        return None


def _flavor(http: str | None) -> str:
    if http is not None:
        if http not in ("httpx", "httpx2"):
            raise ValueError("http must be 'httpx' or 'httpx2'")
        return http
    major = _openai_major()
    if major is not None and major >= 3 and importlib.util.find_spec("httpx2"):
        return "httpx2"
    return "httpx"


def _api(
    model_path: str | os.PathLike[str] | None, engine: Any, session: Any, model: str | None,
    api_key: str | None, engine_options: dict[str, Any],
) -> WarpAPI:
    if sum(x is not None for x in (model_path, engine, session)) != 1:
        raise TypeError("give exactly one of model_path, engine= or session=")
    if model_path is None:
        if engine_options:
            raise TypeError(f"engine options {sorted(engine_options)} need a model_path")
        return WarpAPI(session, engine=engine, model_id=model, api_key=api_key)
    from warp_providers import release, shared_engine

    shared = shared_engine(model_path, **engine_options)
    try:
        return WarpAPI(engine=shared, model_id=model, api_key=api_key,
                       on_close=lambda: release(shared))
    except BaseException:
        release(shared)
        raise


def warp_transport(
    model_path: str | os.PathLike[str] | None = None,
    *,
    engine: Any = None,
    session: Any = None,
    model: str | None = None,
    http: str | None = None,
    timeout: float | None = 600.0,
    **engine_options: Any,
) -> Any:
    """An http client whose requests a local model answers in-process.

    Pass it as `openai.OpenAI(http_client=...)`. Any number of clients on one path share
    one loaded engine (`warp_providers.models.shared_engine`); closing the client (or the
    `openai.OpenAI` that holds it) gives its reference back, and the last one closes the
    engine.

    Args:
        model_path: a container directory (`warp convert` output).
        engine: an open engine instead of a path (or any `EngineLike`).
        session: a `ChatSession` instead of a path.
        model: the model id reported in responses (default: the container name).
        http: "httpx2" or "httpx" (default: what the installed openai major uses).
        timeout: the client's default timeout in seconds.
        **engine_options: passed to `Engine.open` (budget, threads, ctx, ...).

    Returns:
        An `httpx2.Client` or `httpx.Client`.

    """
    flavor = _flavor(http)
    hx = importlib.import_module(flavor)
    sync, _ = transport_classes(flavor)
    api = _api(model_path, engine, session, model, None, engine_options)
    return hx.Client(transport=sync(api), base_url=_HTTP_BASE, timeout=timeout)


def async_warp_transport(
    model_path: str | os.PathLike[str] | None = None,
    *,
    engine: Any = None,
    session: Any = None,
    model: str | None = None,
    http: str | None = None,
    timeout: float | None = 600.0,
    **engine_options: Any,
) -> Any:
    """The async twin of `warp_transport`: pass it as `openai.AsyncOpenAI(http_client=...)`."""
    flavor = _flavor(http)
    hx = importlib.import_module(flavor)
    _, asyn = transport_classes(flavor)
    api = _api(model_path, engine, session, model, None, engine_options)
    return hx.AsyncClient(transport=asyn(api), base_url=_HTTP_BASE, timeout=timeout)


def warp_openai_client(model_path: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """An `openai.OpenAI` answering in-process (placeholder API key, retries off).

    Args:
        model_path: see `warp_transport`.
        **kwargs: `max_retries` for the client (default 0); the rest go to `warp_transport`.
    """
    import openai

    client_args = {k: kwargs.pop(k) for k in ("max_retries",) if k in kwargs}
    http_client = warp_transport(model_path, **kwargs)
    return openai.OpenAI(api_key=PLACEHOLDER_KEY, base_url=BASE_URL, http_client=http_client,
                         max_retries=client_args.get("max_retries", 0))


def warp_async_openai_client(model_path: str | os.PathLike[str] | None = None,
                             **kwargs: Any) -> Any:
    """An `openai.AsyncOpenAI` answering in-process (placeholder API key, retries off)."""
    import openai

    client_args = {k: kwargs.pop(k) for k in ("max_retries",) if k in kwargs}
    http_client = async_warp_transport(model_path, **kwargs)
    return openai.AsyncOpenAI(api_key=PLACEHOLDER_KEY, base_url=BASE_URL,
                              http_client=http_client,
                              max_retries=client_args.get("max_retries", 0))
