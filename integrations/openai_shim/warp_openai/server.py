"""`warp serve`: the OpenAI request core over HTTP/1.1 on Starlette and uvicorn (`[serve]`).

Owns: the socket-level rules of PROTOCOLS.md §7.2-§7.3 and §7.14 (bearer auth, compared in
constant time, before the body is read; Content-Length required and capped before
reading), timeouts (a body that does not arrive within `body_timeout` is a 408; an idle
keep-alive connection closes after `keep_alive_timeout`), CORS (off unless origins are
given), SSE with `: ping` comments from the moment a stream is accepted until its first
token (a long prefill never leaves the socket silent), cancellation when the client
disconnects, graceful shutdown (in-flight requests get `shutdown_timeout` seconds to
finish, then are cancelled with an error event that ends the stream cleanly), a warning
when bound beyond loopback without a key, and `/metrics` in Prometheus text, labelled by
route template, never by the raw path.
Why StreamingResponse and not an SSE library: `bridge.py` already frames the events for
the in-process transport too, pings are wanted only until the first token, and the SSE
library at hand patches uvicorn's exit handler process-wide to end streams at once.
Refuses: what `api.py` refuses. Called by: `warp serve` (cli.py) via `serve()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from warp_openai.api import (
    MAX_BODY_BYTES,
    ROUTES,
    RawBody,
    WarpAPI,
    bearer_matches,
    encode_json,
    error_body,
)
from warp_openai.bridge import Deadline, Pump, sse_event

__all__ = ["Metrics", "WarpServer", "make_app", "make_server", "serve"]

log = logging.getLogger(__name__)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

PING_INTERVAL = 5.0
"""Seconds between `: ping` comments while a stream waits for its first token."""
BODY_TIMEOUT = 30.0
"""Seconds a request body may take to arrive."""
KEEP_ALIVE_TIMEOUT = 5.0
"""Seconds an idle keep-alive connection stays open."""
SHUTDOWN_TIMEOUT = 30.0
"""Seconds in-flight requests get to finish when the server stops."""
_DRAIN_BYTES = 1 << 20
"""A body at most this far over the cap is read and dropped after its 413, so the client
reads the answer on a connection that stays usable; a larger one closes the connection."""
_UNMATCHED = "unmatched"
"""The metrics label of a request no route template matched."""


class Metrics:
    """Process counters exposed at /metrics."""

    def __init__(self) -> None:
        """Start at zero."""
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.tokens = 0
        self.seconds = 0.0
        self.experts_hit = 0
        self.experts_missed = 0
        self.bytes_read = 0

    def record(self, route: str, status: int, stats: dict[str, Any] | None = None) -> None:
        """Count one finished request by its route template (and its `warp` stats)."""
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
            if stats:
                self.tokens += int(stats.get("tokens_generated", 0) or 0)
                self.seconds += float(stats.get("ms", 0.0) or 0.0) / 1000.0
                self.experts_hit += int(stats.get("experts_hit", 0) or 0)
                self.experts_missed += int(stats.get("experts_missed", 0) or 0)
                self.bytes_read += int(stats.get("bytes_read", 0) or 0)

    def text(self) -> str:
        """Prometheus text exposition."""
        with self._lock:
            lines = ["# TYPE warp_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'warp_requests_total{{route="{route}",status="{status}"}} {n}')
            lookups = self.experts_hit + self.experts_missed
            rate = self.experts_hit / lookups if lookups else 0.0
            tok_s = self.tokens / self.seconds if self.seconds > 0 else 0.0
            lines += [
                "# TYPE warp_tokens_generated_total counter",
                f"warp_tokens_generated_total {self.tokens}",
                "# TYPE warp_generation_seconds_total counter",
                f"warp_generation_seconds_total {self.seconds:.6f}",
                "# TYPE warp_tokens_per_second gauge",
                f"warp_tokens_per_second {tok_s:.3f}",
                "# TYPE warp_expert_hit_rate gauge",
                f"warp_expert_hit_rate {rate:.6f}",
                "# TYPE warp_bytes_read_total counter",
                f"warp_bytes_read_total {self.bytes_read}",
            ]
        return "\n".join(lines) + "\n"


class _Drain:
    """The server's shutdown, as in-flight requests see it."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.started = asyncio.Event()

    async def expired(self) -> None:
        """Returns `grace` seconds after the shutdown began."""
        await self.started.wait()
        await asyncio.sleep(self.grace)


def _json(status: int, body: dict[str, Any] | RawBody, *, close: bool = False) -> Response:
    headers = {"connection": "close"} if close else None
    if isinstance(body, RawBody):
        return Response(body.data, status, headers=headers, media_type=body.content_type)
    return Response(encode_json(body), status, headers=headers, media_type="application/json")


def _error(status: int, message: str, type: str = "invalid_request_error", *,
           close: bool = False) -> Response:
    return _json(status, error_body(message, type), close=close)


class _Endpoints:
    """The request handlers of one app (what `make_app` puts behind each route)."""

    def __init__(self, api: WarpAPI, metrics: Metrics, drain: _Drain, *, api_key: str | None,
                 max_body: int, body_timeout: float, ping_interval: float) -> None:
        self.api = api
        self.metrics = metrics
        self.drain = drain
        self.api_key = api_key
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.ping_interval = ping_interval

    def route(self, template: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            response = await self.answer(request, template)
            if not isinstance(response, StreamingResponse):  # streams count when they end
                self.metrics.record(template, response.status_code,
                                    getattr(response, "warp_stats", None))
            return response

        return endpoint

    def _authorized(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        return bearer_matches(request.headers.get("authorization", ""), self.api_key)

    async def answer(self, request: Request, template: str) -> Response:
        method, path = request.method, request.url.path
        if template == "/health" and method == "GET":
            status, body = self.api.handle("GET", "/health")
            assert isinstance(body, dict)
            return _json(status, body)
        if not self._authorized(request):
            return _error(401, "invalid API key", "authentication_error", close=method != "GET")
        if template == "/metrics" and method == "GET":
            return Response(self.metrics.text(), 200,
                            media_type="text/plain; version=0.0.4; charset=utf-8")
        if method != "POST":
            query = request.url.query
            status, body = self.api.handle(method, f"{path}?{query}" if query else path)
            assert isinstance(body, (dict, RawBody))
            return _json(status, body)
        raw = await self._body(request)
        if isinstance(raw, Response):
            return raw
        return await self._generate(request, template, path, raw)

    async def _body(self, request: Request) -> bytes | Response:
        length = request.headers.get("content-length")
        if length is None:
            return _error(411, "Content-Length is required", close=True)
        try:
            n = int(length)
        except ValueError:
            return _error(400, "Content-Length is not a number", close=True)
        over = n > self.max_body
        if over and n > self.max_body + _DRAIN_BYTES:
            return _error(413, f"request body may not exceed {self.max_body} bytes", close=True)
        chunks: list[bytes] = []
        try:
            with anyio.fail_after(self.body_timeout):
                async for chunk in request.stream():
                    if not over:
                        chunks.append(chunk)
        except TimeoutError:
            if over:
                return _error(413, f"request body may not exceed {self.max_body} bytes",
                              close=True)
            return _error(408, f"the request body did not arrive within {self.body_timeout:g} "
                          "seconds", close=True)
        except ClientDisconnect:  # nobody is left to answer
            return Response(status_code=499)
        if over:
            return _error(413, f"request body may not exceed {self.max_body} bytes")
        return b"".join(chunks)

    async def _generate(self, request: Request, template: str, path: str,
                        body: bytes) -> Response:
        headers = {"content-type": request.headers.get("content-type", "")}
        pump = Pump(self.api, "POST", path, body, headers, Deadline(None), stream_early=True)
        head = asyncio.ensure_future(pump.head())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        late = asyncio.ensure_future(self.drain.expired())
        try:
            done, _ = await asyncio.wait({head, gone, late}, return_when=asyncio.FIRST_COMPLETED)
            if head not in done:  # the client left, or the shutdown's grace ran out
                pump.cancel()
            status, out = await head
        except Exception as exc:  # an exception out of the core: still an OpenAI body
            pump.cancel()
            return _error(500, str(exc) or type(exc).__name__, "engine_error")
        finally:
            gone.cancel()
            late.cancel()
        if out is not None:
            response = _json(status, out)
            if isinstance(out, dict):
                response.warp_stats = out.get("warp")  # type: ignore[attr-defined]
            return response
        return StreamingResponse(
            self._events(pump, template),
            headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                     "x-accel-buffering": "no"},
        )

    async def _events(self, pump: Pump, template: str) -> AsyncIterator[bytes]:
        """SSE bytes of one stream: pings until the first frame, then the frames."""
        stats: dict[str, Any] | None = None
        late = asyncio.ensure_future(self.drain.expired())
        nxt = asyncio.ensure_future(pump.next_frame())
        first = True
        try:
            while True:
                timeout = self.ping_interval if first else None
                done, _ = await asyncio.wait({nxt, late}, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if late in done:
                    pump.cancel()
                    yield sse_event(error_body("the server is shutting down; the reply was "
                                               "cut short", "server_shutdown"))
                    return
                if nxt not in done:
                    yield b": ping\n\n"
                    continue
                try:
                    frame = nxt.result()
                except Exception as exc:  # the core failed mid-stream: an error event
                    yield sse_event(error_body(str(exc) or type(exc).__name__, "engine_error"))
                    return
                if frame is None:
                    return
                first = False
                stats = _frame_stats(frame) or stats
                yield frame
                nxt = asyncio.ensure_future(pump.next_frame())
        finally:
            late.cancel()
            nxt.cancel()
            pump.cancel()
            self.metrics.record(template, 200, stats)


def _frame_stats(frame: bytes) -> dict[str, Any] | None:
    if b'"warp"' not in frame or not frame.startswith(b"data: {"):
        return None
    try:
        event = json.loads(frame[6:])
    except ValueError:
        return None
    # A chat or completions chunk carries it at the top; a Responses event in its response.
    return event.get("warp") or (event.get("response") or {}).get("warp")


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (call only once the body has been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class _StripSlashes:
    """Routes `/v1/models/` as `/v1/models`, as the request core does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and len(scope["path"]) > 1 and scope["path"].endswith("/"):
            scope = {**scope, "path": scope["path"].rstrip("/") or "/"}
        await self.app(scope, receive, send)


_ROUTES = [*ROUTES, ("/metrics", ["GET"])]
"""The route templates: the request core's, and /metrics (a POST body is read and
generated from here; any other method's request goes to `api.handle` bodiless)."""
_ANY = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def make_app(
    api: WarpAPI,
    *,
    api_key: str | None = None,
    max_body: int = MAX_BODY_BYTES,
    cors_origins: Sequence[str] = (),
    ping_interval: float = PING_INTERVAL,
    body_timeout: float = BODY_TIMEOUT,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    metrics: Metrics | None = None,
) -> Starlette:
    """The ASGI app of `warp serve` over `api` (which should have no key of its own).

    Args:
        api: the request core.
        api_key: bearer key clients must send (None: no auth).
        max_body: largest request body in bytes.
        cors_origins: origins browsers may call from (`*` for any); empty: no CORS.
        ping_interval: seconds between `: ping` comments before a stream's first token.
        body_timeout: seconds a request body may take to arrive.
        shutdown_timeout: seconds in-flight requests get when the server stops.
        metrics: the counters to add to (default: new ones, at `app.state.metrics`).

    """
    metrics = metrics or Metrics()
    drain = _Drain(shutdown_timeout)
    ends = _Endpoints(api, metrics, drain, api_key=api_key, max_body=max_body,
                      body_timeout=body_timeout, ping_interval=ping_interval)
    routes = [Route(t, ends.route(t), methods=m) for t, m in _ROUTES]
    # Another method on a known path, or an unknown path: the core's OpenAI-shaped 404.
    routes.append(Route("/{path:path}", ends.route(_UNMATCHED), methods=_ANY))
    middleware = [Middleware(_StripSlashes)]
    if cors_origins:
        middleware.insert(0, Middleware(
            CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type", "openai-organization",
                           "openai-project", "x-stainless-*"],
            max_age=600,
        ))

    async def failed(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, str(exc) or type(exc).__name__, "engine_error")

    app = Starlette(routes=routes, middleware=middleware, exception_handlers={Exception: failed})
    app.router.redirect_slashes = False
    app.state.metrics = metrics
    app.state.drain = drain
    return app


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, told of the shutdown's start, and exiting 0 on SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, drain: _Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.started.set()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the signal after a graceful exit; `warp serve` returns instead
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class WarpServer:
    """A bound HTTP server: `serve_forever()` serves, `shutdown()` (another thread) stops.

    Attributes:
        server_address: (host, port) actually bound (port 0 resolved).
        app: the Starlette app.

    """

    def __init__(self, app: Starlette, sock: socket.socket, *, keep_alive_timeout: float,
                 shutdown_timeout: float) -> None:
        """Use `make_server`."""
        self.app = app
        self.socket = sock
        self.server_address = sock.getsockname()[:2]
        config = uvicorn.Config(
            app, http="h11", ws="none", lifespan="off", interface="asgi3", log_config=None,
            access_log=False, proxy_headers=False, server_header=False,
            timeout_keep_alive=keep_alive_timeout,  # type: ignore[arg-type]  # a float works
            # a backstop: the app itself cancels what is left when its grace runs out
            timeout_graceful_shutdown=shutdown_timeout + 5,  # type: ignore[arg-type]
        )
        self._server = _Uvicorn(config, app.state.drain)
        self._running = threading.Event()
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Serves until `shutdown()` (or SIGTERM/SIGINT on the main thread)."""
        self._running.set()
        try:
            asyncio.run(self._server.serve(sockets=[self.socket]))
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stops serving: in-flight requests finish or are cancelled; returns when done."""
        self._server.should_exit = True
        if self._running.is_set():
            self._stopped.wait()

    def server_close(self) -> None:
        """Closes the listening socket."""
        self.socket.close()


def make_server(
    api: WarpAPI, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None,
    max_body: int = MAX_BODY_BYTES, cors_origins: Sequence[str] = (),
    ping_interval: float = PING_INTERVAL, body_timeout: float = BODY_TIMEOUT,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT, shutdown_timeout: float = SHUTDOWN_TIMEOUT,
) -> WarpServer:
    """A bound, not yet serving, HTTP server over `api` (port 0 picks a free port).

    Auth is checked here, before the body is read; `api` itself should have no key. The
    other keywords are those of `make_app`, and `keep_alive_timeout` (seconds an idle
    keep-alive connection stays open).
    """
    if api_key is None and host not in _LOOPBACK:
        log.warning("serving on %s without an API key: anyone who can reach this address can "
                    "use the model (set --api-key or WARP_API_KEY)", host)
    app = make_app(api, api_key=api_key, max_body=max_body, cors_origins=cors_origins,
                   ping_interval=ping_interval, body_timeout=body_timeout,
                   shutdown_timeout=shutdown_timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, so asyncio turns Nagle off on each accepted connection (it checks
    # the protocol): with it on, a response's second write waited for the client's delayed
    # ACK, about 40 ms a request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        # Clients queue on the engine, not on accept(): a short backlog resets connections
        # when a burst of clients connects at once.
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return WarpServer(app, sock, keep_alive_timeout=keep_alive_timeout,
                      shutdown_timeout=shutdown_timeout)


def serve(model_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000,
          *, api_key: str | None = None, model: str | None = None,
          cors_origins: Sequence[str] = (), ping_interval: float = PING_INTERVAL,
          body_timeout: float = BODY_TIMEOUT, keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
          shutdown_timeout: float = SHUTDOWN_TIMEOUT, jobs_dir: str | None = None,
          batch_concurrency: int = 1, allow_local_images: str | None = None,
          **engine_options: Any) -> None:
    """Serves a model until SIGTERM or SIGINT (`warp serve MODEL`).

    Unfinished batches of this model in the jobs directory resume at once.

    Args:
        model_path: the container directory.
        host: bind address (loopback by default; a host with `:` binds IPv6).
        port: TCP port.
        api_key: bearer key clients must send (default: `$WARP_API_KEY`, else none).
        model: the served model id (default: the container name).
        cors_origins: origins browsers may call from (empty: CORS off).
        ping_interval: seconds between SSE pings before a stream's first token.
        body_timeout: seconds a request body may take to arrive.
        keep_alive_timeout: seconds an idle keep-alive connection stays open.
        shutdown_timeout: seconds in-flight requests get to finish on shutdown.
        jobs_dir: where files and batch jobs live (default: `jobs` under the user cache).
        batch_concurrency: lines of a batch in flight at once.
        allow_local_images: a directory image parts may name files in (None: refused).
        **engine_options: passed to `Engine.open` (budget, threads, ctx, `vision`...).

    """
    from warp_providers import release, shared_engine

    key = api_key if api_key is not None else (os.environ.get("WARP_API_KEY") or None)
    engine = shared_engine(model_path, **engine_options)
    api = WarpAPI(engine=engine, model_id=model, on_close=lambda: release(engine),
                  jobs_dir=jobs_dir, batch_concurrency=batch_concurrency,
                  allow_local_images=allow_local_images)
    try:
        api.batches.resume()
        httpd = make_server(api, host, port, api_key=key, cors_origins=cors_origins,
                            ping_interval=ping_interval, body_timeout=body_timeout,
                            keep_alive_timeout=keep_alive_timeout,
                            shutdown_timeout=shutdown_timeout)
    except BaseException:
        api.close()
        raise
    log.info("serving %s on http://%s:%d/v1", api.model_id, host, httpd.server_address[1])
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        api.close()
