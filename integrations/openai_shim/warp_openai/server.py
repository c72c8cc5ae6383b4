"""`warp serve`: the OpenAI request core over HTTP/1.1, with the standard library only.

Owns: socket-level rules of PROTOCOLS.md §7.2-§7.3 and §7.14 (bearer auth before the body
is read, Content-Length required and capped at 64 MiB before reading, refused connections
closed), SSE framing with chunked transfer encoding and `data: [DONE]`, cancellation when
the client disconnects (before each generated token the connection is polled for the
client's end of stream, blocking and streamed requests alike; a failed write stops
generation too), a warning when bound beyond loopback without a key, and `/metrics` in
Prometheus text format.
Why the standard library: one request runs at a time per engine anyway (the engine lock
serialises them), generation is CPU-bound in C with the GIL released, and stdlib threads
keep the package free of an ASGI stack; `ThreadingHTTPServer` gives one thread per client.
Refuses: what `api.py` refuses. Called by: `warp serve` (cli.py) via `serve()`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from warp_openai.api import MAX_BODY_BYTES, ChunkStream, WarpAPI, bearer_matches, error_body

__all__ = ["Metrics", "make_server", "serve"]

log = logging.getLogger(__name__)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


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

    def record(self, path: str, status: int, stats: dict[str, Any] | None = None) -> None:
        """Count one finished request (and its `warp` stats, when it generated)."""
        with self._lock:
            self.requests[(path, status)] = self.requests.get((path, status), 0) + 1
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
            for (path, status), n in sorted(self.requests.items()):
                lines.append(f'warp_requests_total{{path="{path}",status="{status}"}} {n}')
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------ responses
    def _json(self, status: int, body: dict[str, Any], *, close: bool = False) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client has gone: nobody reads the reply
            self.close_connection = True
        self.server.metrics.record(self.path.split("?")[0], status, body.get("warp"))

    def _error(self, status: int, message: str, type: str = "invalid_request_error", *,
               close: bool = False) -> None:
        self._json(status, error_body(message, type), close=close)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode("ascii") + data + b"\r\n")
        self.wfile.flush()

    def _sse(self, stream: ChunkStream) -> None:
        try:
            first = next(stream)
        except StopIteration:
            first = None
        except Exception as exc:  # engine failure before any byte
            stream.close()
            self._error(500, str(exc) or type(exc).__name__, "engine_error")
            return
        stats = None
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "keep-alive")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = first
            while chunk is not None:
                stats = chunk.get("warp", stats)
                self._chunk(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
                try:
                    chunk = next(stream)
                except StopIteration:
                    chunk = None
                except Exception as exc:
                    body = error_body(str(exc) or type(exc).__name__, "engine_error")
                    self._chunk(b"data: " + json.dumps(body).encode() + b"\n\n")
                    break
            if self._client_gone():  # generation stopped for it: nobody reads the end
                self.close_connection = True
                return
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            # The client has gone: stop generating, report nothing.
            self.close_connection = True
        finally:
            stream.close()
        self.server.metrics.record(self.path.split("?")[0], 200, stats)

    def _client_gone(self) -> bool:
        """Whether the client closed its end of the connection (polled before each token).

        A readable socket with nothing to read is an orderly close; a reset raises. Bytes
        the client pipelined are left in place.
        """
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------------ verbs
    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        return bearer_matches(self.headers.get("Authorization", ""), key)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/health":
            status, body = self.server.api.handle("GET", path)
            assert isinstance(body, dict)
            self._json(status, body)
            return
        if not self._authorized():
            self._error(401, "invalid API key", "authentication_error")
            return
        if path == "/metrics":
            data = self.server.metrics.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        status, body = self.server.api.handle("GET", self.path)
        assert isinstance(body, dict)
        self._json(status, body)

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorized():
            self._error(401, "invalid API key", "authentication_error", close=True)
            return
        length = self.headers.get("Content-Length")
        if length is None:
            self._error(411, "Content-Length is required", close=True)
            return
        try:
            n = int(length)
        except ValueError:
            self._error(400, "Content-Length is not a number", close=True)
            return
        if n < 0 or n > self.server.max_body:
            self._error(413, f"request body may not exceed {self.server.max_body} bytes",
                        close=True)
            return
        body = self.rfile.read(n) if n else b""
        status, out = self.server.api.handle("POST", self.path, body,
                                             should_stop=self._client_gone)
        if isinstance(out, ChunkStream):
            self._sse(out)
        else:
            self._json(status, out)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Clients queue on the engine, not on accept(): the stdlib's backlog of 5 resets
    # connections when a burst of clients connects at once.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: WarpAPI, api_key: str | None,
                 max_body: int) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.api = api
        self.api_key = api_key
        self.max_body = max_body
        self.metrics = Metrics()
        super().__init__(address, _Handler)


def make_server(
    api: WarpAPI, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None,
    max_body: int = MAX_BODY_BYTES,
) -> ThreadingHTTPServer:
    """A bound, not yet serving, HTTP server over `api` (port 0 picks a free port).

    Auth is checked here, before the body is read; `api` itself should have no key.
    """
    if api_key is None and host not in _LOOPBACK:
        log.warning("serving on %s without an API key: anyone who can reach this address can "
                    "use the model (set --api-key or WARP_API_KEY)", host)
    return _Server((host, port), api, api_key, max_body)


def serve(model_path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000,
          *, api_key: str | None = None, model: str | None = None, **engine_options: Any) -> None:
    """Serves a model until interrupted (`warp serve MODEL`).

    Args:
        model_path: the container directory.
        host: bind address (loopback by default; a host with `:` binds IPv6).
        port: TCP port.
        api_key: bearer key clients must send (default: `$WARP_API_KEY`, else none).
        model: the served model id (default: the container name).
        **engine_options: passed to `Engine.open` (budget, threads, ctx, ...).

    """
    from warp_providers import release, shared_engine

    key = api_key if api_key is not None else (os.environ.get("WARP_API_KEY") or None)
    engine = shared_engine(model_path, **engine_options)
    api = WarpAPI(engine=engine, model_id=model, on_close=lambda: release(engine))
    try:
        httpd = make_server(api, host, port, api_key=key)
    except BaseException:
        api.close()
        raise
    log.info("serving %s on http://%s:%d/v1", api.model_id, host, httpd.server_address[1])
    previous = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a service manager, `kill`) shuts down as cleanly as Ctrl-C does
        previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        httpd.server_close()
        api.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
