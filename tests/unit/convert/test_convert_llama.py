"""arch/llama.py: its config checks and its tensor map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt import attention, base_config, check_map, load, mlp, norms, standard_pairs, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import llama


def _ckpt(d: Path, bias: bool = False, mlp_bias: bool = False, **cfg_kw):
    cfg = base_config("llama", num_hidden_layers=2, intermediate_size=48, head_dim=8, **cfg_kw)
    shapes = top()
    for i in range(2):
        pre = f"model.layers.{i}."
        shapes |= norms(pre) | attention(pre, 4, 2, 8, bias) | mlp(pre + "mlp.", 48)
        if mlp_bias:
            shapes |= {
                pre + "mlp.gate_proj.bias": (48,),
                pre + "mlp.up_proj.bias": (48,),
                pre + "mlp.down_proj.bias": (32,),
            }
    return write(d, cfg, shapes), shapes


def test_tensor_map_with_attention_and_mlp_biases(tmp_path: Path) -> None:
    data, shapes = _ckpt(tmp_path, bias=True, mlp_bias=True)
    plan = load(tmp_path)
    pairs = standard_pairs(
        {k: v for k, v in shapes.items() if ".mlp." not in k or "proj.weight" in k}
    )
    pairs += [
        (f"model.layers.{i}.mlp.{p}_proj.bias", f"blk.{i}.ffn_{p}.bias")
        for i in range(2)
        for p in ("gate", "up", "down")
    ]
    check_map(plan, data, pairs, computed={"rope_freqs"})
    assert plan.model_type == "llama" and plan.experts == []
    assert plan.hparams["layer_kinds"] == ["dense", "dense"]


def test_rope_table_follows_the_config(tmp_path: Path) -> None:
    _ckpt(tmp_path, rope_theta=500.0)
    t = next(t for t in load(tmp_path).trunk if t.name == "rope_freqs")
    want = 1.0 / 500.0 ** (np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(t.rows(0, 1)[0], want, rtol=1e-6)


@pytest.mark.parametrize(
    "key,value",
    [
        ("hidden_act", "gelu"),
        ("num_key_value_heads", 3),
        ("rms_norm_eps", 0),
        ("hidden_size", -1),
        ("tie_word_embeddings", "yes"),
        ("eos_token_id", 99),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    cfg = base_config("llama", num_hidden_layers=1, intermediate_size=48)
    cfg[key] = value
    with pytest.raises(ConvertError, match=key if key != "eos_token_id" else "vocabulary"):
        llama.ARCH.hparams(cfg, {})


def test_stray_and_missing_tensors_are_named(tmp_path: Path) -> None:
    _, shapes = _ckpt(tmp_path)
    write(
        tmp_path,
        base_config("llama", num_hidden_layers=2, intermediate_size=48, head_dim=8),
        shapes | {"model.layers.0.mlp.gate.weight": (4, 32)},
    )
    with pytest.raises(ConvertError, match="model.layers.0.mlp.gate.weight"):
        load(tmp_path)
    del shapes["model.layers.1.self_attn.k_proj.weight"]
    write(
        tmp_path,
        base_config("llama", num_hidden_layers=2, intermediate_size=48, head_dim=8),
        shapes,
    )
    with pytest.raises(ConvertError, match="model.layers.1.self_attn.k_proj.weight"):
        load(tmp_path)
