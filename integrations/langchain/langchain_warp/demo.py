"""The LangChain stop of `warp demo`'s adapter tour (entry point `warp_providers.demo`).

Owns: one streamed answer through `ChatWarp`.
Called by: `warp_providers.demo` through the entry point `langchain = langchain_warp.demo:tour`.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["tour"]


def tour(model: str, max_tokens: int, out: Callable[[str], None]) -> None:
    """Stream one answer through `ChatWarp` to `out`."""
    from langchain_warp import ChatWarp

    llm = ChatWarp(model_path=model, max_tokens=max_tokens)
    out("\n[LangChain ChatWarp] ")
    for chunk in llm.stream("Name three colours of the rainbow."):
        out(str(chunk.content))
    out("\n")
