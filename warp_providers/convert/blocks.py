"""Layer blocks shared by the hybrid checkpoints (``kimi_linear``, ``glm5_next``).

Owns :class:`Trunk`, which appends a layer's tensors to the plan by the first of their
spellings a checkpoint stores, and the blocks both families spell alike: a KDA
(Kimi Delta Attention) layer as ``blk.{i}.attn_{q,k,v,output}`` plus ``blk.{i}.kda_*``
(the three depthwise convolutions concatenated q, k, v into ``kda_conv.weight``
``[3D * kernel]``), an MLA layer as deepseek_v3's names, a dense SwiGLU MLP, and a MoE
layer's router, selection bias and shared expert.

Refuses, with a ``ConvertError`` naming the tensor: a missing or misshapen one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import TensorSource, computed
from .plan import SrcTensor
from .quant import ConvertError

__all__ = ["Trunk", "dense_mlp", "kda_layer", "mla_layer", "moe_router"]

_MLP = (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down"))


class Trunk:
    """The trunk tensors of a plan, appended by name from a :class:`TensorSource`."""

    def __init__(self, s: TensorSource, tensors: list[SrcTensor]) -> None:
        self.s = s
        self.tensors = tensors

    def _find(self, pre: str, names: tuple[str, ...]) -> str:
        name = self.s.first(pre, names)
        if name is None:
            raise ConvertError(f"{self.s.dir}: tensor {self.s.stored(pre + names[0])!r} is missing")
        return name

    def need(
        self, pre: str, names: tuple[str, ...], cname: str, kind: str, shape: tuple[int, ...]
    ) -> None:
        """Append the first stored of ``pre + names`` as ``cname``."""
        self.tensors.append(self.s.tensor(self._find(pre, names), cname, kind, shape))

    def flat(self, pre: str, names: tuple[str, ...], cname: str, shape: tuple[int, ...]) -> None:
        """Append an f32 tensor stored with ``shape``, written 1-D."""
        v = self.s.f32(self._find(pre, names), shape)
        self.tensors.append(computed(cname, lambda v=v: v.reshape(-1), (int(np.prod(shape)),)))

    def vector(self, pre: str, names: tuple[str, ...], cname: str, size: int,
               padded: bool = False) -> None:
        """Append an f32 vector of ``size`` values, whatever shape stores them (``padded``:
        the first ``size`` of at least that many)."""
        name = self._find(pre, names)
        v = self.s.f32(name, tuple(self.s.st.entries[self.s.stored(name)].shape))
        if v.size != size and not (padded and v.size > size):
            more = "at least " if padded else ""
            raise ConvertError(f"tensor {self.s.stored(name)!r}: {v.size} values, config implies "
                               f"{more}{size}")
        self.tensors.append(computed(cname, lambda v=v: v.reshape(-1)[:size], (size,)))


def kda_layer(t: Trunk, hp: Mapping[str, Any], a: str, blk: str) -> None:
    """Append a KDA layer's tensors under ``a`` (its ``self_attn.`` prefix), either spelling.

    With ``hp["kda_full_gate"]`` the output gate is one full-rank ``g_proj`` [D, hidden]
    (``kda_g.weight``) instead of ``g_a_proj``/``g_b_proj``; with ``hp["kda_a_log_padded"]``
    (not a manifest key: popped by the caller) ``A_log`` may hold more values than heads,
    of which the first ``kda_heads`` are taken.
    """
    kh, d, k = hp["kda_heads"], hp["kda_head_dim"], hp["kda_conv"]
    D, H = kh * d, hp["hidden_size"]
    for p in ("q", "k", "v"):
        t.need(a, (f"{p}_proj.weight",), blk + f"attn_{p}.weight", "trunk", (D, H))
    t.need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, D))
    for p, shape in (("f_a", (d, H)), ("f_b", (D, d))):
        t.need(a, (f"{p}_proj.weight", f"forget_gate.{p}_proj.weight"), blk + f"kda_{p}.weight",
               "trunk", shape)
    gates = (("g", (D, H)),) if hp.get("kda_full_gate") else (("g_a", (d, H)), ("g_b", (D, d)))
    for p, shape in (("b", (kh, H)), *gates):
        t.need(a, (f"{p}_proj.weight",), blk + f"kda_{p}.weight", "trunk", shape)
    t.need(a, ("o_norm.weight",), blk + "kda_o_norm.weight", "f32", (d,))
    t.vector(a, ("dt_bias", "forget_gate.dt_bias"), blk + "kda_dt_bias", D)
    t.vector(a, ("A_log", "forget_gate.A_log"), blk + "kda_a_log", kh,
             padded=bool(hp.get("kda_a_log_padded")))
    if t.s.has(a + "conv1d.weight"):
        t.flat(a, ("conv1d.weight",), blk + "kda_conv.weight", (3 * D, 1, k))
    else:
        parts = [t.s.f32(a + f"{p}_conv1d.weight", (D, 1, k)) for p in ("q", "k", "v")]
        t.tensors.append(computed(blk + "kda_conv.weight",
                                  lambda ps=parts: np.concatenate([p.reshape(-1) for p in ps]),
                                  (3 * D * k,)))


def mla_layer(t: Trunk, hp: Mapping[str, Any], a: str, blk: str, *, biases: bool) -> None:
    """Append an MLA layer's tensors under ``a`` (with ``biases``: the optional biases)."""
    H, nh, R, RD = hp["hidden_size"], hp["n_heads"], hp["kv_lora_rank"], hp["rope_dim"]
    nope, vd, QL = hp["qk_nope_head_dim"], hp["v_head_dim"], hp["q_lora_rank"]
    if QL:
        t.need(a, ("q_a_proj.weight",), blk + "attn_q_a.weight", "trunk", (QL, H))
        t.need(a, ("q_a_layernorm.weight",), blk + "attn_q_a_norm.weight", "f32", (QL,))
        t.need(a, ("q_b_proj.weight",), blk + "attn_q_b.weight", "trunk", (nh * (nope + RD), QL))
    else:
        t.need(a, ("q_proj.weight",), blk + "attn_q.weight", "trunk", (nh * (nope + RD), H))
    t.need(a, ("kv_a_proj_with_mqa.weight",), blk + "attn_kv_a_mqa.weight", "trunk", (R + RD, H))
    t.need(a, ("kv_a_layernorm.weight",), blk + "attn_kv_a_norm.weight", "f32", (R,))
    t.need(a, ("kv_b_proj.weight",), blk + "attn_kv_b.weight", "trunk", (nh * (nope + vd), R))
    t.need(a, ("o_proj.weight",), blk + "attn_output.weight", "trunk", (H, nh * vd))
    if not biases:
        return
    # attention_bias: q_a_proj (with q_lora), kv_a_proj_with_mqa and o_proj carry biases
    for p, cn, n in (("q_a_proj", "attn_q_a", QL), ("kv_a_proj_with_mqa", "attn_kv_a_mqa", R + RD),
                     ("o_proj", "attn_output", H)):
        if n and t.s.has(a + f"{p}.bias"):
            t.need(a, (f"{p}.bias",), blk + f"{cn}.bias", "f32", (n,))


def dense_mlp(t: Trunk, hp: Mapping[str, Any], pre: str, blk: str, spellings: tuple[str, ...],
              width: int | None = None, cname: str = "ffn_{}") -> None:
    """Append a SwiGLU MLP (``width`` wide, else the dense one) under one of ``spellings``."""
    inter, H = hp["intermediate_size"] if width is None else width, hp["hidden_size"]
    for p, cn in _MLP:
        shape = (H, inter) if p == "down_proj" else (inter, H)
        t.need(pre, tuple(f"{sp}{p}.weight" for sp in spellings),
               blk + cname.format(cn[4:]) + ".weight", "trunk", shape)


def moe_router(t: Trunk, hp: Mapping[str, Any], pre: str, blk: str,
               spellings: tuple[str, ...]) -> None:
    """Append the router ``gate`` and its selection bias ``e_score_correction_bias``."""
    E, H = hp["n_experts"], hp["hidden_size"]
    t.need(pre, tuple(f"{sp}gate.weight" for sp in spellings), blk + "ffn_gate_inp.weight",
           "f32", (E, H))
    t.need(pre, tuple(f"{sp}gate.e_score_correction_bias" for sp in spellings),
           blk + "exp_probs_b.bias", "f32", (E,))
