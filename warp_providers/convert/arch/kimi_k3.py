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

Tensors under ``language_model.`` (the tower and projector: below): the
trunk bf16, the routed experts compressed-tensors MXFP4 (``w1|w3|w2.weight_packed`` U8
``[out, in/2]`` low nibble first, ``weight_scale`` U8 ``[out, in/32]`` E8M0), ``A_log``
per head padded to the head dim (its first ``kda_heads`` values). Container names beyond
kimi_linear's: ``blk.{i}.attn_res_{norm,proj}.weight``, ``blk.{i}.ffn_res_{norm,proj}``,
``output_res_{norm,proj}.weight`` (f32 [hidden]), ``blk.{i}.attn_gate.weight`` (MLA
output gate), ``blk.{i}.kda_g.weight``, ``blk.{i}.ffn_lat_{down,up,norm}.weight``; experts
``[moe_intermediate_size, expert_hidden_size]``, stored as shipped (container ``mxfp4``,
every code and scale kept) unless another experts dtype is named.

The image tower, when the checkpoint stores one (``vision_tower.patch_embed.proj.weight``;
without it the tower config is ignored and the container is text only): MoonViT as K3
ships it (docs/IMAGES.md), read from the outer ``vision_config`` (``vt_hidden_size``,
``vt_num_attention_heads``, ``qkv_hidden_size``, ``vt_intermediate_size``,
``vt_num_hidden_layers``, ``init_pos_emb_height`` / ``_width``, ``patch_size``,
``merge_kernel_size``) into the container's ``v.*`` tensors and ``vision`` object, the
checkpoint's ``preprocessor_config.json`` copied verbatim (its ``media_proc_cfg`` read
through ``warp_providers.vision.kimi_preprocessor``):

- ``vision_tower.patch_embed.proj.weight [D, 3, p, p]`` -> ``v.patch_embd.weight [D, 3*p*p]``;
  ``vision_tower.patch_embed.pos_emb.weight [gh, gw, D]`` -> ``v.pos_embd [gh*gw, D]`` (f32);
- ``vision_tower.encoder.blocks.{l}.{norm0, wqkv, wo, norm1, mlp.fc0, mlp.fc1}`` ->
  ``v.blk.{l}.{ln1, attn_qkv, attn_out, ln2, ffn_up, ffn_down}``;
  ``vision_tower.encoder.final_layernorm`` -> ``v.post_ln``;
- ``mm_projector.proj.0`` / ``.2`` -> ``v.mm_in`` / ``v.mm_out``, ``mm_projector.post_norm``
  -> ``v.mm_post_norm``; a linear layer's ``.bias`` is read when stored (the release has none).

The tower's RMSNorms are built without an eps (``norm_eps`` is float32's machine eps, what
PyTorch then uses); the projector's is ``projector_ln_eps`` (default 1e-5); the rotary
base ``vision_config.rope_theta`` (default 10000). The placeholder is the outer
``media_placeholder_token_id`` (default 163605), the markers ``<|media_begin|>`` /
``<|media_end|>`` by the tokenizer's ids (default 163602 / 163604).

Refuses, naming the tensor or key: a missing tensor (an AttnRes one included), an MXFP4
scale of the wrong shape or holding 255 (NaN), an ``A_log`` shorter than the head count;
with a tower: no ``preprocessor_config.json``, a missing or misshapen tower tensor, a
stored tower tensor nothing reads, media ids outside the vocabulary, a non-square position
grid or merge kernel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
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
from ..vision import TowerTensors, merge_and_grid, preprocessor
from .kimi_k25 import patch_limit
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
        plan = finish_plan(s, MODEL_TYPE, cfg, hp, t.tensors, experts,
                           skipped=lambda n: n.startswith(SKIPPED))
        if TOWER_PROBE not in st.entries:
            return plan
        vs = TensorSource(st, cfg)
        info, tower = vision_plan(vs, cfg, preprocessor(src), H, hp["vocab_size"], src)
        unused = sorted(n for n in st.entries if n.startswith(SKIPPED) and n not in vs.used)
        if unused:
            more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
            raise ConvertError(f"{src}: tensors not used by {MODEL_TYPE}: "
                               f"{', '.join(unused[:5])}{more}")
        return replace(plan, trunk=plan.trunk + tower, vision=info)


TOWER_PROBE: Final[str] = "vision_tower.patch_embed.proj.weight"
#: The ids of the release's media tokens, used when the tokenizer does not name them.
MEDIA_IDS: Final[dict[str, int]] = {"<|media_begin|>": 163602, "<|media_end|>": 163604,
                                    "<|media_pad|>": 163605}
#: The tower's RMSNorms are nn.RMSNorm(dim) without an eps: PyTorch's float32 eps.
TOWER_NORM_EPS: Final[float] = float(np.finfo(np.float32).eps)


def _media_ids(src: Path) -> dict[str, int]:
    """The media markers' ids in tokenizer_config.json (the release's defaults otherwise)."""
    ids = dict(MEDIA_IDS)
    p = src / "tokenizer_config.json"
    try:
        dec = json.loads(p.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
    except (OSError, ValueError):
        return ids
    for k, v in dec.items():
        if isinstance(v, Mapping) and v.get("content") in ids and str(k).isdigit():
            ids[v["content"]] = int(k)
    return ids


def vision_plan(s: TensorSource, cfg: Mapping[str, Any], pp: Mapping[str, Any],
                text_hidden: int, vocab: int, src: Path) -> tuple[dict[str, Any],
                                                                  list[SrcTensor]]:
    """The manifest's ``vision`` object and the ``v.*`` tensors of K3's tower."""
    from ...vision import kimi_preprocessor

    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        raise ConvertError("config.json: a Kimi K3 tower needs vision_config (an object)")
    w = "config.json vision_config"
    D = get_int(vc, "vt_hidden_size", minimum=1, where=w)
    L = get_int(vc, "vt_num_hidden_layers", minimum=1, where=w)
    nh = get_int(vc, "vt_num_attention_heads", minimum=1, where=w)
    A = get_int(vc, "qkv_hidden_size", default=D, minimum=1, where=w)
    F = get_int(vc, "vt_intermediate_size", minimum=1, where=w)
    p = get_int(vc, "patch_size", default=14, minimum=1, where=w)
    gh = get_int(vc, "init_pos_emb_height", default=64, minimum=1, where=w)
    gw = get_int(vc, "init_pos_emb_width", default=64, minimum=1, where=w)
    mk = vc.get("merge_kernel_size", [2, 2])
    mk = [mk, mk] if isinstance(mk, int) else mk
    m = merge_and_grid(mk, gh, gw, w)
    if A % nh or (A // nh) % 4:
        raise ConvertError(f"{w}: qkv_hidden_size {A} / {nh} heads must be a multiple of 4")
    theta = get_number(vc, "rope_theta", above=0, default=10000.0, where=w)
    proj_eps = get_number(cfg, "projector_ln_eps", above=0, default=1e-5)
    flat = kimi_preprocessor(pp)
    pp_patch, pp_merge = int(flat.get("patch_size", p)), int(flat.get("merge_size", m))
    if (pp_patch, pp_merge) != (p, m):
        raise ConvertError(f"preprocessor_config.json: patch_size {pp_patch}, merge_size "
                           f"{pp_merge}; the tower's are {p}, {m}")
    v = TowerTensors(s)
    P, M, H = 3 * p * p, m * m * D, text_hidden
    v.add((TOWER_PROBE,), "v.patch_embd.weight", (D, 3, p, p), (D, P), "trunk")
    v.add(("vision_tower.patch_embed.proj.bias",), "v.patch_embd.bias", (D,), (D,), "f32",
          optional=True)
    v.add(("vision_tower.patch_embed.pos_emb.weight",), "v.pos_embd", (gh, gw, D),
          (gh * gw, D), "f32")
    for i in range(L):
        b, o = f"vision_tower.encoder.blocks.{i}.", f"v.blk.{i}."
        for sname, dst, rows, cols in (("wqkv", "attn_qkv", 3 * A, D), ("wo", "attn_out", D, A),
                                       ("mlp.fc0", "ffn_up", F, D), ("mlp.fc1", "ffn_down", D, F)):
            v.add((b + sname + ".weight",), o + dst + ".weight", (rows, cols), (rows, cols),
                  "trunk")
            v.add((b + sname + ".bias",), o + dst + ".bias", (rows,), (rows,), "f32",
                  optional=True)
        for sname, dst in (("norm0", "ln1"), ("norm1", "ln2")):
            v.add((b + sname + ".weight",), o + dst + ".weight", (D,), (D,), "f32")
    v.add(("vision_tower.encoder.final_layernorm.weight",), "v.post_ln.weight", (D,), (D,),
          "f32")
    for sname, dst, rows, cols in (("proj.0", "mm_in", M, M), ("proj.2", "mm_out", H, M)):
        v.add((f"mm_projector.{sname}.weight",), f"v.{dst}.weight", (rows, cols), (rows, cols),
              "trunk")
        v.add((f"mm_projector.{sname}.bias",), f"v.{dst}.bias", (rows,), (rows,), "f32",
              optional=True)
    v.add(("mm_projector.post_norm.weight",), "v.mm_post_norm.weight", (H,), (H,), "f32")
    media = _media_ids(src)
    pad = get_int(cfg, "media_placeholder_token_id", default=media["<|media_pad|>"])
    ids = (pad, media["<|media_begin|>"], media["<|media_end|>"])
    if max(ids) >= vocab:
        raise ConvertError(f"config.json: media_placeholder_token_id / the media markers {ids} "
                           f"outside the vocabulary of {vocab}")
    hparams: dict[str, Any] = {
        "hidden_size": D, "n_layers": L, "n_heads": nh, "intermediate_size": F,
        "patch_size": p, "merge_size": m, "temporal_patch_size": 1, "channels": 3,
        "pos_grid_h": gh, "pos_grid_w": gw, "max_patches": patch_limit(flat, m),
        "out_hidden_size": H, "rope_theta": theta, "norm_eps": TOWER_NORM_EPS,
        "proj_norm_eps": proj_eps, "act": "gelu_tanh", "proj_act": "gelu",
    }
    if A != D:
        hparams["attn_hidden_size"] = A
    info = {
        "arch": MODEL_TYPE, "preprocessor": dict(pp), "patch_size": p, "merge_size": m,
        "temporal_patch_size": 1, "hidden_size": H, "placeholder_token_id": ids[0],
        "image_start_token_id": ids[1], "image_end_token_id": ids[2], "hparams": hparams,
    }
    return info, v.out


ARCH: Final[KimiK3] = KimiK3()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a Kimi K3 checkpoint directory (the text model)."""
    return ARCH.load(src, cfg, gen)
