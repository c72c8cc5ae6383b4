"""The Files and Batch APIs (/v1/files, /v1/batches) over a durable job store.

Owns: the meaning of those routes (multipart upload, file objects, content, list
pagination with `after`/`limit`/`order`, batch creation and its checks, cancel), the Batch
and FileObject shapes the openai SDK parses, the validation of an input file's lines (a
malformed line, a missing or duplicate `custom_id`, another `url`, a body that is not an
object: each an error-file line, the other lines still run), and `Worker`, which answers
a batch's lines through the same chat/completions handlers as the API at a set
concurrency, records each answer (`jobs.py`) and finalizes the output and error files.
Status moves validating -> in_progress -> finalizing -> completed, or -> cancelling ->
cancelled, -> failed (an input file with no request), -> expired (past
`completion_window`); lines a cancel or an expiry leaves unanswered get error lines.
Refuses: endpoints other than /v1/chat/completions and /v1/completions, a file of another
purpose than `batch`, a file over `max_file_bytes` (400 `file_too_large`).
Knows nothing of HTTP: `api.py` routes here; `transport.py` and `server.py` frame it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from warp_openai.api import APIError, ChunkStream, RawBody, _parse
from warp_openai.jobs import (
    TERMINAL,
    JobStore,
    Result,
    default_jobs_dir,
    error_record,
    new_id,
)

__all__ = ["ENDPOINTS", "MAX_FILE_BYTES", "MAX_REQUESTS", "Batches", "Worker", "answer_result",
           "check_lines"]

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
"""The endpoints a batch may run (each line's `url` must be its batch's endpoint)."""
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
"""Purposes `files.create` accepts; only `batch` files can start a batch."""
MAX_FILE_BYTES = 48 << 20
"""Largest uploaded file (kept under the request body cap, so its refusal is a 400)."""
MAX_REQUESTS = 50_000
"""Most request lines in one batch input file."""
FILE_TTL = 30 * 24 * 3600
"""Seconds a batch input file is reported to live (`expires_at`); nothing deletes it."""
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_POLL_S = 1.0
"""Seconds between looks at a running batch's status (a cancel from another process)."""


class Batches:
    """The /v1/files and /v1/batches routes of one `WarpAPI`, and its batch worker."""

    def __init__(self, api: Any, *, jobs_dir: str | Path | None = None, concurrency: int = 1,
                 max_file_bytes: int = MAX_FILE_BYTES) -> None:
        """Serve the routes over the job store in `jobs_dir`.

        Args:
            api: the `WarpAPI` whose handlers answer the lines.
            jobs_dir: the jobs directory (default: `jobs` under the user cache); opened on
                first use.
            concurrency: lines of one batch in flight at once.
            max_file_bytes: largest file `files.create` accepts.

        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.api = api
        self.jobs_dir = jobs_dir
        self.concurrency = concurrency
        self.max_file_bytes = max_file_bytes
        self._store: JobStore | None = None
        self._worker: Worker | None = None
        self._lock = threading.Lock()
        self.autostart = True
        """Whether creating a batch starts the background worker (`warp batch` runs the
        batch in its own thread instead)."""

    @property
    def store(self) -> JobStore:
        """The job store (opened on first use)."""
        with self._lock:
            if self._store is None:
                self._store = JobStore(self.jobs_dir or default_jobs_dir())
            return self._store

    def start(self) -> Worker:
        """Starts the background worker (idempotent); it resumes unfinished batches."""
        store = self.store
        with self._lock:
            if self._worker is None:
                self._worker = Worker(self.api, store, concurrency=self.concurrency)
                self._worker.start()
            return self._worker

    def resume(self) -> Worker | None:
        """Starts the worker when the jobs directory already holds a job database (it
        resumes the unfinished batches); creates nothing otherwise (`warp serve` at start)."""
        root = Path(self.jobs_dir) if self.jobs_dir else default_jobs_dir(create=False)
        if not (root / "jobs.sqlite3").is_file():
            return None
        return self.start()

    def close(self) -> None:
        """Stops the worker (lines in flight are dropped, to be redone) and the store."""
        with self._lock:
            worker, self._worker = self._worker, None
            store, self._store = self._store, None
        if worker is not None:
            worker.stop()
        if store is not None:
            store.close()

    # ------------------------------------------------------------------ routing
    def route(self, method: str, path: str, query: str, body: Any,
              headers: Mapping[str, str]) -> tuple[int, dict[str, Any] | RawBody]:
        """Answers /v1/files[/{id}[/content]] and /v1/batches[/{id}[/cancel]]; the first
        such request starts the worker, which resumes this model's unfinished batches."""
        if self.autostart:
            self.start()
        parts = path.strip("/").split("/")[1:]  # ["files", id, "content"]
        args = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        kind, rest = parts[0], parts[1:]
        if kind == "files":
            if not rest and method == "POST":
                return 200, self.create_file(body, headers)
            if not rest and method == "GET":
                return 200, self.list_files(args)
            if len(rest) == 1 and method == "GET":
                return 200, _file_object(self._file(rest[0]))
            if len(rest) == 1 and method == "DELETE":
                self._file(rest[0])
                self.store.delete_file(rest[0])
                return 200, {"id": rest[0], "object": "file", "deleted": True}
            if len(rest) == 2 and rest[1] == "content" and method == "GET":
                self._file(rest[0])
                try:
                    data = self.store.read_file(rest[0])
                except FileNotFoundError:
                    raise _no_file(rest[0]) from None
                return 200, RawBody(data, "application/octet-stream")
        else:
            if not rest and method == "POST":
                return 200, self.create_batch(_parse(body, self.api.max_body))
            if not rest and method == "GET":
                return 200, self.list_batches(args)
            if len(rest) == 1 and method == "GET":
                return 200, self.batch_object(self._batch(rest[0]))
            if len(rest) == 2 and rest[1] == "cancel" and method == "POST":
                return 200, self.cancel(rest[0])
        raise APIError(404, f"no route for {method} {path}")

    # ------------------------------------------------------------------ files
    def create_file(self, body: Any, headers: Mapping[str, str]) -> dict[str, Any]:
        """POST /v1/files: a multipart upload with `file` and `purpose`."""
        raw = body if isinstance(body, (bytes, bytearray)) else str(body or "").encode()
        if len(raw) > self.api.max_body:
            raise APIError(413, f"request body may not exceed {self.api.max_body} bytes")
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        fields = _multipart(bytes(raw), ctype)
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace")
        if purpose not in PURPOSES:
            raise APIError(400, f"'purpose' must be one of {list(PURPOSES)}", param="purpose")
        if "file" not in fields:
            raise APIError(400, "'file' is a required field", param="file")
        filename, data = fields["file"]
        if len(data) > self.max_file_bytes:
            raise APIError(400, f"the file is {len(data)} bytes, more than the "
                           f"{self.max_file_bytes} this server accepts", param="file",
                           code="file_too_large")
        now = int(time.time())
        expires = None
        seconds = fields.get("expires_after[seconds]")
        if seconds is not None:
            try:
                expires = now + int(seconds[1])
            except ValueError:
                raise APIError(400, "'expires_after[seconds]' must be an integer",
                               param="expires_after.seconds") from None
        elif purpose == "batch":
            expires = now + FILE_TTL
        return _file_object(self.store.add_file(data, filename or "upload", purpose, expires))

    def list_files(self, args: Mapping[str, str]) -> dict[str, Any]:
        """GET /v1/files (`purpose`, `after`, `limit` up to 10,000, `order`)."""
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise APIError(400, "'order' must be 'asc' or 'desc'", param="order")
        rows, more = self.store.files(purpose=args.get("purpose") or None,
                                      after=args.get("after") or None,
                                      limit=_limit(args, 10_000, 10_000),
                                      ascending=order == "asc")
        return _page([_file_object(r) for r in rows], more)

    def _file(self, file_id: str) -> dict[str, Any]:
        row = self.store.file(file_id)
        if row is None:
            raise _no_file(file_id)
        return row

    # ------------------------------------------------------------------ batches
    def create_batch(self, req: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/batches: checks the request, records the batch, wakes the worker."""
        file_id = req.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise APIError(400, "'input_file_id' is a required string", param="input_file_id")
        endpoint = req.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise APIError(400, f"'endpoint' must be one of {list(ENDPOINTS)}: this server "
                           "runs no other endpoint in a batch", param="endpoint")
        window = req.get("completion_window")
        match = _WINDOW.match(window) if isinstance(window, str) else None
        if match is None:
            raise APIError(400, "'completion_window' must be a duration such as '24h' "
                           "(a number and s, m, h or d)", param="completion_window")
        metadata = _metadata(req.get("metadata"))
        found = self.store.file(file_id)
        if found is None:
            raise _no_file(file_id, "input_file_id")
        if found["purpose"] != "batch":
            raise APIError(400, f"file {file_id} has purpose '{found['purpose']}'; a batch "
                           "needs a file uploaded with purpose 'batch'", param="input_file_id",
                           code="invalid_file_purpose")
        seconds = int(match.group(1)) * _UNIT[match.group(2)]
        row = self.store.add_batch(model=self.api.model_id, endpoint=endpoint,
                                   input_file_id=file_id, window=window,
                                   expires_at=int(time.time()) + seconds, metadata=metadata)
        if self.autostart:
            self.start().wake()
        return self.batch_object(row)

    def list_batches(self, args: Mapping[str, str]) -> dict[str, Any]:
        """GET /v1/batches (`after`, `limit` 1-100, default 20), newest first."""
        rows, more = self.store.batches(after=args.get("after") or None,
                                        limit=_limit(args, 20, 100))
        return _page([self.batch_object(r) for r in rows], more)

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """POST /v1/batches/{id}/cancel: `cancelling` until the worker has stopped it."""
        row = self._batch(batch_id)
        if row["status"] in ("cancelling", "cancelled"):
            return self.batch_object(row)
        if not self.store.set_status(batch_id, "cancelling",
                                     only_from=("validating", "in_progress")):
            status = self._batch(batch_id)["status"]
            raise APIError(409, f"cannot cancel a batch with status '{status}'",
                           code="batch_not_cancellable", type="invalid_request_error")
        worker = self._worker
        if worker is not None:
            worker.wake()
        return self.batch_object(self._batch(batch_id))

    def _batch(self, batch_id: str) -> dict[str, Any]:
        row = self.store.batch(batch_id)
        if row is None:
            raise APIError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return row

    def batch_object(self, row: dict[str, Any]) -> dict[str, Any]:
        """The Batch object of a batch's row (counts and usage from its results)."""
        c = self.store.counts(row["id"])
        t = row["times"]
        return {
            "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
            "model": row["model"], "errors": row["errors"],
            "input_file_id": row["input_file_id"],
            "completion_window": row["completion_window"], "status": row["status"],
            "output_file_id": row["output_file_id"], "error_file_id": row["error_file_id"],
            "created_at": row["created_at"], "expires_at": row["expires_at"],
            **{f"{s}_at": t.get(f"{s}_at") for s in (
                "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
                "cancelled")},
            "request_counts": {"total": row["total"], "completed": c["completed"],
                               "failed": c["failed"]},
            "usage": {"input_tokens": c["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": c["cached_tokens"]},
                      "output_tokens": c["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": c["reasoning_tokens"]},
                      "total_tokens": c["prompt_tokens"] + c["completion_tokens"]},
            "metadata": row["metadata"],
        }


class Worker:
    """Runs batches: validation, the lines at `concurrency`, finalization.

    `run(batch_id)` runs one batch to its end in the calling thread (`warp batch`);
    `start()` runs a thread that resumes this model's unfinished batches and takes new
    ones as `wake()` announces them (`warp serve`, the transports).
    """

    def __init__(self, api: Any, store: JobStore, *, concurrency: int = 1) -> None:
        """Answer with `api`'s handlers, record into `store`."""
        self.api = api
        self.store = store
        self.concurrency = concurrency
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the submit point
    def submit(self, url: str, body: dict[str, Any],
               should_stop: Callable[[], bool]) -> tuple[int, dict[str, Any]]:
        """Answers one request line: (status, body) as the API would answer it.

        The one place a line meets the engine: a scheduler that batches decode steps
        replaces this call and nothing else.
        """
        status, out = self.api.call(url, body, should_stop=should_stop)
        if isinstance(out, ChunkStream):  # refused at validation; never reached
            out.close()
            return 400, {"error": {"message": "a batch request cannot stream",
                                   "type": "invalid_request_error", "param": "stream",
                                   "code": None}}
        assert isinstance(out, dict)
        return status, out

    # ------------------------------------------------------------------ background
    def start(self) -> None:
        """Starts the background thread."""
        self._thread = threading.Thread(target=self._loop, name="warp-batch", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A batch was created or cancelled: look now."""
        self._wake.set()

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the thread; lines in flight are cancelled and left for the next run."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for batch_id in self.store.unfinished(self.api.model_id):
                    if self._stop.is_set():
                        break
                    self.run(batch_id)
            except Exception:  # a broken store must not end the thread silently
                log.exception("the batch worker failed; retrying")
            self._wake.wait(_POLL_S)
            self._wake.clear()

    # ------------------------------------------------------------------ one batch
    def run(self, batch_id: str,
            on_result: Callable[[dict[str, Any]], None] | None = None) -> str | None:
        """Runs a batch to its end (or until `stop()`); returns its status then, or None
        when another process is running it.

        Args:
            batch_id: the batch.
            on_result: called after each recorded line with the batch's counts
                (`completed`, `failed`, `total`, token sums).

        """
        with self.store.running(batch_id) as mine:
            if not mine:
                return None
            row = self.store.batch(batch_id)
            if row is None:
                return None
            if row["status"] == "validating":
                self.validate(row)
            self._lines(batch_id, on_result)
            if self._stop.is_set():
                row = self.store.batch(batch_id)
                return row["status"] if row else None
            self.finish(batch_id)
            row = self.store.batch(batch_id)
            return row["status"] if row else None

    def validate(self, row: dict[str, Any]) -> None:
        """Checks a `validating` batch's input lines and moves it on (or fails it)."""
        batch_id = row["id"]
        try:
            text = self.store.read_file(row["input_file_id"]).decode("utf-8")
        except FileNotFoundError:
            self._fail(batch_id, "invalid_file", f"the input file {row['input_file_id']} "
                       "was deleted before the batch started")
            return
        except UnicodeDecodeError as exc:
            self._fail(batch_id, "invalid_file", f"the input file is not UTF-8 text: {exc}")
            return
        lines, refused = check_lines(text, row["endpoint"])
        if not lines and not refused:
            self._fail(batch_id, "empty_file", "the input file holds no request")
            return
        if len(lines) + len(refused) > MAX_REQUESTS:
            self._fail(batch_id, "too_many_requests", f"the input file holds "
                       f"{len(lines) + len(refused)} requests, more than {MAX_REQUESTS}")
            return
        self.store.validated(batch_id, lines, refused)

    def _fail(self, batch_id: str, code: str, message: str) -> None:
        errors = {"object": "list",
                  "data": [{"code": code, "message": message, "param": None, "line": None}]}
        self.store.set_status(batch_id, "failed", only_from=("validating", "cancelling"),
                              errors=errors)

    def _halted(self, batch_id: str) -> bool:
        row = self.store.batch(batch_id)
        if row is None or row["status"] != "in_progress":
            return True
        return time.time() > row["expires_at"]

    def _lines(self, batch_id: str,
               on_result: Callable[[dict[str, Any]], None] | None) -> None:
        row = self.store.batch(batch_id)
        if row is None or row["status"] != "in_progress":
            return
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="warp-batch-line") as pool:
            try:
                self._feed(pool, batch_id, row, on_result)
            except BaseException:  # Ctrl-C: lines in flight stop within a token
                self._stop.set()
                raise

    def _feed(self, pool: ThreadPoolExecutor, batch_id: str, row: dict[str, Any],
              on_result: Callable[[dict[str, Any]], None] | None) -> None:
        endpoint = row["endpoint"]
        todo = iter(self.store.pending(batch_id))
        inflight: set[Future[None]] = set()
        last_look = 0.0
        halted = False
        while True:
            if time.monotonic() - last_look > _POLL_S or self._wake.is_set():
                self._wake.clear()
                last_look = time.monotonic()
                halted = self._halted(batch_id)
            while not (halted or self._stop.is_set()) and len(inflight) < self.concurrency:
                item = next(todo, None)
                if item is None:
                    break
                inflight.add(pool.submit(self._answer, batch_id, endpoint, *item))
            if not inflight:
                break
            done, inflight = wait(inflight, timeout=_POLL_S, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()
                if on_result is not None:
                    on_result({"total": row["total"], **self.store.counts(batch_id)})

    def _answer(self, batch_id: str, endpoint: str, line: int, custom_id: str,
                body: dict[str, Any]) -> None:
        status, out = self.submit(endpoint, body, self._stop.is_set)
        if self._stop.is_set():  # possibly cut short: the next run answers it again
            return
        self.store.record(batch_id, answer_result(line, custom_id, status, out))

    def finish(self, batch_id: str) -> None:
        """Ends a batch whose lines are all answered, cancelled or past its window."""
        row = self.store.batch(batch_id)
        if row is None or row["status"] in TERMINAL:
            return
        status = row["status"]
        if status == "cancelling":
            self.store.refuse_unanswered(batch_id, "batch_cancelled",
                                         "the batch was cancelled before this request ran")
            self.store.finish(batch_id, "cancelled")
            return
        if status == "validating":  # failed validation leaves it terminal; nothing here
            return
        if self.store.pending(batch_id):  # in_progress with lines left: past its window
            if time.time() <= row["expires_at"]:
                return
            self.store.refuse_unanswered(batch_id, "batch_expired", "the batch's "
                                         "completion window ended before this request ran")
            self.store.finish(batch_id, "expired")
            return
        self.store.set_status(batch_id, "finalizing", only_from=("in_progress",))
        self.store.finish(batch_id, "completed")


# ---------------------------------------------------------------------- helpers
def answer_result(line: int, custom_id: str, status: int, out: dict[str, Any]) -> Result:
    """The output (2xx) or error record of one answered line, with its token counts."""
    usage = out.get("usage") or {}
    record = {"id": new_id("batch_req_"), "custom_id": custom_id,
              "response": {"status_code": status, "request_id": new_id("req_"), "body": out},
              "error": None}
    return Result(
        line, 200 <= status < 300, record,
        prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),
        completion_tokens=int(usage.get("completion_tokens", 0) or 0),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get(
            "cached_tokens", 0) or 0),
        reasoning_tokens=int((usage.get("completion_tokens_details") or {}).get(
            "reasoning_tokens", 0) or 0))


def check_lines(text: str, endpoint: str) -> tuple[list[tuple[int, str, str]], list[Result]]:
    """Splits an input file into runnable lines (line number, custom_id, body JSON) and the
    error results of the lines that cannot run. Blank lines are skipped; line numbers
    count from 1, as an editor shows them."""
    lines: list[tuple[int, str, str]] = []
    refused: list[Result] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue

        def refuse(code: str, message: str, custom_id: str | None = None) -> None:
            refused.append(Result(n, False, error_record(custom_id, code, f"line {n}: "
                                                         f"{message}")))

        try:
            item = json.loads(raw)
        except ValueError as exc:
            refuse("invalid_json_line", f"not valid JSON ({exc})")
            continue
        if not isinstance(item, dict):
            refuse("invalid_json_line", "a request line must be a JSON object")
            continue
        cid = item.get("custom_id")
        if not isinstance(cid, str) or not cid:
            refuse("missing_custom_id", "'custom_id' must be a non-empty string")
            continue
        if cid in seen:
            refuse("duplicate_custom_id", f"custom_id {cid!r} was used by an earlier line",
                   cid)
            continue
        seen.add(cid)
        if item.get("method", "POST") != "POST":
            refuse("invalid_method", "'method' must be 'POST'", cid)
        elif item.get("url") != endpoint:
            refuse("invalid_url", f"'url' is {item.get('url')!r}, but this batch runs "
                   f"{endpoint}", cid)
        elif not isinstance(item.get("body"), dict):
            refuse("invalid_body", "'body' must be a JSON object", cid)
        elif item["body"].get("stream"):
            refuse("invalid_body", "'body.stream' must be false: batch requests do not "
                   "stream", cid)
        else:
            lines.append((n, cid, json.dumps(item["body"], ensure_ascii=False)))
    return lines, refused


def _multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """The fields of a multipart/form-data body: name -> (filename, content)."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.lower().startswith("multipart/form-data") or match is None:
        raise APIError(400, "POST /v1/files takes a multipart/form-data body with the "
                       "fields 'file' and 'purpose'")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + match.group(1).encode())[1:]:
        if part.startswith(b"--"):
            break
        head, sep, content = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise APIError(400, "a multipart part has no header block")
        disposition = ""
        for line in head.split(b"\r\n"):
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-disposition":
                disposition = value.decode("utf-8", "replace")
        params = dict(re.findall(r';\s*(\w+)="((?:[^"\\]|\\.)*)"', disposition))
        if "name" in params:
            fields[params["name"]] = (params.get("filename"), content.removesuffix(b"\r\n"))
    return fields


def _no_file(file_id: str, param: str = "file_id") -> APIError:
    return APIError(404, f"No such File object: {file_id}", param=param)


def _limit(args: Mapping[str, str], default: int, most: int) -> int:
    text = args.get("limit")
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise APIError(400, f"'limit' must be an integer from 1 to {most}", param="limit")
    return value


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 16 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in value.items()):
        raise APIError(400, "'metadata' must be an object of at most 16 string values "
                       "(keys up to 64 characters, values up to 512)", param="metadata")
    return value


def _file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"],
            "created_at": row["created_at"], "filename": row["filename"],
            "purpose": row["purpose"], "status": "processed",
            "expires_at": row["expires_at"], "status_details": None}
