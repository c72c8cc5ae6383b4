"""``deepseek_v3`` (also Kimi-K2's ``kimi_k2``): MLA attention, noaux_tc sigmoid routing.

Config: transformers' DeepseekV3Config defaults for omitted keys; MLA dims
(``q_lora_rank`` (0: a full q projection), ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave``); YaRN's ``mscale_all_dim`` in
the softmax scale; routing (``n_group``, ``topk_group``, ``routed_scaling_factor``,
``n_shared_experts``, ``first_k_dense_replace``). Tensors: the MLA projections kept as
stored (``kv_b_proj`` included), dense first layers, shared experts,
``e_score_correction_bias`` -> ``exp_probs_b.bias``; multi-token-prediction layers
(``num_nextn_predict_layers``) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..decoder import ATTENTION, DENSE_MLP, MLA, NORMS, ROUTER, SHARED_EXPERTS, Mla, Noaux
from ..plan import Plan

MODEL_TYPE: Final[str] = "deepseek_v3"

#: transformers' DeepseekV3Config defaults of the keys a config.json may omit.
DEFAULTS: Final[dict[str, Any]] = {
    "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5,
    "n_shared_experts": 1, "rope_interleave": True, "norm_topk_prob": True,
}


class DeepseekV3(Mla, Noaux):
    """Latent attention, grouped sigmoid routing."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **MLA, **DENSE_MLP, **ROUTER, **SHARED_EXPERTS}
    defaults = DEFAULTS


ARCH: Final[DeepseekV3] = DeepseekV3()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``deepseek_v3`` / ``kimi_k2`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
