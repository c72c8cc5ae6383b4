"""Durable batch jobs: files, batches, their lines and results in SQLite under a jobs directory.

Owns: the jobs directory (`jobs.sqlite3` in WAL mode, file contents under `files/`, one
lock file per running batch under `locks/`), every read and write of it, and the crash
points the kill tests use. Each answered line is one transaction (its result row and its
`done` mark together), so a process killed at any point loses at most the lines in
flight, which the next run answers again; the result's primary key makes a second answer
of a line impossible. File contents are written to a temporary name and renamed, then
recorded, so a file is either whole or absent.
Refuses: nothing itself; request meaning lives in `batches.py`.
Test hook: `WARP_BATCH_CRASH_AT=<point>[:<n>]` makes the process SIGKILL itself the n-th
time (default 1st) it reaches the named point (`CRASH_POINTS`); with
`WARP_BATCH_CRASH_ONCE=<path>` only the process that creates `path` first does (one Ray
actor of several, not its restarts). Never set them otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = ["CRASH_POINTS", "TERMINAL", "JobStore", "Result", "crash_point", "default_jobs_dir",
           "error_record", "new_id", "write_atomic"]

CRASH_POINTS = ("validating", "result_written", "result_committed", "finalizing",
                "output_half_written", "output_renamed", "ray_line")
"""Where `WARP_BATCH_CRASH_AT` can kill: mid-validation (lines inserted, not committed),
mid-write of a result (row inserted, not committed), after a result's commit, at the start
of finalization, with half an output file written, and after the output files' rename
but before the batch is marked finished; and in a Ray actor before it answers a line."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, filename TEXT NOT NULL,
    purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, model TEXT NOT NULL,
    endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, status TEXT NOT NULL,
    times TEXT NOT NULL, metadata TEXT, errors TEXT, output_id TEXT NOT NULL,
    error_id TEXT NOT NULL, output_file_id TEXT, error_file_id TEXT,
    total INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT, body TEXT,
    done INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, line));
CREATE INDEX IF NOT EXISTS pending ON lines (batch_id, done, line);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, record TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, line));
"""

TERMINAL = ("completed", "failed", "expired", "cancelled")
"""Statuses after which a batch never changes."""

_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILLs this process when `WARP_BATCH_CRASH_AT` names `name` (see the module doc)."""
    want = os.environ.get("WARP_BATCH_CRASH_AT")
    if not want:
        return
    point, _, nth = want.partition(":")
    if point != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] < int(nth or 1):
        return
    once = os.environ.get("WARP_BATCH_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def new_id(prefix: str) -> str:
    """An OpenAI-style object id: `prefix` and 24 random hex digits."""
    return prefix + secrets.token_hex(12)


def default_jobs_dir(create: bool = True) -> Path:
    """`jobs` under the project's user cache directory (`$WARP_CACHE`, else the XDG cache);
    the cache directory is created unless `create` is False."""
    from warp_providers import cache_dir

    return cache_dir(create) / "jobs"


@dataclass
class Result:
    """One answered line: its output or error record and its token counts."""

    line: int
    ok: bool
    record: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


def _write_atomic(path: Path, chunks: Iterator[bytes], point: str | None = None) -> int:
    """Writes `chunks` to `path` through a temporary name and a rename; returns the size.

    `point`: the crash point reached once the first chunk is on disk.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    size = 0
    with open(tmp, "wb") as f:
        for i, chunk in enumerate(chunks):
            f.write(chunk)
            size += len(chunk)
            if i == 0 and point is not None:
                f.flush()
                crash_point(point)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return size


class JobStore:
    """The jobs directory of one process (several processes may share one directory).

    Every method is thread-safe: one connection, used under a lock.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        """Open (creating) the jobs directory `root`."""
        self.root = Path(root)
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "locks").mkdir(exist_ok=True)
        self._db = sqlite3.connect(self.root / "jobs.sqlite3", timeout=30.0,
                                   check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        self._held: dict[str, IO[bytes]] = {}

    def close(self) -> None:
        """Releases the batches this process runs and closes the database."""
        with self._lock:
            for f in self._held.values():
                f.close()
            self._held.clear()
            self._db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._db.execute(sql, args).fetchone()
            return row

    def _all(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # ------------------------------------------------------------------ files
    def file_path(self, file_id: str) -> Path:
        """Where a file's content lives."""
        return self.root / "files" / file_id

    def add_file(self, data: bytes, filename: str, purpose: str,
                 expires_at: int | None) -> dict[str, Any]:
        """Stores a new file (content first, then its row); returns its row as a dict."""
        ident = new_id("file-")
        _write_atomic(self.file_path(ident), iter([data]))
        now = int(time.time())
        with self._tx() as db:
            db.execute("INSERT INTO files (id, filename, purpose, bytes, created_at, expires_at)"
                       " VALUES (?, ?, ?, ?, ?, ?)",
                       (ident, filename, purpose, len(data), now, expires_at))
        found = self.file(ident)
        assert found is not None
        return found

    def file(self, file_id: str) -> dict[str, Any] | None:
        """A file's row, or None."""
        row = self._one("SELECT * FROM files WHERE id = ?", (file_id,))
        return dict(row) if row is not None else None

    def files(self, *, purpose: str | None = None, after: str | None = None, limit: int = 20,
              ascending: bool = False) -> tuple[list[dict[str, Any]], bool]:
        """A page of files in creation order (newest first unless `ascending`), and whether
        more follow."""
        return self._page("files", "purpose = ?" if purpose else None,
                          [purpose] if purpose else [], after, limit, ascending)

    def delete_file(self, file_id: str) -> bool:
        """Removes a file's row, then its content; False if there was none."""
        with self._tx() as db:
            gone = db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount
        with contextlib.suppress(FileNotFoundError):
            self.file_path(file_id).unlink()
        return bool(gone)

    def read_file(self, file_id: str) -> bytes:
        """A file's content (FileNotFoundError when it has gone)."""
        return self.file_path(file_id).read_bytes()

    def _page(self, table: str, where: str | None, args: list[Any], after: str | None,
              limit: int, ascending: bool) -> tuple[list[dict[str, Any]], bool]:
        clauses = [where] if where else []
        op, order = (">", "ASC") if ascending else ("<", "DESC")
        if after is not None:
            clauses.append(f"seq {op} COALESCE((SELECT seq FROM {table} WHERE id = ?), "
                           f"{'-1' if ascending else '9223372036854775807'})")
            args = [*args, after]
        sql = f"SELECT * FROM {table}"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        rows = self._all(sql + f" ORDER BY seq {order} LIMIT ?", [*args, limit + 1])
        return [dict(r) for r in rows[:limit]], len(rows) > limit

    # ------------------------------------------------------------------ batches
    def add_batch(self, *, model: str, endpoint: str, input_file_id: str, window: str,
                  expires_at: int, metadata: dict[str, str] | None) -> dict[str, Any]:
        """Records a new batch in `validating`; returns its row."""
        ident = new_id("batch_")
        now = int(time.time())
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, model, endpoint, input_file_id, completion_window, "
                "created_at, expires_at, status, times, metadata, output_id, error_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'validating', '{}', ?, ?, ?)",
                (ident, model, endpoint, input_file_id, window, now, expires_at,
                 None if metadata is None else json.dumps(metadata), new_id("file-"),
                 new_id("file-")))
        found = self.batch(ident)
        assert found is not None
        return found

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        """A batch's row (with `times`, `metadata` and `errors` decoded), or None."""
        row = self._one("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return _batch_row(row) if row is not None else None

    def batches(self, *, after: str | None = None, limit: int = 20,
                where: str | None = None, args: Sequence[Any] = ()
                ) -> tuple[list[dict[str, Any]], bool]:
        """A page of batches, newest first, and whether more follow."""
        rows, more = self._page("batches", where, list(args), after, limit, False)
        return [_batch_row(r) for r in rows], more

    def unfinished(self, model: str) -> list[str]:
        """Ids of this model's batches not yet in a terminal status, oldest first."""
        marks = ",".join("?" * len(TERMINAL))
        rows = self._all(f"SELECT id FROM batches WHERE model = ? AND status NOT IN ({marks})"
                         " ORDER BY seq", [model, *TERMINAL])
        return [r["id"] for r in rows]

    def set_status(self, batch_id: str, status: str, *, only_from: Sequence[str] = (),
                   **fields: Any) -> bool:
        """Moves a batch to `status`, stamping `<status>_at`; with `only_from`, only from
        one of those statuses. Returns whether it moved."""
        with self._tx() as db:
            return self._move(db, batch_id, status, only_from, fields)

    def _move(self, db: sqlite3.Connection, batch_id: str, status: str,
              only_from: Sequence[str], fields: dict[str, Any]) -> bool:
        row = db.execute("SELECT status, times FROM batches WHERE id = ?",
                         (batch_id,)).fetchone()
        if row is None or (only_from and row["status"] not in only_from):
            return False
        times = json.loads(row["times"])
        times.setdefault(f"{status}_at", int(time.time()))
        sets = ["status = ?", "times = ?"] + [f"{k} = ?" for k in fields]
        values = [status, json.dumps(times)] + [
            json.dumps(v) if k in ("errors",) and v is not None else v
            for k, v in fields.items()]
        db.execute(f"UPDATE batches SET {', '.join(sets)} WHERE id = ?", [*values, batch_id])
        return True

    @contextlib.contextmanager
    def running(self, batch_id: str) -> Iterator[bool]:
        """Holds the batch's lock file while the body runs; yields False when another
        process (or thread) holds it. The lock dies with the process that held it."""
        import fcntl

        with self._lock:
            if batch_id in self._held:
                yield False
                return
            f = open(self.root / "locks" / f"{batch_id}.lock", "ab")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                yield False
                return
            self._held[batch_id] = f
        try:
            yield True
        finally:
            with self._lock:
                held = self._held.pop(batch_id, None)
            if held is not None:
                held.close()

    # ------------------------------------------------------------------ lines
    def validated(self, batch_id: str, lines: list[tuple[int, str, str]],
                  refused: list[Result]) -> bool:
        """Records a batch's lines (line, custom_id, body JSON) and the refused ones' error
        results, and moves it to `in_progress`, in one transaction."""
        with self._tx() as db:
            row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None or row["status"] != "validating":
                return False
            db.executemany("INSERT INTO lines (batch_id, line, custom_id, body) "
                           "VALUES (?, ?, ?, ?)", [(batch_id, *x) for x in lines])
            for r in refused:
                self._insert_result(db, batch_id, r)
            db.execute("UPDATE batches SET total = ? WHERE id = ?",
                       (len(lines) + len(refused), batch_id))
            crash_point("validating")
            return self._move(db, batch_id, "in_progress", ("validating",), {})

    def pending(self, batch_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        """(line, custom_id, body) of the lines not yet answered, in input order."""
        rows = self._all("SELECT line, custom_id, body FROM lines WHERE batch_id = ? AND "
                         "done = 0 ORDER BY line", (batch_id,))
        return [(r["line"], r["custom_id"], json.loads(r["body"])) for r in rows]

    def record(self, batch_id: str, result: Result) -> None:
        """Stores one line's result and marks the line done, in one transaction."""
        with self._tx() as db:
            self._insert_result(db, batch_id, result)
            crash_point("result_written")
        crash_point("result_committed")

    def _insert_result(self, db: sqlite3.Connection, batch_id: str, r: Result) -> None:
        db.execute("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (batch_id, r.line, int(r.ok), json.dumps(r.record, ensure_ascii=False),
                    r.prompt_tokens, r.completion_tokens, r.cached_tokens,
                    r.reasoning_tokens))
        db.execute("UPDATE lines SET done = 1 WHERE batch_id = ? AND line = ?",
                   (batch_id, r.line))

    def refuse_unanswered(self, batch_id: str, code: str, message: str) -> int:
        """Answers every line still pending with an error `code` (a cancelled or expired
        batch), in one transaction; returns how many."""
        with self._tx() as db:
            rows = db.execute("SELECT line, custom_id FROM lines WHERE batch_id = ? AND "
                              "done = 0 ORDER BY line", (batch_id,)).fetchall()
            for r in rows:
                self._insert_result(db, batch_id, Result(r["line"], False, error_record(
                    r["custom_id"], code, message)))
            return len(rows)

    def counts(self, batch_id: str) -> dict[str, int]:
        """`completed`, `failed` (answered lines) and the token sums of a batch."""
        row = self._one(
            "SELECT COALESCE(SUM(ok), 0) AS completed, COUNT(*) - COALESCE(SUM(ok), 0) AS "
            "failed, COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens, "
            "COALESCE(SUM(completion_tokens), 0) AS completion_tokens, "
            "COALESCE(SUM(cached_tokens), 0) AS cached_tokens, "
            "COALESCE(SUM(reasoning_tokens), 0) AS reasoning_tokens "
            "FROM results WHERE batch_id = ?", (batch_id,))
        assert row is not None
        return dict(row)

    def finish(self, batch_id: str, status: str, *, purpose: str = "batch_output") -> bool:
        """Writes the output and error files from the results (in input order), then records
        them and moves the batch to `status`, in one transaction. Redoing it after a crash
        rewrites the same two files."""
        batch = self.batch(batch_id)
        if batch is None or batch["status"] in TERMINAL:
            return False
        crash_point("finalizing")
        ids = {True: batch["output_id"], False: batch["error_id"]}
        names = {True: f"{batch_id}_output.jsonl", False: f"{batch_id}_error.jsonl"}
        sizes: dict[bool, int] = {}
        for ok in (True, False):
            rows = self._all("SELECT record FROM results WHERE batch_id = ? AND ok = ? "
                             "ORDER BY line", (batch_id, int(ok)))
            if rows:
                sizes[ok] = _write_atomic(self.file_path(ids[ok]),
                                          (r["record"].encode() + b"\n" for r in rows),
                                          "output_half_written")
        crash_point("output_renamed")
        now = int(time.time())
        with self._tx() as db:
            for ok, size in sizes.items():
                db.execute("INSERT OR REPLACE INTO files (id, filename, purpose, bytes, "
                           "created_at, expires_at) VALUES (?, ?, ?, ?, ?, NULL)",
                           (ids[ok], names[ok], purpose, size, now))
            return self._move(db, batch_id, status, (), {
                "output_file_id": ids[True] if True in sizes else None,
                "error_file_id": ids[False] if False in sizes else None})


def error_record(custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    """An error-file line for a request that was never answered (`response` null)."""
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def write_atomic(path: str | os.PathLike[str], data: Iterator[bytes]) -> int:
    """Writes `data` to `path` through a temporary name and a rename; returns the size."""
    return _write_atomic(Path(path), data)


def _batch_row(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out["times"] = json.loads(out["times"])
    out["metadata"] = json.loads(out["metadata"]) if out["metadata"] else None
    out["errors"] = json.loads(out["errors"]) if out["errors"] else None
    return out
