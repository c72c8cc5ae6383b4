"""arch/gpt_oss.py: its config checks and its tensor map (sinks, biases, interleaved experts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ckpt import attention, base_config, check_pairs, load, norms, top, write

from warp_providers.convert import ConvertError
from warp_providers.convert.arch import gpt_oss


def _cfg(**kw):
    return base_config(
        "gpt_oss",
        num_hidden_layers=2,
        head_dim=8,
        intermediate_size=16,
        num_local_experts=3,
        num_experts_per_tok=2,
        sliding_window=4,
        **kw,
    )


def _shapes():
    shapes = top()
    for i in range(2):
        pre = f"model.layers.{i}."
        shapes |= (
            norms(pre)
            | attention(pre, 4, 2, 8, bias=True)
            | {
                pre + "self_attn.o_proj.bias": (32,),
                pre + "self_attn.sinks": (4,),
                pre + "mlp.router.weight": (3, 32),
                pre + "mlp.router.bias": (3,),
                pre + "mlp.experts.gate_up_proj": (3, 32, 32),
                pre + "mlp.experts.gate_up_proj_bias": (3, 32),
                pre + "mlp.experts.down_proj": (3, 16, 32),
                pre + "mlp.experts.down_proj_bias": (3, 32),
            }
        )
    return shapes


def test_tensor_map_and_interleaved_gate_up(tmp_path: Path) -> None:
    data = write(tmp_path, _cfg(), _shapes())
    plan = load(tmp_path)
    p, b = "model.layers.1.", "blk.1."
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.sinks": "attn_sinks",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
        "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
    }
    names |= {
        f"self_attn.{x}_proj.{w}": f"attn_{y}.{w}"
        for x, y in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
        for w in ("weight", "bias")
    }
    check_pairs(
        plan,
        data,
        [(p + k, b + v) for k, v in names.items()],
        layer=1,
        computed={"blk.1.ffn_gate_exps.bias", "blk.1.ffn_up_exps.bias"},
    )
    trunk = {t.name: t for t in plan.trunk}
    gub = data[p + "mlp.experts.gate_up_proj_bias"]
    np.testing.assert_array_equal(trunk[b + "ffn_gate_exps.bias"].rows(0, 3), gub[:, 0::2])
    np.testing.assert_array_equal(trunk[b + "ffn_up_exps.bias"].rows(0, 3), gub[:, 1::2])
    gu, dn = data[p + "mlp.experts.gate_up_proj"][2], data[p + "mlp.experts.down_proj"][2]
    gate, up, down = plan.experts[1].expert(2)
    np.testing.assert_array_equal(gate.rows(0, 16), gu[:, 0::2].T)
    np.testing.assert_array_equal(up.rows(0, 16), gu[:, 1::2].T)
    np.testing.assert_array_equal(down.rows(0, 32), dn.T)
    hp = plan.hparams
    assert hp["attn_kinds"] == ["sliding", "full"] and hp["sliding_window"] == 4
    assert (hp["swiglu_alpha"], hp["swiglu_limit"]) == (1.702, 7.0)


def test_mxfp4_nibbles_low_first_times_the_exponent() -> None:
    blocks = np.zeros((1, 16), np.uint8)
    blocks[0, 0] = 0x2F  # low nibble 0xF (-6), high nibble 0x2 (1.0)
    out = gpt_oss.mxfp4_to_f32(blocks, np.array([128], np.uint8))  # 2^(128 - 127)
    assert out.shape == (32,) and (out[0], out[1]) == (-12.0, 2.0) and not out[2:].any()


@pytest.mark.parametrize(
    "key,value",
    [
        ("sliding_window", 0),
        ("layer_types", ["sliding_attention", "linear_attention"]),
        ("swiglu_limit", -1.0),
        ("intermediate_size", 0),
        ("attention_bias", "no"),
    ],
)
def test_bad_knob_is_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ConvertError, match=key if key != "layer_types" else "layer_types"):
        gpt_oss.ARCH.hparams({**_cfg(), key: value}, {})
