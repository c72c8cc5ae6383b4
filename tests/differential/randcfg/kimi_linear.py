"""Kimi-Linear configs: KDA / MLA layer orders, KDA heads and conv, MLA dims, routing.

Covers the per-layer attention kinds (linear_attn_config's 1-indexed kda_layers /
full_attn_layers, or layer_types), KDA num_heads / head_dim / short_conv_kernel_size,
the NoPE MLA's q_lora_rank (None too), kv_lora_rank and nope / rope / v head dims, head
counts, dense / sparse MLP orders (mlp_layer_types or first_k_dense_replace), expert
groups, top-k, moe_renormalize, routed_scaling_factor, shared experts (0 too),
attention_bias, tied embeddings and rms_norm_eps. Prompts land on both sides of
transformers' 64-token KDA chunk.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from . import deepseek_v3

CONFIG_CLASS = "KimiLinearConfig"
ROUTING_BIAS_STD = 2.0  # as the fixed-config oracle test: trained-like, selection decisive
KDA_CHUNK = 64  # transformers' chunk_kimi_delta_attention chunk size


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 4))
    heads = draw(st.sampled_from([1, 2, 4]))
    kinds = draw(st.lists(st.booleans(), min_size=layers, max_size=layers))  # True: KDA
    lac: dict[str, Any] = {
        "num_heads": draw(st.sampled_from([1, 2, 3])),
        "head_dim": draw(st.sampled_from([8, 16, 32])),
        "short_conv_kernel_size": draw(st.sampled_from([2, 3, 4])),
    }
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        lac["kda_layers"] = [i + 1 for i, k in enumerate(kinds) if k]
        lac["full_attn_layers"] = [i + 1 for i, k in enumerate(kinds) if not k]
    else:
        extra["layer_types"] = ["linear_attention" if k else "full_attention" for k in kinds]
    if draw(st.booleans()):
        extra["mlp_layer_types"] = draw(st.lists(st.sampled_from(["dense", "sparse"]),
                                                 min_size=layers, max_size=layers))
    else:
        extra["first_k_dense_replace"] = draw(st.integers(0, layers))
    route = draw(deepseek_v3.routing())
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64])),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=draw(st.sampled_from([None, 16])),
        kv_lora_rank=draw(st.sampled_from([8, 16, 32])),
        qk_rope_head_dim=draw(st.sampled_from([2, 4, 8])),
        qk_nope_head_dim=draw(st.sampled_from([4, 8, 16])),
        v_head_dim=draw(st.sampled_from([4, 8, 16, 32])),
        intermediate_size=draw(st.sampled_from([32, 64])),
        moe_intermediate_size=draw(st.sampled_from([16, 32])),
        n_shared_experts=draw(st.integers(0, 2)),
        num_experts=route["n_routed_experts"], num_expert_group=route["n_group"],
        topk_group=route["topk_group"], num_experts_per_token=route["num_experts_per_tok"],
        moe_renormalize=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.446])),
        attention_bias=draw(st.booleans()), tie_word_embeddings=draw(st.booleans()),
        linear_attn_config=lac, rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        **extra,
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(2, 24), st.integers(KDA_CHUNK - 8, KDA_CHUNK + 12))


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed, routing_bias_std=ROUTING_BIAS_STD)


def reference(model: Any, prompt: list[int], steps: int) -> Any:
    """The full-forward reference without a cache (transformers' cache needs an MLA layer
    to measure its length, so an all-KDA model runs only without one)."""
    import randcfg

    def uncached(ids: Any) -> Any:
        return model(ids, use_cache=False)

    return randcfg.full_forward_reference(uncached, prompt, steps)
