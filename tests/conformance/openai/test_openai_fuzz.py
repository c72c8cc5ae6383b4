"""Hostile request bodies on every POST route, in-process and over HTTP (>= 5,000 per run).

Table-driven: `ROUTES` maps each POST route to a builder of a valid body and the member
its blocking reply must have; `CLASSES` maps each kind of hostility to a mutator of a valid
body (structural mutations, lone UTF-16 surrogates, nesting past `MAX_DEPTH`, oversized
bodies and fields, broken JSON). A new route (files, batches) joins by adding its row to
`ROUTES`.

Asserted for every body: no 5xx, no exception out of the transport, no dropped
connection, every 4xx an OpenAI error body, every 200 a complete reply (a stream ends
with `data: [DONE]` and carries no error event); where the class fixes the answer (a
surrogate: a 400 naming the field it was put in) that answer. Afterwards the model still
answers. `WARP_FUZZ_SEED` picks another draw.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_engine import ScriptedEngine
from openai_cases import WEATHER

N_INPROC = 5000
"""Bodies sent through the in-process transport per run."""
N_HTTP = 5000
"""Bodies sent to `warp serve`'s HTTP server per run."""
MAX_BODY = 64 * 1024
"""The body cap of the fuzzed surfaces (small, so oversized bodies are cheap to send)."""
SEED = int(os.environ.get("WARP_FUZZ_SEED", "20261201"))

Body = dict[str, Any]


# --------------------------------------------------------------------------- valid bodies
def _text(rng: random.Random) -> str:
    return rng.choice(["hi", "What is 2+2?", "héllo wörld", "日本語", "emoji 😀", "", " "])


def _chat(rng: random.Random) -> Body:
    body: Body = {"model": "m", "messages": [{"role": "user", "content": _text(rng) or "hi"}]}
    if rng.random() < 0.3:
        body["messages"].insert(0, {"role": "system", "content": _text(rng)})
    if rng.random() < 0.2:
        body["messages"].append({"role": "assistant", "content": [{"type": "text",
                                                                   "text": _text(rng)}]})
        body["messages"].append({"role": "user", "content": "again"})
    if rng.random() < 0.3:
        body["tools"] = [copy.deepcopy(WEATHER)]
    for key, values in (("stream", [True, False]), ("max_tokens", [1, 4, 64]),
                        ("temperature", [0, 0.7, 2]), ("stop", ["k", ["o", "zz"]]),
                        ("seed", [1, 2**70]), ("stream_options", [{"include_usage": True}])):
        if rng.random() < 0.3:
            body[key] = rng.choice(values)
    return body


def _completion(rng: random.Random) -> Body:
    body: Body = {"model": "m", "prompt": _text(rng) or "Once"}
    for key, values in (("stream", [True, False]), ("max_tokens", [1, 4, 64]),
                        ("temperature", [0, 1]), ("stop", ["k", ["o"]]),
                        ("stream_options", [{"include_usage": True}])):
        if rng.random() < 0.3:
            body[key] = rng.choice(values)
    return body


def _response(rng: random.Random) -> Body:
    body: Body = {"model": "m", "input": _text(rng) or "hi"}
    if rng.random() < 0.4:
        body["input"] = [{"role": "user", "content": [{"type": "input_text",
                                                       "text": _text(rng) or "hi"}]}]
        if rng.random() < 0.3:
            body["input"].insert(0, {"role": "assistant", "content": _text(rng)})
    if rng.random() < 0.3:
        body["instructions"] = _text(rng)
    if rng.random() < 0.3:
        fn = WEATHER["function"]
        body["tools"] = [{"type": "function", "name": fn["name"],
                          "description": fn["description"],
                          "parameters": copy.deepcopy(fn["parameters"])}]
    for key, values in (("stream", [True, False]), ("max_output_tokens", [1, 4, 64]),
                        ("temperature", [0, 0.7]), ("store", [True, False]),
                        ("text", [{"format": {"type": "text"}}, {"format": {"type": "json_object"}}])):
        if rng.random() < 0.3:
            body[key] = rng.choice(values)
    return body


ROUTES: dict[str, tuple[Callable[[random.Random], Body], str]] = {
    "/v1/chat/completions": (_chat, "choices"),
    "/v1/completions": (_completion, "choices"),
    "/v1/responses": (_response, "output"),
}
"""Every POST route: a builder of a valid body for it, and its blocking reply's member."""


# --------------------------------------------------------------------------- hostility
def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys / indexes) inside a JSON value."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


def _name(path: tuple[Any, ...]) -> str:
    """The `param` spelling of a path: messages[0].content."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


def _set(value: Any, path: tuple[Any, ...], new: Any) -> None:
    _get(value, path[:-1])[path[-1]] = new


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 3, 10**30, -(10**30), 2**63])
    if kind == 3:
        return rng.choice([0.5, -2.5, 1e308, -1e-308, 3.0])
    if kind in (4, 5):
        return rng.choice(["", "user", "auto", "none", "x" * 50, "required", "json_object",
                           "function", "\u0000", "\u202e"])
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["type", "role", "content", "name", "function", "text", "json_schema", "schema",
            "arguments", "url", "image_url", "include_usage", "strict", "parameters",
            "format", "effort", "call_id", "output"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def mutate(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None] | None]:
    """Structural mutations: values replaced, keys dropped or added, wrong types."""
    for _ in range(rng.randrange(1, 4)):
        paths = [p for p in _paths(body) if p]
        op = rng.randrange(3)
        if op == 0 and paths:
            _set(body, rng.choice(paths), _random_value(rng))
        elif op == 1 and paths:
            path = rng.choice(paths)
            parent = _get(body, path[:-1])
            del parent[path[-1]]
        else:
            targets = [p for p in _paths(body) if isinstance(_get(body, p), dict)]
            key = rng.choice(["tools", "tool_choice", "response_format", "n", "top_p", "top_k",
                              "logprobs", "top_logprobs", "reasoning_effort", "thinking",
                              "messages", "prompt", "stop", "max_completion_tokens", "min_p",
                              "presence_penalty", "parallel_tool_calls", "content", "role",
                              "input", "instructions", "max_output_tokens", "text", "store",
                              "reasoning", "previous_response_id", "background"])
            _get(body, rng.choice(targets))[key] = _random_value(rng)
    return body, None


_SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"]


def surrogate(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None]]:
    """A lone surrogate in a string or a key anywhere: a 400 naming that field."""
    lone = rng.choice(_SURROGATES)
    strings = [p for p in _paths(body) if p and isinstance(_get(body, p), str)]
    keyed = [p for p in _paths(body) if p and isinstance(p[-1], str)]
    if strings and rng.random() < 0.7:
        path = rng.choice(strings)
        old = _get(body, path)
        i = rng.randrange(len(old) + 1)
        _set(body, path, old[:i] + lone + old[i:])
        blamed = _name(path)
    else:
        path = rng.choice(keyed)
        parent = _get(body, path[:-1])
        new_key = path[-1] + lone
        parent[new_key] = parent.pop(path[-1])
        blamed = _name((*path[:-1], path[-1] + lone.encode("utf-8", "backslashreplace").decode()))

    def check(err: dict[str, Any]) -> None:
        assert err["code"] == "invalid_unicode" and err["param"] == blamed, (err, blamed)

    return body, check


def deep(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None]]:
    """A value nested past the limit, as arrays or objects, at any field (as raw JSON)."""
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    depth = rng.choice([65, 100, 1000, 5000, 10000 if opener == "[" else 6000])  # < MAX_BODY
    path = rng.choice([p for p in _paths(body) if p])
    marker = "\u0001deep\u0001"
    _set(body, path, marker)
    text = json.dumps(body).replace(json.dumps(marker), opener * depth + "1" + closer * depth)

    def check(err: dict[str, Any]) -> None:
        assert "nests deeper than" in err["message"], err

    return text.encode(), check


def oversized(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None]]:
    """A body over the cap (a 413), or a field over its own limit (a 400 naming it)."""
    kind = rng.randrange(3)
    if kind == 0:
        body["pad"] = "x" * (MAX_BODY + rng.randrange(1, 4096))

        def check(err: dict[str, Any]) -> None:
            assert f"may not exceed {MAX_BODY} bytes" in err["message"], err

    elif kind == 1:
        body["stop"] = [f"s{i}" for i in range(rng.randrange(17, 40))]

        def check(err: dict[str, Any]) -> None:
            assert err["param"] == "stop", err

    else:  # an array over MAX_ARRAY_ITEMS, written compactly to stay under the body cap
        from warp_openai.api import MAX_ARRAY_ITEMS

        n = MAX_ARRAY_ITEMS + 1
        marker = "\u0001big\u0001"
        field = rng.choice(["messages", "tools", "stop", "x"])
        body[field] = marker
        text = json.dumps(body).replace(json.dumps(marker), "[" + ",".join("0" * n) + "]")
        return text.encode(), lambda err: None  # the byte cap or the array limit, both 4xx

    return body, check


def broken(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None] | None]:
    """Not a JSON object: truncated, binary, non-standard constants, huge numbers."""
    text = json.dumps(body)
    kind = rng.randrange(6)
    if kind == 0:
        return text[: rng.randrange(len(text))].encode(), None
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), None
    if kind == 2:
        return text.replace("{", "{\"temperature\": " + rng.choice(["NaN", "Infinity",
                                                                    "-Infinity"]) + ",",
                            1).encode(), None
    if kind == 3:
        return text.replace("{", '{"seed": ' + "9" * 5000 + ",", 1).encode(), None
    if kind == 4:
        return rng.choice([b"[]", b"null", b"1", b'"x"', b"true", b""]), None
    # invalid UTF-8: a surrogate encoded as bytes, an overlong form, a stray continuation
    bad = rng.choice([b"\xed\xa0\x80", b"\xc0\xaf", b"\x80", b"\xff"])
    return text.encode().replace(b'"m"', b'"m' + bad + b'"', 1), None


def valid(rng: random.Random, body: Body) -> tuple[Body | bytes, Callable[[Any], None] | None]:
    """Untouched: whatever the answer, it is a complete one."""
    return body, None


CLASSES: dict[str, tuple[Callable[..., Any], float]] = {
    "valid": (valid, 0.10),
    "mutate": (mutate, 0.35),
    "surrogate": (surrogate, 0.20),
    "deep": (deep, 0.12),
    "oversized": (oversized, 0.08),
    "broken": (broken, 0.15),
}
"""Each class of body, its mutator and its share of the draw."""


def draws(n: int, seed: int) -> list[tuple[str, str, bytes, Callable[[Any], None] | None]]:
    """`n` (route, class, raw body, extra check) tuples; every route meets every class."""
    rng = random.Random(seed)
    names = list(CLASSES)
    weights = [CLASSES[c][1] for c in names]
    pairs = [(r, c) for r in ROUTES for c in names]  # each pair at least once
    pairs += [(rng.choice(list(ROUTES)), rng.choices(names, weights)[0])
              for _ in range(n - len(pairs))]
    out = []
    for route, cls in pairs:
        body, check = CLASSES[cls][0](rng, ROUTES[route][0](rng))
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append((route, cls, raw, check))
    return out


# --------------------------------------------------------------------------- checks
def check_response(route: str, status: int, headers: Any, data: bytes, cls: str,
                   check: Callable[[Any], None] | None) -> None:
    assert status < 500, (status, data[:300])
    if status >= 400:
        assert headers["content-type"].startswith("application/json"), headers
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"], err
        assert isinstance(err["type"], str) and err["type"], err
        assert err["param"] is None or isinstance(err["param"], str), err
        if check is not None:
            check(err)
        return
    assert status == 200, status
    assert check is None, f"a {cls} body was answered 200"
    if headers["content-type"].startswith("text/event-stream"):
        events = [line for line in data.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]", data[-300:]
        for e in events[:-1]:
            assert "error" not in json.loads(e[6:]), e
    else:
        assert ROUTES[route][1] in json.loads(data)


def _run(send: Callable[[str, bytes], tuple[int, Any, bytes]], bodies: list[Any]) -> dict:
    seen: dict[str, int] = {}
    for route, cls, raw, check in bodies:
        try:
            status, headers, data = send(route, raw)
        except Exception as exc:  # out of the transport, or a dropped connection
            raise AssertionError(f"{cls} body on {route} raised {exc!r}: {raw[:200]!r}") from exc
        try:
            check_response(route, status, headers, data, cls, check)
        except AssertionError as exc:
            raise AssertionError(f"{cls} body on {route}: {exc}; body {raw[:200]!r}") from exc
        key = f"{route} {cls} {status}"
        seen[key] = seen.get(key, 0) + 1
    return seen


def _still_answers(send: Callable[[str, bytes], tuple[int, Any, bytes]]) -> None:
    status, _, data = send("/v1/chat/completions",
                           json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
    assert status == 200 and json.loads(data)["choices"][0]["message"]["content"] == "ok"
    status, _, data = send("/v1/completions", json.dumps({"prompt": "hi"}).encode())
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "ok"
    status, _, data = send("/v1/responses", json.dumps({"input": "hi"}).encode())
    assert status == 200
    texts = [part["text"] for item in json.loads(data)["output"] if item["type"] == "message"
             for part in item["content"]]
    assert texts == ["ok"], data


def _api() -> Any:
    from warp_openai import WarpAPI

    return WarpAPI(engine=ScriptedEngine(["ok"], ctx_tokens=4096), max_body=MAX_BODY)


def _report(where: str, n: int, seconds: float, seen: dict[str, int]) -> None:
    by_class: dict[str, int] = {}
    for key, count in seen.items():
        _, cls, _ = key.split(" ")
        by_class[cls] = by_class.get(cls, 0) + count
    print(f"\n{where}: {n} bodies in {seconds:.1f} s (seed {SEED}): {by_class}")


def test_fuzz_in_process_transport():
    import httpx
    from warp_openai import WarpTransport

    bodies = draws(N_INPROC, SEED)
    client = httpx.Client(transport=WarpTransport(_api()), base_url="http://warp.invalid")

    def send(route: str, raw: bytes) -> tuple[int, Any, bytes]:
        with client.stream("POST", route, content=raw,
                           headers={"content-type": "application/json"}) as r:
            return r.status_code, r.headers, r.read()

    t0 = time.perf_counter()
    seen = _run(send, bodies)
    _report("in-process", len(bodies), time.perf_counter() - t0, seen)
    _still_answers(send)
    for route in ROUTES:  # every route met every class, and valid bodies were answered
        for cls in CLASSES:
            assert any(k.startswith(f"{route} {cls} ") for k in seen), (route, cls)
        assert seen.get(f"{route} valid 200"), route
    client.close()


@pytest.mark.enable_socket
def test_fuzz_over_http():
    import httpx

    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("serve_scripted.py")), str(MAX_BODY)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("port "), line
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        bodies = draws(N_HTTP, SEED + 1)
        # No Nagle on the client: it writes headers and body apart, and the second write
        # would wait for the server's delayed ACK.
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        client = httpx.Client(base_url=url, timeout=30,
                              transport=httpx.HTTPTransport(socket_options=nodelay))

        def send(route: str, raw: bytes) -> tuple[int, Any, bytes]:
            with client.stream("POST", route, content=raw,
                               headers={"content-type": "application/json"}) as r:
                return r.status_code, r.headers, r.read()

        t0 = time.perf_counter()
        seen = _run(send, bodies)
        _report("over HTTP", len(bodies), time.perf_counter() - t0, seen)
        _still_answers(send)
        client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert server.returncode == 0  # it shut down cleanly: nothing in it crashed
    for route in ROUTES:
        for cls in CLASSES:
            assert any(k.startswith(f"{route} {cls} ") for k in seen), (route, cls)
