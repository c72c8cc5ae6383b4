"""Which openai SDK this run tests, and that the transport matches its http library.

The suite runs twice in CI: on the installed openai (3.x, httpx2) and on openai 2.54
(httpx) installed into a side directory put first on PYTHONPATH:

    python -m pip install -q --no-deps --target "$VENV/openai2" 'openai==2.54.*'
    WARP_EXPECT_OPENAI=2 PYTHONPATH="$VENV/openai2" python -m pytest tests/conformance/openai

`WARP_EXPECT_OPENAI` makes a misconfigured second run (the side directory not first on the
path) fail instead of quietly testing 3.x twice.
"""

from __future__ import annotations

import asyncio
import importlib
import os

from fake_engine import ScriptedEngine
from openai_cases import USER


def _major() -> int:
    import openai

    return int(openai.__version__.split(".")[0])


def test_the_expected_openai_is_under_test():
    import openai

    want = os.environ.get("WARP_EXPECT_OPENAI")
    if want:
        assert openai.__version__.split(".")[0] == want, (openai.__version__, openai.__file__)
    assert _major() in (2, 3)


def test_transport_uses_the_sdks_http_library():
    import openai
    from warp_openai import warp_async_openai_client, warp_openai_client
    from warp_openai.transport import _flavor

    flavor = "httpx2" if _major() >= 3 else "httpx"
    assert _flavor(None) == flavor
    hx = importlib.import_module(flavor)
    client = warp_openai_client(engine=ScriptedEngine(["hi"]))
    assert isinstance(client, openai.OpenAI) and isinstance(client._client, hx.Client)
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    client.close()
    aclient = warp_async_openai_client(engine=ScriptedEngine(["hi"]))
    assert isinstance(aclient._client, hx.AsyncClient)
    asyncio.run(aclient.close())
