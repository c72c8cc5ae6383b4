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
