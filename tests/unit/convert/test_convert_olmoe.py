"""arch/olmoe.py: its config checks (clip_qkv, routing) and its tensor map (full-row q/k norms)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import (
    attention,
    base_config,
    check_experts,
    check_map,
    load,
    mlp,
    norms,
    standard_pairs,
    top,
    write,
)

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import olmoe


def _cfg(**kw):
    return base_config(
        "olmoe",
        num_hidden_layers=1,
        intermediate_size=16,
        num_experts=2,
        num_experts_per_tok=1,
        num_key_value_heads=4,
        **kw,
    )


def test_tensor_map_with_full_row_qk_norms(tmp_path: Path) -> None:
    pre = "model.layers.0."
    shapes = (
        top()
        | norms(pre)
        | attention(pre, 4, 4, 8)
        | {
            pre + "self_attn.q_norm.weight": (32,),
            pre + "self_attn.k_norm.weight": (32,),
            pre + "mlp.gate.weight": (2, 32),
        }
    )
    for e in range(2):
        shapes |= mlp(f"{pre}mlp.experts.{e}.", 16)
    data = write(tmp_path, _cfg(clip_qkv=3.5), shapes)
    plan = load(tmp_path)
    check_map(plan, data, standard_pairs(shapes), computed={"rope_freqs"})
    ex = pre + "mlp.experts.{}.{}_proj.weight"
    check_experts(
        plan, data, 0, {e: tuple(ex.format(e, p) for p in ("gate", "up", "down")) for e in range(2)}
    )
    hp = plan.hparams
    assert hp["qk_norm"] == "full" and hp["clip_qkv"] == 3.5 and hp["norm_topk_prob"] is False


def test_clip_qkv_null_means_no_clamp() -> None:
    assert olmoe.ARCH.hparams(_cfg(clip_qkv=None), {})["clip_qkv"] == 0.0


@pytest.mark.parametrize(
    "key,value",
    [
        ("clip_qkv", -1),
        ("clip_qkv", "big"),
        ("norm_topk_prob", 1),
        ("num_experts_per_tok", 0),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key):
        olmoe.ARCH.hparams({**_cfg(), key: value}, {})
