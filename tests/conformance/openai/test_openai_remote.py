"""respx where it serves: no request leaves the process, and a transport with a fallback.

The suite's autouse `no_remote` routers (conftest.py, tests/no_remote.py) have no routes,
so a request that would reach the network fails, whichever http library sends it. A
`warp_transport(..., fallback=...)` answers its own routes on its own host in-process and
hands every other host or path to the fallback transport, mocked here by respx: one
client mixes the local model with a remote API.
"""

from __future__ import annotations

import asyncio
import importlib

import httpx
import openai
import pytest
from fake_engine import ScriptedEngine
from openai_cases import USER

REMOTE = "https://api.example.com/v1"
REMOTE_REPLY = {
    "id": "chatcmpl-remote", "object": "chat.completion", "created": 1, "model": "gpt-remote",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "from the remote API"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
}


def _installed_flavor() -> str:
    from warp_openai.transport import _flavor

    return _flavor(None)


@pytest.mark.parametrize("flavor", ["httpx", "httpx2"])
def test_a_request_that_would_leave_the_process_fails(no_remote, flavor):
    hx = importlib.import_module(flavor)
    with hx.Client() as client, pytest.raises(Exception) as err:
        client.get("https://api.example.com/v1/models")
    assert "not mocked" in str(err.value)
    assert no_remote.escaped == ["GET https://api.example.com/v1/models"]
    no_remote.escaped.clear()  # seen and refused: this test passes


def test_the_sdks_own_client_is_refused_too(no_remote):
    from respx.models import AllMockedAssertionError

    client = openai.OpenAI(api_key="k", base_url=REMOTE, max_retries=0)
    with pytest.raises((openai.APIConnectionError, AllMockedAssertionError)):
        client.models.list()
    assert no_remote.escaped == [f"GET {REMOTE}/models"]
    no_remote.escaped.clear()


@pytest.mark.parametrize("flavor", ["httpx", "httpx2"])
def test_fallback_takes_other_hosts_and_paths(no_remote, flavor):
    from warp_openai import warp_transport

    hx = importlib.import_module(flavor)
    router = getattr(no_remote, flavor)
    remote = router.post(f"{REMOTE}/chat/completions").respond(json=REMOTE_REPLY)
    elsewhere = router.get("http://warp.invalid/v1/embeddings").respond(json={"object": "list",
                                                                      "data": []})
    client = warp_transport(engine=ScriptedEngine(["local reply"]), http=flavor,
                            fallback=hx.HTTPTransport())
    with client:
        body = {"model": "m", "messages": USER}
        local = client.post("http://warp.invalid/v1/chat/completions", json=body).json()
        assert local["choices"][0]["message"]["content"] == "local reply"
        away = client.post(f"{REMOTE}/chat/completions", json=body).json()
        assert away["choices"][0]["message"]["content"] == "from the remote API"
        assert client.get("http://warp.invalid/v1/embeddings").json()["object"] == "list"
    assert remote.call_count == 1 and elsewhere.call_count == 1
    assert remote.calls.last.request.content == httpx.Request("POST", "x", json=body).content


def test_one_openai_client_mixes_local_and_remote(no_remote):
    from warp_openai import warp_transport
    from warp_openai.transport import BASE_URL

    flavor = _installed_flavor()
    hx = importlib.import_module(flavor)
    remote = getattr(no_remote, flavor).post(f"{REMOTE}/chat/completions").respond(
        json=REMOTE_REPLY)
    http = warp_transport(engine=ScriptedEngine(["local reply"]), fallback=hx.HTTPTransport())
    local = openai.OpenAI(api_key="k", base_url=BASE_URL, http_client=http, max_retries=0)
    away = local.with_options(base_url=REMOTE)
    assert local.chat.completions.create(model="m", messages=USER).choices[0].message.content \
        == "local reply"
    r = away.chat.completions.create(model="gpt-remote", messages=USER)
    assert (r.model, r.choices[0].message.content) == ("gpt-remote", "from the remote API")
    assert remote.calls.last.request.headers["authorization"] == "Bearer k"
    local.close()


def test_async_fallback(no_remote):
    from warp_openai import async_warp_transport
    from warp_openai.transport import BASE_URL

    flavor = _installed_flavor()
    hx = importlib.import_module(flavor)
    remote = getattr(no_remote, flavor).post(f"{REMOTE}/chat/completions").respond(
        json=REMOTE_REPLY)

    async def run() -> tuple[str, str]:
        http = async_warp_transport(engine=ScriptedEngine(["local async"]),
                                    fallback=hx.AsyncHTTPTransport())
        local = openai.AsyncOpenAI(api_key="k", base_url=BASE_URL, http_client=http,
                                   max_retries=0)
        async with local:
            a = await local.chat.completions.create(model="m", messages=USER)
            b = await local.with_options(base_url=REMOTE).chat.completions.create(
                model="gpt-remote", messages=USER)
        return a.choices[0].message.content, b.choices[0].message.content

    assert asyncio.run(run()) == ("local async", "from the remote API")
    assert remote.call_count == 1


def test_without_a_fallback_every_request_is_answered_in_process(no_remote):
    from warp_openai import warp_transport

    with warp_transport(engine=ScriptedEngine(["x"])) as client:
        r = client.post(f"{REMOTE}/chat/completions", json={"messages": USER})
        assert r.json()["model"] == "scripted"
        assert client.get(f"{REMOTE}/embeddings").status_code == 404  # ours, and not a route
    assert no_remote.escaped == []
