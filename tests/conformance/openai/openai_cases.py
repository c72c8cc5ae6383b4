"""Shared cases of the OpenAI conformance suite (engines, models and request pieces)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fake_engine import CHATML_TEMPLATE, ScriptedEngine, tool_call_text

__all__ = [
    "TIME",
    "USER",
    "WEATHER",
    "CountingEngine",
    "check_invariants",
    "random_tools_moe",
    "tool_call_text",
]


class CountingEngine(ScriptedEngine):
    """A scripted engine that counts the tokens it produced and can pace itself."""

    def __init__(self, *args: Any, gate: threading.Event | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.produced = 0
        self.saw_should_stop = False
        self.cancelled = False
        self.gate = gate
        self.finished = threading.Event()

    def stream(self, prompt: Any, **kw: Any) -> Iterator[Any]:
        self.produced = 0
        self.cancelled = False
        user_stop = kw.get("should_stop")

        def should_stop() -> bool:
            stop = bool(user_stop and user_stop())
            if stop:
                self.saw_should_stop = True
            return stop

        kw["should_stop"] = should_stop
        self.finished.clear()
        try:
            for i, ev in enumerate(super().stream(prompt, **kw)):
                if self.gate is not None and i == 1:
                    self.gate.wait(10)
                self.produced += 1
                yield ev
            if self.last_result is not None and self.last_result.finish_reason == "cancelled":
                self.cancelled = True
        finally:  # exhausted, stopped, or closed by its consumer
            self.finished.set()


USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}


def check_invariants(chunks: list[Any], *, usage: bool) -> None:
    """The stream invariants of issue 5: role first, one id/created/model, finish last."""
    assert chunks, "no chunks"
    assert len({c.id for c in chunks}) == 1
    assert len({c.created for c in chunks}) == 1
    assert len({c.model for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    choice_chunks = [c for c in chunks if c.choices]
    assert choice_chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in choice_chunks[1:])
    finishes = [c.choices[0].finish_reason for c in choice_chunks]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None
    if usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert all(c.usage is None for c in chunks[:-1])
    else:
        assert all(c.choices for c in chunks)


RANDOM_MARKERS = ["<|im_start|>", "<tool_call>", "</tool_call>", "<|im_end|>"]
"""The random MoE's control tokens: ChatML and Hermes tool calls, no <think> (see below)."""


def random_tools_moe(root: Path, *, seed: int = 3) -> Path:
    """A tiny random-weight Qwen3-MoE (2 layers, 8 experts) for the real-engine suite.

    Its vocabulary is byte-level plus `RANDOM_MARKERS` (`<|im_end|>` last: the generated
    checkpoint's eos is its last id) and its template is ChatML with Hermes tools. It has
    no `<think>` token on purpose: a random model at temperature 1 would otherwise open an
    unbounded reasoning channel before the constrained answer; without it every reply is
    the constrained JSON (or tool calls) alone, so 100% of them must parse and validate.
    Builds in about a second, without torch.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from warp_providers.convert import convert
    from warp_providers.synth import MoeShape, make_moe_checkpoint

    out = root / "random-tools.warp"
    if (out / "manifest.json").is_file():
        return out
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    hf = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(RANDOM_MARKERS)
    tok = root / "tokenizer"
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "tokenizer.json").write_text(hf.to_str())
    (tok / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>"})
    )
    shape = MoeShape(
        hidden_size=64,
        num_hidden_layers=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    src = make_moe_checkpoint(root / "hf", shape, seed=seed, tokenizer=tok)
    return Path(convert(src, out))
