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

from warp_providers import ModelNotFoundError

__all__ = ["SERVE", "ServeCommand"]


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0-65535): {text!r}")
    return port


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
        p.add_argument("--budget")
        p.add_argument("--threads", type=int)
        p.add_argument("--ctx", type=int)

    def run(self, a: argparse.Namespace) -> int:
        """Serve until interrupted; return the exit code."""
        from warp_openai.server import serve

        if not (Path(a.model) / "manifest.json").is_file():
            raise ModelNotFoundError(f"{a.model} is not a warp container")
        # The server says where it listens (the bound port, when --port 0 picked one).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("warp serve: %(message)s"))
        server_log = logging.getLogger("warp_openai")
        server_log.addHandler(handler)
        server_log.setLevel(logging.INFO)
        opts: dict[str, Any] = {"budget": a.budget, "threads": a.threads, "ctx": a.ctx}
        serve(a.model, a.host, a.port, api_key=a.api_key,
              **{k: v for k, v in opts.items() if v is not None})
        return 0


SERVE = ServeCommand()
"""The object the `warp_providers.cli` entry point `serve` names."""
