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
from oracle_util import (
    COMMON,
    STD,
    check_draw_changes_selections,
    check_f32_container,
    check_q8_0_against,
    check_q8_0_exact,
    check_state_resumes_decode,
    check_streaming_and_threads,
    convert_to,
    manifest,
    quant_dequant,
    referenced_models,
    require_gguf,
)

BIAS_STD = 0.2  # e_score_correction_bias: large enough to reorder the selection


def _glm4_moe() -> Any:
    import transformers as tf

    return tf.Glm4MoeConfig(**{**COMMON, **dict(
        num_hidden_layers=3, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        partial_rotary_factor=0.5)})


CONFIGS = {"glm4_moe": _glm4_moe}
ARCHS = list(CONFIGS)
# The draw: one that Q8_0 rounding leaves stable in transformers itself (checked by
# assert_q8_0_matches): seed 0 flips 4 of 64 expert selections.
SEEDS = {"glm4_moe": 4}


@pytest.fixture(scope="module")
def models(oracle_env, tmp_path_factory):
    """name -> (torch model, HF dir, reference prompt logits, greedy tokens, step logits)."""
    return referenced_models(CONFIGS, tmp_path_factory, SEEDS, std=STD,
                             routing_bias_std=BIAS_STD)


@pytest.fixture(scope="module")
def f32_containers(models, tmp_path_factory):
    return {name: convert_to(models[name][1],
                             tmp_path_factory.mktemp(f"w-{name}") / "m.warp",
                             experts="f32", trunk="f32") for name in ARCHS}


def _quant_dequant(model: Any) -> Any:
    """A copy whose matrices went through Q8_0 quantize -> dequantize (routers kept f32)."""
    return quant_dequant(model, "q8_0", experts_only=False, routers=("mlp.gate.weight",))


@pytest.mark.oracle
def test_draw_exercises_bias(models):
    """The draw's routing bias changes some selections (else the differential tests could
    not see a mistake in it)."""
    check_draw_changes_selections(models["glm4_moe"][0], "glm4_moe", need_groups=False)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_matches_transformers(arch, models, f32_containers):
    check_f32_container(f32_containers[arch], models[arch], arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_same_greedy_and_small_kl(arch, models, tmp_path):
    check_q8_0_against(models[arch], tmp_path, _quant_dequant(models[arch][0]), arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_container_is_exact_on_its_own_weights(arch, models, tmp_path):
    """The Q8_0 container computes exactly what transformers computes on the quantize ->
    dequantize of the same weights."""
    require_gguf()
    model, hf_dir = models[arch][:2]
    check_q8_0_exact(hf_dir, tmp_path, _quant_dequant(model), "q8.warp", arch)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_streaming_at_floor_bit_identical(arch, f32_containers):
    check_streaming_and_threads(f32_containers[arch])


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_state_roundtrip_continues_identically(arch, f32_containers, tmp_path):
    check_state_resumes_decode(f32_containers[arch], tmp_path)


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_plan_kv_bytes_by_hand(arch, models, f32_containers):
    """The usual K and V of n_kv_heads * head_dim each, per token and layer."""
    from warp_providers import plan_memory

    cfg = models[arch][0].config
    out = f32_containers[arch]
    for ctx in (64, 1000):
        plan = plan_memory(out, ctx=ctx)
        want = 2 * cfg.num_hidden_layers * ctx * cfg.num_key_value_heads * cfg.head_dim * 4
        assert plan["kv_bytes"] == want, (arch, ctx, plan["kv_bytes"], want)
        assert plan["state_bytes"] == {"kv": want}


@pytest.mark.oracle
def test_manifest_hparams(models, f32_containers):
    glm = manifest(f32_containers["glm4_moe"])["hparams"]
    assert glm["rope_dim"] == 8 and glm["head_dim"] == 16 and glm["qk_norm"] == "head"
    assert glm["scoring_func"] == "sigmoid" and glm["routed_scaling_factor"] == 2.5
    assert "kv_lora_rank" not in glm
    names = {t["name"] for t in manifest(f32_containers["glm4_moe"])["trunk"]["tensors"]}
    assert {"blk.1.exp_probs_b.bias", "blk.0.attn_q.bias", "blk.2.ffn_gate_shexp.weight"} <= names
