"""`warp serve`'s HTTP server on 127.0.0.1: the same core, auth, body cap, SSE, disconnects."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from fake_engine import ScriptedEngine
from openai_cases import USER, WEATHER, CountingEngine, tool_call_text

pytestmark = pytest.mark.enable_socket


@pytest.fixture
def serve():
    from warp_openai import WarpAPI
    from warp_openai.server import make_server

    servers = []

    def start(engine, api_key=None, max_body=None):
        kw = {"max_body": max_body} if max_body else {}
        httpd = make_server(WarpAPI(engine=engine), "127.0.0.1", 0, api_key=api_key, **kw)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_openai_client_over_http(serve):
    import openai

    reply = tool_call_text("get_weather", {"city": "Lima"})
    url = serve(ScriptedEngine(["<think>t</think>Hello", reply, "plain"]), api_key="k")
    client = openai.OpenAI(api_key="k", base_url=url + "/v1", max_retries=0)
    r = client.chat.completions.create(model="m", messages=USER)
    assert r.choices[0].message.content == "Hello"
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=USER,
            tools=[WEATHER],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert len({c.id for c in chunks}) == 1
    assert [m.id for m in client.models.list()] == ["scripted"]
    bad = openai.OpenAI(api_key="wrong", base_url=url + "/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=USER, n=2)
    client.close()
    bad.close()


def raw(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(data)
        out = b""
        while True:
            got = s.recv(65536)
            if not got:
                return out
            out += got


def test_health_metrics_and_auth(serve):
    import httpx

    url = serve(ScriptedEngine(["ok"]), api_key="k")
    assert httpx.get(url + "/health").json()["status"] == "ok"  # exempt from auth
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.post(url + "/v1/nope", json={}).status_code == 401  # auth before routing
    h = {"Authorization": "Bearer k"}
    assert (
        httpx.post(url + "/v1/chat/completions", json={"messages": USER}, headers=h).status_code
        == 200
    )
    metrics = httpx.get(url + "/metrics", headers=h).text
    assert 'warp_requests_total{route="/v1/chat/completions",status="200"} 1' in metrics
    assert "warp_tokens_generated_total 3" in metrics and "warp_expert_hit_rate" in metrics


def test_metrics_sum_what_the_replies_reported(serve):
    """/metrics is Prometheus text whose counters add up the replies' `warp` objects."""
    import httpx

    url = serve(ScriptedEngine(["Hello there!", "ok"]))
    stats = [httpx.post(url + "/v1/chat/completions", json={"messages": USER}).json()["warp"]
             for _ in range(2)]
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    values = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            assert line.split()[3] in ("counter", "gauge")
        elif line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values['warp_requests_total{route="/v1/chat/completions",status="200"}'] == 2
    assert values["warp_tokens_generated_total"] == sum(w["tokens_generated"] for w in stats)
    assert values["warp_bytes_read_total"] == sum(w["bytes_read"] for w in stats)
    hits = sum(w["experts_hit"] for w in stats)
    lookups = hits + sum(w["experts_missed"] for w in stats)
    assert values["warp_expert_hit_rate"] == pytest.approx(hits / lookups if lookups else 0.0,
                                                           abs=1e-6)
    seconds = values["warp_generation_seconds_total"]
    assert seconds > 0
    assert values["warp_tokens_per_second"] == pytest.approx(
        values["warp_tokens_generated_total"] / seconds, rel=1e-3)


@pytest.mark.parametrize("host,key,warns", [("0.0.0.0", None, True), ("0.0.0.0", "k", False),
                                            ("127.0.0.1", None, False)])
def test_open_binding_without_a_key_warns(caplog, host, key, warns):
    from warp_openai import WarpAPI
    from warp_openai.server import make_server

    with caplog.at_level("WARNING", logger="warp_openai.server"):
        httpd = make_server(WarpAPI(engine=ScriptedEngine()), host, 0, api_key=key)
    httpd.server_close()
    warned = [r for r in caplog.records if "without an API key" in r.getMessage()]
    assert bool(warned) is warns


# (HTTP drops whitespace around a header value, so "Bearer k " reaches the check as "Bearer k")
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "bearer k", "Basic k", "Bearer  k"])
def test_missing_or_wrong_key_is_401_before_the_body_is_read(serve, auth):
    """The body is never sent: a server that read it before checking the key would hang."""
    url = serve(ScriptedEngine(["ok"]), api_key="k")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
    if auth is not None:
        head += b"Authorization: " + auth.encode() + b"\r\n"
    out = raw(url, head + b"\r\n")
    assert out.startswith(b"HTTP/1.1 401")
    error = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["type"] == "authentication_error" and error["message"] == "invalid API key"


def test_key_checks_with_the_sdk(serve):
    import httpx
    import openai

    url = serve(ScriptedEngine(["ok"]), api_key="k")
    for key in ("wrong", "k2", "K"):
        client = openai.OpenAI(api_key=key, base_url=url + "/v1", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="m", messages=USER)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
        client.close()
    for method in ("GET", "POST"):  # no Authorization header at all
        path = "/v1/models" if method == "GET" else "/v1/chat/completions"
        r = httpx.request(method, url + path, json={"messages": USER})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    client = openai.OpenAI(api_key="k", base_url=url + "/v1", max_retries=0)
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    client.close()


def test_body_rules(serve):
    url = serve(ScriptedEngine(["ok"]), max_body=1000)
    host, port = url.removeprefix("http://").split(":")
    # Over the cap but sent: a 413, the body is read and dropped, the connection stays usable.
    body = json.dumps({"messages": USER, "pad": "x" * 5000}).encode()
    ok = json.dumps({"messages": USER}).encode()
    with socket.create_connection((host, int(port)), timeout=5) as s:
        for data in (body, ok):
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(data)).encode() + b"\r\n\r\n" + data)
        out = b""
        while out.count(b"HTTP/1.1 ") < 2 or not out.rstrip().endswith(b"}"):
            out += s.recv(65536)
    first, second = out.split(b"HTTP/1.1 ")[1:3]
    assert first.startswith(b"413") and b"may not exceed 1000 bytes" in first
    assert second.startswith(b"200") and b'"content":"ok"' in second.replace(b" ", b"")
    # Declared far over the cap: refused before reading, connection closed (never sent).
    out = raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
              + str(1000 + (2 << 20)).encode() + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413") and b"may not exceed 1000 bytes" in out
    out = raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411")
    # The default cap (64 MiB): a declared length far over it is refused, nothing read.
    url = serve(ScriptedEngine(["ok"]))
    over = str(64 * 1024 * 1024 + (2 << 20)).encode()
    out = raw(
        url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + over + b"\r\n\r\n",
    )
    assert out.startswith(b"HTTP/1.1 413") and b"67108864 bytes" in out
    # A malformed length is an HTTP framing error: 400 and the connection closed.
    out = raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ab\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")


def test_sse_framing(serve):
    import httpx

    url = serve(ScriptedEngine(["ab"]))
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={"messages": USER, "stream": True}
    ) as r:
        assert r.headers["content-type"] == "text/event-stream"
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-1]][:3] == [
        {"role": "assistant", "content": ""},
        {"content": "a"},
        {"content": "b"},
    ]


def test_disconnect_stops_generation(serve):
    gate = threading.Event()
    engine = CountingEngine(["q" * 5000], gate=gate)
    url = serve(engine)
    body = json.dumps({"messages": USER, "stream": True}).encode()
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    out = s.recv(100)
    assert out.startswith(b"HTTP/1.1 200")
    while b"data: " not in out:  # the generation has begun (the engine waits at the gate)
        out += s.recv(1000)
    s.close()
    gate.set()
    # Stopped by the end-of-stream poll before a token, or by a failed write: either way
    # the generation ends long before its 5000 tokens.
    assert engine.finished.wait(5)
    assert engine.produced < 100
