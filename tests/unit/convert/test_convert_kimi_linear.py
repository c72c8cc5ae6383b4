"""arch/kimi_linear.py: its config checks and its tensor map (KDA + NoPE MLA, both spellings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt import base_config, check_experts, check_pairs, load, mlp, norms, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import kimi_linear

LAC = {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4}


def _cfg(**kw):
    return base_config(
        "kimi_linear",
        num_hidden_layers=2,
        num_key_value_heads=4,
        intermediate_size=48,
        layer_types=["linear_attention", "full_attention"],
        linear_attn_config=LAC,
        q_lora_rank=0,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_size=16,
        num_shared_experts=1,
        first_k_dense_replace=1,
        num_expert_group=1,
        **kw,
    )


def _shapes():
    a0, a1, m1 = "model.layers.0.self_attn.", "model.layers.1.self_attn.", "model.layers.1."
    shapes = top() | norms("model.layers.0.") | norms(m1) | mlp("model.layers.0.mlp.", 48)
    shapes |= {a0 + f"{p}_proj.weight": (16, 32) for p in "qkv"} | {
        a0 + "o_proj.weight": (32, 16),
        a0 + "f_a_proj.weight": (8, 32),
        a0 + "f_b_proj.weight": (16, 8),
        a0 + "b_proj.weight": (2, 32),
        a0 + "g_a_proj.weight": (8, 32),
        a0 + "g_b_proj.weight": (16, 8),
        a0 + "o_norm.weight": (8,),
        a0 + "dt_bias": (16,),
        a0 + "A_log": (1, 1, 2, 1),
    }
    shapes |= {a0 + f"{p}_conv1d.weight": (16, 1, 4) for p in "qkv"}
    shapes |= {
        a1 + "q_proj.weight": (64, 32),
        a1 + "kv_a_proj_with_mqa.weight": (24, 32),
        a1 + "kv_a_layernorm.weight": (16,),
        a1 + "kv_b_proj.weight": (64, 16),
        a1 + "o_proj.weight": (32, 32),
        m1 + "block_sparse_moe.gate.weight": (4, 32),
        m1 + "block_sparse_moe.gate.e_score_correction_bias": (4,),
    }
    shapes |= mlp(m1 + "block_sparse_moe.shared_experts.", 16)
    for e in range(4):
        ex = f"{m1}block_sparse_moe.experts.{e}."
        shapes |= {
            ex + "w1.weight": (16, 32),
            ex + "w3.weight": (16, 32),
            ex + "w2.weight": (32, 16),
        }
    return shapes


def test_kda_layer_tensor_map(tmp_path: Path) -> None:
    data = write(tmp_path, _cfg(), _shapes())
    plan = load(tmp_path)
    a, b = "model.layers.0.self_attn.", "blk.0."
    pairs = [(a + f"{p}_proj.weight", f"{b}attn_{p}.weight") for p in "qkv"]
    pairs += [
        (a + f"{p}_proj.weight", f"{b}kda_{p}.weight") for p in ("f_a", "f_b", "b", "g_a", "g_b")
    ]
    pairs += [
        (a + "o_proj.weight", b + "attn_output.weight"),
        (a + "o_norm.weight", b + "kda_o_norm.weight"),
        ("model.layers.0.input_layernorm.weight", b + "attn_norm.weight"),
        ("model.layers.0.post_attention_layernorm.weight", b + "ffn_norm.weight"),
    ]
    pairs += [
        (f"model.layers.0.mlp.{p}_proj.weight", f"{b}ffn_{p}.weight")
        for p in ("gate", "up", "down")
    ]
    check_pairs(
        plan,
        data,
        pairs,
        layer=0,
        computed={b + "kda_dt_bias", b + "kda_a_log", b + "kda_conv.weight"},
    )
    trunk = {t.name: t for t in plan.trunk}
    np.testing.assert_array_equal(
        trunk[b + "kda_a_log"].rows(0, 1)[0], data[a + "A_log"].reshape(-1)
    )
    conv = np.concatenate([data[a + f"{p}_conv1d.weight"].reshape(-1) for p in "qkv"])
    np.testing.assert_array_equal(trunk[b + "kda_conv.weight"].rows(0, 1)[0], conv)


def test_mla_moe_layer_tensor_map(tmp_path: Path) -> None:
    data = write(tmp_path, _cfg(), _shapes())
    plan = load(tmp_path)
    a, m, b = "model.layers.1.self_attn.", "model.layers.1.block_sparse_moe.", "blk.1."
    pairs = [
        (a + "q_proj.weight", b + "attn_q.weight"),
        (a + "kv_a_proj_with_mqa.weight", b + "attn_kv_a_mqa.weight"),
        (a + "kv_a_layernorm.weight", b + "attn_kv_a_norm.weight"),
        (a + "kv_b_proj.weight", b + "attn_kv_b.weight"),
        (a + "o_proj.weight", b + "attn_output.weight"),
        (m + "gate.weight", b + "ffn_gate_inp.weight"),
        (m + "gate.e_score_correction_bias", b + "exp_probs_b.bias"),
        ("model.layers.1.input_layernorm.weight", b + "attn_norm.weight"),
        ("model.layers.1.post_attention_layernorm.weight", b + "ffn_norm.weight"),
    ]
    pairs += [
        (f"{m}shared_experts.{p}_proj.weight", f"{b}ffn_{p}_shexp.weight")
        for p in ("gate", "up", "down")
    ]
    check_pairs(plan, data, pairs, layer=1)
    check_experts(
        plan,
        data,
        1,
        {e: tuple(f"{m}experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")) for e in range(4)},
    )
    rope = next(t for t in plan.trunk if t.name == "rope_freqs")
    assert not rope.rows(0, 1).any()  # NoPE: the rope part is carried unrotated
    hp = plan.hparams
    assert hp["attn_kinds"] == ["kda", "full"] and (hp["kda_heads"], hp["kda_head_dim"]) == (2, 8)
    assert (hp["top_k"], hp["n_group"], hp["shared_expert_intermediate_size"]) == (2, 1, 16)


@pytest.mark.parametrize(
    "key,value",
    [
        ("scoring_func", "softmax"),
        ("layer_types", ["full_attention"]),
        ("linear_attn_config", {"num_heads": 0, "head_dim": 8}),
        ("first_k_dense_replace", -1),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    cfg = _cfg()
    cfg[key] = value
    if key == "first_k_dense_replace":
        cfg.pop("mlp_layer_types", None)
    with pytest.raises(ConvertError, match=key if key != "linear_attn_config" else "KDA heads"):
        kimi_linear.ARCH.hparams(cfg, {})
