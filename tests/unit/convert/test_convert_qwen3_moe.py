"""arch/qwen3_moe.py: its config checks (layer kinds, window) and its tensor map."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import attention, base_config, check_map, load, mlp, norms, standard_pairs, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import qwen3_moe


def _cfg(**kw):
    kw = {"num_experts": 2, **kw}
    return base_config(
        "qwen3_moe",
        num_hidden_layers=2,
        intermediate_size=48,
        head_dim=8,
        moe_intermediate_size=16,
        num_experts_per_tok=1,
        mlp_only_layers=[0],
        **kw,
    )


def test_tensor_map_dense_and_moe_layers(tmp_path: Path) -> None:
    shapes = top(tied=True)
    for i in range(2):
        pre = f"model.layers.{i}."
        shapes |= (
            norms(pre)
            | attention(pre, 4, 2, 8)
            | {pre + "self_attn.q_norm.weight": (8,), pre + "self_attn.k_norm.weight": (8,)}
        )
    shapes |= mlp("model.layers.0.mlp.", 48) | {"model.layers.1.mlp.gate.weight": (2, 32)}
    shapes |= mlp("model.layers.1.mlp.experts.0.", 16) | mlp("model.layers.1.mlp.experts.1.", 16)
    data = write(tmp_path, _cfg(tie_word_embeddings=True), shapes)
    plan = load(tmp_path)
    check_map(plan, data, standard_pairs(shapes), computed={"rope_freqs"})
    assert plan.hparams["layer_kinds"] == ["dense", "moe"] and plan.hparams["qk_norm"] == "head"
    assert [x.layer for x in plan.experts] == [1]


def test_no_experts_is_a_dense_model() -> None:
    hp = qwen3_moe.ARCH.hparams(_cfg(num_experts=0), {})
    assert hp["layer_kinds"] == ["dense", "dense"] and hp["top_k"] == 0


def test_window_only_when_use_sliding_window() -> None:
    assert "attn_kinds" not in qwen3_moe.ARCH.hparams(_cfg(sliding_window=4), {})
    on = qwen3_moe.ARCH.hparams(_cfg(sliding_window=4, use_sliding_window=True), {})
    assert on["attn_kinds"] == ["sliding", "sliding"] and on["sliding_window"] == 4


@pytest.mark.parametrize(
    "key,value",
    [
        ("mlp_only_layers", "0"),
        ("decoder_sparse_step", 0),
        ("use_sliding_window", "on"),
        ("mlp_layer_types", ["dense"]),
        ("moe_intermediate_size", None),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key):
        qwen3_moe.ARCH.hparams({**_cfg(), key: value}, {})
