"""`warp serve`: the OpenAI-compatible HTTP server, as a command the core's CLI discovers.

Owns: the command's arguments and its run; registered under the `warp_providers.cli`
entry-point group by this distribution, so the core's `warp` lists `serve` only when
warp-openai is installed (and otherwise names the package to install).
Refuses: a path that is not a warp container (ModelNotFoundError, one line in the CLI).
Called by: `warp_providers.cli` through the entry point `serve = warp_openai.cli:SERVE`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from warp_providers import ModelNotFoundError, WarpError

__all__ = ["SERVE", "ServeCommand"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0-65535): {text!r}")
    return port


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
        p.add_argument("--budget")
        p.add_argument("--threads", type=int)
        p.add_argument("--ctx", type=int)

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
        opts: dict[str, Any] = {"budget": a.budget, "threads": a.threads, "ctx": a.ctx}
        serve(a.model, a.host, a.port, api_key=a.api_key, cors_origins=a.cors_origin or (),
              ping_interval=a.ping_interval, body_timeout=a.body_timeout,
              keep_alive_timeout=a.keep_alive_timeout, shutdown_timeout=a.shutdown_timeout,
              **{k: v for k, v in opts.items() if v is not None})
        return 0


SERVE = ServeCommand()
"""The object the `warp_providers.cli` entry point `serve` names."""
