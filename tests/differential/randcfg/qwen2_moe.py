"""Qwen2-MoE configs: dense/sparse schedules (decoder_sparse_step, mlp_only_layers, no
experts at all), routing (top-k up to every expert, norm_topk_prob), the gated shared
expert (including width 0), qkv biases on or off, sliding windows on the layers
`use_sliding_window`/`max_window_layers` (or explicit `layer_types`) pick, every rope type."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "Qwen2MoeConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 4))
    experts = 0 if draw(st.integers(0, 9)) == 0 else draw(st.sampled_from([1, 2, 3, 4, 8, 12]))
    cfg = dict(
        _common.common(draw), **_common.heads(draw, explicit_head_dim=False),
        num_hidden_layers=layers,
        intermediate_size=draw(st.sampled_from([8, 32, 64])),
        moe_intermediate_size=draw(st.sampled_from([8, 16, 32])),
        shared_expert_intermediate_size=draw(st.sampled_from([0, 16, 48])),
        num_experts=experts,
        num_experts_per_tok=draw(st.integers(1, max(1, min(experts, 8)))),
        norm_topk_prob=draw(st.booleans()), decoder_sparse_step=draw(st.integers(1, 3)),
        mlp_only_layers=sorted(draw(st.sets(st.integers(0, layers - 1), max_size=layers))),
        qkv_bias=draw(st.booleans()), rope_parameters=_common.rope(draw),
        use_sliding_window=draw(st.booleans()), sliding_window=draw(st.integers(1, 24)),
        max_window_layers=draw(st.integers(0, layers)),
    )
    if draw(st.booleans()):  # sliding layers need use_sliding_window (else no window)
        kinds = ["sliding_attention", "full_attention"] if cfg["use_sliding_window"] else [
            "full_attention"]
        cfg["layer_types"] = draw(st.lists(st.sampled_from(kinds), min_size=layers,
                                           max_size=layers))
    return cfg


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return _common.window_prompt_lens(config["sliding_window"])


def refusal(config: dict[str, Any]) -> str | None:
    return _common.refusal(config)


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
