"""`warp batch MODEL INPUT -o OUTPUT`: one OpenAI batch input file through a local model.

Owns: the job of one (input, output) pair in the jobs directory (found again by a key of
the input's sha256 and the output's absolute path, so `--resume` continues it), running
it in the foreground through the same `batches.Worker` the Batch API uses, progress
(lines done/total, tok/s, ETA) on stderr through `warp_providers.Progress`, writing the
output and error files (temporary name, then rename) and the summary.
Refuses: an unfinished job for the same pair without `--resume` (it names the flag), an
input whose requests name no endpoint a batch runs. Called by: `cli.py` (`BatchCommand`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from warp_providers import Progress, WarpError

__all__ = ["default_concurrency", "default_errors_path", "run_file", "summary_line"]

QUEUED_SHARE = 0.5
"""Lines `warp batch` keeps queued beyond the engine's sequences, as a share of them."""


def default_concurrency(max_sequences: int) -> int:
    """Lines in flight for `warp batch` on an engine of its own with `max_sequences`.

    More than the sequences: the lines beyond them wait, already tokenized, in the
    scheduler's queue, so a finished line's sequence is taken by the next at once (while
    its answer is committed) instead of staying empty for a step, and no sequence is
    left free for a prefix snapshot that a one-shot line would never use. `warp serve`
    keeps the engine's sequences (`WarpAPI`'s default), so an interactive request waits
    behind no queued line.
    """
    n = max(1, int(max_sequences))
    return n + int(n * QUEUED_SHARE) if n > 1 else 1


def default_errors_path(output: Path) -> Path:
    """Where error lines go when no `--errors` is given: beside the output."""
    stem = output.name.removesuffix(".jsonl")
    return output.with_name(f"{stem}.errors.jsonl")


def _endpoint(data: bytes) -> str:
    from warp_openai.batches import ENDPOINTS

    for raw in data.splitlines():
        try:
            url = json.loads(raw).get("url")
        except (ValueError, AttributeError):
            continue
        if url in ENDPOINTS:
            return str(url)
    return ENDPOINTS[0]


def _seconds(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def run_file(api: Any, input_path: Path, output: Path, *, errors: Path | None = None,
             resume: bool = False, endpoint: str | None = None,
             stream: IO[str] | None = None,
             runner: Callable[[Any, str, Callable[[dict[str, Any]], None]], str | None]
             | None = None) -> dict[str, Any]:
    """Runs (or with `resume`, continues) the job of `input_path` -> `output`.

    Args:
        api: the `WarpAPI` whose batch store and handlers run the job.
        input_path: the batch input file (OpenAI batch JSONL).
        output: where the output lines go (error lines go to `errors`).
        errors: the error file (default `default_errors_path(output)`; written only
            when a line failed).
        resume: continue an interrupted job of this input and output.
        endpoint: the batch's endpoint (default: the first line's `url`).
        stream: where progress goes (default stderr).
        runner: runs the batch: `runner(api, batch_id, on_result) -> status` (default:
            a `batches.Worker` in this thread).

    Returns:
        The summary: status, counts, tokens, wall seconds, tok/s and the files written.

    """
    from warp_openai.batches import Worker

    data = input_path.read_bytes()
    output = output.resolve()
    key = hashlib.sha256(hashlib.sha256(data).digest() + str(output).encode()).hexdigest()[:32]
    store = api.batches.store
    found, _ = store.batches(limit=1, where="json_extract(metadata, '$.warp_job') = ?",
                             args=[key])
    batch = found[0] if found else None
    if batch is not None and batch["status"] not in ("completed", "failed", "expired",
                                                     "cancelled") and not resume:
        done = store.counts(batch["id"])
        raise WarpError(f"an unfinished job writes {output} ({batch['id']}, "
                        f"{done['completed'] + done['failed']} of {batch['total']} lines "
                        "answered): rerun with --resume to continue it")
    if batch is None or not resume:
        f = store.add_file(data, input_path.name, "batch", None)
        api.batches.autostart = False
        obj = api.batches.create_batch({
            "input_file_id": f["id"], "endpoint": endpoint or _endpoint(data),
            "completion_window": "365d", "metadata": {"warp_job": key}})
        batch = store.batch(obj["id"])
    assert batch is not None
    batch_id = batch["id"]

    t0 = time.monotonic()
    start = store.counts(batch_id)
    bar: Progress | None = None

    def on_result(c: dict[str, Any]) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress(c["total"], "batch", unit="lines", stream=stream)
        done = c["completed"] + c["failed"]
        elapsed = time.monotonic() - t0
        tokens = c["completion_tokens"] - start["completion_tokens"]
        rate = (done - start["completed"] - start["failed"]) / elapsed if elapsed else 0.0
        eta = (c["total"] - done) / rate if rate else 0.0
        bar.update_to(done, c["total"], f"{tokens / elapsed if elapsed else 0:.1f} tok/s, "
                                        f"ETA {_seconds(eta)}")

    def default(api: Any, batch_id: str, cb: Callable[[dict[str, Any]], None]) -> str | None:
        return Worker(api, store, concurrency=api.batches.concurrency).run(batch_id, cb)

    try:
        status = (runner or default)(api, batch_id, on_result)
    finally:
        if bar is not None:
            bar.close()
    wall = time.monotonic() - t0
    if status is None:
        raise WarpError(f"another process is running this job ({batch_id}); wait for it "
                        "or stop it")
    row = store.batch(batch_id)
    assert row is not None
    if status == "failed":
        why = "; ".join(e["message"] for e in (row["errors"] or {}).get("data", []))
        raise WarpError(f"the batch failed: {why}")
    from warp_openai.jobs import write_atomic

    output.parent.mkdir(parents=True, exist_ok=True)
    body = store.read_file(row["output_file_id"]) if row["output_file_id"] else b""
    write_atomic(output, iter([body]))
    errors_path = None
    if row["error_file_id"]:
        errors_path = (errors or default_errors_path(output)).resolve()
        write_atomic(errors_path, iter([store.read_file(row["error_file_id"])]))
    elif errors is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(errors)  # an earlier run's errors, stale now
    c = store.counts(batch_id)
    ran = c["completion_tokens"] - start["completion_tokens"]
    return {"batch_id": batch_id, "status": status, "total": row["total"],
            "completed": c["completed"], "failed": c["failed"],
            "prompt_tokens": c["prompt_tokens"], "completion_tokens": c["completion_tokens"],
            "lines_this_run": c["completed"] + c["failed"] - start["completed"]
            - start["failed"], "wall_s": round(wall, 3),
            "tok_s": round(ran / wall, 2) if wall > 0 else 0.0,
            "output": str(output), "errors": str(errors_path) if errors_path else None}


def summary_line(s: dict[str, Any]) -> str:
    """The summary as one line for stderr."""
    files = f"output {s['output']}" + (f", errors {s['errors']}" if s["errors"] else "")
    return (f"warp batch: {s['total']} lines ({s['completed']} completed, {s['failed']} "
            f"failed; {s['lines_this_run']} answered in this run), {s['prompt_tokens']} prompt"
            f" + {s['completion_tokens']} completion tokens, {s['wall_s']:.1f} s wall, "
            f"{s['tok_s']:.1f} tok/s; {files}\n")
