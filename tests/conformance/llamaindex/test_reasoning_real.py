"""`Warp`'s reasoning channel on the REAL engine: `ThinkingBlock` and `thinking_delta`.

The model is `real_models.hermes_tiny` (a random-weight Qwen3-MoE whose vocabulary has
`<think>`/`</think>` control tokens) with its ChatML template changed so that the
generation prompt opens `<think>`, as reasoning models' templates do. The reply therefore
starts inside the reasoning channel, and everything up to the model's `</think>` is
reasoning. Greedy decoding of fixed weights makes the reply deterministic; the assertions
are invariants of the adapter (the streamed deltas fold into the final blocks, chat and
stream agree, no marker leaks) rather than the random model's text.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import real_models
from llama_index.core.base.llms.types import ChatResponse, TextBlock, ThinkingBlock
from llama_index.core.llms import ChatMessage
from llama_index.llms.warp import Warp

pytestmark = pytest.mark.slow

GENERATION_PROMPT = "<|im_start|>assistant\n{%- endif %}"
THINK_MARKERS = ("<think>", "</think>")
MESSAGES = [ChatMessage(role="user", content="Think first, then answer: what is 2 + 2?")]


def think_opening(src: Path, out: Path) -> Path:
    """A copy of container `src` whose chat template's generation prompt opens `<think>`."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("tokenizer_config.json", "chat_template.jinja"):
            os.link(f, out / f.name)
    config = json.loads((src / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    assert template.endswith(GENERATION_PROMPT)
    template = template.removesuffix(GENERATION_PROMPT) + (
        "<|im_start|>assistant\n<think>\n{%- endif %}"
    )
    config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_text(template)
    return out


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Warp:
    root = Path(tmp_path_factory.mktemp("li-think"))
    path = think_opening(real_models.hermes_tiny(root), root / "think.warp")
    return Warp(model_path=str(path), max_tokens=16)


def thinking(response: ChatResponse) -> str:
    blocks = [b for b in response.message.blocks if isinstance(b, ThinkingBlock)]
    assert len(blocks) <= 1
    return blocks[0].content or "" if blocks else ""


def check_stream(responses: list[ChatResponse], blocking: ChatResponse) -> None:
    deltas = [r.additional_kwargs.get("thinking_delta") for r in responses]
    assert any(deltas), "no thinking_delta while streaming"
    final = responses[-1]
    assert "".join(d or "" for d in deltas) == thinking(final) == thinking(blocking)
    assert "".join(r.delta or "" for r in responses) == (final.message.content or "")
    assert final.message.content == blocking.message.content
    for r in responses:  # a step carries reasoning or answer text, never reasoning as text
        if r.additional_kwargs.get("thinking_delta"):
            assert not r.delta


def test_chat_returns_a_thinking_block(llm: Warp) -> None:
    response = llm.chat(MESSAGES)
    reasoning = thinking(response)
    assert reasoning, response.message.blocks
    assert isinstance(response.message.blocks[0], ThinkingBlock)  # reasoning comes first
    for marker in THINK_MARKERS:
        assert marker not in reasoning and marker not in (response.message.content or "")
    text = [b for b in response.message.blocks if isinstance(b, TextBlock)]
    assert "".join(b.text for b in text) == (response.message.content or "")
    assert response.raw is not None and response.raw["usage"]["completion_tokens"] > 0


def test_stream_chat_yields_thinking_deltas(llm: Warp) -> None:
    check_stream(list(llm.stream_chat(MESSAGES)), llm.chat(MESSAGES))


def test_astream_chat_yields_thinking_deltas(llm: Warp) -> None:
    async def run() -> tuple[list[ChatResponse], ChatResponse]:
        responses = [r async for r in await llm.astream_chat(MESSAGES)]
        return responses, await llm.achat(MESSAGES)

    check_stream(*asyncio.run(run()))


def test_complete_carries_thinking(llm: Warp) -> None:
    blocking = llm.chat(MESSAGES)
    completion = llm.complete(MESSAGES[0].content or "")
    extra: dict[str, Any] = completion.additional_kwargs
    assert extra["thinking"] == thinking(blocking)
    assert completion.text == (blocking.message.content or "")
