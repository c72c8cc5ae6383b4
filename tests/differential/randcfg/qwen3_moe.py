"""Qwen3-MoE configs: dense/sparse schedules, GQA ratios, head dims, routing, rope."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

CONFIG_CLASS = "Qwen3MoeConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 4))
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    experts = draw(st.integers(2, 16))
    step = draw(st.integers(1, 3))
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64, 96])),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=draw(st.sampled_from([8, 16, 32])),
        intermediate_size=draw(st.sampled_from([32, 64, 96])),
        moe_intermediate_size=draw(st.sampled_from([16, 32, 64])),
        num_experts=experts, num_experts_per_tok=draw(st.integers(1, min(experts, 8))),
        norm_topk_prob=draw(st.booleans()), decoder_sparse_step=step,
        mlp_only_layers=sorted(draw(st.sets(st.integers(0, layers - 1), max_size=layers))),
        rope_parameters={"rope_type": "default",
                         "rope_theta": draw(st.sampled_from([10000.0, 1e6]))},
        tie_word_embeddings=draw(st.booleans()), rms_norm_eps=1e-6,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
