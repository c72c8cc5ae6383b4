"""``qwen2_moe``: optional experts with a gated shared expert, per-layer sliding window.

Config: ``num_experts`` (0: a dense model), ``num_experts_per_tok``,
``moe_intermediate_size``, ``shared_expert_intermediate_size`` (0: none), the layer
kinds (``mlp_only_layers``, ``decoder_sparse_step`` or ``mlp_layer_types``),
``norm_topk_prob`` (default false), and ``use_sliding_window`` with ``sliding_window``
on the layers ``layer_types`` marks (by default, as Qwen2MoeConfig derives it: even
layers below ``max_window_layers``). Tensors: attention with q/k/v biases, dense MLPs,
the router, ``mlp.shared_expert.*`` and its sigmoid gate ``mlp.shared_expert_gate``. A
shared expert of width 0, as transformers still stores it, is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from ..base import StEntry, get_flag, get_int
from ..decoder import (
    ATTENTION,
    DENSE_MLP,
    MLP_BIAS,
    NORMS,
    ROUTER,
    Decoder,
    Moe,
    optional_experts,
    sliding_window,
)
from ..plan import Plan
from ..quant import ConvertError

MODEL_TYPE: Final[str] = "qwen2_moe"

SHARED_EXPERT: Final[dict[str, str]] = {
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}


class Qwen2Moe(Decoder):
    """Experts optional; a sigmoid-gated shared expert when it has a width."""

    model_type = MODEL_TYPE
    tensors = {**NORMS, **ATTENTION, **DENSE_MLP, **MLP_BIAS, **ROUTER, **SHARED_EXPERT}

    def experts(self, cfg: Mapping[str, Any], inter: int) -> Moe:
        """Experts of ``moe_intermediate_size`` plus ``shared_expert_intermediate_size``."""
        return optional_experts(cfg, inter, "shared_expert_intermediate_size")

    def shared_expert_gate(self, moe: Moe) -> bool:
        """Return the shared expert is always gated."""
        return moe.shared > 0

    def sliding(self, cfg: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """Return the window on the ``layer_types`` sliding layers, as transformers derives them."""
        use = get_flag(cfg, "use_sliding_window", False)
        window = sliding_window(cfg, use)
        types = cfg.get("layer_types")
        if types is None:
            mwl = get_int(cfg, "max_window_layers", default=28)
            types = ["sliding_attention" if (i + 1) % 2 and i < mwl and use else "full_attention"
                     for i in range(n_layers)]
        if not isinstance(types, list) or len(types) != n_layers or not all(
                t in ("sliding_attention", "full_attention") for t in types):
            raise ConvertError(
                f"config.json: layer_types must list {n_layers} entries of "
                "'sliding_attention' or 'full_attention'"
            )
        kinds = ["sliding" if t == "sliding_attention" else "full" for t in types]
        if "sliding" in kinds and not window:
            raise ConvertError(
                "config.json: layer_types has sliding_attention layers, but sliding_window is "
                "off (use_sliding_window false, or sliding_window null or 0)"
            )
        return {"sliding_window": window, "attn_kinds": kinds} if "sliding" in kinds else {}

    def skip(self, hp: Mapping[str, Any], cname: str, ent: StEntry) -> bool:
        """Leave out a shared expert of width 0, which transformers still stores.

        Its empty matrices, and the gate that scales its zero output, change nothing.
        """
        if hp["shared_expert_intermediate_size"] or not hp["n_experts"]:
            return False
        return cname == "ffn_gate_inp_shexp.weight" or (
            cname.endswith("_shexp.weight") and 0 in ent.shape
        )


ARCH: Final[Qwen2Moe] = Qwen2Moe()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``qwen2_moe`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
