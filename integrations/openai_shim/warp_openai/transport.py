"""httpx / httpx2 transports that answer OpenAI requests in-process, with no socket.

Owns: `WarpTransport` / `AsyncWarpTransport` (the transports, for `httpx` and, through
`transport_classes("httpx2")`, for `httpx2`), SSE framing of `api.ChunkStream`s as
generator-backed response streams (the first event reaches the client before generation
ends; closing the response stops generation), the per-call read timeout from
`request.extensions["timeout"]`, `x-should-retry: false` on every error, handing
requests that are not this model's (another host or path) to a `fallback` transport, and the
constructors `warp_transport` / `async_warp_transport` (an http client for the installed
openai major: httpx2 for openai 3.x, httpx for 2.x) and `warp_openai_client` /
`warp_async_openai_client`.
Refuses: nothing itself; request meaning lives in `api.py`.
Async requests run on one worker thread each (`bridge.Pump`; a generation's result is
read in the thread that iterated it) that stays at most one chunk ahead of the reader, so
the event loop never blocks; the engine's scheduler batches the concurrent requests.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

from warp_openai.api import ROUTES, ChunkStream, RawBody, WarpAPI, encode_json
from warp_openai.bridge import Deadline, Pump, events_after, first_event

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
_SSE_HEADERS = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


def _json_headers(status: int, data: bytes) -> list[tuple[str, str]]:
    headers = [("content-type", "application/json"), ("content-length", str(len(data)))]
    if status >= 400:
        headers.append(("x-should-retry", "false"))
    return headers


def _target(request: Any) -> str:
    """The request's path and query string, as the request core reads them."""
    query = request.url.query
    if isinstance(query, bytes):
        query = query.decode("ascii", "replace")
    return f"{request.url.path}?{query}" if query else str(request.url.path)


def _read_timeout(request: Any) -> float | None:
    timeout = request.extensions.get("timeout") or {}
    if isinstance(timeout, dict):
        value = timeout.get("read")
    else:
        value = getattr(timeout, "read", None)
    return None if value is None else float(value)


LOCAL_HOSTS = ("warp.invalid",)
"""Hosts a transport with a fallback answers itself (its own routes only)."""
_LOCAL_ROUTES = tuple(dict.fromkeys(t.split("/{")[0] for t, _ in ROUTES))


def _ours(request: Any, hosts: tuple[str, ...]) -> bool:
    """Whether a request is for this transport's model: one of its hosts and routes."""
    if request.url.host not in hosts:
        return False
    path = request.url.path.rstrip("/") or "/"
    return any(path == r or path.startswith(r + "/") for r in _LOCAL_ROUTES)


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

        def __init__(self, stream: ChunkStream, first: bytes, deadline: Deadline,
                     request: Any) -> None:
            self._stream = stream
            self._frames = events_after(stream, first, deadline)
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

        def __init__(self, api: WarpAPI, fallback: Any = None,
                     local_hosts: tuple[str, ...] = LOCAL_HOSTS) -> None:
            """Serve `api` (a `WarpAPI`); with `fallback`, only its routes on `local_hosts`."""
            self.api = api
            self.fallback = fallback
            self.local_hosts = local_hosts

        def handle_request(self, request: Any) -> Any:
            """Httpx entry point."""
            if self.fallback is not None and not _ours(request, self.local_hosts):
                return self.fallback.handle_request(request)
            body = request.read()
            deadline = Deadline(_read_timeout(request))
            status, out = self.api.handle(request.method, _target(request), body,
                                          headers=dict(request.headers),
                                          should_stop=deadline.expired)
            if isinstance(out, ChunkStream):
                first, failure = first_event(out)
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
            if self.fallback is not None:
                self.fallback.close()

    def _respond(status: int, body: dict[str, Any] | RawBody) -> Any:
        if isinstance(body, RawBody):
            headers = [("content-type", body.content_type),
                       ("content-length", str(len(body.data)))]
            return hx.Response(status, headers=headers, content=body.data)
        data = encode_json(body)
        return hx.Response(status, headers=_json_headers(status, data), content=data)

    class AsyncSSEStream(hx.AsyncByteStream):
        """Async body fed by the request's worker thread; `aclose()` stops generation."""

        def __init__(self, pump: Pump, request: Any) -> None:
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

        def __init__(self, api: WarpAPI, fallback: Any = None,
                     local_hosts: tuple[str, ...] = LOCAL_HOSTS) -> None:
            """Serve `api` (a `WarpAPI`); with `fallback`, only its routes on `local_hosts`."""
            self.api = api
            self.fallback = fallback
            self.local_hosts = local_hosts

        async def handle_async_request(self, request: Any) -> Any:
            """Httpx entry point."""
            if self.fallback is not None and not _ours(request, self.local_hosts):
                return await self.fallback.handle_async_request(request)
            body = await request.aread()
            deadline = Deadline(_read_timeout(request))
            pump = Pump(self.api, request.method, _target(request), body,
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
            if self.fallback is not None:
                await self.fallback.aclose()

    WarpTransport.__qualname__ = WarpTransport.__name__ = "WarpTransport"
    AsyncWarpTransport.__qualname__ = AsyncWarpTransport.__name__ = "AsyncWarpTransport"
    WarpTransport.__module__ = AsyncWarpTransport.__module__ = __name__
    return WarpTransport, AsyncWarpTransport


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
    batch = {k: engine_options.pop(k)
             for k in ("jobs_dir", "batch_concurrency", "allow_local_images")
             if k in engine_options}
    if model_path is None:
        if engine_options:
            raise TypeError(f"engine options {sorted(engine_options)} need a model_path")
        return WarpAPI(session, engine=engine, model_id=model, api_key=api_key, **batch)
    from warp_providers import release, shared_engine

    shared = shared_engine(model_path, **engine_options)
    try:
        return WarpAPI(engine=shared, model_id=model, api_key=api_key,
                       on_close=lambda: release(shared), **batch)
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
    fallback: Any = None,
    local_hosts: tuple[str, ...] = LOCAL_HOSTS,
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
        fallback: a transport of the same http library (e.g. `httpx.HTTPTransport()`)
            for every request that is not one of this model's routes on `local_hosts`:
            one client then reaches the local model and a remote API alike. None
            answers every request in-process.
        local_hosts: the hosts this model answers when a fallback is set.
        **engine_options: passed to `Engine.open` (budget, threads, ctx, `vision=True` to
            load the container's vision tower, ...), except `jobs_dir`,
            `batch_concurrency` (the Batch API) and `allow_local_images` (a directory
            image parts may name files in), which go to `WarpAPI`.

    Returns:
        An `httpx2.Client` or `httpx.Client`.

    Example:
        >>> http = warp_transport("m.warp", fallback=httpx.HTTPTransport())  # doctest: +SKIP
        >>> local = openai.OpenAI(base_url=BASE_URL, http_client=http)     # doctest: +SKIP
        >>> remote = local.with_options(base_url="https://api.openai.com/v1")  # doctest: +SKIP

    """
    flavor = _flavor(http)
    hx = importlib.import_module(flavor)
    sync, _ = transport_classes(flavor)
    api = _api(model_path, engine, session, model, None, engine_options)
    return hx.Client(transport=sync(api, fallback, tuple(local_hosts)), base_url=_HTTP_BASE,
                     timeout=timeout)


def async_warp_transport(
    model_path: str | os.PathLike[str] | None = None,
    *,
    engine: Any = None,
    session: Any = None,
    model: str | None = None,
    http: str | None = None,
    timeout: float | None = 600.0,
    fallback: Any = None,
    local_hosts: tuple[str, ...] = LOCAL_HOSTS,
    **engine_options: Any,
) -> Any:
    """The async twin of `warp_transport`: pass it as `openai.AsyncOpenAI(http_client=...)`.

    `fallback` is an async transport (e.g. `httpx.AsyncHTTPTransport()`).
    """
    flavor = _flavor(http)
    hx = importlib.import_module(flavor)
    _, asyn = transport_classes(flavor)
    api = _api(model_path, engine, session, model, None, engine_options)
    return hx.AsyncClient(transport=asyn(api, fallback, tuple(local_hosts)),
                          base_url=_HTTP_BASE, timeout=timeout)


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
