"""The LlamaIndex stop of `warp demo`'s adapter tour (entry point `warp_providers.demo`).

Owns: one streamed completion through `Warp`.
Called by: `warp_providers.demo` through the entry point
`llamaindex = llama_index.llms.warp.demo:tour`.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["tour"]


def tour(model: str, max_tokens: int, out: Callable[[str], None]) -> None:
    """Stream one answer through LlamaIndex's `Warp` to `out`."""
    from llama_index.llms.warp import Warp

    llm = Warp(model_path=model, max_tokens=max_tokens)
    out("\n[LlamaIndex Warp] ")
    for step in llm.stream_complete("Name a large city in Japan."):
        out(step.delta or "")
    out("\n")
