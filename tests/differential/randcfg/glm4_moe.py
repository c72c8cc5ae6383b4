"""GLM-4.5 (glm4_moe) configs: GQA, head dims, partial rotary, qk norm, grouped routing.

Covers head_dim, head and KV-head counts, partial_rotary_factor (0.25 .. 1), rope default /
linear / yarn, use_qk_norm, attention_bias, first_k_dense_replace, n_group / topk_group,
top-k, norm_topk_prob, routed_scaling_factor, n_shared_experts (0 too), tied embeddings,
the MTP layer count and rms_norm_eps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from . import deepseek_v3

CONFIG_CLASS = "Glm4MoeConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 3))
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    prf = draw(st.sampled_from([0.25, 0.5, 0.5, 0.75, 1.0]))
    rd = int(head_dim * prf)
    rp = draw(deepseek_v3.rope(512, rd)) if rd > 2 else {"rope_type": "default",
                                                          "rope_theta": 10000.0}
    rp = {k: v for k, v in rp.items() if k not in ("mscale", "mscale_all_dim")}
    rp["partial_rotary_factor"] = prf
    route = draw(deepseek_v3.routing())
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64, 96])),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, intermediate_size=draw(st.sampled_from([32, 64])),
        moe_intermediate_size=draw(st.sampled_from([16, 32])),
        n_shared_experts=draw(st.integers(0, 2)),
        first_k_dense_replace=draw(st.integers(0, layers)), **route,
        norm_topk_prob=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 1.5, 2.5])),
        use_qk_norm=draw(st.booleans()), attention_bias=draw(st.booleans()),
        rope_parameters=rp, tie_word_embeddings=draw(st.booleans()),
        num_nextn_predict_layers=draw(st.integers(0, 1)),
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed,
                                 routing_bias_std=deepseek_v3.ROUTING_BIAS_STD)
