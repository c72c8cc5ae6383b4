"""DeepSeek-V3 configs: MLA ranks and head dims, grouped sigmoid routing, rope variants.

Covers q_lora_rank (None = a plain q_proj), kv_lora_rank, the nope / rope / v head dims,
head counts, first_k_dense_replace, n_group / topk_group, top-k, norm_topk_prob,
routed_scaling_factor, n_shared_experts (0 too), rope default / linear / dynamic / yarn
(with and without mscale / mscale_all_dim / attention_factor / truncate), rope_interleave,
attention_bias, tied embeddings, the MTP layer count and rms_norm_eps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

CONFIG_CLASS = "DeepseekV3Config"
# The selection-only routing bias as large as a trained one: it settles most selections
# (with a bias as small as the other weights, random routers near-tie).
ROUTING_BIAS_STD = 1.0


@st.composite
def routing(draw: Any, max_groups: int = 4) -> dict[str, Any]:
    """n_routed_experts / n_group / topk_group / num_experts_per_tok, valid together."""
    n_group = draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= max_groups]))
    per = draw(st.integers(2, 32 // n_group))  # transformers sums each group's top 2
    topk_group = draw(st.integers(1, n_group))
    top_k = draw(st.integers(1, min(8, topk_group * per)))
    return dict(n_routed_experts=n_group * per, n_group=n_group, topk_group=topk_group,
                num_experts_per_tok=top_k)


@st.composite
def rope(draw: Any, max_pos: int, dim: int) -> dict[str, Any]:
    """rope_parameters over `dim` rotated dims (transformers' dynamic NTK needs dim > 2)."""
    theta = draw(st.sampled_from([10000.0, 50000.0, 1e6]))
    kind = draw(st.sampled_from(["default", "linear", "yarn"] + (["dynamic"] if dim > 2 else [])))
    if kind == "default":
        return {"rope_type": "default", "rope_theta": theta}
    factor = draw(st.sampled_from([2.0, 4.0, 8.0, 40.0]))
    if kind in ("linear", "dynamic"):
        return {"rope_type": kind, "rope_theta": theta, "factor": factor}
    rp: dict[str, Any] = {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                          "original_max_position_embeddings": draw(
                              st.sampled_from([16, 32, 64, max_pos // 2]))}
    scales = draw(st.sampled_from(["none", "both", "mscale_all_dim", "mscale", "factor"]))
    if scales in ("both", "mscale"):
        rp["mscale"] = draw(st.sampled_from([0.707, 1.0]))
    if scales in ("both", "mscale_all_dim"):
        rp["mscale_all_dim"] = draw(st.sampled_from([0.707, 0.8, 1.0]))
    if scales == "factor":
        rp["attention_factor"] = draw(st.sampled_from([0.9, 1.2]))
    if draw(st.booleans()):
        rp["beta_fast"] = float(draw(st.sampled_from([16, 32])))
        rp["beta_slow"] = float(draw(st.sampled_from([1, 2])))
    if draw(st.booleans()):
        rp["truncate"] = draw(st.booleans())
    return rp


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 2, 4]))
    max_pos = 512
    rope_dim = draw(st.sampled_from([2, 4, 8, 16]))
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64, 96])),
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads,  # MLA expands every head from the one latent
        q_lora_rank=draw(st.sampled_from([None, 8, 16, 48])),
        kv_lora_rank=draw(st.sampled_from([8, 16, 32, 64])),
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        v_head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        intermediate_size=draw(st.sampled_from([32, 64, 96])),
        moe_intermediate_size=draw(st.sampled_from([16, 32, 48])),
        n_shared_experts=draw(st.integers(0, 2)),
        first_k_dense_replace=draw(st.integers(0, layers)),
        **draw(routing()),
        norm_topk_prob=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 1.5, 2.5, 2.827])),
        rope_parameters=draw(rope(max_pos, rope_dim)), rope_interleave=draw(st.booleans()),
        attention_bias=draw(st.booleans()), tie_word_embeddings=draw(st.booleans()),
        num_nextn_predict_layers=draw(st.integers(0, 1)),
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        max_position_embeddings=max_pos, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed, routing_bias_std=ROUTING_BIAS_STD)
