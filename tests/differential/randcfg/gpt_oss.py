"""gpt-oss configs: attention shapes with explicit head_dim, any sliding/full layer
pattern and window, attention biases on or off, sinks, 1..12 experts with top-k up to
all of them, swiglu_alpha and a swiglu_limit low enough to clamp, every rope type
(YaRN by default)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "GptOssConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 4))
    experts = draw(st.integers(1, 12))
    cfg = dict(
        _common.common(draw, act=False), **_common.heads(draw, explicit_head_dim=False),
        num_hidden_layers=layers, head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        intermediate_size=draw(st.sampled_from([8, 16, 32, 64])),
        num_local_experts=experts, num_experts_per_tok=draw(st.integers(1, min(experts, 8))),
        sliding_window=draw(st.integers(1, 24)), attention_bias=draw(st.booleans()),
        swiglu_alpha=draw(st.sampled_from([1.0, 1.702, 3.0])),
        swiglu_limit=draw(st.sampled_from([0.5, 1.0, 7.0])),
        rope_parameters=_common.rope(draw),
    )
    if draw(st.booleans()):
        cfg["layer_types"] = draw(st.lists(
            st.sampled_from(["sliding_attention", "full_attention"]),
            min_size=layers, max_size=layers))
    return cfg


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return _common.window_prompt_lens(config["sliding_window"])


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
