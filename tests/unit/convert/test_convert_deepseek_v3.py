"""arch/deepseek_v3.py (and the kimi_k2 alias): config checks, MLA + routing tensor map."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import base_config, check_experts, check_map, load, mlp, norms, standard_pairs, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import deepseek_v3


def _cfg(**kw):
    return base_config(
        "deepseek_v3",
        num_hidden_layers=2,
        num_key_value_heads=4,
        intermediate_size=48,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.0,
        num_nextn_predict_layers=1,
        **kw,
    )


def _shapes():
    shapes = top()
    for i in range(3):  # layer 2: the multi-token-prediction layer
        a = f"model.layers.{i}.self_attn."
        shapes |= norms(f"model.layers.{i}.") | {
            a + "q_a_proj.weight": (16, 32),
            a + "q_a_layernorm.weight": (16,),
            a + "q_b_proj.weight": (64, 16),
            a + "kv_a_proj_with_mqa.weight": (24, 32),
            a + "kv_a_layernorm.weight": (16,),
            a + "kv_b_proj.weight": (64, 16),
            a + "o_proj.weight": (32, 32),
        }
    shapes |= mlp("model.layers.0.mlp.", 48) | mlp("model.layers.1.mlp.shared_experts.", 16)
    shapes |= {
        "model.layers.1.mlp.gate.weight": (4, 32),
        "model.layers.1.mlp.gate.e_score_correction_bias": (4,),
    }
    for e in range(4):
        shapes |= mlp(f"model.layers.1.mlp.experts.{e}.", 16)
    return shapes


@pytest.mark.parametrize("model_type", ["deepseek_v3", "kimi_k2"])
def test_tensor_map_mla_shared_experts_routing_bias(tmp_path: Path, model_type: str) -> None:
    shapes = _shapes()
    data = write(tmp_path, {**_cfg(), "model_type": model_type}, shapes)
    plan = load(tmp_path)
    kept = {k: v for k, v in shapes.items() if not k.startswith("model.layers.2.")}
    check_map(plan, data, standard_pairs(kept), computed={"rope_freqs"})
    ex = "model.layers.1.mlp.experts.{}.{}_proj.weight"
    check_experts(
        plan, data, 1, {e: tuple(ex.format(e, p) for p in ("gate", "up", "down")) for e in range(4)}
    )
    hp = plan.hparams
    assert plan.model_type == "deepseek_v3" and hp["layer_kinds"] == ["dense", "moe"]
    assert (hp["head_dim"], hp["rope_dim"], hp["shared_expert_intermediate_size"]) == (16, 8, 16)
    assert (hp["scoring_func"], hp["n_group"], hp["routed_scaling_factor"]) == ("sigmoid", 2, 2.0)


def test_yarn_mscale_enters_the_softmax_scale() -> None:
    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,
    }
    plain = deepseek_v3.ARCH.hparams(_cfg(), {})["attn_scale"]
    scaled = deepseek_v3.ARCH.hparams(_cfg(rope_scaling=rope), {})["attn_scale"]
    assert plain == pytest.approx(16**-0.5)
    assert scaled == pytest.approx(plain * (0.1 * __import__("math").log(4.0) + 1.0) ** 2)


@pytest.mark.parametrize(
    "key,value",
    [
        ("scoring_func", "softmax"),
        ("topk_method", "greedy"),
        ("n_group", 3),
        ("topk_group", 3),
        ("routed_scaling_factor", 0),
        ("kv_lora_rank", 0),
        ("rope_interleave", "no"),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key if key != "kv_lora_rank" else "kv_lora_rank"):
        deepseek_v3.ARCH.hparams({**_cfg(), key: value}, {})
