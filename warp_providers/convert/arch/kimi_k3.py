"""``kimi_k3``: the Kimi K3 text model as released (``KimiK3ForConditionalGeneration``).

Detected by the outer ``architectures`` naming ``KimiK3ForConditionalGeneration`` and at
least one K3-only key in ``text_config`` (:data:`K3_KEYS`), whatever the outer
``model_type`` says (registry.py routes by the architecture); a config with one and not
the other is refused. The text config (``model_type`` ``kimi_linear``) is read as
kimi_linear's, plus: SiTU-GLU (``hidden_act: "situ"``, ``activation_situ_beta``,
``activation_situ_linear_beta`` -> ``situ_beta``, ``situ_linear_beta``), latent MoE
(``routed_expert_hidden_size`` -> ``expert_hidden_size``, ``latent_moe_use_norm`` ->
``latent_moe_norm``), Attention Residuals (``attn_res_block_size``), the MLA output gate
(``mla_use_output_gate`` -> ``mla_output_gate``), the full-rank KDA output gate
(``use_full_rank_gate`` -> ``kda_full_gate``) and the bounded decay gate
(``gate_lower_bound`` -> ``kda_lower_bound``). A key set to false/null is the key absent.

Tensors under ``language_model.`` (the vision tower and projector are skipped): the
trunk bf16, the routed experts compressed-tensors MXFP4 (``w1|w3|w2.weight_packed`` U8
``[out, in/2]`` low nibble first, ``weight_scale`` U8 ``[out, in/32]`` E8M0), ``A_log``
per head padded to the head dim (its first ``kda_heads`` values). Container names beyond
kimi_linear's: ``blk.{i}.attn_res_{norm,proj}.weight``, ``blk.{i}.ffn_res_{norm,proj}``,
``output_res_{norm,proj}.weight`` (f32 [hidden]), ``blk.{i}.attn_gate.weight`` (MLA
output gate), ``blk.{i}.kda_g.weight``, ``blk.{i}.ffn_lat_{down,up,norm}.weight``; experts
``[moe_intermediate_size, expert_hidden_size]``, stored as shipped (container ``mxfp4``,
every code and scale kept) unless another experts dtype is named.

Refuses, naming the tensor or key: a missing tensor (an AttnRes one included), an MXFP4
scale of the wrong shape or holding 255 (NaN), an ``A_log`` shorter than the head count.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..base import (
    FP4_E2M1,
    SafetensorsDir,
    TensorSource,
    finish_plan,
    get_flag,
    get_int,
    get_number,
    top_tensors,
)
from ..blocks import Trunk, dense_mlp, kda_layer, mla_layer, moe_router
from ..plan import ExpertLayerSrc, Plan, SrcTensor, rope_freqs
from ..quant import ConvertError, mxfp4_pack
from .kimi_linear import KimiLinear

MODEL_TYPE: Final[str] = "kimi_k3"
ARCHITECTURE: Final[str] = "KimiK3ForConditionalGeneration"
#: Keys of the K3 text config that Kimi-Linear's lacks (linear_attn_config's two included).
K3_KEYS: Final[tuple[str, ...]] = (
    "routed_expert_hidden_size", "latent_moe_use_norm", "attn_res_block_size",
    "activation_situ_beta", "activation_situ_linear_beta", "mla_use_output_gate",
    "use_full_rank_gate", "gate_lower_bound",
)
PREFIX: Final[str] = "language_model."
SKIPPED: Final[tuple[str, ...]] = ("vision_tower.", "mm_projector.", "multi_modal_projector.")


def k3_keys(tc: Mapping[str, Any]) -> list[str]:
    """The K3-only keys a text config sets (false and null count as absent)."""
    lac = tc.get("linear_attn_config")
    lac = lac if isinstance(lac, Mapping) else {}
    return [k for k in K3_KEYS if tc.get(k, lac.get(k)) not in (None, False)]


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The K3 text config, after checking the outer architecture and the K3-only keys."""
    tc = cfg.get("text_config")
    if not isinstance(tc, Mapping):
        raise ConvertError("config.json: a Kimi K3 checkpoint nests its text model in "
                           "text_config (an object)")
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise ConvertError(f"config.json: architectures does not name {ARCHITECTURE}")
    if not k3_keys(tc):
        raise ConvertError(f"config.json: text_config has none of the K3 keys "
                           f"({', '.join(K3_KEYS)}): not a Kimi K3 text model")
    return {k: v for k, v in tc.items() if v is not None and v is not False}


def mxfp4_rows(packed: np.ndarray, scale: np.ndarray, name: str) -> Any:
    """Row loader of the exact f32 of an MXFP4 matrix (packed [out, in/2], E8M0 [out, in/32])."""

    def rows(r0: int, r1: int) -> np.ndarray:
        p, s = np.asarray(packed[r0:r1]), np.asarray(scale[r0:r1])
        if (s == 255).any():
            raise ConvertError(f"tensor {name!r}: E8M0 scale 255 is NaN")
        q = np.empty((r1 - r0, 2 * p.shape[1]), np.float32)
        q[:, 0::2], q[:, 1::2] = FP4_E2M1[p & 0x0F], FP4_E2M1[p >> 4]
        mul = np.ldexp(np.float32(1.0), s.astype(np.int32) - 127).astype(np.float32)
        return q * np.repeat(mul, 32, axis=1)

    return rows


def mxfp4_expert(s: TensorSource, stem: str, cname: str, shape: tuple[int, int]) -> SrcTensor:
    """Expert matrix ``stem`` (``...w1``) as container tensor ``cname``: its codes and scales
    as the container's ``mxfp4`` (kept byte for byte, the default), or f32 rows dequantized
    exactly for another requested experts dtype.

    Nothing is mapped or read here (the plan builds every expert more than once): the
    container bytes are two plain reads and one repacking when written."""
    rows, cols = shape
    if cols % 32:
        raise ConvertError(f"tensor {stem + '.weight_packed'!r}: {cols} columns, not a multiple "
                           "of the MXFP4 block of 32")
    pent = s.u8_entry(stem + ".weight_packed", (rows, cols // 2))
    sent = s.u8_entry(stem + ".weight_scale", (rows, cols // 32))
    pname, sname = s.stored(stem + ".weight_packed"), s.stored(stem + ".weight_scale")
    st = s.st

    def f32_rows(r0: int, r1: int) -> np.ndarray:
        return mxfp4_rows(st.raw(pname), st.raw(sname), sname)(r0, r1)

    def raw() -> np.ndarray:
        return mxfp4_pack(st.read(pname).reshape(rows, cols // 2),
                          st.read(sname).reshape(rows, cols // 32), sname)

    return SrcTensor(cname, shape, "experts", f32_rows, pent.nbytes + sent.nbytes, raw=raw,
                     raw_dtype="mxfp4")


class _Prefixed(dict):
    """Stored names of the text model: every name asked for, under ``language_model.``
    (so a missing tensor is named as the checkpoint would store it)."""

    def get(self, name: str, default: Any = None) -> str:  # noqa: ARG002
        # the stored name's own string when it exists (one copy per tensor in the plan)
        return dict.get(self, name) or PREFIX + name


class KimiK3(KimiLinear):
    """kimi_linear plus latent MoE, SiTU-GLU, AttnRes and the K3 gates."""

    model_type = MODEL_TYPE

    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """kimi_linear's keys of the text config, then the K3 ones."""
        tc = text_config(cfg)
        act = tc.get("hidden_act", "silu")
        if act not in ("situ", "silu"):
            raise ConvertError(f"config.json: hidden_act {act!r}: Kimi K3 uses situ (or silu)")
        hp = super().hparams({**tc, "hidden_act": "silu"}, gen)
        lac = tc.get("linear_attn_config") or {}
        H = hp["hidden_size"]
        lat = get_int(tc, "routed_expert_hidden_size", default=H)
        if not 0 < lat <= H or lat % 32 or hp["moe_intermediate_size"] % 32:
            raise ConvertError(f"config.json: routed_expert_hidden_size {lat} must be in "
                               f"1..{H}, and it and moe_intermediate_size multiples of 32")
        if act == "situ":
            hp["situ_beta"] = get_number(tc, "activation_situ_beta", above=0, default=1.0)
            if "activation_situ_linear_beta" in tc:
                hp["situ_linear_beta"] = get_number(tc, "activation_situ_linear_beta", above=0)
        latent = "routed_expert_hidden_size" in tc
        if latent:  # a latent MoE, even one as wide as hidden
            hp["expert_hidden_size"] = lat
        block = get_int(tc, "attn_res_block_size", default=0)
        norm = latent and get_flag(tc, "latent_moe_use_norm", False)  # the latent's norm
        for key, on in (("latent_moe_norm", norm),
                        ("mla_output_gate", get_flag(tc, "mla_use_output_gate", False)),
                        ("kda_full_gate", bool(lac.get("use_full_rank_gate")))):
            if on:
                hp[key] = True
        if block:
            hp["attn_res_block_size"] = block
        if lac.get("gate_lower_bound") is not None:
            hp["kda_lower_bound"] = get_number(lac, "gate_lower_bound", at_most=0,
                                               where="config.json linear_attn_config")
        return hp

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
        """Plan of a Kimi K3 checkpoint directory (its text model)."""
        hp = self.hparams(cfg, gen)
        hp.pop("_rope")
        st = SafetensorsDir(src)
        alias = _Prefixed({n[len(PREFIX):]: n for n in st.entries if n.startswith(PREFIX)})
        s = TensorSource(st, cfg, alias)
        H, RD, sh = hp["hidden_size"], hp["rope_dim"], hp["shared_expert_intermediate_size"]
        latent = "expert_hidden_size" in hp
        lat, inter = hp.get("expert_hidden_size", H), hp["moe_intermediate_size"]
        t = Trunk(s, top_tensors(s, hp))
        t.tensors.append(rope_freqs(np.zeros(RD // 2, dtype=np.float32)))
        res = bool(hp.get("attn_res_block_size"))

        def res_pair(pre: str, hf: str, cname: str) -> None:
            t.need(pre, (hf + "_norm.weight",), cname + "_norm.weight", "f32", (H,))
            t.vector(pre, (hf + "_proj.weight",), cname + "_proj.weight", H)

        if res:
            res_pair("model.", "output_attn_res", "output_res")
        experts: list[ExpertLayerSrc] = []
        kda_hp = {**hp, "kda_a_log_padded": True}
        for i in range(hp["n_layers"]):
            pre, blk = f"model.layers.{i}.", f"blk.{i}."
            a = pre + "self_attn."
            t.need(pre, ("input_layernorm.weight",), blk + "attn_norm.weight", "f32", (H,))
            t.need(pre, ("post_attention_layernorm.weight",), blk + "ffn_norm.weight", "f32", (H,))
            if res:
                res_pair(pre, "self_attention_res", blk + "attn_res")
                res_pair(pre, "mlp_res", blk + "ffn_res")
            if hp["attn_kinds"][i] == "kda":
                kda_layer(t, kda_hp, a, blk)
            else:
                mla_layer(t, hp, a, blk, biases=False)
                if hp.get("mla_output_gate"):
                    t.need(a, ("g_proj.weight",), blk + "attn_gate.weight", "trunk",
                           (hp["n_heads"] * hp["v_head_dim"], H))
            if hp["layer_kinds"][i] == "dense":
                dense_mlp(t, hp, pre, blk, ("mlp.",))
                continue
            b = pre + "block_sparse_moe."
            moe_router(t, hp, pre, blk, ("block_sparse_moe.",))
            if sh:
                dense_mlp(t, hp, pre, blk, ("block_sparse_moe.shared_experts.",), width=sh,
                          cname="ffn_{}_shexp")
            if latent:
                t.need(b, ("routed_expert_down_proj.weight",), blk + "ffn_lat_down.weight",
                       "trunk", (lat, H))
                t.need(b, ("routed_expert_up_proj.weight",), blk + "ffn_lat_up.weight",
                       "trunk", (H, lat))
                if hp.get("latent_moe_norm"):
                    t.need(b, ("routed_expert_norm.weight",), blk + "ffn_lat_norm.weight",
                           "f32", (lat,))
            shapes = ((inter, lat), (inter, lat), (lat, inter))

            def expert(e: int, i: int = i, b: str = b) -> tuple[SrcTensor, ...]:
                return tuple(mxfp4_expert(s, f"{b}experts.{e}.{w}", f"blk.{i}.expert.{e}.{n}",
                                          shape)
                             for w, n, shape in zip(("w1", "w3", "w2"), ("gate", "up", "down"),
                                                    shapes))

            nbytes = sum(x.nbytes for e in range(hp["n_experts"]) for x in expert(e))
            experts.append(ExpertLayerSrc(i, hp["n_experts"], shapes, expert, nbytes))
        return finish_plan(s, MODEL_TYPE, cfg, hp, t.tensors, experts,
                           skipped=lambda n: n.startswith(SKIPPED))


ARCH: Final[KimiK3] = KimiK3()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a Kimi K3 checkpoint directory (the text model)."""
    return ARCH.load(src, cfg, gen)
