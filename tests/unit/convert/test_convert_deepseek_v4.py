"""arch/deepseek_v4.py: its config checks and its tensor map (the release's names)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ckpt import check_pairs, load
from safetensors.numpy import load_file, save_file

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import deepseek_v4
from warp_providers.synth import DeepseekV4Shape, make_deepseek_v4_checkpoint

SHAPE = DeepseekV4Shape(
    hidden_size=64,
    num_hidden_layers=3,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    num_attention_heads=2,
    head_dim=32,
    q_lora_rank=32,
    qk_rope_head_dim=16,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=2,
    index_head_dim=16,
    index_topk=4,
    compress_rate_csa=4,
    compress_rate_hca=8,
    sliding_window=8,
    hc_mult=2,
    num_hash_layers=1,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_deepseek_v4_checkpoint(tmp_path_factory.mktemp("v4") / "hf", SHAPE)


def _stored(d: Path) -> dict:
    out: dict = {}
    for f in sorted(d.glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def test_csa_layer_tensor_map(ckpt: Path) -> None:
    plan = load(ckpt)
    a, x = "layers.1.attn.", "layers.1.attn.indexer."
    pairs = [
        ("layers.1.attn_norm.weight", "blk.1.attn_norm.weight"),
        ("layers.1.ffn_norm.weight", "blk.1.ffn_norm.weight"),
        (a + "wq_a.weight", "blk.1.attn_q_a.weight"),
        (a + "q_norm.weight", "blk.1.attn_q_a_norm.weight"),
        (a + "wq_b.weight", "blk.1.attn_q_b.weight"),
        (a + "wkv.weight", "blk.1.attn_kv.weight"),
        (a + "norm.weight", "blk.1.attn_kv_norm.weight"),
        (a + "wo_a.weight", "blk.1.attn_output_a.weight"),
        (a + "wo_b.weight", "blk.1.attn_output_b.weight"),
        (a + "attn_sink", "blk.1.attn_sinks"),
        (a + "compressor.wkv.weight", "blk.1.attn_cmp_kv.weight"),
        (a + "compressor.wgate.weight", "blk.1.attn_cmp_gate.weight"),
        (a + "compressor.norm.weight", "blk.1.attn_cmp_norm.weight"),
        (a + "compressor.ape", "blk.1.attn_cmp_bias"),
        (x + "compressor.wkv.weight", "blk.1.attn_idx_kv.weight"),
        (x + "compressor.wgate.weight", "blk.1.attn_idx_gate.weight"),
        (x + "compressor.norm.weight", "blk.1.attn_idx_norm.weight"),
        (x + "compressor.ape", "blk.1.attn_idx_bias"),
        (x + "wq_b.weight", "blk.1.attn_idx_q.weight"),
        (x + "weights_proj.weight", "blk.1.attn_idx_w.weight"),
        ("layers.1.ffn.gate.weight", "blk.1.ffn_gate_inp.weight"),
        ("layers.1.ffn.gate.bias", "blk.1.exp_probs_b.bias"),
    ] + [
        (f"layers.1.hc_{p}_{k}", f"blk.1.hc_{p}.{k}")
        for p in ("attn", "ffn")
        for k in ("fn", "base", "scale")
    ]
    shexp = [
        (f"layers.1.ffn.shared_experts.{w}.weight", f"blk.1.ffn_{p}_shexp.weight")
        for w, p in (("w1", "gate"), ("w3", "up"), ("w2", "down"))
    ]
    check_pairs(plan, _stored(ckpt), pairs + shexp, layer=1)
    hp = plan.hparams
    assert hp["compress_kinds"] == ["none", "csa", "hca"] and hp["hash_layers"] == [
        True,
        False,
        False,
    ]
    names = {t.name for t in plan.trunk}
    assert {"blk.0.ffn_hash_ids", "rope_freqs_compress", "hc_head.fn"} <= names
    assert not any(n.startswith(("blk.0.attn_cmp", "blk.2.attn_idx")) for n in names)


@pytest.mark.parametrize(
    "key,value",
    [
        ("scoring_func", "softmax"),
        ("hc_mult", 17),
        ("o_groups", 3),
        ("num_key_value_heads", 2),
        ("compress_ratios", [0, 5, 128]),
        ("mlp_layer_types", ["moe"]),
        ("hc_eps", -1.0),
    ],
)
def test_bad_knob_is_refused_by_name(ckpt: Path, key: str, value: object) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[key] = value
    if key == "compress_ratios":
        cfg.pop("layer_types", None)
    with pytest.raises(ConvertError, match=key):
        deepseek_v4.ARCH.hparams(cfg, {})


def test_stray_tensor_is_named(ckpt: Path, tmp_path: Path) -> None:
    for f in ckpt.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    save_file(
        {"layers.0.attn.mystery": np.zeros(3, np.float32)}, str(tmp_path / "model-x.safetensors")
    )
    index = tmp_path / "model.safetensors.index.json"
    wm = json.loads(index.read_text())
    wm["weight_map"]["layers.0.attn.mystery"] = "model-x.safetensors"
    index.write_text(json.dumps(wm))
    with pytest.raises(ConvertError, match="layers.0.attn.mystery"):
        load(tmp_path)
