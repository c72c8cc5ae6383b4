"""``mixtral``: softmax top-k experts on every layer, optional sliding window.

Config: ``num_local_experts`` (or another expert-count spelling),
``num_experts_per_tok``, experts ``intermediate_size`` wide with renormalized top-k
weights, ``sliding_window`` (null: none) on every layer. Tensors: attention, the router
``block_sparse_moe.gate`` (or ``mlp.gate``), experts ``w1``/``w3``/``w2`` per expert or
fused.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..decoder import ATTENTION, NORMS, ROUTER, Decoder, Moe, routed_experts, uniform_sliding
from ..plan import Plan

MODEL_TYPE: Final[str] = "mixtral"


class Mixtral(Decoder):
    """Every layer MoE, no shared expert."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **ROUTER}
    all_moe = True

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Experts ``intermediate_size`` wide, top-k weights renormalized."""
        return routed_experts(cfg, inter, norm_topk=True)

    def sliding(self, cfg: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """``sliding_window`` on every layer (there is no switch)."""
        return uniform_sliding(cfg, n_layers, True)


ARCH: Final[Mixtral] = Mixtral()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``mixtral`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
