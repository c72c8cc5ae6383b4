"""The OpenAI-compatible request core: (method, path, JSON body) -> (status, body or chunks).

Owns: routing (`ROUTES`, the one table `server.py` and `transport.py` serve: GET /health,
/v1/models, /v1/models/{id}; POST /v1/chat/completions, /v1/completions, whose meaning is
in completions.py; /v1/responses, in responses.py; /v1/files and /v1/batches, in
batches.py),
optional bearer auth, body parsing, the validation order and error
texts of PROTOCOLS.md §7, generation options, blocking and streamed response shapes
(chunk dicts; the transport or server frames them as SSE), usage and the `warp` stats
object, and cancellation (closing a `ChunkStream` stops generation within a token).
Refuses: everything §7 refuses, OpenAI-shaped (`{"error": {message, type, param, code}}`);
`n` > 1 and `top_logprobs` > 0 (one sampled completion per request).
Also owns the body rules every POST route shares (size, nesting depth, lone surrogates,
field sizes: a 4xx naming the field). Knows nothing of HTTP libraries: `transport.py`
(httpx/httpx2) and `server.py` (Starlette) frame what this returns.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warp_providers import (
    ChatFormatError,
    ChatResult,
    ChatSession,
    ContextOverflowError,
    ImageError,
    SamplingParams,
    ToolCallArguments,
    ToolCallStart,
    Usage,
    WarpError,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "ROUTES",
    "APIError",
    "ChunkStream",
    "RawBody",
    "WarpAPI",
    "bearer_matches",
    "encode_json",
    "error_body",
]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Request bodies above this are refused on their declared length (§7.3)."""
DEFAULT_MAX_TOKENS = 4096
"""Completion limit when a request sets none (§7.17)."""
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (tool schemas included)."""
MAX_STRING_CHARS = 8 * 1024 * 1024
"""Longest string anywhere in a body (a prompt this long is already past any context)."""
MAX_ARRAY_ITEMS = 100_000
"""Most items of any array in a body."""
MAX_STOP = 16
"""Most stop strings a request may give."""
ROUTES = [
    ("/health", ["GET"]),
    ("/v1/models", ["GET"]),
    ("/v1/models/{model:path}", ["GET"]),
    ("/v1/chat/completions", ["POST"]),
    ("/v1/completions", ["POST"]),
    ("/v1/responses", ["POST"]),
    ("/v1/responses/{response_id}", ["GET", "DELETE"]),
    ("/v1/responses/{response_id}/input_items", ["GET"]),
    ("/v1/files", ["GET", "POST"]),
    ("/v1/files/{file_id}", ["GET", "DELETE"]),
    ("/v1/files/{file_id}/content", ["GET"]),
    ("/v1/batches", ["GET", "POST"]),
    ("/v1/batches/{batch_id}", ["GET"]),
    ("/v1/batches/{batch_id}/cancel", ["POST"]),
]
"""Every route (template, methods): `server.py` mounts these, `transport.py` answers their
prefixes; a new route is one line here and its branch in `WarpAPI._route`."""
_ROLES = ["assistant", "developer", "system", "tool", "user"]
_TYPES = {401: "authentication_error", 404: "not_found_error", 500: "engine_error"}


class APIError(Exception):
    """A refusal with its HTTP status and OpenAI error fields."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        type: str | None = None,
    ) -> None:
        """Create the error; `type` defaults from the status."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return error_body(self.message, self.type, self.param, self.code)


@dataclass
class RawBody:
    """A reply that is not JSON (a file's content): its bytes and media type."""

    data: bytes
    content_type: str


def encode_json(body: Any) -> bytes:
    """A response body as UTF-8 JSON; never raises on text the body carries.

    A lone surrogate (which no request can bring in: `_parse` refuses them) would be
    written as its JSON escape, `\\udXXX`, instead of failing the whole response.
    """
    return json.dumps(body, ensure_ascii=False).encode("utf-8", "backslashreplace")


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class ChunkStream:
    """Chunk dicts of one streamed reply; `close()` (from any thread) stops generation.

    Iterate it in one thread: the engine records a generation's result per thread.
    """

    def __init__(self, make: Callable[[Callable[[], bool]], Iterator[dict[str, Any]]]) -> None:
        """`make(should_stop)` returns the chunk generator."""
        self._cancel = threading.Event()
        self._gen = make(self._cancel.is_set)
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._cancel.is_set():
            self._finish()
            raise StopIteration
        return next(self._gen)

    def cancel(self) -> None:
        """Asks generation to stop before its next token (thread-safe, never blocks)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        """Whether `cancel` or `close` was called."""
        return self._cancel.is_set()

    def close(self) -> None:
        """Stops generation and releases the engine (call from the iterating thread)."""
        self._cancel.set()
        self._finish()

    def _finish(self) -> None:
        with self._lock:
            try:
                self._gen.close()
            except ValueError:  # "generator already executing": it sees the flag instead
                pass


def bearer_matches(authorization: str, key: str) -> bool:
    """Whether an Authorization header is `Bearer <key>`, compared in constant time."""
    scheme = "Bearer "
    given = authorization[len(scheme):] if authorization.startswith(scheme) else ""
    # compared even when the scheme is wrong, so the time never depends on the header
    return hmac.compare_digest(given.encode(), key.encode()) and authorization.startswith(scheme)


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class WarpAPI:
    """The OpenAI surface over one `ChatSession` (or a bare engine without a chat format).

    Example:
        >>> api = WarpAPI(session)                                  # doctest: +SKIP
        >>> status, body = api.handle("GET", "/v1/models")          # doctest: +SKIP

    """

    def __init__(
        self,
        session: ChatSession | None = None,
        *,
        engine: Any = None,
        model_id: str | None = None,
        api_key: str | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        on_close: Callable[[], Any] | None = None,
        max_body: int = MAX_BODY_BYTES,
        jobs_dir: str | Path | None = None,
        batch_concurrency: int | None = None,
        max_file_bytes: int | None = None,
        allow_local_images: str | Path | None = None,
    ) -> None:
        """Serve a session (or an engine: its chat format is resolved here).

        Args:
            session: the chat session; None resolves one from `engine`.
            engine: the engine, when no session is given. A model without a chat format
                still serves /v1/completions; chat requests get 400 unsupported_chat_format.
            model_id: the served model id (default: the session's model name).
            api_key: require `Authorization: Bearer <key>` (None: no auth).
            default_max_tokens: completion limit when a request sets none.
            on_close: called once by `close()` (gives back a shared engine's reference).
            max_body: largest raw request body in bytes (a 413 above it).
            jobs_dir: where files and batch jobs live (default: `jobs` under the user
                cache directory, `$WARP_CACHE` when set); opened on first use.
            batch_concurrency: lines of a batch in flight at once (default: the engine's
                `max_sequences`, so a batch fills the scheduler's batched steps; a
                request from another caller waits for the next free sequence in order).
            max_file_bytes: largest file /v1/files accepts (default `MAX_FILE_BYTES`).
            allow_local_images: a directory whose files image parts may name (a path or a
                `file://` URL, resolved inside it); None refuses local image paths.

        """
        self._on_close = on_close
        self._format_error: ChatFormatError | None = None
        if session is None:
            if engine is None:
                raise TypeError("WarpAPI needs a session or an engine")
            try:
                session = ChatSession(engine)
            except ChatFormatError as exc:
                self._format_error = exc
        if session is not None and allow_local_images is not None:
            session.allow_local_images = allow_local_images
        self.session = session
        self.engine = session.engine if session is not None else engine
        info = self.engine.info()
        default_id = session.model_name if session else str(info.get("name") or "warp")
        self.model_id = model_id or default_id
        self.api_key = api_key
        self.default_max_tokens = default_max_tokens
        self.max_body = max_body
        self.created = int(time.time())
        self._started = time.monotonic()
        from warp_openai.responses import Responses

        self.responses = Responses(self)
        """The /v1/responses routes and their store of finished responses."""
        from warp_openai.batches import MAX_FILE_BYTES, Batches

        if batch_concurrency is None:
            batch_concurrency = max(1, int(info.get("max_sequences") or 1))
        self.batches = Batches(self, jobs_dir=jobs_dir, concurrency=batch_concurrency,
                               max_file_bytes=max_file_bytes or MAX_FILE_BYTES)
        """The /v1/files and /v1/batches routes, their job store and batch worker."""

    def close(self) -> None:
        """Stops the batch worker and ends this surface's use of its engine (idempotent;
        see `on_close`)."""
        self.batches.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    # ------------------------------------------------------------------ entry point
    def handle(
        self,
        method: str,
        path: str,
        body: bytes | str | Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> tuple[int, dict[str, Any] | ChunkStream | RawBody]:
        """Answers one request.

        Args:
            method: GET, POST or DELETE.
            path: the URL path and query string (trailing slashes are ignored; the list
                routes read `after`, `limit`, `order` and `purpose` from the query).
            body: the raw body (bytes/str) or an already parsed JSON object.
            headers: request headers (`Authorization`, when a key is set, and the
                `Content-Type` of a file upload).
            should_stop: polled before each generated token; True ends the reply early
                (a caller's timeout or disconnect).

        Returns:
            (status, body dict) or (200, ChunkStream) for a streamed chat completion.
            Errors are returned, never raised; an engine failure is a 500 `engine_error`.
            /v1/completions streams too (`"stream": true`). A file's content is a
            `RawBody`.

        """
        return self._guarded(method, path, lambda: self._route(
            method.upper(), _clean(path), _query(path), body, headers or {}, should_stop))

    def call(self, path: str, body: Mapping[str, Any], *,
             should_stop: Callable[[], bool] | None = None
             ) -> tuple[int, dict[str, Any] | ChunkStream | RawBody]:
        """Answers one POST to a generation route on a parsed body, with no auth check:
        what a batch line runs (`batches.Worker.submit`). Errors are returned as in
        `handle`."""
        routes = {"/v1/chat/completions": self.chat_completions,
                  "/v1/completions": self.completions}

        def answer() -> tuple[int, dict[str, Any] | ChunkStream | RawBody]:
            if path not in routes:
                raise APIError(404, f"no route for POST {path}")
            return routes[path](_parse(body, self.max_body), should_stop=should_stop)

        return self._guarded("POST", path, answer)

    def _guarded(self, method: str, path: str,
                 answer: Callable[[], tuple[int, dict[str, Any] | ChunkStream | RawBody]]
                 ) -> tuple[int, dict[str, Any] | ChunkStream | RawBody]:
        try:
            return answer()
        except APIError as exc:
            return exc.status, exc.body()
        except ChatFormatError as exc:
            return 400, error_body(exc.message, "invalid_request_error", exc.param, exc.code)
        except ContextOverflowError as exc:
            return 400, error_body(str(exc), "invalid_request_error", "messages",
                                   "context_length_exceeded")
        except ImageError as exc:
            return 400, error_body(str(exc), "invalid_request_error", "messages",
                                   "invalid_image")
        except RecursionError:  # a structure deeper than a check above let through
            return 400, error_body(f"request body nests deeper than {MAX_DEPTH} levels")
        except (WarpError, ValueError, RuntimeError, OSError) as exc:
            return 500, error_body(str(exc) or type(exc).__name__, "engine_error")
        except Exception as exc:  # a bug here: logged with its traceback, still an answer
            log.exception("unexpected error answering %s %s", method, path)
            return 500, error_body(f"internal error: {type(exc).__name__}: {exc}",
                                   "engine_error")

    def _route(
        self, method: str, path: str, query: str, body: Any, headers: Mapping[str, str],
        should_stop: Callable[[], bool] | None,
    ) -> tuple[int, dict[str, Any] | ChunkStream | RawBody]:
        if method == "GET" and path == "/health":
            return 200, {"status": "ok", "model": self.model_id, "engine": self._engine_build(),
                         "uptime_s": int(time.monotonic() - self._started)}
        if path == "/v1/responses" or path.startswith("/v1/responses/"):
            self._auth(headers)
            return self.responses.route(method, path, body, should_stop)
        if path in ("/v1/files", "/v1/batches") or path.startswith(("/v1/files/",
                                                                    "/v1/batches/")):
            self._auth(headers)
            return self.batches.route(method, path, query, body, headers)
        if method == "POST":
            self._auth(headers)
            if path == "/v1/chat/completions":
                return self.chat_completions(_parse(body, self.max_body), should_stop=should_stop)
            if path == "/v1/completions":
                return self.completions(_parse(body, self.max_body), should_stop=should_stop)
            raise APIError(404, f"no route for POST {path}")
        if method == "GET":
            self._auth(headers)
            if path == "/v1/models":
                return 200, {"object": "list", "data": [self._model_object()]}
            if path.startswith("/v1/models/"):
                wanted = path[len("/v1/models/"):]
                if wanted != self.model_id:
                    raise APIError(404, f"no such model: {wanted}", param="model")
                return 200, self._model_object()
            raise APIError(404, f"no route for GET {path}")
        raise APIError(404, f"no route for {method} {path}")

    def _auth(self, headers: Mapping[str, str]) -> None:
        if self.api_key is None:
            return
        given = ""
        for k, v in headers.items():
            if k.lower() == "authorization":
                given = v
        if not bearer_matches(given, self.api_key):
            raise APIError(401, "invalid API key")

    def _engine_build(self) -> str:
        info = self.engine.info()
        return str(info.get("engine") or info.get("kernels") or info.get("model_type") or "warp")

    def _model_object(self) -> dict[str, Any]:
        info = self.engine.info()
        keys = ("model_type", "n_layers", "n_experts", "top_k", "hidden", "ctx_tokens",
                "params_total", "params_active", "quant_summary", "vocab_size")
        model = {"id": self.model_id, "object": "model", "created": self.created,
                 "owned_by": "warp"}
        details = {k: info[k] for k in keys if k in info}
        if details:
            model["warp"] = details
        return model

    # ------------------------------------------------------------------ chat
    def chat_completions(
        self, req: dict[str, Any], *, should_stop: Callable[[], bool] | None = None
    ) -> tuple[int, dict[str, Any] | ChunkStream]:
        """POST /v1/chat/completions on a parsed body (§7.4 order)."""
        if self.session is None:
            err = self._format_error
            reason = err.message if err is not None else "no chat format"
            raise APIError(400, f"this model cannot be used for chat completions: {reason}. "
                           "POST /v1/completions for raw continuation",
                           param="model", code="unsupported_chat_format")
        stream = req.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            raise APIError(400, "'stream' must be a boolean", param="stream")
        _validate_messages(req)
        effort = _reasoning(req)  # §7.4: reasoning before tools, tool_choice, response_format
        if req.get("tools") is not None and not isinstance(req["tools"], list):
            raise APIError(400, "'tools' must be an array", param="tools")
        choice = req.get("tool_choice")
        if choice is not None and not isinstance(choice, (str, dict)):
            raise APIError(400, "'tool_choice' must be a string or an object", param="tool_choice")
        if isinstance(choice, str) and choice not in ("auto", "none", "required"):
            raise APIError(400, "'tool_choice' must be 'auto', 'none', 'required' or an object "
                           "naming a function", param="tool_choice")
        if req.get("response_format") is not None and not isinstance(req["response_format"], dict):
            raise APIError(400, "'response_format' must be an object", param="response_format")
        _check_images(req, vision=bool(getattr(self.session, "vision", False)))
        chat_req = _chat_request(req, effort)
        limit = _max_tokens(req, self.default_max_tokens)
        prep = self.session.prepare(chat_req, max_tokens=limit)
        sampling = _sampling(req)
        stop = _stop(req)
        logprobs = _logprobs(req)
        opts = _stream_options(req)
        procs = _logit_bias(req, self.engine)
        ident, created = _new_id("chatcmpl-"), int(time.time())
        if not stream:
            t0 = time.perf_counter()
            result = None
            entries: list[dict[str, Any]] | None = [] if logprobs else None
            for chunk in self.session.stream(prep, sampling=sampling, stop=stop,
                                             processors=procs, should_stop=should_stop):
                result = chunk.result or result
                if entries is not None and chunk.delta.content and chunk.logprob is not None:
                    entries.append(_logprob_entry(chunk.delta.content, chunk.logprob))
            assert result is not None
            return 200, self._completion_body(ident, created, result, time.perf_counter() - t0,
                                              entries)

        outer = should_stop

        def make(cancelled: Callable[[], bool]) -> Iterator[dict[str, Any]]:
            def stop_now() -> bool:
                return cancelled() or bool(outer is not None and outer())

            return self._chunks(ident, created, prep, sampling, stop, stop_now, opts, logprobs,
                                procs)

        return 200, ChunkStream(make)

    def _chunks(
        self, ident: str, created: int, prep: Any, sampling: SamplingParams, stop: list[str],
        should_stop: Callable[[], bool], include_usage: bool, logprobs: bool,
        procs: list[Any],
    ) -> Iterator[dict[str, Any]]:
        assert self.session is not None
        base = {"id": ident, "object": "chat.completion.chunk", "created": created,
                "model": self.model_id}

        def chunk(delta: dict[str, Any], finish: str | None = None,
                  lp: list[dict[str, Any]] | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta,
                                         "logprobs": {"content": lp} if lp is not None else None,
                                         "finish_reason": finish}]}

        t0 = time.perf_counter()
        role_sent = False
        announced: set[int] = set()
        result: ChatResult | None = None
        items = self.session.stream(prep, sampling=sampling, stop=stop, processors=procs,
                                    should_stop=should_stop)
        for item in items:
            if item.result is not None:
                result = item.result
                continue
            d = item.delta
            if not role_sent:
                role_sent = True
                yield chunk({"role": "assistant", "content": ""})
            if d.reasoning:
                yield chunk({"reasoning_content": d.reasoning})
            if d.content:
                lp = None
                if logprobs and item.logprob is not None:
                    lp = [_logprob_entry(d.content, item.logprob)]
                yield chunk({"content": d.content}, lp=lp)
            for ev in d.tool_calls:
                if isinstance(ev, ToolCallStart):
                    announced.add(ev.index)
                    yield chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                                 "function": {"name": ev.name, "arguments": ""}}]})
                elif isinstance(ev, ToolCallArguments) and ev.fragment:
                    yield chunk({"tool_calls": [{"index": ev.index,
                                                 "function": {"arguments": ev.fragment}}]})
        if result is None:  # cancelled: the consumer is gone
            return
        if not role_sent:
            yield chunk({"role": "assistant", "content": ""})
        for call in result.message.tool_calls:  # calls the stream never announced
            if call.index not in announced:
                yield chunk({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                             "function": {"name": call.name, "arguments": ""}}]})
                yield chunk({"tool_calls": [{"index": call.index,
                                             "function": {"arguments": call.arguments}}]})
        stats = _stats(result.stats, result.usage.completion_tokens, time.perf_counter() - t0)
        final = chunk({}, result.message.finish_reason or "stop")
        final["warp"] = stats
        yield final
        if include_usage:
            yield {**base, "choices": [], "usage": usage_body(result.usage), "warp": stats}

    def _completion_body(self, ident: str, created: int, result: ChatResult, seconds: float,
                         logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        msg = result.message
        message: dict[str, Any] = {"role": "assistant", "content": msg.content or None}
        if msg.reasoning:
            message["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in msg.tool_calls
            ]
        return {
            "id": ident, "object": "chat.completion", "created": created, "model": self.model_id,
            "choices": [{"index": 0, "message": message,
                         "logprobs": {"content": logprobs} if logprobs is not None else None,
                         "finish_reason": msg.finish_reason or "stop"}],
            "usage": usage_body(result.usage),
            "warp": _stats(result.stats, result.usage.completion_tokens, seconds),
        }

    # ------------------------------------------------------------------ raw completions
    def completions(
        self, req: dict[str, Any], *, should_stop: Callable[[], bool] | None = None
    ) -> tuple[int, dict[str, Any] | ChunkStream]:
        """POST /v1/completions (§7.15, with streaming, echo and logprobs: completions.py)."""
        from warp_openai.completions import completions

        return completions(self, req, should_stop=should_stop)


# ---------------------------------------------------------------------- helpers
def _query(path: str) -> str:
    return path.split("#", 1)[0].partition("?")[2]


def _clean(path: str) -> str:
    path = path.split("?", 1)[0].split("#", 1)[0]
    path = path.rstrip("/")
    return path or "/"


def _parse(body: Any, max_body: int = MAX_BODY_BYTES) -> dict[str, Any]:
    if isinstance(body, Mapping):
        value: Any = dict(body)
    else:
        if body is None or body == b"" or body == "":
            raise APIError(400, "request body is empty")
        size = len(body.encode("utf-8", "surrogatepass")) if isinstance(body, str) else len(body)
        if size > max_body:
            raise APIError(413, f"request body may not exceed {max_body} bytes")
        try:
            text = body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else str(body)
            value = json.loads(text, parse_constant=_no_constant)
        except RecursionError:
            raise APIError(400, f"request body nests deeper than {MAX_DEPTH} levels") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise APIError(400, "request body must be a JSON object")
    _check_tree(value)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _check_tree(root: dict[str, Any]) -> None:
    """Refuses what no field may hold, naming the field: nesting beyond `MAX_DEPTH`, lone
    UTF-16 surrogates (valid JSON escapes that are not Unicode text, which no tokenizer
    can encode), strings over `MAX_STRING_CHARS` and arrays over `MAX_ARRAY_ITEMS` items.

    Iterative, so a deep body costs no Python stack.
    """
    todo: list[tuple[Any, str, int]] = [(root, "", 0)]
    while todo:
        value, at, depth = todo.pop()
        if isinstance(value, str):
            _check_text(value, at or "body")
            continue
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                name = key if key.isascii() else key.encode("utf-8", "backslashreplace").decode()
                path = f"{at}.{name}" if at else name
                _check_text(key, path)
                items.append((item, path))
        elif isinstance(value, list):
            if len(value) > MAX_ARRAY_ITEMS:
                raise APIError(400, f"{at} has {len(value)} items, more than the "
                               f"{MAX_ARRAY_ITEMS} allowed", param=at,
                               code="array_above_max_length")
            items = [(item, f"{at}[{i}]") for i, item in enumerate(value)]
        else:
            continue
        if depth >= MAX_DEPTH and items:
            raise APIError(400, f"{at or 'the body'} nests deeper than {MAX_DEPTH} levels",
                           param=at or None)
        todo.extend((item, path, depth + 1) for item, path in items)


def _check_text(text: str, at: str) -> None:
    if len(text) > MAX_STRING_CHARS:
        raise APIError(400, f"{at} is {len(text)} characters long, more than the "
                       f"{MAX_STRING_CHARS} allowed", param=at, code="string_above_max_length")
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        raise APIError(400, f"{at} holds a lone UTF-16 surrogate (U+{bad:04X}) at character "
                       f"{exc.start}: it is not a Unicode character; send the text as valid "
                       "UTF-8 (a pair of surrogates escapes one astral character)",
                       param=at, code="invalid_unicode") from None


def _check_images(req: Mapping[str, Any], *, vision: bool) -> None:
    """§7.8: every image part names its image; http(s) URLs are refused (no sockets here);
    a model without a vision tower refuses every image with `vision_disabled`."""
    found = False
    for i, m in enumerate(req["messages"]):
        content = m.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part["type"]
            if kind not in ("image", "image_url"):
                continue
            ref = part.get(kind)
            if isinstance(ref, dict):
                ref = ref.get("url") or ref.get("path") or ref.get("data")
            if not isinstance(ref, str) or not ref:
                at = f"messages[{i}].content[{j}]"
                raise APIError(400, f"{at} is an image with no url", param=at)
            if vision and ref[:8].lower().startswith(("http://", "https://")):
                at = f"messages[{i}].content[{j}]"
                raise APIError(400, f"{at}: image URLs over http(s) are not fetched (this "
                               "library never opens sockets); send the image as a base64 "
                               "data: URL", param=at, code="invalid_image_url")
            found = True
    if found and not vision:
        raise APIError(400, "this model was loaded without a vision tower, so it cannot read "
                       "images; send the conversation as text", code="vision_disabled")


def _validate_messages(req: Mapping[str, Any]) -> None:
    if "messages" not in req:
        raise APIError(400, "'messages' is a required property", param="messages")
    messages = req["messages"]
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(400, f"{at} must be an object", param=at)
        if m.get("role") not in _ROLES:
            raise APIError(400, f"{at}.role must be one of {_ROLES}", param=f"{at}.role")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise APIError(400, f"{at}.content must be a string, an array, or null",
                           param=f"{at}.content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            pat = f"{at}.content[{j}]"
            if not isinstance(part, dict):
                raise APIError(400, f"{pat} must be an object", param=pat)
            kind = part.get("type")
            if not isinstance(kind, str) or not kind:
                raise APIError(400, f"{pat}.type must be a non-empty string", param=f"{pat}.type")
            if kind not in ("image", "image_url") and not isinstance(part.get("text"), str):
                raise APIError(400, f"{pat}.text must be a string", param=f"{pat}.text")
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if m.get("role") != "assistant":
            raise APIError(400, f"{at}.tool_calls is only valid for assistant messages",
                           param=f"{at}.tool_calls")
        if not isinstance(calls, list):
            raise APIError(400, f"{at}.tool_calls must be an array", param=f"{at}.tool_calls")
        for j, call in enumerate(calls):
            cat = f"{at}.tool_calls[{j}]"
            if not isinstance(call, dict):
                raise APIError(400, f"{cat} must be an object", param=cat)
            fn = call.get("function", call)
            if not isinstance(fn, dict):
                raise APIError(400, f"{cat}.function must be an object", param=f"{cat}.function")
            name = fn.get("name")
            if not isinstance(name, str) or not name:
                raise APIError(400, f"{cat}.function.name must be a non-empty string",
                               param=f"{cat}.function.name")
            args = fn.get("arguments")
            if args is not None and not isinstance(args, (dict, str)):
                raise APIError(400, f"{cat}.function.arguments must be an object or JSON string",
                               param=f"{cat}.function.arguments")


_CHAT_KEYS = ("messages", "tools", "tool_choice", "response_format", "reasoning_effort",
              "thinking", "parallel_tool_calls")


def _reasoning(req: Mapping[str, Any]) -> str | None:
    """The effort of §7.6 step 1 (first non-null spelling), type-checked after `thinking`."""
    effort = req.get("reasoning_effort")
    if effort is None:
        effort = req.get("thinking_effort")
    if effort is None and isinstance(req.get("reasoning"), dict):
        effort = req["reasoning"].get("effort")
    if req.get("thinking") is not None and not isinstance(req["thinking"], bool):
        raise APIError(400, "'thinking' must be a boolean", param="thinking")
    if effort is not None and not isinstance(effort, str):
        raise APIError(400, "'reasoning_effort' must be a string", param="reasoning_effort")
    return effort


def _chat_request(req: Mapping[str, Any], effort: str | None) -> dict[str, Any]:
    out = {k: req[k] for k in _CHAT_KEYS if k in req}
    if effort is not None:
        out["reasoning_effort"] = effort
    if out.get("tools") is None:
        out.pop("tools", None)
    return out


def _number(req: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"'{key}' must be a number", param=key)
    if not (lo <= value <= hi):
        raise APIError(400, f"'{key}' must be between {lo} and {hi}", param=key)
    return float(value)


def _int(req: Mapping[str, Any], key: str) -> int | None:
    value = req.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"'{key}' must be an integer", param=key)
    return value


def _sampling(req: Mapping[str, Any]) -> SamplingParams:
    n = req.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, float)) or n != 1):
        raise APIError(400, "'n' must be 1: this engine generates one completion per request",
                       param="n")
    temperature = _number(req, "temperature", 0.0, 0.0, 2.0)
    top_p = _number(req, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:  # only the most likely token survives: greedy
        temperature, top_p = 0.0, 1.0
    top_k = req.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise APIError(400, "'top_k' must be a non-negative integer", param="top_k")
    min_p = _number(req, "min_p", 0.0, 0.0, 1.0)
    seed = _int(req, "seed")
    presence = _number(req, "presence_penalty", 0.0, -2.0, 2.0)
    frequency = _number(req, "frequency_penalty", 0.0, -2.0, 2.0)
    return SamplingParams(
        temperature=temperature, top_p=top_p, top_k=top_k or 0, min_p=min_p,
        seed=None if seed is None else seed % (1 << 64),
        presence_penalty=presence, frequency_penalty=frequency,
    )


def _max_tokens(req: Mapping[str, Any], default: int) -> int:
    key = "max_completion_tokens" if "max_completion_tokens" in req else "max_tokens"
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise APIError(400, "'max_tokens' must be a positive integer", param="max_tokens")
    return value


def _stop(req: Mapping[str, Any]) -> list[str]:
    stop = req.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError(400, "'stop' must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP:
        raise APIError(400, f"'stop' may hold at most {MAX_STOP} strings", param="stop")
    return [s for s in stop if s]


def _logprobs(req: Mapping[str, Any]) -> bool:
    want = req.get("logprobs")
    if want is not None and not isinstance(want, bool):
        raise APIError(400, "'logprobs' must be a boolean", param="logprobs")
    top = req.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise APIError(400, "'top_logprobs' must be an integer between 0 and 20",
                           param="top_logprobs")
        if top > 0:
            raise APIError(400, "'top_logprobs' > 0 is not supported: this engine reports only "
                           "the sampled token's log-probability", param="top_logprobs")
    return bool(want)


def _stream_options(req: Mapping[str, Any]) -> bool:
    opts = req.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise APIError(400, "'stream_options' must be an object", param="stream_options")
    return bool(opts.get("include_usage"))


def _logprob_entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8")),
            "top_logprobs": []}


def usage_body(usage: Usage) -> dict[str, Any]:
    """Chat and completions `usage`: counts plus the cached prompt and reasoning tokens."""
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}


def _logit_bias(req: Mapping[str, Any], engine: Any) -> list[Any]:
    from warp_openai.bias import logit_bias

    vocab = int(engine.info().get("vocab_size") or engine.tokenizer.vocab_size)
    bias = logit_bias(req, vocab)
    return [bias] if bias is not None else []


def _stats(s: Mapping[str, Any], n: int, seconds: float) -> dict[str, Any]:
    """The `warp` object of a reply from the generation's engine stats.

    `prefill_tok_s` is the engine's own figure on every route and in both modes: prompt
    tokens evaluated over the seconds their evaluation took. `prefill_tokens` and
    `cached_tokens` say how many were evaluated and how many a previous request's context
    already held; after a cache hit few are evaluated, and their speed is near decode speed.
    """
    hits = int(s.get("expert_hits", 0) or 0)
    misses = int(s.get("expert_misses", 0) or 0)
    tok_s = s.get("decode_tok_s")
    if tok_s is None:
        tok_s = n / seconds if seconds > 0 else 0.0
    return {
        "tokens_generated": n,
        "experts_hit": hits,
        "experts_missed": misses,
        "expert_hit_rate": hits / (hits + misses) if hits + misses else None,
        "bytes_read": int(s.get("bytes_read", 0) or 0),
        "direct_io": bool(s.get("direct_io", False)),
        "ms": round(seconds * 1000.0, 1),
        "tok_s": round(float(tok_s), 2),
        "prefill_tok_s": round(float(s.get("prefill_tok_s", 0.0) or 0.0), 2),
        "prefill_ms": round(float(s.get("prefill_seconds", 0.0) or 0.0) * 1000.0, 3),
        "prefill_tokens": int(s.get("prompt_tokens_evaluated", 0) or 0),
        "cached_tokens": int(s.get("cached_tokens", 0) or 0),
    }
