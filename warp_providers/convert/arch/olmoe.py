"""``olmoe``: softmax top-k experts on every layer, full-row q/k RMSNorm, ``clip_qkv``.

Config: the expert count, ``num_experts_per_tok``, experts ``intermediate_size`` wide,
``norm_topk_prob`` (default false), ``clip_qkv`` (null or >= 0). Tensors: attention,
``q_norm``/``k_norm`` over the whole projected row, the router, the experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..base import get_flag, get_optional_number
from ..decoder import ATTENTION, NORMS, QK_NORM, ROUTER, Decoder, Moe, routed_experts
from ..plan import Plan

MODEL_TYPE: Final[str] = "olmoe"


class Olmoe(Decoder):
    """Every layer MoE; q/k normed before the heads are split."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **QK_NORM, **ROUTER}
    all_moe = True

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Experts ``intermediate_size`` wide; renormalized top-k only if configured."""
        return routed_experts(cfg, inter, norm_topk=get_flag(cfg, "norm_topk_prob", False))

    def qk_norm(self, cfg: Mapping[str, Any]) -> str:
        """Whole q/k rows."""
        return "full"

    def clip_qkv(self, cfg: Mapping[str, Any]) -> float:
        """``clip_qkv`` (null: no clamp)."""
        return get_optional_number(cfg, "clip_qkv", at_least=0) or 0.0


ARCH: Final[Olmoe] = Olmoe()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of an ``olmoe`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
