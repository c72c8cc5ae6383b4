"""`warp serve` and `warp batch`, as commands the core's CLI discovers.

Owns: the commands' arguments and their runs; registered under the `warp_providers.cli`
entry-point group by this distribution, so the core's `warp` lists `serve` and `batch`
only when warp-openai is installed (and otherwise names the package to install).
`serve` is the OpenAI-compatible HTTP server (server.py); `batch` runs an OpenAI batch
input file through the model with progress, resumably (batchfile.py).
Refuses: a path that is not a warp container (ModelNotFoundError, one line in the CLI).
Called by: `warp_providers.cli` through the entry points `serve = warp_openai.cli:SERVE`
and `batch = warp_openai.cli:BATCH`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from warp_providers import ModelNotFoundError, WarpError

__all__ = ["BATCH", "SERVE", "BatchCommand", "ServeCommand"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0-65535): {text!r}")
    return port


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


class ServeCommand:
    """The `warp serve MODEL` subcommand: its help line, its arguments and its run."""

    help = "OpenAI-compatible HTTP server over the same core"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Declare the command's arguments on its subparser."""
        p.add_argument("model")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=_port, default=8000,
                       help="TCP port (default 8000; 0: any free one)")
        p.add_argument("--api-key", help="bearer key clients must send (default: $WARP_API_KEY)")
        p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                       help="an origin browsers may call from (repeatable; '*' for any; "
                            "default: CORS off)")
        p.add_argument("--ping-interval", type=_seconds, default=5.0, metavar="S",
                       help="seconds between SSE ': ping' comments before a stream's first "
                            "token (default 5)")
        p.add_argument("--body-timeout", type=_seconds, default=30.0, metavar="S",
                       help="seconds a request body may take to arrive (default 30)")
        p.add_argument("--keep-alive-timeout", type=_seconds, default=5.0, metavar="S",
                       help="seconds an idle keep-alive connection stays open (default 5)")
        p.add_argument("--shutdown-timeout", type=_seconds, default=30.0, metavar="S",
                       help="seconds in-flight requests get to finish on SIGTERM (default 30)")
        p.add_argument("--jobs-dir", help="where files and batch jobs live (default: jobs "
                       "under the user cache, $WARP_CACHE when set)")
        p.add_argument("--batch-concurrency", type=_positive, default=None, metavar="N",
                       help="lines of a batch in flight at once (default: the engine's "
                            "--max-sequences)")
        p.add_argument("--vision", action="store_true",
                       help="load the model's vision tower, so image_url parts are read")
        p.add_argument("--allow-local-images", metavar="DIR",
                       help="image parts may name files inside DIR (default: refused)")
        _engine_args(p)

    def run(self, a: argparse.Namespace) -> int:
        """Serve until interrupted; return the exit code."""
        try:
            from warp_openai.server import serve
        except ImportError as exc:  # starlette / uvicorn: the serve extra
            raise WarpError(
                f"warp serve needs the server's packages ({exc.name}): "
                "pip install 'warp-openai[serve]'"
            ) from None

        if not (Path(a.model) / "manifest.json").is_file():
            raise ModelNotFoundError(f"{a.model} is not a warp container")
        # The server says where it listens (the bound port, when --port 0 picked one).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warp serve: %(message)s"))
        server_log = logging.getLogger("warp_openai")
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        serve(a.model, a.host, a.port, api_key=a.api_key, cors_origins=a.cors_origin or (),
              ping_interval=a.ping_interval, body_timeout=a.body_timeout,
              keep_alive_timeout=a.keep_alive_timeout, shutdown_timeout=a.shutdown_timeout,
              jobs_dir=a.jobs_dir, batch_concurrency=a.batch_concurrency,
              allow_local_images=a.allow_local_images,
              **({"vision": True} if a.vision else {}), **_engine_opts(a))
        return 0


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget")
    p.add_argument("--threads", type=int)
    p.add_argument("--ctx", type=int)
    p.add_argument("--max-sequences", type=int, metavar="N",
                   help="requests generated at once, batched (default: 4, or what the "
                        "budget holds)")
    p.add_argument("--experts-per-token", type=int, metavar="N",
                   help="routed experts per token, 1..the model's top-k (default: as shipped)")


def _engine_opts(a: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {"budget": a.budget, "threads": a.threads, "ctx": a.ctx,
                            "max_sequences": a.max_sequences,
                            "experts_per_token": a.experts_per_token}
    return {k: v for k, v in opts.items() if v is not None}


class BatchCommand:
    """The `warp batch MODEL INPUT -o OUTPUT` subcommand."""

    help = "run an OpenAI batch input file through a model, resumably"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Declare the command's arguments on its subparser."""
        p.add_argument("model")
        p.add_argument("input", help="OpenAI batch input (JSONL: custom_id, method, url, body)")
        p.add_argument("-o", "--output", required=True, help="where the output lines go")
        p.add_argument("--errors", metavar="FILE",
                       help="where error lines go (default: OUTPUT.errors.jsonl, written "
                            "only when a line failed)")
        p.add_argument("--resume", action="store_true",
                       help="continue the interrupted job of this input and output")
        p.add_argument("--max-concurrency", type=_positive, default=None, metavar="N",
                       help="lines in flight at once (default: 1.5x the engine's "
                            "--max-sequences: each line a sequence of its batched steps, "
                            "the rest queued to take a finished line's sequence at once)")
        p.add_argument("--endpoint", choices=["/v1/chat/completions", "/v1/completions"],
                       help="the endpoint of every line (default: the first line's url)")
        p.add_argument("--jobs-dir", help="where the job's state lives (default: jobs under "
                       "the user cache, $WARP_CACHE when set)")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                       help="answer the lines on Ray (warp-openai[ray]): join the cluster at "
                            "ADDRESS ('auto', 'ray://head:10001'), or start a local instance")
        p.add_argument("--ray-actors", type=_positive, default=2, metavar="N",
                       help="with --ray: engines in the actor pool (default 2)")
        _engine_args(p)

    def run(self, a: argparse.Namespace) -> int:
        """Run the job; print the summary; return the exit code."""
        from warp_openai.api import WarpAPI
        from warp_openai.batchfile import default_concurrency, run_file, summary_line
        from warp_providers import release, shared_engine

        if not (Path(a.model) / "manifest.json").is_file():
            raise ModelNotFoundError(f"{a.model} is not a warp container")
        source = Path(a.input)
        if not source.is_file():
            raise FileNotFoundError(f"no such input file: {a.input}")
        runner = None
        if a.ray is not None:
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise WarpError("warp batch --ray needs Ray: pip install 'warp-openai[ray]'")
            from warp_openai.ray_batch import ray_runner

            runner = ray_runner(str(Path(a.model).resolve()), address=a.ray or None,
                                actors=a.ray_actors, engine_options=_engine_opts(a))
        engine = shared_engine(a.model, **_engine_opts(a))
        concurrency = a.max_concurrency or default_concurrency(
            int(engine.info().get("max_sequences") or 1))
        api = WarpAPI(engine=engine, on_close=lambda: release(engine), jobs_dir=a.jobs_dir,
                      batch_concurrency=concurrency)
        try:
            summary = run_file(api, source, Path(a.output),
                               errors=Path(a.errors) if a.errors else None, resume=a.resume,
                               endpoint=a.endpoint, runner=runner)
        finally:
            api.close()
        sys.stderr.write(summary_line(summary))
        if a.json:
            sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return 0


SERVE = ServeCommand()
"""The object the `warp_providers.cli` entry point `serve` names."""
BATCH = BatchCommand()
"""The object the `warp_providers.cli` entry point `batch` names."""
