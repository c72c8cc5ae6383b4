"""`warp serve` on a real loopback socket: CORS, SSE pings, timeouts, graceful shutdown, metrics.

The engines are scripted (`fake_engine.py`): a slow prefill is a sleep before the first
token, an endless reply is a long script paced per token, so every timing here is a
bound the server must meet, not a speed the machine must have.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from fake_engine import BYTES_PER_TOKEN, ScriptedEngine
from openai_cases import USER, CountingEngine

pytestmark = pytest.mark.enable_socket


class SlowEngine(ScriptedEngine):
    """A scripted engine whose prefill takes `prefill_s`, and each token `token_s`."""

    def __init__(self, *args: Any, prefill_s: float = 0.0, token_s: float = 0.0,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.prefill_s = prefill_s
        self.token_s = token_s
        self.first_token_at: float | None = None
        self.finished = threading.Event()
        self.produced = 0

    def stream(self, prompt: Any, **kw: Any) -> Any:
        self.finished.clear()
        self.produced = 0
        try:
            time.sleep(self.prefill_s)
            for ev in super().stream(prompt, **kw):
                if self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                self.produced += 1
                yield ev
                time.sleep(self.token_s)
        finally:
            self.finished.set()


@pytest.fixture
def serve():
    from warp_openai import WarpAPI
    from warp_openai.server import make_server

    servers = []

    def start(engine: Any, **kw: Any) -> Any:
        httpd = make_server(WarpAPI(engine=engine), "127.0.0.1", 0, **kw)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.thread = thread
        servers.append(httpd)
        return httpd

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


# --------------------------------------------------------------------------- CORS
def test_cors_preflight_and_request(serve):
    import httpx

    origin = "http://ui.example:3000"
    url = serve(ScriptedEngine(["ok"]), api_key="k", cors_origins=[origin]).url
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(url + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200  # answered before auth: a browser sends no key here
    assert r.headers["access-control-allow-origin"] == origin
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    r = httpx.post(url + "/v1/chat/completions", json={"messages": USER},
                   headers={"Origin": origin, "Authorization": "Bearer k"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    # an origin not listed gets no grant
    r = httpx.options(url + "/v1/chat/completions",
                      headers={**preflight, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    assert r.status_code >= 400


def test_cors_is_off_by_default(serve):
    import httpx

    url = serve(ScriptedEngine(["ok"])).url
    r = httpx.options(url + "/v1/chat/completions",
                      headers={"Origin": "http://ui.example",
                               "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.post(url + "/v1/chat/completions", json={"messages": USER},
                   headers={"Origin": "http://ui.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# --------------------------------------------------------------------------- SSE pings
def test_sse_pings_before_the_first_token_of_a_slow_prefill(serve):
    import httpx

    engine = SlowEngine(["Hello"], prefill_s=1.5)
    url = serve(engine, ping_interval=0.2).url
    lines: list[tuple[float, str]] = []
    with httpx.stream("POST", url + "/v1/chat/completions",
                      json={"messages": USER, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append((time.monotonic(), line))
    first_data = next(i for i, (_, line) in enumerate(lines) if line.startswith("data: "))
    pings = [t for t, line in lines[:first_data] if line == ": ping"]
    assert len(pings) >= 3, lines[:first_data]  # ~1.5 s of prefill at 0.2 s a ping
    assert engine.first_token_at is not None and pings[0] < engine.first_token_at
    # pings only fill the silence before the first token; the SDK skips them
    assert all(not line.startswith(":") for _, line in lines[first_data:])
    assert lines[-1][1] == "data: [DONE]"


def test_the_sdk_reads_a_stream_with_pings(serve):
    import openai

    url = serve(SlowEngine(["Hello there"], prefill_s=0.8), ping_interval=0.1).url
    client = openai.OpenAI(api_key="x", base_url=url + "/v1", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello there"
    client.close()


# --------------------------------------------------------------------------- timeouts
def test_idle_keep_alive_connection_is_closed(serve):
    url = serve(ScriptedEngine(["ok"]), keep_alive_timeout=0.5).url
    with _connect(url) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        out = b""
        while not out.endswith(b"}"):
            out += s.recv(65536)
        assert out.startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert s.recv(65536) == b""  # the server closed the idle connection
        idle = time.monotonic() - idle_from
    assert 0.3 < idle < 5, idle


def test_slow_body_is_timed_out(serve):
    url = serve(ScriptedEngine(["ok"]), body_timeout=0.5).url
    body = json.dumps({"messages": USER}).encode()
    with _connect(url) as s:
        s.sendall(_post("/v1/chat/completions", body)[: -len(body) + 5])  # 5 bytes of it
        t0 = time.monotonic()
        out = b""
        while True:
            got = s.recv(65536)
            if not got:
                break
            out += got
        waited = time.monotonic() - t0
    assert out.startswith(b"HTTP/1.1 408"), out
    head, payload = out.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head.lower()
    err = json.loads(payload)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "did not arrive within 0.5 seconds" in err["message"]
    assert 0.4 < waited < 5, waited


# --------------------------------------------------------------------------- shutdown
def _stream_reader(url: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Reads one stream to its end on a thread; `state` fills in as it goes."""
    import httpx

    state: dict[str, Any] = {"lines": [], "started": threading.Event(), "error": None}

    def read() -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                              timeout=30) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        state["lines"].append(line)
                        state["started"].set()
        except Exception as exc:  # a dropped connection: the test fails on it
            state["error"] = exc
        finally:
            state["started"].set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, state


def test_shutdown_lets_an_in_flight_stream_finish(serve):
    gate = threading.Event()
    engine = CountingEngine(["finish me"], gate=gate)
    httpd = serve(engine, shutdown_timeout=20)
    reader, state = _stream_reader(httpd.url, {"messages": USER, "stream": True})
    assert state["started"].wait(10)
    stopper = threading.Thread(target=httpd.shutdown, daemon=True)
    stopper.start()
    time.sleep(0.5)
    with pytest.raises(OSError):  # no new connections while draining
        _connect(httpd.url).close()
    assert stopper.is_alive()  # it waits for the stream
    gate.set()
    reader.join(10)
    stopper.join(10)
    assert not stopper.is_alive() and state["error"] is None
    assert state["lines"][-1] == "data: [DONE]"
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in state["lines"][:-1] if json.loads(line[6:])["choices"])
    assert text == "finish me"


def test_shutdown_cancels_a_stream_that_outlasts_the_grace(serve):
    engine = SlowEngine(["x" * 100000], token_s=0.005)
    httpd = serve(engine, shutdown_timeout=0.5)
    reader, state = _stream_reader(httpd.url, {"messages": USER, "stream": True})
    assert state["started"].wait(10)
    t0 = time.monotonic()
    httpd.shutdown()
    took = time.monotonic() - t0
    reader.join(10)
    assert 0.4 < took < 10, took
    assert state["error"] is None  # the stream ended cleanly, not by a cut connection
    last = json.loads(state["lines"][-1][6:])
    assert last["error"]["type"] == "server_shutdown"
    assert engine.finished.wait(5) and engine.produced < 100000  # generation stopped


def test_sigterm_drains_and_exits_zero(tmp_path):
    """`warp serve`'s process path: SIGTERM with a stream in flight, exit status 0."""
    import signal
    from pathlib import Path

    import httpx

    script = Path(__file__).with_name("serve_scripted.py")
    p = subprocess.Popen([sys.executable, str(script), "65536"], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(url + "/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 200
        reader, state = _stream_reader(url, {"messages": USER, "stream": True})
        state["started"].wait(10)
        p.send_signal(signal.SIGTERM)
        reader.join(20)
        assert state["error"] is None and state["lines"][-1] == "data: [DONE]"
    finally:
        p.wait(timeout=60)
    assert p.returncode == 0


# --------------------------------------------------------------------------- metrics
def test_metrics_are_labelled_by_route_template(serve):
    import httpx

    url = serve(ScriptedEngine(["ok"])).url
    for name in ("a", "b", "scripted"):
        httpx.get(url + f"/v1/models/{name}")
    for path in ("/x/1", "/x/2", "/v1/nope"):
        httpx.post(url + path, json={})
    httpx.post(url + "/v1/chat/completions/", json={"messages": USER})  # trailing slash
    text = httpx.get(url + "/metrics").text
    assert 'warp_requests_total{route="/v1/models/{model:path}",status="404"} 2' in text
    assert 'warp_requests_total{route="/v1/models/{model:path}",status="200"} 1' in text
    assert 'warp_requests_total{route="unmatched",status="404"} 3' in text
    assert 'warp_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    for raw_path in ("/x/1", "/v1/models/a", "/v1/nope"):
        assert f'"{raw_path}"' not in text


def test_responses_routes_over_http_with_their_methods_and_templates(serve):
    """Create (blocking and streamed), GET, input_items, DELETE: each reaches the Responses
    store through its own method, and /metrics counts each under its template, with the
    tokens of both generations."""
    import httpx

    url = serve(ScriptedEngine(["ok", "fine"])).url
    with httpx.Client(base_url=url) as c:
        made = c.post("/v1/responses", json={"input": "hi"})
        assert made.status_code == 200, made.text
        ident = made.json()["id"]
        with c.stream("POST", "/v1/responses", json={"input": "again", "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        assert events[-1]["type"] == "response.completed", events[-1]
        streamed = events[-1]["response"]
        got = c.get(f"/v1/responses/{ident}")
        assert got.status_code == 200 and got.json() == made.json()
        items = c.get(f"/v1/responses/{ident}/input_items").json()
        assert [i["content"][0]["text"] for i in items["data"]] == ["hi"]
        assert c.post(f"/v1/responses/{ident}", json={}).status_code == 404  # no such method
        gone = c.delete(f"/v1/responses/{ident}")
        assert gone.status_code == 200 and gone.json()["deleted"] is True
        missing = c.get(f"/v1/responses/{ident}")
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"
        assert c.delete(f"/v1/responses/{ident}").status_code == 404
        text = c.get("/metrics").text
    assert 'warp_requests_total{route="/v1/responses",status="200"} 2' in text
    assert 'warp_requests_total{route="/v1/responses/{response_id}",status="200"} 2' in text
    assert 'warp_requests_total{route="/v1/responses/{response_id}",status="404"} 2' in text
    assert ('warp_requests_total{route="/v1/responses/{response_id}/input_items",'
            'status="200"} 1') in text
    assert 'warp_requests_total{route="unmatched",status="404"} 1' in text
    assert ident not in text
    blocking, stream = made.json()["warp"], streamed["warp"]
    assert stream["bytes_read"] >= BYTES_PER_TOKEN  # the streamed one counts too
    n = blocking["tokens_generated"] + stream["tokens_generated"]
    assert f"warp_tokens_generated_total {n}\n" in text
    assert f"warp_bytes_read_total {blocking['bytes_read'] + stream['bytes_read']}\n" in text


# --------------------------------------------------------------------------- hostile, live
def test_a_lone_surrogate_is_a_400_naming_the_field_and_the_connection_lives(serve):
    url = serve(ScriptedEngine(["ok"])).url
    bad = b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'
    good = json.dumps({"messages": USER}).encode()
    with _connect(url) as s:
        s.sendall(_post("/v1/chat/completions", bad) + _post("/v1/chat/completions", good))
        out = b""
        while out.count(b"HTTP/1.1 ") < 2 or not out.rstrip().endswith(b"}"):
            out += s.recv(65536)
    first, second = out.split(b"HTTP/1.1 ")[1:3]
    assert first.startswith(b"400")
    err = json.loads(first.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["param"] == "messages[0].content" and err["code"] == "invalid_unicode"
    assert second.startswith(b"200")


def test_the_core_does_not_import_the_http_stack():
    code = ("import sys; import warp_providers, warp_providers.cli, warp_providers.session, "
            "warp_openai; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('starlette', 'uvicorn')]; assert not bad, bad")
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
