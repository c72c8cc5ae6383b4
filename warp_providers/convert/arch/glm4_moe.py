"""``glm4_moe``: GQA with partial rope and optional q/k norm, noaux_tc sigmoid routing.

Config: transformers' Glm4MoeConfig defaults for omitted keys (``partial_rotary_factor``
0.5 unless given), ``use_qk_norm``, routing (``n_group``, ``topk_group``,
``routed_scaling_factor``, ``n_shared_experts``, ``first_k_dense_replace``). Tensors:
attention with biases, per-head q/k norms, dense first layers, shared experts,
``e_score_correction_bias`` -> ``exp_probs_b.bias``, experts per expert or as
transformers-5 fused ``gate_up_proj``/``down_proj``; multi-token-prediction layers are
skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..base import get_flag
from ..decoder import ATTENTION, DENSE_MLP, NORMS, QK_NORM, ROUTER, SHARED_EXPERTS, Noaux
from ..plan import Plan

MODEL_TYPE: Final[str] = "glm4_moe"

#: transformers' Glm4MoeConfig defaults of the keys a config.json may omit.
DEFAULTS: Final[dict[str, Any]] = {
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 1.0,
    "n_shared_experts": 1, "norm_topk_prob": True, "use_qk_norm": False,
}


class Glm4Moe(Noaux):
    """Grouped sigmoid routing over standard attention."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **QK_NORM, **DENSE_MLP, **ROUTER, **SHARED_EXPERTS}
    defaults = DEFAULTS

    def config(self, cfg: Mapping[str, Any]) -> Mapping[str, Any]:
        """Return the defaults, and half the head rotated unless the config says otherwise."""
        out = dict(super().config(cfg))
        rp = out.get("rope_parameters") or out.get("rope_scaling")
        if "partial_rotary_factor" not in out and not (
                isinstance(rp, Mapping) and "partial_rotary_factor" in rp):
            out["partial_rotary_factor"] = 0.5
        return out

    def qk_norm(self, cfg: Mapping[str, Any]) -> str:
        """Per head when ``use_qk_norm``."""
        return "head" if get_flag(cfg, "use_qk_norm", False) else "none"


ARCH: Final[Glm4Moe] = Glm4Moe()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``glm4_moe`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
