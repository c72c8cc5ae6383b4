"""Qwen3-MoE configs: dense/sparse schedules (decoder_sparse_step, mlp_only_layers, no
experts at all), GQA/MQA/MHA ratios, head dims, routing (top-k up to every expert,
norm_topk_prob), attention biases, a sliding window on every layer (use_sliding_window),
every rope type."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "Qwen3MoeConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 4))
    experts = 0 if draw(st.integers(0, 15)) == 0 else draw(st.integers(1, 16))
    return dict(
        _common.common(draw), **_common.heads(draw, explicit_head_dim=False),
        num_hidden_layers=layers, head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        intermediate_size=draw(st.sampled_from([8, 32, 64, 96])),
        moe_intermediate_size=draw(st.sampled_from([8, 16, 32, 64])),
        num_experts=experts, num_experts_per_tok=draw(st.integers(1, max(1, min(experts, 8)))),
        norm_topk_prob=draw(st.booleans()), decoder_sparse_step=draw(st.integers(1, 3)),
        mlp_only_layers=sorted(draw(st.sets(st.integers(0, layers - 1), max_size=layers))),
        attention_bias=draw(st.booleans()), rope_parameters=_common.rope(draw),
        use_sliding_window=draw(st.booleans()), sliding_window=draw(st.integers(1, 24)),
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return _common.window_prompt_lens(config["sliding_window"])


def refusal(config: dict[str, Any]) -> str | None:
    return _common.refusal(config)


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
