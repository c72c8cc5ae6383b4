"""`python serve_scripted.py MAX_BODY`: `warp serve`'s HTTP server over the scripted engine.

Prints `port N` once bound on 127.0.0.1, then serves until SIGTERM. A process of its own,
so a test's client and this server do not share one interpreter's lock (in one process,
loopback requests there take several times longer).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE.parents[2] / "integrations" / "openai_shim", HERE.parents[1], HERE.parents[2]):
    sys.path.insert(0, str(p))

from fake_engine import ScriptedEngine  # noqa: E402
from warp_openai import WarpAPI  # noqa: E402
from warp_openai.server import make_server  # noqa: E402


def main() -> None:
    max_body = int(sys.argv[1])
    api = WarpAPI(engine=ScriptedEngine(["ok"], ctx_tokens=4096), max_body=max_body)
    httpd = make_server(api, "127.0.0.1", 0, max_body=max_body)
    sys.stdout.write(f"port {httpd.server_address[1]}\n")
    sys.stdout.flush()
    httpd.serve_forever()
    httpd.server_close()


if __name__ == "__main__":
    main()
