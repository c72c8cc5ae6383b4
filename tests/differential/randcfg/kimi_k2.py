"""Kimi-K2 configs: DeepSeek-V3 checkpoints whose config.json says ``model_type: kimi_k2``.

Kimi-K2's knobs around its published values: one expert group (n_group = topk_group = 1),
many experts with top-8 routing, routed_scaling_factor 2.827, one dense first layer, a
shared expert, q_lora, YaRN with mscale = mscale_all_dim; plus the MLA dims and head
counts drawn as for deepseek_v3. `postsave` writes config.json as Kimi-K2 ships it:
``model_type`` kimi_k2, ``rope_scaling`` with a top-level ``rope_theta``, and
``scoring_func`` / ``topk_method`` spelled out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from . import deepseek_v3

CONFIG_CLASS = "DeepseekV3Config"


@st.composite
def configs(draw: Any) -> dict[str, Any]:
    layers = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 2, 4]))
    experts = draw(st.sampled_from([8, 16, 24, 32]))
    rope_dim = draw(st.sampled_from([4, 8, 16]))
    yarn = draw(st.booleans())
    rp: dict[str, Any] = {"rope_type": "default", "rope_theta": 50000.0}
    if yarn:
        m = draw(st.sampled_from([1.0, 0.707]))
        rp = {"rope_type": "yarn", "rope_theta": 50000.0,
              "factor": draw(st.sampled_from([4.0, 32.0])), "mscale": m, "mscale_all_dim": m,
              "beta_fast": 1.0 * draw(st.sampled_from([32, 16])), "beta_slow": 1.0,
              "original_max_position_embeddings": draw(st.sampled_from([16, 64]))}
    return dict(
        vocab_size=272, hidden_size=draw(st.sampled_from([32, 64])),
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        q_lora_rank=draw(st.sampled_from([16, 32, None])),
        kv_lora_rank=draw(st.sampled_from([16, 32])), qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=draw(st.sampled_from([8, 16])),
        v_head_dim=draw(st.sampled_from([8, 16])),
        intermediate_size=draw(st.sampled_from([32, 64])),
        moe_intermediate_size=draw(st.sampled_from([8, 16])),
        n_shared_experts=1, first_k_dense_replace=draw(st.sampled_from([1, 1, 0])),
        n_routed_experts=experts, n_group=1, topk_group=1,
        num_experts_per_tok=draw(st.sampled_from([8, 8, 2, 6])),
        norm_topk_prob=draw(st.sampled_from([True, True, False])),
        routed_scaling_factor=draw(st.sampled_from([2.827, 2.827, 1.0])),
        rope_parameters=rp, rope_interleave=True, attention_bias=False,
        tie_word_embeddings=False, num_nextn_predict_layers=draw(st.integers(0, 1)),
        rms_norm_eps=1e-6, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build(config: dict[str, Any], seed: int) -> Any:
    return deepseek_v3.build(config, seed)


def postsave(hf_dir: Path, config: dict[str, Any]) -> None:
    path = hf_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg["model_type"] = "kimi_k2"
    rp = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        rp["type"] = rp.pop("rope_type")
        cfg["rope_scaling"] = rp
    else:
        cfg["rope_scaling"] = None
    cfg.update(scoring_func="sigmoid", topk_method="noaux_tc")
    path.write_text(json.dumps(cfg, indent=2))
