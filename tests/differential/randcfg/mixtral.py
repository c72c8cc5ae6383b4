"""Mixtral configs: attention shapes (explicit head_dim too), every rope type, 1..12
experts with top-k up to all of them, a sliding window (or none), tied embeddings."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "MixtralConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    experts = draw(st.integers(1, 12))
    attn = _common.heads(draw, explicit_head_dim=True)
    rope = _common.rope(draw)
    if rope["rope_type"] in ("dynamic", "yarn"):  # their inits need head_dim set
        attn.setdefault("head_dim", attn["hidden_size"] // attn["num_attention_heads"])
    return dict(
        _common.common(draw), **attn, rope_parameters=rope,
        num_hidden_layers=draw(st.integers(1, 3)),
        intermediate_size=draw(st.sampled_from([8, 16, 32, 64])),
        num_local_experts=experts,
        num_experts_per_tok=draw(st.integers(1, min(experts, 8))),
        sliding_window=draw(st.one_of(st.none(), st.integers(1, 24))),
        router_jitter_noise=draw(st.sampled_from([0.0, 0.1])),  # training only
    )


def prompt_lens(config: dict[str, Any]) -> st.SearchStrategy[int]:
    return _common.window_prompt_lens(config["sliding_window"])


def refusal(config: dict[str, Any]) -> str | None:
    return _common.refusal(config)


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
