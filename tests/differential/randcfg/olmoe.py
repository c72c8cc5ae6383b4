"""OLMoE configs: attention shapes, the full-width q/k norm, clip_qkv (off, loose, tight
enough to fire), attention biases, 1..12 experts with top-k up to all of them,
norm_topk_prob, every rope type, tied embeddings."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from randcfg import _common

CONFIG_CLASS = "OlmoeConfig"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    experts = draw(st.integers(1, 12))
    return dict(
        _common.common(draw), **_common.heads(draw, explicit_head_dim=False),
        num_hidden_layers=draw(st.integers(1, 3)),
        intermediate_size=draw(st.sampled_from([8, 16, 32, 64])),
        num_experts=experts, num_experts_per_tok=draw(st.integers(1, min(experts, 8))),
        norm_topk_prob=draw(st.booleans()), attention_bias=draw(st.booleans()),
        clip_qkv=draw(st.sampled_from([None, 0.05, 0.5, 8.0])),
        rope_parameters=_common.rope(draw),
    )


def refusal(config: dict[str, Any]) -> str | None:
    return _common.refusal(config)


def build(config: dict[str, Any], seed: int) -> Any:
    import randcfg

    return randcfg.default_build(CONFIG_CLASS, config, seed)
