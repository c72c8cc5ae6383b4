"""``kimi_k25``: Kimi K2.5 / K2.6 (``Kimi_K25ForConditionalGeneration``).

The text model is ``text_config`` read as ``deepseek_v3`` (its tensors under
``language_model.``, layers spelled ``model.layers.`` or ``model.blocks.``; the LM head
tied to the embedding when the outer ``tie_word_embeddings`` says so and no
``language_model.lm_head.weight`` is stored). The MoonViT tower (``vision_config``) and
its projector become the container's ``v.*`` tensors and its ``vision`` object
(docs/FORMAT.md section 7), with the checkpoint's ``preprocessor_config.json`` copied
verbatim:

- ``vision_tower.{encoder.,}patch_embed.proj.{weight [D, 3, p, p], bias}`` ->
  ``v.patch_embd.{weight [D, 3*p*p], bias}``; ``vision_tower.patch_embed.pos_emb.weight``
  ``[gh, gw, D]`` -> ``v.pos_embd`` ``[gh*gw, D]`` (f32);
- ``vision_tower.encoder.blocks.{l}.{norm0, wqkv, wo, norm1, mlp.fc0, mlp.fc1}`` ->
  ``v.blk.{l}.{ln1, attn_qkv, attn_out, ln2, ffn_up, ffn_down}`` (the fused q/k/v kept in
  the checkpoint's interleaved rotary layout); ``vision_tower.encoder.final_layernorm`` ->
  ``v.post_ln``;
- ``{model.,}mm_projector.pre_norm`` -> ``v.mm_norm``, ``mm_projector.proj.0`` / ``.2`` ->
  ``v.mm_in`` / ``v.mm_out``.

Refuses, naming the key or tensor: no ``preprocessor_config.json``, a non-square merge
kernel or position grid, ``projection_hidden_size`` other than the tower's width, an
activation other than GELU / GELU-tanh, a missing or misshapen tower tensor, a stored
tensor nothing reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..base import SafetensorsDir, TensorSource, get_int, get_number
from ..plan import Plan, SrcTensor
from ..quant import ConvertError
from ..vision import TowerTensors, merge_and_grid, preprocessor
from .deepseek_v3 import ARCH as TEXT

MODEL_TYPE: Final[str] = "kimi_k25"
TEXT_PREFIX: Final[str] = "language_model."
#: transformers' Kimi_K25VisionConfig defaults of the keys a config may omit.
VISION_DEFAULTS: Final[dict[str, Any]] = {
    "patch_size": 14, "pos_emb_height": 64, "pos_emb_width": 64, "num_attention_heads": 16,
    "num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304,
    "hidden_act": "gelu_pytorch_tanh", "merge_kernel_size": [2, 2],
}
#: Kimi_K25ImageProcessor's defaults of the keys a preprocessor_config.json may omit.
PROCESSOR_DEFAULTS: Final[dict[str, Any]] = {
    "patch_size": 14, "merge_size": 2, "max_patches": 16384,
    "size": {"max_height": 512, "max_width": 512},
}
ACTS: Final[dict[str, str]] = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                               "gelu": "gelu"}
ENCODER_NORM_EPS: Final[float] = 1e-5  # the tower's LayerNorms (fixed in the model)


class _TextView:
    """The text model's tensors under their deepseek_v3 names (the reading side of a
    SafetensorsDir: ``dir``, ``entries``, ``raw``)."""

    def __init__(self, st: SafetensorsDir) -> None:
        self.dir = st.dir
        self._st = st
        self._orig: dict[str, str] = {}
        for n in st.entries:
            if n.startswith(TEXT_PREFIX):
                name = n[len(TEXT_PREFIX):]
                if name.startswith("model.blocks."):
                    name = "model.layers." + name[len("model.blocks."):]
                self._orig[name] = n
        self.entries = {k: st.entries[v] for k, v in self._orig.items()}

    def raw(self, name: str) -> np.ndarray:
        return self._st.raw(self._orig[name])


def patch_limit(pp: Mapping[str, Any], merge: int) -> int:
    """Most patches the image processor gives one image (its resize then the padding to
    the merge size): min(S^2, budget + 2 m S + m^2), S the side limit padded to m."""
    size = pp.get("size", PROCESSOR_DEFAULTS["size"])
    side = int(size.get("max_height", 512)) if isinstance(size, Mapping) else 512
    budget = int(pp.get("max_patches", PROCESSOR_DEFAULTS["max_patches"]))
    s = math.ceil(side / merge) * merge
    return min(s * s, budget + 2 * merge * s + merge * merge)


def vision_plan(s: TensorSource, cfg: Mapping[str, Any], pp: Mapping[str, Any],
                text_hidden: int) -> tuple[dict[str, Any], list[SrcTensor]]:
    """The manifest's ``vision`` object and the ``v.*`` tensors."""
    vc = {**VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
    w = "config.json vision_config"
    D = get_int(vc, "hidden_size", minimum=1, where=w)
    L = get_int(vc, "num_hidden_layers", minimum=1, where=w)
    nh = get_int(vc, "num_attention_heads", minimum=1, where=w)
    F = get_int(vc, "intermediate_size", minimum=1, where=w)
    p = get_int(vc, "patch_size", minimum=1, where=w)
    gh = get_int(vc, "pos_emb_height", minimum=1, where=w)
    gw = get_int(vc, "pos_emb_width", minimum=1, where=w)
    mk = vc["merge_kernel_size"]
    m = merge_and_grid(mk, gh, gw, w)
    if D % nh or (D // nh) % 4:
        raise ConvertError(f"{w}: hidden_size {D} / {nh} heads must be a multiple of 4")
    act = ACTS.get(str(vc.get("hidden_act")))
    if act != "gelu_tanh":
        raise ConvertError(f"{w}: hidden_act {vc.get('hidden_act')!r}: MoonViT uses "
                           "gelu_pytorch_tanh")
    ph = get_int(cfg, "projection_hidden_size", default=D, minimum=1)
    if ph != D:
        raise ConvertError(f"config.json: projection_hidden_size {ph} is not the tower's "
                           f"hidden_size {D}")
    rope = vc.get("rope_parameters") or {}
    theta = get_number(rope, "rope_theta", above=0, default=10000.0,
                       where="config.json vision_config.rope_parameters")
    proj_eps = get_number(cfg, "projection_layer_norm_eps", above=0, default=1e-5)
    pp_patch = int(pp.get("patch_size", PROCESSOR_DEFAULTS["patch_size"]))
    pp_merge = int(pp.get("merge_size", PROCESSOR_DEFAULTS["merge_size"]))
    if (pp_patch, pp_merge) != (p, m):
        raise ConvertError(f"preprocessor_config.json: patch_size {pp_patch}, merge_size "
                           f"{pp_merge}; the tower's are {p}, {m}")
    v = TowerTensors(s)
    P = 3 * p * p
    v.add(("vision_tower.patch_embed.proj.weight", "vision_tower.encoder.patch_embed.proj.weight"),
          "v.patch_embd.weight", (D, 3, p, p), (D, P), "trunk")
    v.add(("vision_tower.patch_embed.proj.bias", "vision_tower.encoder.patch_embed.proj.bias"),
          "v.patch_embd.bias", (D,), (D,), "f32")
    v.add(("vision_tower.patch_embed.pos_emb.weight",), "v.pos_embd", (gh, gw, D), (gh * gw, D),
          "f32")
    for i in range(L):
        b = f"vision_tower.encoder.blocks.{i}."
        o = f"v.blk.{i}."
        for src, dst, rows, cols in (("wqkv", "attn_qkv", 3 * D, D), ("wo", "attn_out", D, D),
                                     ("mlp.fc0", "ffn_up", F, D), ("mlp.fc1", "ffn_down", D, F)):
            v.add((b + src + ".weight",), o + dst + ".weight", (rows, cols), (rows, cols), "trunk")
            v.add((b + src + ".bias",), o + dst + ".bias", (rows,), (rows,), "f32")
        for src, dst in (("norm0", "ln1"), ("norm1", "ln2")):
            for part in ("weight", "bias"):
                v.add((b + f"{src}.{part}",), o + f"{dst}.{part}", (D,), (D,), "f32")
    M = m * m * D
    for part in ("weight", "bias"):
        v.add((f"vision_tower.encoder.final_layernorm.{part}",), f"v.post_ln.{part}", (D,), (D,),
              "f32")
        v.add((f"mm_projector.pre_norm.{part}", f"model.mm_projector.pre_norm.{part}"),
              f"v.mm_norm.{part}", (D,), (D,), "f32")
    v.add(("mm_projector.proj.0.weight",), "v.mm_in.weight", (M, M), (M, M), "trunk")
    v.add(("mm_projector.proj.0.bias",), "v.mm_in.bias", (M,), (M,), "f32")
    v.add(("mm_projector.proj.2.weight",), "v.mm_out.weight", (text_hidden, M),
          (text_hidden, M), "trunk")
    v.add(("mm_projector.proj.2.bias",), "v.mm_out.bias", (text_hidden,), (text_hidden,), "f32")
    ids = {}
    for key, default in (("image_token_id", 163605), ("vision_start_token_id", 163602),
                         ("vision_end_token_id", 163604)):
        ids[key] = get_int(cfg, key, default=default)
    info = {
        "arch": MODEL_TYPE,
        "preprocessor": dict(pp),
        "patch_size": p,
        "merge_size": m,
        "temporal_patch_size": 1,
        "hidden_size": text_hidden,
        "placeholder_token_id": ids["image_token_id"],
        "image_start_token_id": ids["vision_start_token_id"],
        "image_end_token_id": ids["vision_end_token_id"],
        "hparams": {
            "hidden_size": D, "n_layers": L, "n_heads": nh, "intermediate_size": F,
            "patch_size": p, "merge_size": m, "temporal_patch_size": 1, "channels": 3,
            "pos_grid_h": gh, "pos_grid_w": gw, "max_patches": patch_limit(pp, m),
            "out_hidden_size": text_hidden, "rope_theta": theta,
            "norm_eps": ENCODER_NORM_EPS, "proj_norm_eps": proj_eps,
            "act": act, "proj_act": "gelu",
        },
    }
    return info, v.out


def _load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    tc = cfg.get("text_config")
    if not isinstance(tc, Mapping):
        raise ConvertError("config.json: kimi_k25 nests its text model in text_config (an "
                           "object)")
    st = SafetensorsDir(src)
    view = _TextView(st)
    tied = bool(cfg.get("tie_word_embeddings", False)) and "lm_head.weight" not in view.entries
    text = TEXT.load(src, {**tc, "tie_word_embeddings": tied}, gen, st=view)
    if text.hparams["vocab_size"] <= max(
            get_int(cfg, k, default=0)
            for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id")):
        raise ConvertError("config.json: image_token_id / vision_*_token_id outside the "
                           f"vocabulary of {text.hparams['vocab_size']}")
    s = TensorSource(st, cfg)
    info, tensors = vision_plan(s, cfg, preprocessor(src), text.hparams["hidden_size"])
    unused = sorted(n for n in st.entries if not n.startswith(TEXT_PREFIX) and n not in s.used)
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise ConvertError(f"{src}: tensors not used by {MODEL_TYPE}: "
                           f"{', '.join(unused[:5])}{more}")
    return replace(text, model_type=MODEL_TYPE, source_config=cfg,
                   trunk=text.trunk + tensors, vision=info)


class KimiK25:
    """The deepseek_v3 text model and the MoonViT tower of one checkpoint directory."""

    model_type = MODEL_TYPE

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any],
             st: Any = None) -> Plan:
        """Plan of a Kimi K2.5 / K2.6 checkpoint directory: the text model and the tower."""
        if st is not None:
            raise ConvertError(f"{MODEL_TYPE} reads only tensors stored in safetensors")
        return _load(src, cfg, gen)


ARCH: Final[KimiK25] = KimiK25()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a Kimi K2.5 / K2.6 checkpoint directory: the text model and the tower."""
    return ARCH.load(src, cfg, gen)
