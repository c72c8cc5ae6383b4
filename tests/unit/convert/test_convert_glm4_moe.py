"""arch/glm4_moe.py: its defaults and config checks, and its tensor map."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import attention, base_config, check_map, load, mlp, norms, standard_pairs, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import glm4_moe


def _cfg(**kw):
    return base_config(
        "glm4_moe",
        num_hidden_layers=2,
        head_dim=8,
        intermediate_size=48,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        use_qk_norm=True,
        **kw,
    )


def test_tensor_map_with_qk_norm_and_shared_expert(tmp_path: Path) -> None:
    shapes = top()
    for i in range(2):
        pre = f"model.layers.{i}."
        shapes |= (
            norms(pre)
            | attention(pre, 4, 2, 8, bias=True)
            | {pre + "self_attn.q_norm.weight": (8,), pre + "self_attn.k_norm.weight": (8,)}
        )
    shapes |= mlp("model.layers.0.mlp.", 48) | mlp("model.layers.1.mlp.shared_experts.", 16)
    shapes |= {
        "model.layers.1.mlp.gate.weight": (4, 32),
        "model.layers.1.mlp.gate.e_score_correction_bias": (4,),
        "model.layers.1.mlp.experts.gate_up_proj": (4, 32, 32),
        "model.layers.1.mlp.experts.down_proj": (4, 32, 16),
    }
    data = write(tmp_path, _cfg(), shapes)
    plan = load(tmp_path)
    check_map(plan, data, standard_pairs(shapes), computed={"rope_freqs"})
    hp = plan.hparams
    assert hp["qk_norm"] == "head" and hp["rope_dim"] == 4  # partial_rotary_factor 0.5
    assert (hp["n_group"], hp["routed_scaling_factor"], hp["norm_topk_prob"]) == (1, 1.0, True)


def test_partial_rotary_factor_from_the_config_wins() -> None:
    assert glm4_moe.ARCH.hparams(_cfg(partial_rotary_factor=1.0), {})["rope_dim"] == 8
    rp = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}
    assert glm4_moe.ARCH.hparams(_cfg(rope_parameters=rp), {})["rope_dim"] == 2


@pytest.mark.parametrize(
    "key,value",
    [
        ("use_qk_norm", 1),
        ("partial_rotary_factor", 1.5),
        ("scoring_func", "softmax"),
        ("n_shared_experts", -1),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key):
        glm4_moe.ARCH.hparams({**_cfg(), key: value}, {})
