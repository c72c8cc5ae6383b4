"""glm4_moe: engine vs transformers on a tiny random model (no download).

Partial rotary (0.5), per-head qk norm, q/k/v biases, sigmoid routing with a random bias,
routed_scaling_factor, a shared expert and a dense first layer.

F32 max |dlogit| <= 1e-4 over a 32-token prompt and 16 decode steps; Q8_0 the same
16-token greedy continuation and mean KL <= 1e-3; exactness on the quantize -> dequantize
weights; expert streaming at the floor bit-identical to all-resident; state save/load
round-trips and continues identically; plan_memory's kv_bytes equals a hand computation
(K and V of n_kv_heads * head_dim each).
"""

from __future__ import annotations

from typing import Any

import pytest
from oracle_util import COMMON, check_draw_changes_selections, manifest, routed_suite

BIAS_STD = 0.2  # e_score_correction_bias: large enough to reorder the selection


def _glm4_moe() -> Any:
    import transformers as tf

    return tf.Glm4MoeConfig(**{**COMMON, **dict(
        num_hidden_layers=3, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        partial_rotary_factor=0.5)})


CONFIGS = {"glm4_moe": _glm4_moe}
# The draw: one that Q8_0 rounding leaves stable in transformers itself (checked by
# assert_q8_0_matches): seed 0 flips 4 of 64 expert selections.
SEEDS = {"glm4_moe": 4}


def _hand_state_bytes(cfg: Any, ctx: int) -> dict[str, int]:
    """The usual K and V of n_kv_heads * head_dim each, per token and layer."""
    per_token = 2 * cfg.num_key_value_heads * cfg.head_dim
    return {"kv": cfg.num_hidden_layers * ctx * per_token * 4}


(models, f32_containers, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q8_0_container_is_exact_on_its_own_weights, test_streaming_at_floor_bit_identical,
 test_state_roundtrip_continues_identically, test_plan_kv_bytes_by_hand,
 ) = routed_suite(CONFIGS, SEEDS, BIAS_STD, _hand_state_bytes)


@pytest.mark.oracle
def test_draw_exercises_bias(models):
    """The draw's routing bias changes some selections (else the differential tests could
    not see a mistake in it)."""
    check_draw_changes_selections(models["glm4_moe"][0], "glm4_moe", need_groups=False)


@pytest.mark.oracle
def test_manifest_hparams(models, f32_containers):
    glm = manifest(f32_containers["glm4_moe"])["hparams"]
    assert glm["rope_dim"] == 8 and glm["head_dim"] == 16 and glm["qk_norm"] == "head"
    assert glm["scoring_func"] == "sigmoid" and glm["routed_scaling_factor"] == 2.5
    assert "kv_lora_rank" not in glm
    names = {t["name"] for t in manifest(f32_containers["glm4_moe"])["trunk"]["tensors"]}
    assert {"blk.1.exp_probs_b.bias", "blk.0.attn_q.bias", "blk.2.ffn_gate_shexp.weight"} <= names
