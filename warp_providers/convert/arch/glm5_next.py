"""``glm5_next`` (GLM-5.3-Flash; also ``glm5_next_text``), the text model only.

The multimodal checkpoint's ``text_config`` and ``model.language_model.*`` tensors are
read, or a flat text config. Its image tower ``model.visual.*`` (``vision_config``)
becomes the container's ``v.*`` tensors and ``vision`` object (docs/FORMAT.md section 7)
when the checkpoint ships a ``preprocessor_config.json`` (copied verbatim); without one the
tower is skipped and the container is text-only. Tower tensors: ``patch_embed.proj``
(``[D, C, T, p, p]`` -> ``v.patch_embd`` ``[D, C*T*p*p]``), ``blocks.{l}.{norm1, norm2,
attn.qkv, attn.proj, attn.q_norm, attn.k_norm, mlp.gate_proj, mlp.up_proj,
mlp.down_proj}`` -> ``v.blk.{l}.{ln1, ln2, attn_qkv, attn_out, attn_q_norm, attn_k_norm,
ffn_gate, ffn_up, ffn_down}``, ``post_layernorm`` -> ``v.post_ln``, ``downsample``
(``[O, D, m, m]``, as the matrix ``v.mm_down`` ``[O, m*m*D]`` over a merge block's
patches), ``merger.{proj, post_projection_norm, gate_proj, up_proj, down_proj}`` ->
``v.mm_{proj, norm, gate, up, ffn_down}``. Config:
transformers' ``Glm5NextTextConfig`` defaults and schedules (``layer_types``
"linear_attention" -> ``attn_kinds`` "kda", "indexed_attention"/"full_attention" ->
"full"; ``mlp_layer_types``; ``indexer_types`` or ``index_topk_pattern`` or
``index_topk_freq``/``index_skip_topk_offset`` -> ``index_kinds``; ``linear_attn_config``),
NoPE MLA (``qk_rope_head_dim`` 0), lora norms at ``rms_norm_eps``, ``swiglu_limit``,
hyper-connections (``hc_*``), the DSA indexer (``index_*``). Tensors, in either spelling
(the release's ``hc_attn_fn``, ``self_attn.f_a_proj``, ``q_conv1d``..., per-expert
``mlp.experts.N.*``; transformers' ``attn_hc.fn``, ``forget_gate.*``, ``conv1d``, fused
experts), fp8 block-scaled matrices included: hyper-connection weights (f32,
``blk.{i}.hc_{attn,ffn}.{fn,base,scale}``), KDA layers as kimi_linear's, MLA layers as
deepseek_v3's, the indexer as ``blk.{i}.attn_idx_*``. The multi-token-prediction layers
(``layers.{n_layers}.`` and later, ``shared_head``) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from ..base import (
    SafetensorsDir,
    TensorSource,
    collect_experts,
    finish_plan,
    get_flag,
    get_int,
    get_number,
    get_optional_number,
    top_tensors,
)
from ..blocks import Trunk, dense_mlp, kda_layer, mla_layer, moe_router
from ..decoder import Mla, Noaux, Rope
from ..plan import ExpertLayerSrc, Plan
from ..quant import ConvertError
from ..vision import TowerTensors, preprocessor

MODEL_TYPE: Final[str] = "glm5_next"

#: transformers' Glm5NextTextConfig defaults of the keys this module reads.
TEXT_DEFAULTS: Final[dict[str, Any]] = {
    "vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 45, "num_attention_heads": 64,
    "n_shared_experts": 1, "n_routed_experts": 288, "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 0, "v_head_dim": 256,
    "qk_nope_head_dim": 256, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32, "swiglu_limit": 10.0,
    "linear_head_dim": 128, "linear_num_heads": 64, "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0, "hc_mult": 4, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20,
    "index_kpool": 16, "index_kpool_always_select_tail": True,
}
VISION_PREFIXES: Final[tuple[str, ...]] = ("model.visual.", "visual.", "model.vision_tower.")
#: transformers' Glm5NextVisionConfig defaults of the keys a config may omit.
VISION_DEFAULTS: Final[dict[str, Any]] = {
    "depth": 24, "hidden_size": 1024, "hidden_act": "silu", "attention_bias": True,
    "num_heads": 16, "in_channels": 3, "patch_size": 14, "rms_norm_eps": 1e-5,
    "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 1536,
    "intermediate_size": 4096, "projection_intermediate_size": 10240, "swiglu_limit": 10.0,
}
#: Glm5NextImageProcessor's defaults of the keys a preprocessor_config.json may omit.
PROCESSOR_DEFAULTS: Final[dict[str, Any]] = {
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "max_image_tokens": 8000,
}


def vision_plan(s: TensorSource, cfg: Mapping[str, Any], pp: Mapping[str, Any],
                hidden: int, vocab: int) -> tuple[dict[str, Any], list[Any]]:
    """The manifest's ``vision`` object and the ``v.*`` tensors of the tower."""
    import numpy as np

    vc = {**VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
    w = "config.json vision_config"
    g = {k: get_int(vc, k, minimum=1, where=w) for k in (
        "depth", "hidden_size", "num_heads", "in_channels", "patch_size", "spatial_merge_size",
        "temporal_patch_size", "out_hidden_size", "intermediate_size",
        "projection_intermediate_size")}
    D, L, nh, C = g["hidden_size"], g["depth"], g["num_heads"], g["in_channels"]
    p, m, T, O = g["patch_size"], g["spatial_merge_size"], g["temporal_patch_size"], g["out_hidden_size"]
    F, P = g["intermediate_size"], g["projection_intermediate_size"]
    if D % nh or (D // nh) % 4:
        raise ConvertError(f"{w}: hidden_size {D} / {nh} heads must be a multiple of 4")
    if O != hidden:
        raise ConvertError(f"{w}: out_hidden_size {O} is not the text hidden_size {hidden}")
    if vc.get("hidden_act") != "silu":
        raise ConvertError(f"{w}: hidden_act {vc.get('hidden_act')!r}: the tower uses silu")
    lim = get_number(vc, "swiglu_limit", at_least=0, where=w)
    eps = get_number(vc, "rms_norm_eps", above=0, where=w)
    rope = vc.get("rope_parameters") or {}
    theta = get_number(rope, "rope_theta", above=0, default=10000.0,
                       where="config.json vision_config.rope_parameters")
    pq = {k: int(pp.get(k, d)) for k, d in PROCESSOR_DEFAULTS.items()}
    if (pq["patch_size"], pq["merge_size"], pq["temporal_patch_size"]) != (p, m, T):
        raise ConvertError(f"preprocessor_config.json: patch_size {pq['patch_size']}, merge_size "
                           f"{pq['merge_size']}, temporal_patch_size "
                           f"{pq['temporal_patch_size']}; the tower's are {p}, {m}, {T}")
    pre = next((x for x in VISION_PREFIXES if s.has(x + "patch_embed.proj.weight")),
               VISION_PREFIXES[0])
    v = TowerTensors(s)
    v.add((pre + "patch_embed.proj.weight",), "v.patch_embd.weight", (D, C, T, p, p),
          (D, C * T * p * p), "trunk")
    v.add((pre + "patch_embed.proj.bias",), "v.patch_embd.bias", (D,), (D,), "f32", optional=True)
    hd = D // nh
    for i in range(L):
        b, o = f"{pre}blocks.{i}.", f"v.blk.{i}."
        for src, dst, n in (("norm1", "ln1", D), ("norm2", "ln2", D), ("attn.q_norm", "attn_q_norm", hd),
                            ("attn.k_norm", "attn_k_norm", hd)):
            v.add((b + src + ".weight",), o + dst + ".weight", (n,), (n,), "f32")
        for src, dst, rows, cols in (("attn.qkv", "attn_qkv", 3 * D, D), ("attn.proj", "attn_out", D, D),
                                     ("mlp.gate_proj", "ffn_gate", F, D),
                                     ("mlp.up_proj", "ffn_up", F, D),
                                     ("mlp.down_proj", "ffn_down", D, F)):
            v.add((b + src + ".weight",), o + dst + ".weight", (rows, cols), (rows, cols), "trunk")
            v.add((b + src + ".bias",), o + dst + ".bias", (rows,), (rows,), "f32", optional=True)
    v.add((pre + "post_layernorm.weight",), "v.post_ln.weight", (D,), (D,), "f32")
    v.add((pre + "downsample.weight",), "v.mm_down.weight", (O, D, m, m), (O, m * m * D), "trunk",
          fn=lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)))
    v.add((pre + "downsample.bias",), "v.mm_down.bias", (O,), (O,), "f32", optional=True)
    mg = pre + "merger."
    v.add((mg + "proj.weight",), "v.mm_proj.weight", (O, O), (O, O), "trunk")
    for part in ("weight", "bias"):
        v.add((mg + f"post_projection_norm.{part}",), f"v.mm_norm.{part}", (O,), (O,), "f32")
    v.add((mg + "gate_proj.weight",), "v.mm_gate.weight", (P, O), (P, O), "trunk")
    v.add((mg + "up_proj.weight",), "v.mm_up.weight", (P, O), (P, O), "trunk")
    v.add((mg + "down_proj.weight",), "v.mm_ffn_down.weight", (O, P), (O, P), "trunk")
    ids = {k: get_int(cfg, k, default=d) for k, d in (
        ("image_token_id", 154854), ("image_start_token_id", 154830),
        ("image_end_token_id", 154831))}
    bad = [f"{k} {i}" for k, i in ids.items() if i >= vocab]
    if bad:
        raise ConvertError(f"config.json: {', '.join(bad)} outside the vocabulary of {vocab}")
    info = {
        "arch": MODEL_TYPE, "preprocessor": dict(pp), "patch_size": p, "merge_size": m,
        "temporal_patch_size": T, "hidden_size": hidden,
        "placeholder_token_id": ids["image_token_id"],
        "image_start_token_id": ids["image_start_token_id"],
        "image_end_token_id": ids["image_end_token_id"],
        "hparams": {
            "hidden_size": D, "n_layers": L, "n_heads": nh, "intermediate_size": F,
            "patch_size": p, "merge_size": m, "temporal_patch_size": T, "channels": C,
            "pos_grid_h": 1, "pos_grid_w": 1, "max_patches": pq["max_image_tokens"] * m * m,
            "out_hidden_size": O, "rope_theta": theta, "norm_eps": eps,
            "proj_norm_eps": 1e-5, "act": "silu", "proj_act": "gelu",
            "proj_intermediate_size": P, "glu_limit": lim,
        },
    }
    return info, v.out


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Return the text config with defaults, in transformers' spelling (nested or flat)."""
    tc = cfg.get("text_config") if cfg.get("model_type") == "glm5_next" else None
    if tc is None:
        tc = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config")}
    if not isinstance(tc, Mapping):
        raise ConvertError("config.json: text_config must be an object")
    out = dict(TEXT_DEFAULTS)
    out.update({k: v for k, v in tc.items() if v is not None or k == "linear_lower_bound"})
    if "linear_lower_bound" not in tc:
        out["linear_lower_bound"] = TEXT_DEFAULTS["linear_lower_bound"]
    lac = out.get("linear_attn_config")
    if lac is not None:
        if not isinstance(lac, Mapping):
            raise ConvertError("config.json: linear_attn_config must be an object")
        out["linear_head_dim"] = lac.get("head_dim", out["linear_head_dim"])
        out["linear_num_heads"] = lac.get("num_heads", out["linear_num_heads"])
        out["linear_conv_kernel_dim"] = lac.get(
            "short_conv_kernel_size", out["linear_conv_kernel_dim"]
        )
        out["linear_lower_bound"] = lac.get("gate_lower_bound", out["linear_lower_bound"])
        if lac.get("safe_gate", True) and out["linear_lower_bound"] is None:
            out["linear_lower_bound"] = -5.0
    return out


def schedules(tc: Mapping[str, Any], n: int) -> tuple[list[str], list[str], list[str]]:
    """(attn_kinds, layer_kinds, index_kinds) as transformers' config derives them."""
    types = tc.get("layer_types")
    if types is None:
        types = ["indexed_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise ConvertError(f"config.json: layer_types must list {n} entries")
    attn = []
    for t in types:
        if t not in ("linear_attention", "indexed_attention", "full_attention"):
            raise ConvertError(f"config.json: unknown layer_types entry {t!r}")
        attn.append("kda" if t == "linear_attention" else "full")
    mlp = tc.get("mlp_layer_types")
    if mlp is None:
        mlp = ["dense"] * min(3, n) + ["sparse"] * (n - 3)
    idx = tc.get("indexer_types")
    if idx is None:
        pattern = tc.get("index_topk_pattern")
        if pattern is not None:
            if isinstance(pattern, str):
                if any(c not in "FS" for c in pattern):
                    raise ConvertError(f"config.json: index_topk_pattern {pattern!r}: only F and S")
                idx = [{"F": "full", "S": "shared"}[c] for c in pattern]
            else:
                idx = list(pattern)
        else:
            freq = max(get_int(tc, "index_topk_freq", default=1), 1)
            offset = get_int(tc, "index_skip_topk_offset", default=2)
            idx = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if not isinstance(idx, list) or len(idx) != n or any(k not in ("full", "shared") for k in idx):
        raise ConvertError(f'config.json: indexer_types must list {n} of "full" / "shared"')
    kinds = []
    for i in range(n):
        if attn[i] == "kda":
            kinds.append("none")
            continue
        if idx[i] == "shared" and (i == 0 or attn[i - 1] != "full" or idx[i - 1] != "full"):
            raise ConvertError(
                f"config.json: layer {i} shares the indexer selection, but layer {i - 1} is not "
                "an indexed layer with its own indexer"
            )
        kinds.append(idx[i])
    return attn, list(mlp), kinds


class Glm5Next(Mla, Noaux):
    """KDA + NoPE-MLA hybrid with hyper-connections and a DSA indexer."""

    model_type = MODEL_TYPE

    def rope(self, cfg: Mapping[str, Any], rope_head: int) -> Rope:
        """No rope at all."""
        max_pos = get_int(cfg, "max_position_embeddings", default=2048)
        return Rope("default", 10000.0, 0, {}, max_pos, 1.0)

    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """Return the MLA/routing keys, then the KDA, hyper-connection and indexer ones."""
        tc = text_config(cfg)
        n = get_int(tc, "num_hidden_layers")
        attn, mlp, index = schedules(tc, n)
        if get_int(tc, "qk_rope_head_dim") != 0:
            raise ConvertError(
                "config.json: glm5_next attention has no rope (qk_rope_head_dim must be 0)"
            )
        if get_int(tc, "q_lora_rank") == 0:
            raise ConvertError("config.json: glm5_next needs q_lora_rank (the indexer reads it)")
        if tc.get("hidden_act") != "silu":
            raise ConvertError(f"config.json: hidden_act {tc.get('hidden_act')!r}: only silu")
        if get_flag(tc, "attention_bias", False):
            raise ConvertError("config.json: attention_bias=true is not supported for glm5_next")
        if not get_flag(tc, "index_kpool_always_select_tail", True):
            raise ConvertError("config.json: index_kpool_always_select_tail=false is not supported")
        nkv = tc.get("num_key_value_heads")
        if nkv is not None and nkv != tc["num_attention_heads"]:
            raise ConvertError("config.json: num_key_value_heads must equal num_attention_heads")
        dropped = ("head_dim", "layer_types", "rope_parameters", "rope_scaling",
                   "partial_rotary_factor")
        c2 = {k: v for k, v in tc.items() if k not in dropped}
        c2.update(mlp_layer_types=mlp, rope_interleave=False, first_k_dense_replace=0,
                  num_key_value_heads=tc["num_attention_heads"])
        hp = super().hparams(c2, gen)
        hp.pop("_rope")
        topk, pool = get_int(tc, "index_topk"), get_int(tc, "index_kpool")
        if pool == 0 or topk % pool:
            raise ConvertError(
                f"config.json: index_topk {topk} must be a multiple of index_kpool {pool}"
            )
        heads, hd = get_int(tc, "linear_num_heads"), get_int(tc, "linear_head_dim")
        conv = get_int(tc, "linear_conv_kernel_dim")
        if heads == 0 or hd == 0 or conv == 0:
            raise ConvertError(
                "config.json: linear_num_heads, linear_head_dim and the conv kernel must be > 0"
            )
        hc = get_int(tc, "hc_mult")
        if not 1 <= hc <= 16 or get_int(tc, "hc_sinkhorn_iters") == 0:
            raise ConvertError("config.json: hc_mult must be in 1..16 and hc_sinkhorn_iters > 0")
        lb = get_optional_number(tc, "linear_lower_bound", at_most=0)
        lim = get_number(tc, "swiglu_limit", above=0)  # transformers clamps by it always
        hp.update(
            attn_kinds=attn, kda_heads=heads, kda_head_dim=hd, kda_conv=conv, hc_mult=hc,
            hc_sinkhorn_iters=get_int(tc, "hc_sinkhorn_iters"), hc_eps=float(tc["hc_eps"]),
            lora_norm_eps=hp["rms_norm_eps"], swiglu_limit=lim,
            index_heads=get_int(tc, "index_n_heads"), index_head_dim=get_int(tc, "index_head_dim"),
            index_topk=topk, index_kpool=pool, index_tail=True, index_kinds=index,
        )
        if lb is not None:
            hp["kda_lower_bound"] = lb
        return hp

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
        """Plan of a ``glm5_next`` / ``glm5_next_text`` checkpoint directory."""
        hp = self.hparams(cfg, gen)
        s = TensorSource(SafetensorsDir(src), cfg)
        pre0 = next((p for p in ("model.language_model.", "model.", "")
                     if p + "embed_tokens.weight" in s.st.entries), None)
        if pre0 is None:
            raise ConvertError("tensor 'model.language_model.embed_tokens.weight' is missing")
        L, H, QL = hp["n_layers"], hp["hidden_size"], hp["q_lora_rank"]
        HC, NI, ID = hp["hc_mult"], hp["index_heads"], hp["index_head_dim"]
        MIX = (2 + HC) * HC
        t = Trunk(s, top_tensors(s, hp, prefix=pre0))
        experts: list[ExpertLayerSrc] = []
        for i in range(L):
            pre, blk = f"{pre0}layers.{i}.", f"blk.{i}."
            a = pre + "self_attn."
            t.need(pre, ("input_layernorm.weight",), blk + "attn_norm.weight", "f32", (H,))
            t.need(pre, ("post_attention_layernorm.weight",), blk + "ffn_norm.weight", "f32", (H,))
            for part in ("attn", "ffn"):
                for key, shape in (("fn", (MIX, HC * H)), ("base", (MIX,)), ("scale", (3,))):
                    t.flat(pre, (f"hc_{part}_{key}", f"{part}_hc.{key}"), blk + f"hc_{part}.{key}",
                           shape)
            if hp["attn_kinds"][i] == "kda":
                kda_layer(t, hp, a, blk)
            else:
                mla_layer(t, hp, a, blk, biases=False)
                if hp["index_kinds"][i] == "full":
                    x = a + "indexer."
                    for names, cn, kind, shape in (
                        (("wq_b.weight",), "attn_idx_q.weight", "trunk", (NI * ID, QL)),
                        (("wk.weight",), "attn_idx_k.weight", "trunk", (ID, H)),
                        (("index_kpool_compress_gate",), "attn_idx_gate.weight", "trunk", (ID, H)),
                        (("weights_proj.weight",), "attn_idx_w.weight", "trunk", (NI, H)),
                        (("k_norm.weight",), "attn_idx_k_norm.weight", "f32", (ID,)),
                        (("k_norm.bias",), "attn_idx_k_norm.bias", "f32", (ID,)),
                    ):
                        t.need(x, names, blk + cn, kind, shape)
                    t.flat(x, ("index_kpool_compress_ape",), blk + "attn_idx_ape",
                           (hp["index_kpool"], ID))
            if hp["layer_kinds"][i] == "dense":
                dense_mlp(t, hp, pre, blk, ("mlp.",))
                continue
            moe_router(t, hp, pre, blk, ("mlp.",))
            dense_mlp(t, hp, pre, blk, ("mlp.shared_experts.",),
                      width=hp["shared_expert_intermediate_size"], cname="ffn_{}_shexp")
            experts.append(collect_experts(s, hp, i, pre))

        pp = preprocessor(src, required=False)
        vision = None
        if pp is not None and any(n.startswith(VISION_PREFIXES) for n in s.st.entries):
            vision, vt = vision_plan(s, cfg, pp, H, hp["vocab_size"])
            t.tensors.extend(vt)

        def skipped(name: str) -> bool:
            """Return the vision tower (without a preprocessor config), the
            multi-token-prediction layers."""
            if name.startswith(VISION_PREFIXES):
                return vision is None
            if name.startswith(pre0 + "layers."):
                idx = name[len(pre0) + 7 :].split(".", 1)[0]
                return idx.isdigit() and int(idx) >= L
            return ".shared_head." in name

        plan = finish_plan(s, MODEL_TYPE, cfg, hp, t.tensors, experts, skipped=skipped)
        return plan if vision is None else replace(plan, vision=vision)


ARCH: Final[Glm5Next] = Glm5Next()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``glm5_next`` / ``glm5_next_text`` checkpoint directory (the text model)."""
    return ARCH.load(src, cfg, gen)
