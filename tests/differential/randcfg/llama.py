"""Llama configs: attention shapes (MHA/GQA/MQA, explicit head_dim), every supported rope
type with its parameters, attention and MLP biases, tied embeddings, norm eps."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "LlamaConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    return dict(
        _common.common(draw), **_common.heads(draw, explicit_head_dim=True),
        num_hidden_layers=draw(st.integers(1, 3)),
        intermediate_size=draw(st.sampled_from([8, 32, 64, 96])),
        rope_parameters=_common.rope(draw),
        attention_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()),
        pretraining_tp=draw(st.sampled_from([1, 2])), hidden_act="silu",
    )


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)


def refusal(config: dict[str, Any]) -> str | None:
    return _common.refusal(config)
