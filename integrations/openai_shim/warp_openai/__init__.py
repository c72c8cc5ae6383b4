"""warp-openai: the OpenAI SDK over a local warp model, in-process (no server, no socket).

    import openai
    from warp_openai import warp_transport

    client = openai.OpenAI(api_key="local", http_client=warp_transport("model.warp"))
    client.chat.completions.create(model="local", messages=[{"role": "user", "content": "Hi"}])

`api.py` holds request meaning (routing, validation, response shapes); `transport.py` the
httpx/httpx2 glue; `server.py` the same core over HTTP (`warp serve`).
"""

from warp_openai.api import APIError, ChunkStream, WarpAPI
from warp_openai.transport import (
    AsyncWarpTransport,
    WarpTransport,
    async_warp_transport,
    transport_classes,
    warp_async_openai_client,
    warp_openai_client,
    warp_transport,
)

__all__ = [
    "APIError",
    "AsyncWarpTransport",
    "ChunkStream",
    "WarpAPI",
    "WarpTransport",
    "async_warp_transport",
    "transport_classes",
    "warp_async_openai_client",
    "warp_openai_client",
    "warp_transport",
]

