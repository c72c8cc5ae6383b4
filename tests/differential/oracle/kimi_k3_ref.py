"""A PyTorch reference of the Kimi K3 text model, read from a checkpoint in the released layout.

Written from the maths of the model (docs/MODELS.md, "Kimi K3"), not from the engine:
transformers' kimi_linear pieces where K3 keeps them (the causal short convolution, the
chunked KDA recurrence with its q/k l2norm, the gated output RMSNorm), and the K3 pieces
here: latent MoE, SiTU-GLU, the full-rank KDA output gate, the bounded decay gate, MLA
with a factorized query, NoPE and the optional output gate, Attention Residuals with the
model-level output aggregation. Routed experts are dequantized exactly from MXFP4
(low nibble first, E8M0 scale 2^(e-127) per 32 values). Everything runs in float32 from
the checkpoint's bf16 / f32 values; `logits(ids)` is a full forward (no cache), so
decoding compares against a fresh forward of the longer prefix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
#: The eps of the MLA latent norms (transformers' Kimi lineage default; docs/MODELS.md).
LORA_EPS = 1e-6


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def situ_glu(g: torch.Tensor, u: torch.Tensor, b1: float, b2: float | None) -> torch.Tensor:
    """SiTU-GLU: b1 tanh(g / b1) sigmoid(g) times u (bounded by b2 tanh(u / b2) when set)."""
    a = b1 * torch.tanh(g / b1) * torch.sigmoid(g)
    return a * (b2 * torch.tanh(u / b2) if b2 else u)


def bounded_gate(f: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor,
                 lower: float) -> torch.Tensor:
    """log-decay lower * sigmoid(exp(A_log_h) (f + dt_bias)); f [T, H, d], a_log [H]."""
    return lower * torch.sigmoid(a_log.exp()[:, None] * (f + dt_bias))


def attn_res(prefix: torch.Tensor, blocks: list[torch.Tensor], norm_w: torch.Tensor,
             proj_w: torch.Tensor, eps: float) -> torch.Tensor:
    """Softmax over [blocks..., prefix] (per token) of sum(rmsnorm(v) * norm_w * proj_w)."""
    v = torch.stack([*blocks, prefix], -2)                       # [T, nb+1, H]
    s = (rms(v, None, eps) * (norm_w * proj_w.reshape(-1))).sum(-1)
    return (s.softmax(-1).unsqueeze(-1) * v).sum(-2)


def mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The exact f32 of compressed-tensors MXFP4 [out, in/2] + E8M0 [out, in/32]."""
    p = packed.to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], -1).reshape(p.shape[0], -1)
    exp = scale.to(torch.float64) - 127
    s = torch.pow(2.0, exp).repeat_interleave(32, -1)
    return (FP4[codes].to(torch.float64) * s).to(torch.float32)


class KimiK3Reference:
    """The K3 text model of checkpoint directory `src` (eps of the AttnRes keys: `res_eps`,
    default rms_norm_eps; `experts`: applied to each dequantized expert matrix, e.g. a
    quantize -> dequantize round trip)."""

    def __init__(self, src: Path, res_eps: float | None = None,
                 lora_eps: float = LORA_EPS, experts: Any = None) -> None:
        from safetensors import safe_open

        self.cfg: dict[str, Any] = json.loads((Path(src) / "config.json").read_text())[
            "text_config"]
        self.t: dict[str, torch.Tensor] = {}
        for f in sorted(Path(src).glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    v = st.get_tensor(k)
                    self.t[k] = v if v.dtype == torch.uint8 else v.float()
        c = self.cfg
        self.eps = c["rms_norm_eps"]
        self.res_eps = self.eps if res_eps is None else res_eps
        self.lora_eps = lora_eps
        self.lac = c["linear_attn_config"]
        self.b1 = c.get("activation_situ_beta") or 1.0
        self.b2 = c.get("activation_situ_linear_beta")
        self.block = c.get("attn_res_block_size") or 0
        self._experts: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}
        self._expert_fn = experts or (lambda w: w)

    def w(self, name: str) -> torch.Tensor:
        return self.t["language_model." + name]

    def act(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return situ_glu(g, u, self.b1, self.b2) if self.cfg["hidden_act"] == "situ" \
            else F.silu(g) * u

    def mlp(self, p: str, x: torch.Tensor) -> torch.Tensor:
        g, u = x @ self.w(p + "gate_proj.weight").T, x @ self.w(p + "up_proj.weight").T
        return self.act(g, u) @ self.w(p + "down_proj.weight").T

    # ------------------------------------------------------------------ attention
    def kda(self, p: str, x: torch.Tensor) -> torch.Tensor:
        from transformers.models.kimi_linear.modeling_kimi_linear import (
            causal_conv1d_fn, chunk_kimi_delta_attention)

        T, nh, d = x.shape[0], self.lac["num_heads"], self.lac["head_dim"]
        qkv = []
        for n in "qkv":
            y = (x @ self.w(f"{p}{n}_proj.weight").T).T.unsqueeze(0)       # [1, D, T]
            w = self.w(f"{p}{n}_conv1d.weight")                             # [D, 1, K]
            # the short convolution keeps SiLU whatever hidden_act says
            y = causal_conv1d_fn(y, w.squeeze(1), None, activation="silu")
            qkv.append(y[0].T.reshape(1, T, nh, d))
        f = (x @ self.w(p + "f_a_proj.weight").T) @ self.w(p + "f_b_proj.weight").T
        a_log = self.w(p + "A_log").flatten()[:nh]                          # padded per head
        dt = self.w(p + "dt_bias").reshape(nh, d)
        lb = self.lac.get("gate_lower_bound")
        f = f.reshape(T, nh, d)
        g = bounded_gate(f, dt, a_log, lb) if lb is not None else \
            -a_log.exp()[:, None] * F.softplus(f + dt)
        beta = torch.sigmoid(x @ self.w(p + "b_proj.weight").T).reshape(1, T, nh)
        o, _ = chunk_kimi_delta_attention(*qkv, g=g.unsqueeze(0), beta=beta,
                                          use_qk_l2norm_in_kernel=True)
        o = o[0]
        if self.lac.get("use_full_rank_gate"):
            gate = x @ self.w(p + "g_proj.weight").T
        else:
            gate = (x @ self.w(p + "g_a_proj.weight").T) @ self.w(p + "g_b_proj.weight").T
        o = rms(o, self.w(p + "o_norm.weight"), self.eps) * torch.sigmoid(gate.reshape(T, nh, d))
        return o.reshape(T, nh * d) @ self.w(p + "o_proj.weight").T

    def mla(self, p: str, x: torch.Tensor) -> torch.Tensor:
        c, T = self.cfg, x.shape[0]
        nh, nope, rd, vd = (c["num_attention_heads"], c["qk_nope_head_dim"],
                            c["qk_rope_head_dim"], c["v_head_dim"])
        if c.get("q_lora_rank"):
            qa = rms(x @ self.w(p + "q_a_proj.weight").T, self.w(p + "q_a_layernorm.weight"),
                     self.lora_eps)
            q = qa @ self.w(p + "q_b_proj.weight").T
        else:
            q = x @ self.w(p + "q_proj.weight").T
        q = q.reshape(T, nh, nope + rd)
        ckv = x @ self.w(p + "kv_a_proj_with_mqa.weight").T
        lat, k_pe = ckv.split([c["kv_lora_rank"], rd], -1)
        kv = rms(lat, self.w(p + "kv_a_layernorm.weight"), self.lora_eps) @ \
            self.w(p + "kv_b_proj.weight").T
        k_nope, v = kv.reshape(T, nh, nope + vd).split([nope, vd], -1)
        k = torch.cat([k_nope, k_pe[:, None, :].expand(T, nh, rd)], -1)   # NoPE: unrotated
        s = torch.einsum("thd,shd->hts", q, k) * (nope + rd) ** -0.5
        s = s + torch.full((T, T), float("-inf")).triu(1)
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, nh * vd)
        if c.get("mla_use_output_gate"):
            o = o * torch.sigmoid(x @ self.w(p + "g_proj.weight").T)
        return o @ self.w(p + "o_proj.weight").T

    # ------------------------------------------------------------------ MoE
    def expert(self, layer: int, e: int) -> tuple[torch.Tensor, ...]:
        if (layer, e) not in self._experts:
            p = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
            self._experts[layer, e] = tuple(
                self._expert_fn(mxfp4(self.w(p + f"{n}.weight_packed"),
                                      self.w(p + f"{n}.weight_scale")))
                for n in ("w1", "w3", "w2"))
        return self._experts[layer, e]

    def moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        p = f"model.layers.{layer}.block_sparse_moe."
        scores = torch.sigmoid(x @ self.w(p + "gate.weight").T)
        choice = scores + self.w(p + "gate.e_score_correction_bias")
        k = c["num_experts_per_token"]
        idx = choice.topk(k, -1).indices
        wts = scores.gather(-1, idx)
        if c.get("moe_renormalize", True):
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * c.get("routed_scaling_factor", 1.0)
        latent = bool(c.get("routed_expert_hidden_size"))
        xl = x @ self.w(p + "routed_expert_down_proj.weight").T if latent else x
        y = torch.zeros_like(xl)
        for t in range(x.shape[0]):
            for j in range(k):
                w1, w3, w2 = self.expert(layer, int(idx[t, j]))
                y[t] += wts[t, j] * (self.act(xl[t] @ w1.T, xl[t] @ w3.T) @ w2.T)
        if latent and c.get("latent_moe_use_norm"):
            y = rms(y, self.w(p + "routed_expert_norm.weight"), self.eps)
        if latent:
            y = y @ self.w(p + "routed_expert_up_proj.weight").T
        return y + self.mlp(p + "shared_experts.", x)

    # ------------------------------------------------------------------ model
    def res(self, prefix: torch.Tensor, blocks: list[torch.Tensor], name: str) -> torch.Tensor:
        return attn_res(prefix, blocks, self.w(name + "_norm.weight"),
                        self.w(name + "_proj.weight"), self.res_eps)

    def forward(self, ids: list[int], rows: torch.Tensor | None = None,
                placeholder: int = -1) -> torch.Tensor:
        """Logits of every position; `rows` [n, hidden] (an image tower's, in order) take
        the place of the embeddings at the n positions holding `placeholder`."""
        c = self.cfg
        kda = set(self.lac["kda_layers"])
        x = self.w("model.embed_tokens.weight")[torch.tensor(ids)]
        if rows is not None:
            at = torch.tensor(ids) == placeholder
            assert int(at.sum()) == len(rows), "one row per placeholder"
            x = x.clone()
            x[at] = rows.to(x.dtype)
        blocks: list[torch.Tensor] = []
        for i in range(c["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            ps: torch.Tensor | None = x
            if self.block:
                if blocks:
                    x = self.res(x, blocks, pre + "self_attention_res")
                if i % self.block == 0:
                    blocks.append(ps)
                    ps = None
            h = rms(x, self.w(pre + "input_layernorm.weight"), self.eps)
            att = self.kda(pre + "self_attn.", h) if i + 1 in kda else \
                self.mla(pre + "self_attn.", h)
            if self.block:
                ps = att if ps is None else ps + att
                x = self.res(ps, blocks, pre + "mlp_res")
            else:
                x = x + att
            h = rms(x, self.w(pre + "post_attention_layernorm.weight"), self.eps)
            ffn = self.mlp(pre + "mlp.", h) if i < c["first_k_dense_replace"] else self.moe(i, h)
            x = ps + ffn if self.block else x + ffn
        if self.block:
            x = self.res(x, blocks, "model.output_attn_res")
        x = rms(x, self.w("model.norm.weight"), self.eps)
        return x @ self.w("lm_head.weight").T

    def logits(self, ids: list[int], rows: torch.Tensor | None = None,
               placeholder: int = -1) -> np.ndarray:
        with torch.no_grad():
            return self.forward(ids, rows, placeholder).numpy()
