"""``kimi_linear``: KDA layers and MLA layers without positional encoding, MoE.

Config: ``layer_types`` ("linear_attention" -> ``attn_kinds`` "kda", or the older
``linear_attn_config`` ``kda_layers``/``full_attn_layers``, 1-based); ``kda_heads``,
``kda_head_dim``, ``kda_conv`` from ``linear_attn_config`` (or ``linear_num_heads``,
``linear_head_dim``, ``linear_conv_kernel_dim``); MLA dims as deepseek_v3's with no rope
(``rope_freqs`` is all zeros, so the rope part is carried unrotated, exactly); sigmoid
grouped routing (the checkpoint's own spellings ``num_expert_group``,
``moe_renormalize``... accepted), shared experts, dense first layers
(``first_k_dense_replace``). Tensors in the original checkpoint spelling
(``block_sparse_moe.*``, ``experts.N.w1/w2/w3``, ``q_conv1d``...) or transformers'
(``mlp.*``, fused experts, ``conv1d``, ``forget_gate.*``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..base import (
    SafetensorsDir,
    TensorSource,
    collect_experts,
    finish_plan,
    get_int,
    top_tensors,
)
from ..blocks import Trunk, dense_mlp, kda_layer, mla_layer, moe_router
from ..decoder import Mla, Noaux
from ..plan import ExpertLayerSrc, Plan, rope_freqs
from ..quant import ConvertError

MODEL_TYPE: Final[str] = "kimi_linear"

#: Defaults of the routing keys a config.json may omit.
DEFAULTS: Final[dict[str, Any]] = {
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "n_shared_experts": 1,
    "norm_topk_prob": True,
}
#: transformers-config spelling <- the original checkpoint's.
KEY_ALIASES: Final[dict[str, str]] = {
    "num_experts_per_tok": "num_experts_per_token",
    "n_shared_experts": "num_shared_experts",
    "n_group": "num_expert_group",
    "norm_topk_prob": "moe_renormalize",
    "max_position_embeddings": "model_max_length",
}
_LAC = "config.json linear_attn_config"


class KimiLinear(Mla, Noaux):
    """MLA + KDA hybrid with grouped sigmoid routing."""

    model_type = MODEL_TYPE
    defaults = DEFAULTS

    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """Return the MLA/routing keys, then ``attn_kinds`` and the KDA dims."""
        from .kimi_k3 import k3_keys  # kimi_k3 builds on this module

        if self.model_type == MODEL_TYPE and (k3 := k3_keys(cfg)):
            raise ConvertError(f"config.json: Kimi K3 keys {', '.join(k3)} in a kimi_linear "
                               "config (a K3 checkpoint names KimiK3ForConditionalGeneration)")
        c2 = {k: v for k, v in cfg.items() if v is not None}
        for key, alias in KEY_ALIASES.items():
            if key not in c2 and alias in c2:
                c2[key] = c2[alias]
        lac = cfg.get("linear_attn_config") or {}
        if not isinstance(lac, Mapping):
            raise ConvertError("config.json: linear_attn_config must be an object")
        n = get_int(cfg, "num_hidden_layers")
        types = cfg.get("layer_types")
        if types is None and "kda_layers" in lac and "full_attn_layers" in lac:
            types = [None] * n
            for i in lac["full_attn_layers"]:
                types[int(i) - 1] = "full_attention"
            for i in lac["kda_layers"]:
                types[int(i) - 1] = "linear_attention"
        if types is None:
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
        if not isinstance(types, list) or len(types) != n or any(
                t not in ("full_attention", "linear_attention") for t in types):
            raise ConvertError(f"config.json: layer_types must list {n} attention kinds")
        if "mlp_layer_types" not in c2:
            fk = get_int(cfg, "first_k_dense_replace", default=1)
            c2["mlp_layer_types"] = ["dense" if i < fk else "sparse" for i in range(n)]
        for k in ("rope_parameters", "rope_scaling", "partial_rotary_factor", "layer_types"):
            c2.pop(k, None)  # NoPE: the rope part of MLA is never rotated
        c2["rope_interleave"] = False
        c2.setdefault("first_k_dense_replace", 0)
        if c2.get("scoring_func") not in (None, "sigmoid"):
            raise ConvertError(f"config.json: scoring_func {c2['scoring_func']!r}: kimi_linear "
                               "routes with sigmoid scores")
        hp = super().hparams(c2, gen)
        heads = get_int(lac, "num_heads", default=get_int(cfg, "linear_num_heads", default=32),
                        where=_LAC)
        hd = get_int(lac, "head_dim", default=get_int(cfg, "linear_head_dim", default=128),
                     where=_LAC)
        conv = get_int(lac, "short_conv_kernel_size",
                       default=get_int(cfg, "linear_conv_kernel_dim", default=4), where=_LAC)
        if heads == 0 or hd == 0 or conv == 0:
            raise ConvertError("config.json: KDA heads, head_dim and conv kernel must be > 0")
        hp.update(
            attn_kinds=["kda" if t == "linear_attention" else "full" for t in types],
            kda_heads=heads, kda_head_dim=hd, kda_conv=conv, rope_attn_factor=1.0,
        )
        return hp

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
        """Plan of a ``kimi_linear`` checkpoint directory."""
        hp = self.hparams(cfg, gen)
        hp.pop("_rope")
        s = TensorSource(SafetensorsDir(src), cfg)
        if hp["tie_word_embeddings"] and s.has("lm_head.weight"):
            # KimiLinearForCausalLM ties nothing (empty _tied_weights_keys): whatever
            # tie_word_embeddings says, transformers computes the logits with lm_head.weight
            hp["tie_word_embeddings"] = False
        H, RD, sh = hp["hidden_size"], hp["rope_dim"], hp["shared_expert_intermediate_size"]
        t = Trunk(s, top_tensors(s, hp))
        t.tensors.append(rope_freqs(np.zeros(RD // 2, dtype=np.float32)))
        experts: list[ExpertLayerSrc] = []
        for i in range(hp["n_layers"]):
            pre, blk = f"model.layers.{i}.", f"blk.{i}."
            t.need(pre, ("input_layernorm.weight",), blk + "attn_norm.weight", "f32", (H,))
            if hp["attn_kinds"][i] == "kda":
                kda_layer(t, hp, pre + "self_attn.", blk)
            else:
                mla_layer(t, hp, pre + "self_attn.", blk, biases=True)
            t.need(pre, ("post_attention_layernorm.weight",), blk + "ffn_norm.weight", "f32", (H,))
            if hp["layer_kinds"][i] == "dense":
                dense_mlp(t, hp, pre, blk, ("mlp.", "block_sparse_moe."))
                continue
            moe_router(t, hp, pre, blk, ("block_sparse_moe.", "mlp."))
            shared = ("block_sparse_moe.shared_experts.", "mlp.shared_experts.")
            if sh:
                dense_mlp(t, hp, pre, blk, shared, width=sh, cname="ffn_{}_shexp")
            else:  # n_shared_experts=0: transformers still writes the MLP, 0 rows wide
                for n in (f"{sp}{p}.weight" for sp in shared
                          for p in ("gate_proj", "up_proj", "down_proj")):
                    if s.has(pre + n) and 0 in s.st.entries[pre + n].shape:
                        s.used.add(pre + n)
            experts.append(collect_experts(s, hp, i, pre))
        return finish_plan(s, MODEL_TYPE, cfg, hp, t.tensors, experts)


ARCH: Final[KimiLinear] = KimiLinear()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``kimi_linear`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
