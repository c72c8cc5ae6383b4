"""Soak: N short requests of every kind through the OpenAI transport and over HTTP.

Request i has kind i % 6 (sync, async, streaming, cancelled mid-stream, tool-forced,
schema-constrained) and path (i // 6) % 2 (the in-process `warp_transport`, or HTTP to
the `warp serve` server on 127.0.0.1 in this process, so one RSS covers both), all on
one shared engine, `--concurrency` requests in flight (worker threads; each runs its
async requests on its own event loop). A request is an error when it raises or its
reply is not what its kind promises: text and usage; streamed chunks ending in a finish
reason; a cancelled stream that delivered a first chunk and closed; a forced tool call
whose arguments parse (or a reply cut by max_tokens); JSON matching the schema (or cut).

Reported per 10% of the run (by completion order): errors, p50/p95/p99 latency, tok/s
(completion tokens / the decile's wall span) and RSS; then the RSS drift, median RSS of
the last 10% against that of the first 10% (after a warm-up of 600 requests, at least
concurrency x 12: every kind and path on about every worker, and Python's re cache full).
Per-request figures go to arrays
allocated before the run, so the harness itself does not grow. Exits 1 on any error.

    python benchmarks/soak.py [--model DIR] [--requests 10000] [--concurrency 8]
        [--max-tokens 4] [--json out.json]

Without --model it builds the tests' tiny random MoE with tool markers
(tests/conformance/openai/openai_cases.py) in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "integrations" / "openai_shim", ROOT / "tests",
           ROOT / "tests" / "conformance" / "openai"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

KINDS = ("sync", "async", "stream", "cancel", "tool", "schema")
PATHS = ("transport", "http")
KEY = "sk-warp-soak"
SCHEMA = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}},
          "required": ["c"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"], "additionalProperties": False}}}
CONSTRAINED_MAX_TOKENS = 48  # room for the JSON frame; a cut reply is still accepted
# Warm-up before the measured run: Python's re cache (512 patterns) fills up, since the
# chat format compiles one pattern per request (its sentinels carry a nonce).
WARM_REQUESTS = 600


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def body(i: int, kind: str, max_tokens: int) -> dict[str, Any]:
    b: dict[str, Any] = {"model": "m", "max_tokens": max_tokens,
                         "messages": [{"role": "user", "content": f"Item {i}: one word."}]}
    if kind in ("stream", "cancel"):
        b.update(stream=True, stream_options={"include_usage": True})
    elif kind == "tool":
        b.update(tools=[TOOL], tool_choice="required", max_tokens=CONSTRAINED_MAX_TOKENS)
    elif kind == "schema":
        b.update(response_format={"type": "json_schema",
                                  "json_schema": {"name": "c", "schema": SCHEMA}},
                 max_tokens=CONSTRAINED_MAX_TOKENS)
    return b


def check_reply(kind: str, reply: Any) -> int:
    """Completion tokens of a finished reply; raises AssertionError when it is wrong."""
    choice = reply.choices[0]
    finish = choice.finish_reason
    assert finish in ("stop", "length", "tool_calls"), f"finish_reason {finish!r}"
    if kind == "tool" and finish != "length":
        calls = choice.message.tool_calls
        assert calls and calls[0].function.name == "count", f"no forced call: {choice.message}"
        json.loads(calls[0].function.arguments)
    elif kind == "schema" and finish != "length":
        assert json.loads(choice.message.content)["c"] in ("red", "blue")
    else:
        assert isinstance(choice.message.content, str)
    return int(reply.usage.completion_tokens)


def check_stream(chunks: list[Any]) -> int:
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes and finishes[-1] in ("stop", "length"), f"stream ended with {finishes[-1:]}"
    assert chunks[-1].usage is not None, "no usage chunk"
    return int(chunks[-1].usage.completion_tokens)


class Clients:
    """One sync client per path (shared by the workers) and, per worker thread, an event
    loop with one async client per path."""

    def __init__(self, engine: Any, http_base: str) -> None:
        import openai
        from warp_openai import warp_openai_client

        self._engine, self._base = engine, http_base
        self.sync = {"transport": warp_openai_client(engine=engine),
                     "http": openai.OpenAI(api_key=KEY, base_url=http_base, max_retries=0)}
        self._local = threading.local()
        self._loops: list[tuple[asyncio.AbstractEventLoop, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def run_async(self, path: str, fn: Callable[[Any], Any]) -> Any:
        if not hasattr(self._local, "loop"):
            import openai
            from warp_openai import warp_async_openai_client

            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            clients = {"transport": warp_async_openai_client(engine=self._engine),
                       "http": openai.AsyncOpenAI(api_key=KEY, base_url=self._base,
                                                  max_retries=0)}
            self._local.loop, self._local.clients = loop, clients
            with self._lock:
                self._loops.append((loop, clients))
        return self._local.loop.run_until_complete(fn(self._local.clients[path]))

    def close(self) -> None:
        for c in self.sync.values():
            c.close()
        for loop, clients in self._loops:
            for c in clients.values():
                loop.run_until_complete(c.close())
            loop.close()


class Log:
    """Per-request figures in arrays allocated before the run, so that recording them
    does not grow the RSS being measured; only failures keep a message."""

    FIELDS = ("start", "end", "tokens", "rss")

    def __init__(self, n: int) -> None:
        self.a = {f: np.zeros(n) for f in self.FIELDS}
        self.failed = np.zeros(n, dtype=bool)
        self.errors: list[str] = []

    def put(self, i: int, start: float, end: float, tokens: int, err: str | None) -> None:
        for f, v in zip(self.FIELDS, (start, end, tokens, rss_bytes())):
            self.a[f][i] = v
        if err is not None:
            self.failed[i] = True
            self.errors.append(f"{KINDS[i % len(KINDS)]}/{PATHS[(i // len(KINDS)) % 2]} "
                               f"#{i}: {err}")


def one(clients: Clients, i: int, max_tokens: int, log: Log) -> None:
    kind, path = KINDS[i % len(KINDS)], PATHS[(i // len(KINDS)) % len(PATHS)]
    b = body(i, kind, max_tokens)
    client = clients.sync[path]
    t0 = time.perf_counter()
    try:
        if kind == "async":
            async def call(ac: Any) -> int:
                return check_reply(kind, await ac.chat.completions.create(**b))

            tokens = clients.run_async(path, call)
        elif kind == "stream":
            tokens = check_stream(list(client.chat.completions.create(**b)))
        elif kind == "cancel":
            stream = client.chat.completions.create(**b)
            first = next(iter(stream))
            stream.close()  # the client goes away mid-stream
            assert first is not None
            tokens = 1
        else:
            tokens = check_reply(kind, client.chat.completions.create(**b))
        err = None
    except Exception as e:  # every failure is counted and reported
        tokens, err = 0, f"{type(e).__name__}: {e}"[:300]
    log.put(i, t0, time.perf_counter(), tokens, err)


def deciles(log: Log) -> list[dict[str, Any]]:
    order = np.argsort(log.a["end"], kind="stable")
    n = len(order)
    out = []
    for d in range(10):
        part = order[d * n // 10:(d + 1) * n // 10]
        if not len(part):
            continue
        start, end = log.a["start"][part], log.a["end"][part]
        lat = end - start
        span = end.max() - start.min()
        out.append({"decile": d + 1, "requests": int(len(part)),
                    "errors": int(log.failed[part].sum()),
                    "p50_ms": float(np.percentile(lat, 50) * 1e3),
                    "p95_ms": float(np.percentile(lat, 95) * 1e3),
                    "p99_ms": float(np.percentile(lat, 99) * 1e3),
                    "tok_s": float(log.a["tokens"][part].sum() / span) if span > 0 else 0.0,
                    "rss": float(np.median(log.a["rss"][part]))})
    return out


def soak(model: Path, requests: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Runs the soak on `model`; returns the report (see the module docstring)."""
    from warp_openai import WarpAPI
    from warp_openai.server import make_server

    from warp_providers.models import shared_engine

    engine = shared_engine(model)
    httpd = make_server(WarpAPI(engine=engine), "127.0.0.1", 0, api_key=KEY)
    server = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    server.start()
    clients = Clients(engine, f"http://127.0.0.1:{httpd.server_address[1]}/v1")
    n_warm = max(concurrency * len(KINDS) * len(PATHS), WARM_REQUESTS)
    warm, log = Log(n_warm), Log(requests)
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            for _ in pool.map(lambda i: one(clients, i, max_tokens, warm), range(n_warm)):
                pass
            t0 = time.perf_counter()
            for _ in pool.map(lambda i: one(clients, i, max_tokens, log), range(requests)):
                pass
            wall = time.perf_counter() - t0
    finally:
        clients.close()
        httpd.shutdown()
        httpd.server_close()
    parts = deciles(log)
    errors = warm.errors + log.errors
    first, last = parts[0]["rss"], parts[-1]["rss"]
    return {"model": str(model), "requests": requests, "concurrency": concurrency,
            "max_tokens": max_tokens, "wall_s": wall, "errors": len(errors),
            "error_samples": errors[:10], "tokens": int(log.a["tokens"].sum()),
            "deciles": parts, "rss_first": first, "rss_last": last,
            "rss_drift": (last - first) / first}


def print_report(rep: dict[str, Any]) -> None:
    print(f"{rep['requests']} requests at concurrency {rep['concurrency']} in "
          f"{rep['wall_s']:.1f} s ({rep['requests'] / rep['wall_s']:.1f} req/s, "
          f"{rep['tokens'] / rep['wall_s']:.1f} tok/s); errors {rep['errors']}")
    print("decile  requests  errors  p50 ms  p95 ms  p99 ms   tok/s   RSS MiB")
    for p in rep["deciles"]:
        print(f"{p['decile']:6d}  {p['requests']:8d}  {p['errors']:6d}  {p['p50_ms']:6.1f}  "
              f"{p['p95_ms']:6.1f}  {p['p99_ms']:6.1f}  {p['tok_s']:6.1f}  "
              f"{p['rss'] / (1 << 20):8.1f}")
    print(f"RSS drift first 10% -> last 10%: {rep['rss_drift']:+.2%}")
    for s in rep["error_samples"]:
        print("error:", s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
          f"load {os.getloadavg()}; {' '.join(sys.argv)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wp-soak-") as tmp:
        model = a.model
        if model is None:
            from openai_cases import random_tools_moe

            model = random_tools_moe(Path(tmp))
        rep = soak(model, a.requests, a.concurrency, a.max_tokens)
    print_report(rep)
    if a.json:
        a.json.write_text(json.dumps(rep, indent=1))
    sys.exit(1 if rep["errors"] else 0)


if __name__ == "__main__":
    main()
