"""arch/glm5_next.py: its config checks and schedules, and its tensor map (KDA, MLA, DSA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt import check_pairs, load
from safetensors.numpy import load_file

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import glm5_next
from warp_providers.synth import Glm5NextShape, make_glm5_next_checkpoint

SHAPE = Glm5NextShape(
    hidden_size=64,
    num_hidden_layers=4,
    layer_pattern="LFSL",
    first_k_dense_replace=1,
    intermediate_size=64,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    num_attention_heads=2,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    v_head_dim=32,
    linear_num_heads=2,
    linear_head_dim=32,
    index_n_heads=2,
    index_head_dim=32,
    index_topk=32,
    index_kpool=16,
    hc_mult=2,
)
P = "model.language_model.layers."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_glm5_next_checkpoint(tmp_path_factory.mktemp("g5") / "hf", SHAPE)


def _stored(d: Path) -> dict:
    out: dict = {}
    for f in sorted(d.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def _common(i: int) -> list[tuple[str, str]]:
    pre = f"{P}{i}."
    out = [
        (pre + "input_layernorm.weight", f"blk.{i}.attn_norm.weight"),
        (pre + "post_attention_layernorm.weight", f"blk.{i}.ffn_norm.weight"),
    ]
    return out + [
        (f"{pre}hc_{p}_{k}", f"blk.{i}.hc_{p}.{k}")
        for p in ("attn", "ffn")
        for k in ("fn", "base", "scale")
    ]


def test_kda_layer_tensor_map(ckpt: Path) -> None:
    a = f"{P}0.self_attn."
    pairs = _common(0) + [(a + f"{p}_proj.weight", f"blk.0.attn_{p}.weight") for p in "qkv"]
    pairs += [
        (a + "o_proj.weight", "blk.0.attn_output.weight"),
        (a + "o_norm.weight", "blk.0.kda_o_norm.weight"),
        (a + "dt_bias", "blk.0.kda_dt_bias"),
        (a + "A_log", "blk.0.kda_a_log"),
    ]
    pairs += [
        (a + f"{p}_proj.weight", f"blk.0.kda_{p}.weight") for p in ("f_a", "f_b", "b", "g_a", "g_b")
    ]
    pairs += [
        (f"{P}0.mlp.{p}_proj.weight", f"blk.0.ffn_{p}.weight") for p in ("gate", "up", "down")
    ]
    check_pairs(load(ckpt), _stored(ckpt), pairs, layer=0, computed={"blk.0.kda_conv.weight"})


def test_indexed_mla_layer_tensor_map(ckpt: Path) -> None:
    a, x = f"{P}1.self_attn.", f"{P}1.self_attn.indexer."
    pairs = (
        _common(1)
        + [
            (a + "q_a_proj.weight", "blk.1.attn_q_a.weight"),
            (a + "q_a_layernorm.weight", "blk.1.attn_q_a_norm.weight"),
            (a + "q_b_proj.weight", "blk.1.attn_q_b.weight"),
            (a + "kv_a_proj_with_mqa.weight", "blk.1.attn_kv_a_mqa.weight"),
            (a + "kv_a_layernorm.weight", "blk.1.attn_kv_a_norm.weight"),
            (a + "kv_b_proj.weight", "blk.1.attn_kv_b.weight"),
            (a + "o_proj.weight", "blk.1.attn_output.weight"),
            (x + "wq_b.weight", "blk.1.attn_idx_q.weight"),
            (x + "wk.weight", "blk.1.attn_idx_k.weight"),
            (x + "index_kpool_compress_gate", "blk.1.attn_idx_gate.weight"),
            (x + "weights_proj.weight", "blk.1.attn_idx_w.weight"),
            (x + "k_norm.weight", "blk.1.attn_idx_k_norm.weight"),
            (x + "k_norm.bias", "blk.1.attn_idx_k_norm.bias"),
            (x + "index_kpool_compress_ape", "blk.1.attn_idx_ape"),
            (f"{P}1.mlp.gate.weight", "blk.1.ffn_gate_inp.weight"),
            (f"{P}1.mlp.gate.e_score_correction_bias", "blk.1.exp_probs_b.bias"),
        ]
        + [
            (f"{P}1.mlp.shared_experts.{p}_proj.weight", f"blk.1.ffn_{p}_shexp.weight")
            for p in ("gate", "up", "down")
        ]
    )
    plan = load(ckpt)
    check_pairs(plan, _stored(ckpt), pairs, layer=1)
    assert plan.hparams["index_kinds"] == ["none", "full", "shared", "none"]
    assert plan.hparams["rope_dim"] == 0 and plan.model_type == "glm5_next"
    assert not any(t.name.startswith("blk.2.attn_idx") for t in plan.trunk)  # shares layer 1's


def test_flat_text_config_is_the_same_model(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    flat = {**cfg["text_config"], "model_type": "glm5_next_text"}
    assert glm5_next.ARCH.hparams(flat, {}) == glm5_next.ARCH.hparams(cfg, {})


@pytest.mark.parametrize(
    "key,value",
    [
        ("qk_rope_head_dim", 64),
        ("q_lora_rank", 0),
        ("attention_bias", True),
        ("index_kpool", 5),
        ("hc_mult", 17),
        ("linear_lower_bound", 1.0),
        ("swiglu_limit", 0),
        ("index_topk_pattern", "FX"),
    ],
)
def test_bad_knob_is_refused_by_name(ckpt: Path, key: str, value: object) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["text_config"][key] = value
    if key == "index_topk_pattern":
        cfg["text_config"].pop("indexer_types", None)
    with pytest.raises(ConvertError, match=key if key != "hc_mult" else "hc_mult"):
        glm5_next.ARCH.hparams(cfg, {})


def test_indexer_sharing_needs_an_indexed_layer_before() -> None:
    tc = glm5_next.text_config(
        {
            "model_type": "glm5_next_text",
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "indexed_attention"],
            "indexer_types": ["full", "shared"],
        }
    )
    with pytest.raises(ConvertError, match="shares the indexer selection"):
        glm5_next.schedules(tc, 2)
