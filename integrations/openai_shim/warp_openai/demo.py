"""The OpenAI SDK stop of `warp demo`'s adapter tour (entry point `warp_providers.demo`).

Owns: one streamed chat completion through `openai.OpenAI` over `warp_transport`.
Called by: `warp_providers.demo` through the entry point `openai = warp_openai.demo:tour`.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["tour"]


def tour(model: str, max_tokens: int, out: Callable[[str], None]) -> None:
    """Stream one answer through the OpenAI SDK, in-process, to `out`."""
    import openai

    from warp_openai import warp_transport

    client = openai.OpenAI(api_key="local", base_url="http://warp.local/v1",
                           http_client=warp_transport(model))
    out("\n[OpenAI SDK over warp_transport] ")
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello in French."}],
        max_tokens=max_tokens, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            out(chunk.choices[0].delta.content)
    out("\n")
