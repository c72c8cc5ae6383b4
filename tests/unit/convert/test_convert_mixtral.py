"""arch/mixtral.py: its config checks and its tensor map (per-expert and fused experts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt import (
    attention,
    base_config,
    check_experts,
    check_map,
    load,
    norms,
    standard_pairs,
    top,
    write,
)

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import mixtral


def _cfg(**kw):
    return base_config(
        "mixtral",
        num_hidden_layers=2,
        intermediate_size=16,
        head_dim=8,
        num_local_experts=3,
        num_experts_per_tok=2,
        **kw,
    )


def _shapes(fused: bool = False):
    shapes = top()
    for i in range(2):
        pre = f"model.layers.{i}."
        shapes |= (
            norms(pre) | attention(pre, 4, 2, 8) | {pre + "block_sparse_moe.gate.weight": (3, 32)}
        )
        if fused:
            shapes |= {
                pre + "mlp.experts.gate_up_proj": (3, 32, 32),
                pre + "mlp.experts.down_proj": (3, 32, 16),
            }
        else:
            for e in range(3):
                ex = f"{pre}block_sparse_moe.experts.{e}."
                shapes |= {
                    ex + "w1.weight": (16, 32),
                    ex + "w3.weight": (16, 32),
                    ex + "w2.weight": (32, 16),
                }
    return shapes


def test_tensor_map_per_expert(tmp_path: Path) -> None:
    shapes = _shapes()
    data = write(tmp_path, _cfg(), shapes)
    plan = load(tmp_path)
    check_map(plan, data, standard_pairs(shapes), computed={"rope_freqs"})
    ex = "model.layers.1.block_sparse_moe.experts.{}.{}.weight"
    check_experts(
        plan, data, 1, {e: tuple(ex.format(e, w) for w in ("w1", "w3", "w2")) for e in range(3)}
    )
    hp = plan.hparams
    assert (hp["n_experts"], hp["top_k"], hp["moe_intermediate_size"]) == (3, 2, 16)
    assert hp["layer_kinds"] == ["moe", "moe"] and hp["norm_topk_prob"] is True


def test_fused_experts_split_gate_and_up(tmp_path: Path) -> None:
    data = write(tmp_path, _cfg(), _shapes(fused=True))
    (bank,) = [x for x in load(tmp_path).experts if x.layer == 0]
    gu = data["model.layers.0.mlp.experts.gate_up_proj"]
    gate, up, down = bank.expert(2)
    np.testing.assert_array_equal(gate.rows(0, 16), gu[2, :16])
    np.testing.assert_array_equal(up.rows(0, 16), gu[2, 16:])
    np.testing.assert_array_equal(down.rows(0, 32), data["model.layers.0.mlp.experts.down_proj"][2])


def test_sliding_window_on_every_layer() -> None:
    assert mixtral.ARCH.hparams(_cfg(sliding_window=5), {})["attn_kinds"] == ["sliding"] * 2
    assert "attn_kinds" not in mixtral.ARCH.hparams(_cfg(sliding_window=None), {})


@pytest.mark.parametrize(
    "key,value",
    [
        ("num_experts_per_tok", 4),
        ("sliding_window", -2),
        ("num_local_experts", 0),
        ("hidden_act", "relu"),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key if key != "num_local_experts" else "expert count"):
        mixtral.ARCH.hparams({**_cfg(), key: value}, {})


def test_missing_expert_projection_is_named(tmp_path: Path) -> None:
    shapes = _shapes()
    del shapes["model.layers.0.block_sparse_moe.experts.1.w3.weight"]
    write(tmp_path, _cfg(), shapes)
    with pytest.raises(ConvertError, match="expert 1 has no up projection"):
        load(tmp_path)
