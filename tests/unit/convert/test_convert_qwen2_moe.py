"""arch/qwen2_moe.py: its config checks (shared expert, layer_types windows) and tensor map."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import attention, base_config, check_map, load, mlp, norms, standard_pairs, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import qwen2_moe


def _cfg(**kw):
    kw = {"num_hidden_layers": 1, "shared_expert_intermediate_size": 24, **kw}
    return base_config(
        "qwen2_moe",
        intermediate_size=48,
        head_dim=8,
        moe_intermediate_size=16,
        num_experts=2,
        num_experts_per_tok=1,
        **kw,
    )


def _shapes(shared: int = 24):
    pre = "model.layers.0."
    shapes = (
        top()
        | norms(pre)
        | attention(pre, 4, 2, 8, bias=True)
        | {pre + "mlp.gate.weight": (2, 32), pre + "mlp.shared_expert_gate.weight": (1, 32)}
    )
    shapes |= mlp(pre + "mlp.shared_expert.", shared)
    return shapes | mlp(pre + "mlp.experts.0.", 16) | mlp(pre + "mlp.experts.1.", 16)


def test_tensor_map_with_gated_shared_expert(tmp_path: Path) -> None:
    shapes = _shapes()
    data = write(tmp_path, _cfg(), shapes)
    plan = load(tmp_path)
    check_map(plan, data, standard_pairs(shapes), computed={"rope_freqs"})
    assert plan.hparams["shared_expert_gate"] is True
    assert plan.hparams["shared_expert_intermediate_size"] == 24


def test_zero_width_shared_expert_is_left_out(tmp_path: Path) -> None:
    shapes = _shapes(shared=0)
    data = write(tmp_path, _cfg(shared_expert_intermediate_size=0), shapes)
    plan = load(tmp_path)
    kept = {k: v for k, v in shapes.items() if "shared_expert" not in k}
    check_map(plan, data, standard_pairs(kept), computed={"rope_freqs"})
    assert plan.hparams["shared_expert_gate"] is False


def test_window_on_the_layer_types_sliding_layers() -> None:
    hp = qwen2_moe.ARCH.hparams(
        _cfg(num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=2),
        {},
    )
    assert hp["n_layers"] == 3
    assert hp["attn_kinds"] == ["sliding", "full", "full"] and hp["sliding_window"] == 4


@pytest.mark.parametrize(
    "key,value,cfg_kw",
    [
        ("sliding_window", None, dict(layer_types=["sliding_attention"])),
        ("layer_types", ["full"], {}),
        ("shared_expert_intermediate_size", -4, {}),
        ("max_window_layers", "all", dict(use_sliding_window=True, sliding_window=4)),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object, cfg_kw: dict) -> None:
    with pytest.raises(ConvertError, match=key):
        qwen2_moe.ARCH.hparams({**_cfg(**cfg_kw), key: value}, {})
