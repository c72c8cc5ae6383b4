"""``qwen3_moe``: optional experts, per-head q/k RMSNorm, optional sliding window.

Config: ``num_experts`` (0: a dense model), ``num_experts_per_tok``,
``moe_intermediate_size``, the layer kinds (``mlp_only_layers``, ``decoder_sparse_step``
or ``mlp_layer_types``), ``norm_topk_prob`` (default false), ``sliding_window`` on every
layer when ``use_sliding_window``. Tensors: attention, ``q_norm``/``k_norm`` of one head,
dense MLPs, the router, the experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..base import get_flag
from ..decoder import (
    ATTENTION,
    DENSE_MLP,
    MLP_BIAS,
    NORMS,
    QK_NORM,
    ROUTER,
    Decoder,
    Moe,
    optional_experts,
    uniform_sliding,
)
from ..plan import Plan

MODEL_TYPE: Final[str] = "qwen3_moe"


class Qwen3Moe(Decoder):
    """Experts optional, no shared expert; q and k normed per head."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **QK_NORM, **DENSE_MLP, **MLP_BIAS, **ROUTER}

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Experts of ``moe_intermediate_size``."""
        return optional_experts(cfg, inter)

    def qk_norm(self, cfg: Mapping[str, Any]) -> str:
        """One head."""
        return "head"

    def sliding(self, cfg: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """``sliding_window`` on every layer when ``use_sliding_window``."""
        return uniform_sliding(cfg, n_layers, get_flag(cfg, "use_sliding_window", False))


ARCH: Final[Qwen3Moe] = Qwen3Moe()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``qwen3_moe`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
