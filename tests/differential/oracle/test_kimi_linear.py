"""kimi_linear: engine vs transformers on a tiny random model (no download).

The tiny model has both KDA and MLA layers, grouped routing with a selection bias, a dense
first layer and a shared expert. F32 max |dlogit| <= 1e-4 over the prompt (prefill chunks
64 and 5) and 16 decode steps; Q8_0 the same greedy continuation and mean KL <= 1e-3;
expert streaming at the floor bit-identical to all-resident; state save/load round-trips
and continues identically; plan_memory's state bytes equal a hand computation.
"""

from __future__ import annotations

from typing import Any

from oracle_util import COMMON, converted_suite


def _kimi_linear_config(**over: Any) -> Any:
    import transformers as tf

    kw = dict(COMMON)
    kw.update(
        num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
        num_experts_per_token=2, n_shared_experts=1, num_expert_group=4, topk_group=2,
        routed_scaling_factor=2.5, moe_renormalize=True, kv_lora_rank=32, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4,
        linear_attn_config={"head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4,
                            "kda_layers": [1, 3], "full_attn_layers": [2, 4]},
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    )
    kw.update(over)
    return tf.KimiLinearConfig(**kw)


CONFIGS = {"kimi_linear": _kimi_linear_config}
# The selection-only routing bias is drawn as large as a trained one (which settles most
# selections): with a bias as small as the other weights, near-tied grouped selections
# flip under Q8_0 rounding in transformers itself (mean KL 1.5e-2)
ROUTING_BIAS_STD = 2.0


def _hand_kv_bytes(hp: dict[str, Any], ctx: int) -> dict[str, int]:
    """MLA layers keep one latent row (kv_lora_rank + rope dims) per position; KDA layers a
    recurrent state S [heads, d, d] plus the conv window [kernel-1, 3*heads*d]."""
    n_kda = hp["attn_kinds"].count("kda")
    n_mla = hp["n_layers"] - n_kda
    assert n_kda == 2 and n_mla == 2
    h, d, k = hp["kda_heads"], hp["kda_head_dim"], hp["kda_conv"]
    kda = h * d * d + (k - 1) * 3 * h * d
    return {"mla_latent": 4 * n_mla * ctx * (hp["kv_lora_rank"] + hp["rope_dim"]),
            "recurrent": 4 * n_kda * kda}


(models, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q8_0_container_is_exact_on_its_own_weights, test_streaming_at_floor_bit_identical,
 test_state_roundtrip_continues_identically, test_plan_state_bytes,
 ) = converted_suite(CONFIGS, ROUTING_BIAS_STD, _hand_kv_bytes)

