"""Hugging Face importer for ``glm5_next`` (GLM-5.3-Flash), the text model only.

Called by :func:`hf.load_hf` for ``model_type`` ``glm5_next`` (the multimodal checkpoint:
its ``text_config`` and ``model.language_model.*`` tensors; the vision tower
``model.visual.*`` is skipped) or ``glm5_next_text`` / a flat text config. Owns the config
quirks and the tensor map:

* config: transformers' ``Glm5NextTextConfig`` defaults and schedules (``layer_types``
  "linear_attention" -> ``attn_kinds`` "kda", "indexed_attention"/"full_attention" ->
  "full"; ``mlp_layer_types``; ``indexer_types`` or ``index_topk_pattern`` or
  ``index_topk_freq``/``index_skip_topk_offset`` -> ``index_kinds``; ``linear_attn_config``),
  NoPE MLA (``qk_rope_head_dim`` 0), lora norms at ``rms_norm_eps``, ``swiglu_limit``,
  hyper-connections (``hc_*``), the DSA indexer (``index_*``).
* tensors, in either spelling (the release's ``hc_attn_fn``, ``self_attn.f_a_proj``,
  ``q_conv1d``..., per-expert ``mlp.experts.N.*``; transformers' ``attn_hc.fn``,
  ``forget_gate.*``, ``conv1d``, fused experts), fp8 block-scaled matrices included:
  hyper-connection weights (f32, ``blk.{i}.hc_{attn,ffn}.{fn,base,scale}``), KDA layers as
  kimi_linear's ``blk.{i}.kda_*``, MLA layers as deepseek_v3's, the indexer as
  ``blk.{i}.attn_idx_*``. The multi-token-prediction layers (``layers.{n_layers}.`` and later,
  ``shared_head``) are skipped.

Anything else is refused with a ``ConvertError`` naming the tensor or key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from . import hf
from .hf_ext import _computed, _first, _St, expert_layer
from .quant import ConvertError
from .writer import ExpertLayerSrc, Plan

GLM5_MODEL_TYPES: Final[tuple[str, ...]] = ("glm5_next", "glm5_next_text")

# transformers' Glm5NextTextConfig defaults of the keys this importer reads.
_DEFAULTS: Final[dict[str, Any]] = {
    "vocab_size": 154880,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 45,
    "num_attention_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 288,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 0,
    "v_head_dim": 256,
    "qk_nope_head_dim": 256,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "swiglu_limit": 10.0,
    "linear_head_dim": 128,
    "linear_num_heads": 64,
    "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "hc_mult": 4,
    "hc_eps": 1e-6,
    "hc_sinkhorn_iters": 20,
    "index_kpool": 16,
    "index_kpool_always_select_tail": True,
}
_VISION_PREFIXES: Final[tuple[str, ...]] = ("model.visual.", "visual.", "model.vision_tower.")


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Return the text config with defaults, in transformers' spelling (nested or flat)."""
    tc = cfg.get("text_config") if cfg.get("model_type") == "glm5_next" else None
    if tc is None:
        tc = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config")}
    if not isinstance(tc, Mapping):
        raise ConvertError("config.json: text_config must be an object")
    out = dict(_DEFAULTS)
    out.update({k: v for k, v in tc.items() if v is not None or k == "linear_lower_bound"})
    if "linear_lower_bound" not in tc:
        out["linear_lower_bound"] = _DEFAULTS["linear_lower_bound"]
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


def _schedules(tc: Mapping[str, Any], n: int) -> tuple[list[str], list[str], list[str]]:
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
            freq = max(hf._int(tc, "index_topk_freq", default=1), 1)
            offset = hf._int(tc, "index_skip_topk_offset", default=2)
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


def _hparams(cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
    tc = _text_config(cfg)
    n = hf._int(tc, "num_hidden_layers")
    attn, mlp, index = _schedules(tc, n)
    if hf._int(tc, "qk_rope_head_dim") != 0:
        raise ConvertError(
            "config.json: glm5_next attention has no rope (qk_rope_head_dim must be 0)"
        )
    if hf._int(tc, "q_lora_rank") == 0:
        raise ConvertError("config.json: glm5_next needs q_lora_rank (the indexer reads it)")
    if tc.get("hidden_act") != "silu":
        raise ConvertError(f"config.json: hidden_act {tc.get('hidden_act')!r}: only silu")
    if hf._flag(tc, "attention_bias", False):
        raise ConvertError("config.json: attention_bias=true is not supported for glm5_next")
    if not hf._flag(tc, "index_kpool_always_select_tail", True):
        raise ConvertError("config.json: index_kpool_always_select_tail=false is not supported")
    nkv = tc.get("num_key_value_heads")
    if nkv is not None and nkv != tc["num_attention_heads"]:
        raise ConvertError("config.json: num_key_value_heads must equal num_attention_heads")
    c2 = {
        k: v
        for k, v in tc.items()
        if k
        not in (
            "head_dim",
            "layer_types",
            "rope_parameters",
            "rope_scaling",
            "partial_rotary_factor",
        )
    }
    c2.update(
        mlp_layer_types=mlp,
        rope_interleave=False,
        first_k_dense_replace=0,
        num_key_value_heads=tc["num_attention_heads"],
    )
    # hf._hparams plans MLA with rope; run it with two rope dims, then take them back out
    # (NoPE: head_dim is qk_nope_head_dim, the softmax scale its inverse square root).
    c2["qk_rope_head_dim"] = 2
    hp = hf._hparams("deepseek_v3", c2, gen)
    hp.pop("_rope")
    nope = hp["qk_nope_head_dim"]
    hp.update(
        head_dim=nope, rope_dim=0, rope_theta=10000.0, rope_attn_factor=1.0, attn_scale=nope**-0.5
    )
    topk, pool = hf._int(tc, "index_topk"), hf._int(tc, "index_kpool")
    if pool == 0 or topk % pool:
        raise ConvertError(
            f"config.json: index_topk {topk} must be a multiple of index_kpool {pool}"
        )
    heads, hd = hf._int(tc, "linear_num_heads"), hf._int(tc, "linear_head_dim")
    conv = hf._int(tc, "linear_conv_kernel_dim")
    if heads == 0 or hd == 0 or conv == 0:
        raise ConvertError(
            "config.json: linear_num_heads, linear_head_dim and the conv kernel must be > 0"
        )
    hc = hf._int(tc, "hc_mult")
    if not 1 <= hc <= 16 or hf._int(tc, "hc_sinkhorn_iters") == 0:
        raise ConvertError("config.json: hc_mult must be in 1..16 and hc_sinkhorn_iters > 0")
    lb = tc.get("linear_lower_bound")
    if lb is not None and (isinstance(lb, bool) or not isinstance(lb, (int, float)) or lb > 0):
        raise ConvertError(f"config.json: linear_lower_bound must be null or <= 0, got {lb!r}")
    lim = tc.get("swiglu_limit")  # transformers clamps by it unconditionally
    if isinstance(lim, bool) or not isinstance(lim, (int, float)) or not lim > 0:
        raise ConvertError(f"config.json: swiglu_limit must be a positive number, got {lim!r}")
    hp.update(
        attn_kinds=attn,
        kda_heads=heads,
        kda_head_dim=hd,
        kda_conv=conv,
        hc_mult=hc,
        hc_sinkhorn_iters=hf._int(tc, "hc_sinkhorn_iters"),
        hc_eps=float(tc["hc_eps"]),
        lora_norm_eps=hp["rms_norm_eps"],
        swiglu_limit=float(lim),
        index_heads=hf._int(tc, "index_n_heads"),
        index_head_dim=hf._int(tc, "index_head_dim"),
        index_topk=topk,
        index_kpool=pool,
        index_tail=True,
        index_kinds=index,
    )
    if lb is not None:
        hp["kda_lower_bound"] = float(lb)
    return hp


def _prefix(st: hf.SafetensorsDir) -> str:
    for p in ("model.language_model.", "model.", ""):
        if p + "embed_tokens.weight" in st.entries:
            return p
    raise ConvertError("tensor 'model.language_model.embed_tokens.weight' is missing")


def _load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    hp = _hparams(cfg, gen)
    st = hf.SafetensorsDir(src)
    s = _St(st)
    b = hf._Builder(st, cfg)
    pre0 = _prefix(st)
    L, H, V = hp["n_layers"], hp["hidden_size"], hp["vocab_size"]
    nh, R, QL = hp["n_heads"], hp["kv_lora_rank"], hp["q_lora_rank"]
    nope, vd = hp["qk_nope_head_dim"], hp["v_head_dim"]
    kh, d, K = hp["kda_heads"], hp["kda_head_dim"], hp["kda_conv"]
    D = kh * d
    inter, sh, E = hp["intermediate_size"], hp["shared_expert_intermediate_size"], hp["n_experts"]
    HC = hp["hc_mult"]
    MIX = (2 + HC) * HC
    NI, ID, P = hp["index_heads"], hp["index_head_dim"], hp["index_kpool"]

    trunk = [
        s.tensor(b, pre0 + "embed_tokens.weight", "token_embd.weight", "embedding", (V, H)),
        s.tensor(b, pre0 + "norm.weight", "output_norm.weight", "f32", (H,)),
    ]
    if not hp["tie_word_embeddings"]:
        trunk.append(s.tensor(b, "lm_head.weight", "output.weight", "output", (V, H)))
    experts: list[ExpertLayerSrc] = []

    def need(
        pre: str, names: tuple[str, ...], cname: str, kind: str, shape: tuple[int, ...]
    ) -> None:
        name = _first(s, pre, names)
        if name is None:
            raise ConvertError(f"{src}: tensor {pre + names[0]!r} is missing")
        trunk.append(s.tensor(b, name, cname, kind, shape))

    def flat(pre: str, names: tuple[str, ...], cname: str, shape: tuple[int, ...]) -> None:
        """Add an f32 tensor stored 1-D (hyper-connection weights, indexer ape, KDA vectors)."""
        name = _first(s, pre, names)
        if name is None:
            raise ConvertError(f"{src}: tensor {pre + names[0]!r} is missing")
        v = s.f32(name, shape)
        trunk.append(_computed(cname, lambda v=v: v.reshape(-1), (int(np.prod(shape)),)))

    for i in range(L):
        pre, blk = f"{pre0}layers.{i}.", f"blk.{i}."
        a = pre + "self_attn."
        need(pre, ("input_layernorm.weight",), blk + "attn_norm.weight", "f32", (H,))
        need(pre, ("post_attention_layernorm.weight",), blk + "ffn_norm.weight", "f32", (H,))
        for part in ("attn", "ffn"):
            flat(pre, (f"hc_{part}_fn", f"{part}_hc.fn"), blk + f"hc_{part}.fn", (MIX, HC * H))
            flat(pre, (f"hc_{part}_base", f"{part}_hc.base"), blk + f"hc_{part}.base", (MIX,))
            flat(pre, (f"hc_{part}_scale", f"{part}_hc.scale"), blk + f"hc_{part}.scale", (3,))
        if hp["attn_kinds"][i] == "kda":
            for p in ("q", "k", "v"):
                need(a, (f"{p}_proj.weight",), blk + f"attn_{p}.weight", "trunk", (D, H))
            need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, D))
            need(
                a,
                ("f_a_proj.weight", "forget_gate.f_a_proj.weight"),
                blk + "kda_f_a.weight",
                "trunk",
                (d, H),
            )
            need(
                a,
                ("f_b_proj.weight", "forget_gate.f_b_proj.weight"),
                blk + "kda_f_b.weight",
                "trunk",
                (D, d),
            )
            need(a, ("b_proj.weight",), blk + "kda_b.weight", "trunk", (kh, H))
            need(a, ("g_a_proj.weight",), blk + "kda_g_a.weight", "trunk", (d, H))
            need(a, ("g_b_proj.weight",), blk + "kda_g_b.weight", "trunk", (D, d))
            need(a, ("o_norm.weight",), blk + "kda_o_norm.weight", "f32", (d,))
            flat(a, ("dt_bias", "forget_gate.dt_bias"), blk + "kda_dt_bias", (D,))
            flat(a, ("A_log", "forget_gate.A_log"), blk + "kda_a_log", (kh,))
            if s.has(a + "conv1d.weight"):
                flat(a, ("conv1d.weight",), blk + "kda_conv.weight", (3 * D, 1, K))
            else:
                parts = [s.f32(a + f"{p}_conv1d.weight", (D, 1, K)) for p in ("q", "k", "v")]
                trunk.append(
                    _computed(
                        blk + "kda_conv.weight",
                        lambda ps=parts: np.concatenate([p.reshape(-1) for p in ps]),
                        (3 * D * K,),
                    )
                )
        else:
            need(a, ("q_a_proj.weight",), blk + "attn_q_a.weight", "trunk", (QL, H))
            need(a, ("q_a_layernorm.weight",), blk + "attn_q_a_norm.weight", "f32", (QL,))
            need(a, ("q_b_proj.weight",), blk + "attn_q_b.weight", "trunk", (nh * nope, QL))
            need(a, ("kv_a_proj_with_mqa.weight",), blk + "attn_kv_a_mqa.weight", "trunk", (R, H))
            need(a, ("kv_a_layernorm.weight",), blk + "attn_kv_a_norm.weight", "f32", (R,))
            need(a, ("kv_b_proj.weight",), blk + "attn_kv_b.weight", "trunk", (nh * (nope + vd), R))
            need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, nh * vd))
            if hp["index_kinds"][i] == "full":
                x = a + "indexer."
                need(x, ("wq_b.weight",), blk + "attn_idx_q.weight", "trunk", (NI * ID, QL))
                need(x, ("wk.weight",), blk + "attn_idx_k.weight", "trunk", (ID, H))
                need(
                    x,
                    ("index_kpool_compress_gate",),
                    blk + "attn_idx_gate.weight",
                    "trunk",
                    (ID, H),
                )
                need(x, ("weights_proj.weight",), blk + "attn_idx_w.weight", "trunk", (NI, H))
                need(x, ("k_norm.weight",), blk + "attn_idx_k_norm.weight", "f32", (ID,))
                need(x, ("k_norm.bias",), blk + "attn_idx_k_norm.bias", "f32", (ID,))
                flat(x, ("index_kpool_compress_ape",), blk + "attn_idx_ape", (P, ID))
        if hp["layer_kinds"][i] == "dense":
            for p, cn, shape in (
                ("gate_proj", "ffn_gate", (inter, H)),
                ("up_proj", "ffn_up", (inter, H)),
                ("down_proj", "ffn_down", (H, inter)),
            ):
                need(pre, (f"mlp.{p}.weight",), blk + f"{cn}.weight", "trunk", shape)
            continue
        need(pre, ("mlp.gate.weight",), blk + "ffn_gate_inp.weight", "f32", (E, H))
        need(pre, ("mlp.gate.e_score_correction_bias",), blk + "exp_probs_b.bias", "f32", (E,))
        for p, cn, shape in (
            ("gate_proj", "ffn_gate_shexp", (sh, H)),
            ("up_proj", "ffn_up_shexp", (sh, H)),
            ("down_proj", "ffn_down_shexp", (H, sh)),
        ):
            need(pre, (f"mlp.shared_experts.{p}.weight",), blk + f"{cn}.weight", "trunk", shape)
        experts.append(expert_layer(src, b, hp, i, pre, ((n, n) for n in st.entries), s.used))
    for layer in experts:
        for e in range(layer.n_experts):
            layer.expert(e)

    def skipped(name: str) -> bool:
        """Vision tower, multi-token-prediction layers, fp8 scales already consumed."""
        if name.startswith(_VISION_PREFIXES) or name in b.used_scales:
            return True
        if name.startswith(pre0 + "layers."):
            idx = name[len(pre0) + 7 :].split(".", 1)[0]
            return idx.isdigit() and int(idx) >= L
        return ".shared_head." in name

    unused = sorted(n for n in set(st.entries) - s.used if not skipped(n))
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise ConvertError(f"{src}: tensors not used by glm5_next: {', '.join(unused[:5])}{more}")
    files, tokenizer, chat = hf._tokenizer_files(src)
    return Plan(
        model_type="glm5_next",
        source_config=cfg,
        hparams=hp,
        trunk=trunk,
        experts=experts,
        files=files,
        tokenizer=tokenizer,
        chat=chat,
        source="hf",
    )


def load_glm5(src: Path, cfg: dict[str, Any]) -> Plan:
    """Plan of a ``glm5_next`` / ``glm5_next_text`` checkpoint (the text model)."""
    gen_path = src / "generation_config.json"
    gen = hf._load_json(gen_path) if gen_path.is_file() else {}
    return _load(src, cfg, gen)
