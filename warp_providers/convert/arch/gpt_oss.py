"""``gpt_oss``: attention sinks, alternating sliding layers, biased experts, MXFP4 sources.

Config: ``intermediate_size`` (the experts' width), ``layer_types`` -> ``attn_kinds``
("sliding"/"full", by default alternating from a sliding first layer) with
``sliding_window``, ``attention_bias`` (default true: q/k/v/o biases),
``swiglu_alpha``/``swiglu_limit``, YaRN via ``rope_parameters``. Tensors: attention sinks
(``blk.{i}.attn_sinks``), the router with its bias (``ffn_gate_inp.bias``), expert biases
as trunk tensors ``ffn_{gate,up,down}_exps.bias`` (``[n_experts, width]`` f32), and the
fused ``gate_up_proj`` whose gate and up are *interleaved* (gate = even, up = odd), stored
``[E, hidden, 2*inter]`` as transformers holds it, or as the original MXFP4
``*_blocks``/``*_scales`` ``[E, rows, cols/32, 16]`` (FP4 e2m1 nibbles, low nibble first,
times 2^(scale-127)): stored as container ``mxfp4`` code for code by default
(``quant.mxfp4_pack``), dequantized exactly when another experts dtype is requested; a
scale byte 255 (NaN) is refused naming the tensor either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..base import (
    FP4_E2M1,
    SafetensorsDir,
    TensorSource,
    computed,
    finish_plan,
    get_flag,
    get_int,
    get_number,
    rope_inv_freq,
    to_f32,
    top_tensors,
)
from ..decoder import Prepared
from ..plan import ExpertLayerSrc, Plan, SrcTensor, expert_shapes, rope_freqs
from ..quant import ConvertError, check_e8m0, mxfp4_pack

MODEL_TYPE: Final[str] = "gpt_oss"

#: HF layer-name suffix -> (canonical name, role).
LAYER: Final[dict[str, tuple[str, str]]] = {
    "input_layernorm.weight": ("attn_norm.weight", "f32"),
    "post_attention_layernorm.weight": ("ffn_norm.weight", "f32"),
    "self_attn.q_proj.weight": ("attn_q.weight", "trunk"),
    "self_attn.q_proj.bias": ("attn_q.bias", "f32"),
    "self_attn.k_proj.weight": ("attn_k.weight", "trunk"),
    "self_attn.k_proj.bias": ("attn_k.bias", "f32"),
    "self_attn.v_proj.weight": ("attn_v.weight", "trunk"),
    "self_attn.v_proj.bias": ("attn_v.bias", "f32"),
    "self_attn.o_proj.weight": ("attn_output.weight", "trunk"),
    "self_attn.o_proj.bias": ("attn_output.bias", "f32"),
    "self_attn.sinks": ("attn_sinks", "f32"),
    "mlp.router.weight": ("ffn_gate_inp.weight", "f32"),
    "mlp.router.bias": ("ffn_gate_inp.bias", "f32"),
}


def mxfp4_to_f32(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Dequantize MXFP4 ``blocks [..., G, 16]`` (u8) with ``scales [..., G]`` (u8, e8m0).

    Returns ``[..., G * 32]`` float32: element ``2j`` of a group is the low nibble of byte
    ``j``, element ``2j + 1`` the high nibble, each times ``2 ** (scale - 127)``.
    """
    b = np.asarray(blocks, dtype=np.uint8)
    s = np.asarray(scales, dtype=np.int32) - 127
    if b.shape[:-1] != s.shape or b.shape[-1] != 16:
        raise ConvertError(f"MXFP4 blocks {list(b.shape)} do not match scales {list(s.shape)}")
    out = np.empty((*b.shape[:-1], 32), dtype=np.float32)
    out[..., 0::2] = FP4_E2M1[b & 0x0F]
    out[..., 1::2] = FP4_E2M1[b >> 4]
    out = np.ldexp(out, s[..., None]).astype(np.float32)
    return out.reshape(*b.shape[:-2], b.shape[-2] * 32)


class GptOss(Prepared):
    """Experts on every layer, no shared expert, no dense MLP."""

    model_type = MODEL_TYPE

    def hparams(self, cfg: Mapping[str, Any], gen: Mapping[str, Any]) -> dict[str, Any]:
        """Return the standard keys, then this family's.

        They are ``attention_bias`` (popped by the loader), the window, ``attn_kinds`` and
        the clamped SwiGLU's ``swiglu_alpha``/``swiglu_limit``.
        """
        inter = get_int(cfg, "intermediate_size")
        if inter == 0:
            raise ConvertError("config.json: intermediate_size must be > 0")
        hp = super().hparams(
            self.prepare(cfg, moe_inter=inter, inter=0, norm_topk=True, shared=0), gen
        )
        n = hp["n_layers"]
        types = cfg.get("layer_types")
        if types is None:
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        if not isinstance(types, list) or len(types) != n:
            raise ConvertError(f"config.json: layer_types must list {n} entries")
        kinds = []
        for t in types:
            if t not in ("sliding_attention", "full_attention"):
                raise ConvertError(f"config.json: unknown layer_types entry {t!r}")
            kinds.append("sliding" if t == "sliding_attention" else "full")
        window = get_int(cfg, "sliding_window", minimum=1) if "sliding" in kinds else None
        hp.update(attention_bias=get_flag(cfg, "attention_bias", True))
        hp.update(
            sliding_window=window,
            attn_kinds=kinds,
            swiglu_alpha=get_number(cfg, "swiglu_alpha", default=1.702, above=0),
            swiglu_limit=get_number(cfg, "swiglu_limit", default=7.0, above=0),
        )
        return hp

    def load(self, src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
        """Plan of a ``gpt_oss`` checkpoint directory."""
        hp = self.hparams(cfg, gen)
        rope_type, rope_params = hp.pop("_rope")
        bias = hp.pop("attention_bias")
        s = TensorSource(SafetensorsDir(src), cfg)
        H, hd, nh, nkv = hp["hidden_size"], hp["head_dim"], hp["n_heads"], hp["n_kv_heads"]
        E, inter = hp["n_experts"], hp["moe_intermediate_size"]
        shapes = {
            "attn_norm.weight": (H,), "ffn_norm.weight": (H,),
            "attn_q.weight": (nh * hd, H), "attn_q.bias": (nh * hd,),
            "attn_k.weight": (nkv * hd, H), "attn_k.bias": (nkv * hd,),
            "attn_v.weight": (nkv * hd, H), "attn_v.bias": (nkv * hd,),
            "attn_output.weight": (H, nh * hd), "attn_output.bias": (H,),
            "attn_sinks": (nh,), "ffn_gate_inp.weight": (E, H), "ffn_gate_inp.bias": (E,),
        }
        trunk = top_tensors(s, hp)
        inv, _ = rope_inv_freq(rope_type, hp["rope_theta"], hp["rope_dim"], rope_params,
                               hp["max_position_embeddings"])
        trunk.append(rope_freqs(inv))
        experts: list[ExpertLayerSrc] = []
        for i in range(hp["n_layers"]):
            pre = f"model.layers.{i}."
            for hf_name, (cname, kind) in LAYER.items():
                if hf_name.startswith("self_attn.") and hf_name.endswith(".bias") and not bias:
                    continue  # attention_bias false: no q/k/v/o biases (the engine's are optional)
                trunk.append(s.tensor(pre + hf_name, f"blk.{i}.{cname}", kind, shapes[cname]))
            ex = pre + "mlp.experts."
            gub = s.f32(ex + "gate_up_proj_bias", (E, 2 * inter))
            trunk.append(computed(f"blk.{i}.ffn_gate_exps.bias", lambda a=gub: a[:, 0::2],
                                  (E, inter)))
            trunk.append(computed(f"blk.{i}.ffn_up_exps.bias", lambda a=gub: a[:, 1::2],
                                  (E, inter)))
            trunk.append(s.tensor(ex + "down_proj_bias", f"blk.{i}.ffn_down_exps.bias", "f32",
                                  (E, H)))
            experts.append(_experts(s, hp, i))
        return finish_plan(s, MODEL_TYPE, cfg, hp, trunk, experts)


def _experts(s: TensorSource, hp: Mapping[str, Any], i: int) -> ExpertLayerSrc:
    """Layer ``i``'s experts from the MXFP4 blocks or the dequantized fused tensors."""
    E, H, inter = hp["n_experts"], hp["hidden_size"], hp["moe_intermediate_size"]
    ex = f"model.layers.{i}.mlp.experts."
    shapes = expert_shapes(hp)
    gshape, _, dshape = shapes
    names = [f"blk.{i}.expert.{{}}.{p}" for p in ("gate", "up", "down")]
    Part = Callable[[int, int], np.ndarray]
    if s.has(ex + "gate_up_proj_blocks"):
        if H % 32 or inter % 32:
            raise ConvertError(f"layer {i}: MXFP4 experts need hidden and inter multiples of 32")
        gu_b = s.u8(ex + "gate_up_proj_blocks", (E, 2 * inter, H // 32, 16))
        gu_s = s.u8(ex + "gate_up_proj_scales", (E, 2 * inter, H // 32))
        dn_b = s.u8(ex + "down_proj_blocks", (E, H, inter // 32, 16))
        dn_s = s.u8(ex + "down_proj_scales", (E, H, inter // 32))
        nbytes = (gu_b.nbytes + gu_s.nbytes + dn_b.nbytes + dn_s.nbytes) // E

        gu_sn, dn_sn = s.stored(ex + "gate_up_proj_scales"), s.stored(ex + "down_proj_scales")

        def expert(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
            def part(par: int) -> tuple[Part, Callable[[], np.ndarray]]:
                def rows(r0: int, r1: int) -> np.ndarray:
                    sl = slice(2 * r0 + par, 2 * r1 + par, 2)
                    check_e8m0(gu_s[e, sl], gu_sn)
                    return mxfp4_to_f32(gu_b[e, sl], gu_s[e, sl])

                def raw() -> np.ndarray:
                    return mxfp4_pack(gu_b[e, par::2], gu_s[e, par::2], gu_sn)
                return rows, raw

            def drows(r0: int, r1: int) -> np.ndarray:
                check_e8m0(dn_s[e, r0:r1], dn_sn)
                return mxfp4_to_f32(dn_b[e, r0:r1], dn_s[e, r0:r1])

            def draw() -> np.ndarray:
                return mxfp4_pack(dn_b[e], dn_s[e], dn_sn)

            g, u, d = (n.format(e) for n in names)
            (grows, graw), (urows, uraw) = part(0), part(1)
            return (SrcTensor(g, gshape, "experts", grows, nbytes // 3, graw, "mxfp4"),
                    SrcTensor(u, gshape, "experts", urows, nbytes // 3, uraw, "mxfp4"),
                    SrcTensor(d, dshape, "experts", drows, nbytes // 3, draw, "mxfp4"))

        return ExpertLayerSrc(i, E, shapes, expert, nbytes * E)
    gu_name, dn_name = ex + "gate_up_proj", ex + "down_proj"
    gu_ent, dn_ent = s.entry(gu_name), s.entry(dn_name)
    for name, ent, want in ((gu_name, gu_ent, (E, H, 2 * inter)), (dn_name, dn_ent, (E, inter, H))):
        if tuple(ent.shape) != want:
            raise ConvertError(f"tensor {name!r}: shape {list(ent.shape)}, "
                               f"config implies {list(want)}")
    gu_raw, dn_raw = s.raw(gu_name), s.raw(dn_name)
    nbytes = (gu_ent.nbytes + dn_ent.nbytes) // E

    def expert_f(e: int) -> tuple[SrcTensor, SrcTensor, SrcTensor]:
        def gu() -> np.ndarray:
            return to_f32(gu_raw[e], gu_ent.dtype)  # [H, 2I], gate/up interleaved

        g, u, d = (n.format(e) for n in names)
        return (
            computed(g, lambda: gu()[:, 0::2].T, gshape, "experts", nbytes // 3),
            computed(u, lambda: gu()[:, 1::2].T, gshape, "experts", nbytes // 3),
            computed(d, lambda: to_f32(dn_raw[e], dn_ent.dtype).T, dshape, "experts", nbytes // 3),
        )

    return ExpertLayerSrc(i, E, shapes, expert_f, nbytes * E)


ARCH: Final[GptOss] = GptOss()


def load(src: Path, cfg: dict[str, Any], gen: Mapping[str, Any]) -> Plan:
    """Plan of a ``gpt_oss`` checkpoint directory."""
    return ARCH.load(src, cfg, gen)
