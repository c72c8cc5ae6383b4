"""Blocking request core <-> byte streams: SSE framing and the one-thread-per-request pump.

Owns: SSE framing of `api.ChunkStream`s (`data: {json}` events, an engine failure mid-stream
as an error event, `data: [DONE]` unless the stream was cancelled), a progress deadline,
and `Pump`, which runs one `WarpAPI.handle` call on a thread of its own (a generation's
result is read in the thread that iterated it, so one request never changes threads)
and hands its head and SSE frames to an asyncio event loop one at a time, at most one
frame ahead of the reader.
Refuses: nothing; request meaning lives in `api.py`. Called by: `transport.py` (the async
in-process transport) and `server.py` (`warp serve`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

from warp_openai.api import ChunkStream, WarpAPI, encode_json, error_body

__all__ = ["DONE", "Deadline", "Pump", "events_after", "first_event", "sse_event"]

DONE = b"data: [DONE]\n\n"
"""The SSE event that ends a stream that was not cancelled."""


def sse_event(chunk: dict[str, Any]) -> bytes:
    """One chunk as an SSE `data:` event."""
    return b"data: " + encode_json(chunk) + b"\n\n"


class Deadline:
    """A read timeout: expires when no progress was made for `seconds` (None: never)."""

    def __init__(self, seconds: float | None) -> None:
        """Armed from now."""
        self.seconds = seconds
        self._at: float | None = None
        self.hit = False
        self.arm()

    def arm(self) -> None:
        """Progress was made: restart the clock."""
        self._at = None if self.seconds is None else time.monotonic() + self.seconds

    def expired(self) -> bool:
        """Whether the deadline passed (it stays passed)."""
        if self._at is not None and time.monotonic() > self._at:
            self.hit = True
        return self.hit


def first_event(stream: ChunkStream) -> tuple[bytes | None, dict[str, Any] | None]:
    """The first SSE event, or the 500 body when generation fails before it."""
    try:
        first = next(stream)
    except StopIteration:
        return b"", None
    except Exception as exc:  # an engine failure before any byte: a plain 500
        stream.close()
        return None, error_body(str(exc) or type(exc).__name__, "engine_error")
    return sse_event(first), None


def events_after(stream: ChunkStream, first: bytes, deadline: Deadline) -> Iterator[bytes]:
    """`first`, then the SSE events after it; an engine failure becomes an error event."""
    if first:
        yield first
    while True:
        deadline.arm()
        try:
            chunk = next(stream)
        except StopIteration:
            break
        except Exception as exc:
            yield sse_event(error_body(str(exc) or type(exc).__name__, "engine_error"))
            return
        yield sse_event(chunk)
    if not stream.cancelled:
        yield DONE


class Pump:
    """Runs one request on its own thread; hands SSE frames to the event loop one by one.

    `await head()` gives (status, body) for a plain reply or (200, None) for a stream,
    whose frames `await next_frame()` then gives (None at the end); `cancel()` (from the
    event loop) stops the generation within a token.
    """

    def __init__(self, api: WarpAPI, method: str, path: str, body: bytes,
                 headers: dict[str, str], deadline: Deadline, *,
                 stream_early: bool = False) -> None:
        """Starts the request's thread.

        Args:
            api: the request core.
            method: the HTTP method.
            path: the URL path.
            body: the raw request body.
            headers: request headers handed to the core.
            deadline: stops generation when it expires.
            stream_early: announce a stream (head (200, None)) as soon as the core accepts
                it, before its first token; a failure before that token then comes as an
                error event instead of a 500. Without it the head waits for the first token.

        """
        self._early = stream_early
        self.deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._credit = threading.Semaphore(0)
        self._cancel = threading.Event()
        self._stream: ChunkStream | None = None
        self._done = False
        self.finished = threading.Event()
        """Set when the request's thread is done with the engine."""
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
            if self._early:
                self._put(("head", 200, None))
            first, failure = first_event(out)
            if failure is not None:
                if self._early:
                    self._put(("frame", sse_event(failure)))
                    self._put(("end",))
                else:
                    self._put(("head", 500, failure))
                return
            if not self._early:
                self._put(("head", 200, None))
            for frame in events_after(out, first or b"", self.deadline):
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
        finally:
            self.finished.set()

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
