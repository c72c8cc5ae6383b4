"""deepseek_v3: engine vs transformers on tiny random models (no download).

The first draw keeps DeepSeek-V3's distinctive features: MLA with q_lora and the latent
KV cache, YaRN (mscale != mscale_all_dim, so both the cos/sin factor and the squared
softmax-scale factor differ from 1) with interleaved rope, 4 expert groups with topk_group
2, a random e_score_correction_bias, routed_scaling_factor, a shared expert and a dense
first layer. A second draw covers MLA without q_lora, non-interleaved rope, attention
biases and Kimi-K2's single group.

Per draw: F32 max |dlogit| <= 1e-4 over a 32-token prompt and 16 decode steps; Q8_0 the
same 16-token greedy continuation and mean KL <= 1e-3; exactness on the quantize ->
dequantize weights; expert streaming at the floor bit-identical to all-resident; state
save/load round-trips and continues identically; plan_memory's kv_bytes equals a hand
computation (the MLA latent: kv_lora_rank + qk_rope_head_dim floats per token and layer).
The published config spelling converts to the same container.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from oracle_util import (
    COMMON,
    PROMPT,
    check_draw_changes_selections,
    convert_to,
    manifest,
    routed_suite,
)

BIAS_STD = 0.2  # e_score_correction_bias: large enough to reorder the selection


def _deepseek_v3() -> Any:
    import transformers as tf

    return tf.DeepseekV3Config(**{**COMMON, **dict(
        num_hidden_layers=3, num_key_value_heads=4, max_position_embeddings=256,
        intermediate_size=128, moe_intermediate_size=32, n_routed_experts=16, n_group=4,
        topk_group=2, num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32,
                         "beta_slow": 1, "original_max_position_embeddings": 64})})


def _deepseek_v3_plain() -> Any:
    """No q_lora (q_proj), rotate_half rope, attention biases, one group (Kimi-K2)."""
    import transformers as tf

    return tf.DeepseekV3Config(**{**COMMON, **dict(
        num_key_value_heads=4, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2, n_shared_experts=2,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=8, routed_scaling_factor=1.5, norm_topk_prob=False,
        rope_interleave=False, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})})


CONFIGS = {"deepseek_v3": _deepseek_v3, "deepseek_v3_plain": _deepseek_v3_plain}
# The draw of each model: one that Q8_0 rounding leaves stable in transformers itself
# (checked by assert_q8_0_matches): seed 0 of deepseek_v3 sits at mean KL 9.9e-4.
SEEDS = {"deepseek_v3": 1}


@pytest.mark.oracle
def test_draws_exercise_groups_and_bias(models):
    """The deepseek_v3 draw's group limit and bias both change some selections (else the
    differential tests could not see a mistake in them)."""
    check_draw_changes_selections(models["deepseek_v3"][0], "deepseek_v3", need_groups=True)


def _hand_state_bytes(cfg: Any, ctx: int) -> dict[str, int]:
    """MLA caches kv_lora_rank + qk_rope_head_dim floats per token and layer (no V)."""
    return {"mla_latent": 4 * ctx * cfg.num_hidden_layers * (cfg.kv_lora_rank
                                                             + cfg.qk_rope_head_dim)}


(models, f32_containers, test_f32_matches_transformers, test_q8_0_same_greedy_and_small_kl,
 test_q8_0_container_is_exact_on_its_own_weights, test_streaming_at_floor_bit_identical,
 test_state_roundtrip_continues_identically, test_plan_kv_bytes_by_hand,
 ) = routed_suite(CONFIGS, SEEDS, BIAS_STD, _hand_state_bytes)


@pytest.mark.oracle
def test_manifest_hparams(models, f32_containers):
    import math

    hp = manifest(f32_containers["deepseek_v3"])["hparams"]
    assert hp["scoring_func"] == "sigmoid" and hp["n_group"] == 4 and hp["topk_group"] == 2
    assert hp["routed_scaling_factor"] == 2.5 and hp["rope_interleave"] is True
    assert (hp["kv_lora_rank"], hp["q_lora_rank"], hp["qk_nope_head_dim"], hp["v_head_dim"],
            hp["rope_dim"], hp["head_dim"]) == (32, 32, 16, 16, 8, 24)
    assert hp["layer_kinds"] == ["dense", "moe", "moe"]
    assert hp["shared_expert_intermediate_size"] == 32 and not hp["shared_expert_gate"]
    mscale_all = 0.1 * 0.8 * math.log(4.0) + 1.0
    assert math.isclose(hp["attn_scale"], 24**-0.5 * mscale_all**2, rel_tol=1e-12)
    assert math.isclose(hp["rope_attn_factor"], (0.1 * math.log(4.0) + 1) / mscale_all)
    plain = manifest(f32_containers["deepseek_v3_plain"])["hparams"]
    assert plain["q_lora_rank"] == 0 and plain["rope_interleave"] is False
    assert plain["shared_expert_intermediate_size"] == 64 and plain["n_group"] == 1


@pytest.mark.oracle
def test_original_config_spelling_and_mtp_layer(models, f32_containers, tmp_path):
    """A DeepSeek-V3 checkpoint as published: rope_scaling + top-level rope_theta,
    scoring_func/topk_method spelled out, an MTP layer after the decoder (skipped). It
    converts to the same hparams and logits; a softmax scoring_func is refused."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from warp_providers import Engine
    from warp_providers.convert.quant import ConvertError

    src = tmp_path / "hf"
    shutil.copytree(models["deepseek_v3"][1], src)
    cfg = json.loads((src / "config.json").read_text())
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    cfg.update(rope_scaling=rp, scoring_func="sigmoid", topk_method="noaux_tc",
               num_nextn_predict_layers=1)
    (src / "config.json").write_text(json.dumps(cfg))
    (st,) = src.glob("*.safetensors")
    tensors = load_file(st)
    tensors["model.layers.3.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    tensors["model.layers.3.enorm.weight"] = np.ones(64, np.float32)
    save_file(tensors, st, metadata={"format": "pt"})
    out = convert_to(src, tmp_path / "m.warp", experts="f32", trunk="f32")
    want = manifest(f32_containers["deepseek_v3"])["hparams"]
    assert manifest(out)["hparams"] == want
    with Engine.open(out, threads=2) as a, Engine.open(f32_containers["deepseek_v3"]) as b:
        assert np.array_equal(a.eval(PROMPT, all_logits=True), b.eval(PROMPT, all_logits=True))
    cfg["scoring_func"] = "softmax"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConvertError, match="scoring_func"):
        convert_to(src, tmp_path / "bad.warp", experts="f32", trunk="f32")
