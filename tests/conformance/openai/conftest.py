"""Fixtures of the OpenAI conformance suite: the real `openai` client over our transport."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
for p in (ROOT / "integrations" / "openai_shim", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


@pytest.fixture(autouse=True)
def no_remote(request: pytest.FixtureRequest):
    """Every test here runs under respx routers with no routes (tests/no_remote.py): an
    HTTP request that would leave the process fails the test, even if something swallowed
    the error. Tests over `warp serve` (marked enable_socket) may reach 127.0.0.1."""
    from no_remote import guard

    routers = guard(allow_loopback=request.node.get_closest_marker("enable_socket") is not None)
    try:
        yield routers
    finally:
        routers.stop()
    assert not routers.escaped, f"requests left the process: {routers.escaped}"


@pytest.fixture
def make_client():
    """make_client(engine, **kw) -> openai.OpenAI over the in-process transport."""
    import openai
    from warp_openai import warp_transport

    clients = []

    def make(engine: Any, http: str | None = None, **kw: Any) -> Any:
        client = openai.OpenAI(
            api_key="test",
            http_client=warp_transport(engine=engine, http=http),
            max_retries=kw.pop("max_retries", 0),
            **kw,
        )
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def make_async_client():
    import openai
    from warp_openai import async_warp_transport

    def make(engine: Any, http: str | None = None, **kw: Any) -> Any:
        return openai.AsyncOpenAI(
            api_key="test",
            http_client=async_warp_transport(engine=engine, http=http),
            max_retries=kw.pop("max_retries", 0),
            **kw,
        )

    return make


# --------------------------------------------------------------------------- real engine
API_KEY = "sk-warp-test"
"""The bearer key of the HTTP targets (the in-process ones ignore keys)."""


def _engine_built() -> None:
    from support import has_module, requires

    requires(has_module("warp_providers._engine"), "the compiled engine (warp_providers._engine)")


@pytest.fixture(scope="session")
def smol_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct, converted once per run (tests/real_models.py)."""
    from real_models import smollm2

    return smollm2(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random MoE with Hermes tool markers and no <think> (openai_cases.py)."""
    _engine_built()
    from openai_cases import random_tools_moe

    return random_tools_moe(tmp_path_factory.mktemp("random-moe"))


class Target:
    """The real `openai` clients pointed at one model, in-process or over HTTP."""

    def __init__(self, via: str, path: Path) -> None:
        import openai
        from warp_openai import warp_async_openai_client, warp_openai_client

        from warp_providers.models import shared_engine

        self.via = via
        self.path = path
        self.engine = shared_engine(path)  # what every client here shares
        self.model_id = path.name.removesuffix(".warp")
        self._server: Any = None
        if via == "inproc":
            self.client = warp_openai_client(path)
            self._aclient = lambda: warp_async_openai_client(path)
        else:
            import threading

            from warp_openai import WarpAPI
            from warp_openai.server import make_server

            httpd = make_server(WarpAPI(engine=self.engine), "127.0.0.1", 0, api_key=API_KEY)
            threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
            self._server = httpd
            self.url = f"http://127.0.0.1:{httpd.server_address[1]}"
            base = self.url + "/v1"
            self.client = openai.OpenAI(api_key=API_KEY, base_url=base, max_retries=0)
            self._aclient = lambda: openai.AsyncOpenAI(
                api_key=API_KEY, base_url=base, max_retries=0
            )

    def aclient(self) -> Any:
        """A new `openai.AsyncOpenAI` (make it inside the event loop that uses it)."""
        return self._aclient()

    def close(self) -> None:
        self.client.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


HTTP = pytest.param("http", marks=pytest.mark.enable_socket)
"""The `via` of a target over HTTP on 127.0.0.1 (sockets enabled for that test only)."""


@pytest.fixture
def connect():
    """connect(model_path, via="inproc" | "http") -> Target, closed after the test."""
    targets: list[Target] = []

    def make(path: Path, via: str = "inproc") -> Target:
        target = Target(via, path)
        targets.append(target)
        return target

    yield make
    for t in targets:
        t.close()


@pytest.fixture(params=["inproc", HTTP])
def via(request: pytest.FixtureRequest) -> str:
    """Runs a test in-process and over `warp serve`'s HTTP server."""
    return request.param
