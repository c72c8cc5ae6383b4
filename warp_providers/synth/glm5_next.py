"""Random glm5_next (GLM-5.3-Flash text model) checkpoints in the release's tensor names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from warp_providers.synth._common import Writer, tokenizer_files

_KINDS = {"L": "linear_attention", "F": "indexed_attention", "S": "indexed_attention"}


@dataclass(frozen=True)
class Glm5NextShape:
    """The shape of a generated glm5_next checkpoint (default ~4.8 G parameters).

    `layer_pattern` spells the attention of each layer, repeated to `num_hidden_layers`:
    "L" a KDA linear-attention layer, "F" an MLA layer with its own DSA indexer, "S" an MLA
    layer reusing the selection of the "F" layer right before it. The first
    `first_k_dense_replace` layers have a dense MLP, the others shared + routed experts.
    """

    hidden_size: int = 1024
    num_hidden_layers: int = 16
    layer_pattern: str = "LLLFLLFS"
    first_k_dense_replace: int = 1
    intermediate_size: int = 4096
    n_routed_experts: int = 64
    num_experts_per_tok: int = 8
    n_group: int = 1
    topk_group: int = 1
    n_shared_experts: int = 1
    moe_intermediate_size: int = 1536
    num_attention_heads: int = 16
    q_lora_rank: int = 512
    kv_lora_rank: int = 256
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    linear_num_heads: int = 8
    linear_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    index_n_heads: int = 8
    index_head_dim: int = 64
    index_topk: int = 256
    index_kpool: int = 16
    hc_mult: int = 4
    swiglu_limit: float = 10.0

    def layer_codes(self) -> str:
        """One of "L", "F", "S" per layer (the pattern repeated and cut)."""
        p = self.layer_pattern
        if not p or any(c not in _KINDS for c in p):
            raise ValueError(f"layer_pattern {p!r}: only L, F and S")
        codes = (p * (self.num_hidden_layers // len(p) + 1))[: self.num_hidden_layers]
        for i, c in enumerate(codes):
            if c == "S" and (i == 0 or codes[i - 1] != "F"):
                raise ValueError(f"layer {i} shares the indexer but layer {i - 1} is not 'F'")
        return codes

    def expert_params(self) -> int:
        """Parameters of all routed experts."""
        moe_layers = self.num_hidden_layers - min(self.first_k_dense_replace,
                                                  self.num_hidden_layers)
        return 3 * self.hidden_size * self.moe_intermediate_size * self.n_routed_experts * \
            moe_layers


def _config(sh: Glm5NextShape, codes: str, vocab_padded: int, eos: int) -> dict[str, Any]:
    n = sh.num_hidden_layers
    text = {
        "model_type": "glm5_next_text", "vocab_size": vocab_padded,
        "hidden_size": sh.hidden_size, "num_hidden_layers": n,
        "intermediate_size": sh.intermediate_size,
        "moe_intermediate_size": sh.moe_intermediate_size,
        "num_attention_heads": sh.num_attention_heads,
        "num_key_value_heads": sh.num_attention_heads,
        "n_routed_experts": sh.n_routed_experts, "num_experts_per_tok": sh.num_experts_per_tok,
        "n_shared_experts": sh.n_shared_experts, "n_group": sh.n_group,
        "topk_group": sh.topk_group, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "q_lora_rank": sh.q_lora_rank, "kv_lora_rank": sh.kv_lora_rank,
        "qk_nope_head_dim": sh.qk_nope_head_dim, "qk_rope_head_dim": 0,
        "v_head_dim": sh.v_head_dim,
        "layer_types": [_KINDS[c] for c in codes],
        "indexer_types": ["shared" if c == "S" else "full" for c in codes],
        "mlp_layer_types": ["dense" if i < sh.first_k_dense_replace else "sparse"
                            for i in range(n)],
        "linear_num_heads": sh.linear_num_heads, "linear_head_dim": sh.linear_head_dim,
        "linear_conv_kernel_dim": sh.linear_conv_kernel_dim, "linear_lower_bound": -5.0,
        "index_n_heads": sh.index_n_heads, "index_head_dim": sh.index_head_dim,
        "index_topk": sh.index_topk, "index_kpool": sh.index_kpool,
        "index_kpool_always_select_tail": True,
        "hc_mult": sh.hc_mult, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20,
        "swiglu_limit": sh.swiglu_limit, "hidden_act": "silu", "attention_bias": False,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": eos, "pad_token_id": None,
        "torch_dtype": "float16",
    }
    # The release is the multimodal checkpoint; a tiny vision tower config (no tensors
    # are written for it: the converter skips it and transformers initialises it).
    vision = {"model_type": "glm5_next_vision", "depth": 1, "hidden_size": 32,
              "num_heads": 2, "intermediate_size": 32, "out_hidden_size": sh.hidden_size,
              "projection_intermediate_size": 32}
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
            "text_config": text, "vision_config": vision, "tie_word_embeddings": False,
            "torch_dtype": "float16"}


def make_glm5_next_checkpoint(out: str | Path, shape: Glm5NextShape | None = None,
                              seed: int = 0, tokenizer: str | Path | None = None) -> Path:
    """Write a random glm5_next (GLM-5.3-Flash) checkpoint in the release's tensor names.

    The config is the release's nested one (`text_config`, a tiny `vision_config` without
    tensors); the text model sits under `model.language_model.` with per-expert
    `mlp.experts.N.*`, `hc_{attn,ffn}_{fn,base,scale}`, `self_attn.f_a_proj`, `dt_bias`,
    `A_log` and `{q,k,v}_conv1d`, which transformers renames on load and `warp convert`
    reads directly. It has every layer kind: KDA linear attention (bounded forget gate),
    MLA attention with a DSA indexer of its own ("F") or sharing the previous layer's
    selection ("S"), dense first MLPs, then sigmoid-routed MoE with a random selection bias
    and a shared expert, and `hc_mult` hyper-connection streams. Float16 safetensors, one
    shard per layer (the f32 parameters transformers keeps in float32 are float32).

    Args:
        out: the directory to create.
        shape: sizes (default: 4.80 G parameters, 9.6 GB of float16 of which the routed
            experts are 94%; a 5.1 GB Q8_0 container, floor ~0.43 GB).
        seed: the RNG seed; the same seed gives the same bytes.
        tokenizer: as for `make_moe_checkpoint` (a directory with tokenizer.json).

    Returns:
        The directory, ready for `warp convert`.

    """
    sh = shape or Glm5NextShape()
    codes = sh.layer_codes()
    tok_json, tok_cfg, vocab = tokenizer_files(tokenizer)
    vocab_padded = (vocab + 31) // 32 * 32
    wr = Writer(Path(out), _config(sh, codes, vocab_padded, vocab - 1), tok_json, tok_cfg, seed)
    rng = wr.rng
    h, hc = sh.hidden_size, sh.hc_mult
    std = 1.0 / np.sqrt(h)

    def w(*dims: int, scale: float = std, dtype: type = np.float16) -> np.ndarray:
        return wr.w(*dims, scale=scale, dtype=dtype)

    def ones(k: int) -> np.ndarray:
        return np.ones(k, np.float16)

    def mlp(p: str, inter: int) -> dict[str, np.ndarray]:
        return {p + "gate_proj.weight": w(inter, h), p + "up_proj.weight": w(inter, h),
                p + "down_proj.weight": w(h, inter, scale=1.0 / np.sqrt(inter))}

    pre = "model.language_model."
    wr.shard("model-embed.safetensors", {
        pre + "embed_tokens.weight": w(vocab_padded, h, scale=1.0),
        pre + "norm.weight": ones(h),
        "lm_head.weight": w(vocab_padded, h),
    })
    nh, ql, kvr = sh.num_attention_heads, sh.q_lora_rank, sh.kv_lora_rank
    nope, vd = sh.qk_nope_head_dim, sh.v_head_dim
    kh, kd, kk = sh.linear_num_heads, sh.linear_head_dim, sh.linear_conv_kernel_dim
    dd = kh * kd
    ni, idd = sh.index_n_heads, sh.index_head_dim
    mix = (2 + hc) * hc
    for i, code in enumerate(codes):
        p = f"{pre}layers.{i}."
        a = p + "self_attn."
        t = {p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)}
        for part in ("attn", "ffn"):
            t[f"{p}hc_{part}_fn"] = w(mix, hc * h, scale=0.02, dtype=np.float32)
            t[f"{p}hc_{part}_base"] = np.zeros(mix, np.float32)
            t[f"{p}hc_{part}_scale"] = np.ones(3, np.float32)
        if code == "L":
            # dt_bias: the inverse softplus of a step in [1e-3, 1e-1], as transformers
            # initialises it; A_log 0 (the bounded gate's decay rate 1).
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), dd))
            t.update({
                a + "q_proj.weight": w(dd, h), a + "k_proj.weight": w(dd, h),
                a + "v_proj.weight": w(dd, h),
                a + "o_proj.weight": w(h, dd, scale=1.0 / np.sqrt(dd)),
                a + "f_a_proj.weight": w(kd, h),
                a + "f_b_proj.weight": w(dd, kd, scale=1.0 / np.sqrt(kd)),
                a + "b_proj.weight": w(kh, h),
                a + "g_a_proj.weight": w(kd, h),
                a + "g_b_proj.weight": w(dd, kd, scale=1.0 / np.sqrt(kd)),
                a + "o_norm.weight": ones(kd),
                a + "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(np.float32),
                a + "A_log": np.zeros(kh, np.float32),
            })
            for q in "qkv":
                t[f"{a}{q}_conv1d.weight"] = w(dd, 1, kk, scale=1.0 / np.sqrt(kk),
                                               dtype=np.float32)
        else:
            t.update({
                a + "q_a_proj.weight": w(ql, h), a + "q_a_layernorm.weight": ones(ql),
                a + "q_b_proj.weight": w(nh * nope, ql, scale=1.0 / np.sqrt(ql)),
                a + "kv_a_proj_with_mqa.weight": w(kvr, h),
                a + "kv_a_layernorm.weight": ones(kvr),
                a + "kv_b_proj.weight": w(nh * (nope + vd), kvr, scale=1.0 / np.sqrt(kvr)),
                a + "o_proj.weight": w(h, nh * vd, scale=1.0 / np.sqrt(nh * vd)),
            })
            if code == "F":
                x = a + "indexer."
                t.update({
                    x + "wq_b.weight": w(ni * idd, ql, scale=1.0 / np.sqrt(ql)),
                    x + "wk.weight": w(idd, h),
                    x + "k_norm.weight": ones(idd), x + "k_norm.bias": np.zeros(idd, np.float16),
                    x + "weights_proj.weight": w(ni, h),
                    x + "index_kpool_compress_gate": w(idd, h),
                    x + "index_kpool_compress_ape": w(sh.index_kpool, idd, scale=0.1),
                })
        if i < sh.first_k_dense_replace:
            t.update(mlp(p + "mlp.", sh.intermediate_size))
        else:
            # router logits ~ N(0, 1): sigmoid scores spread over (0, 1); a larger scale
            # saturates them at 1.0 and the bias alone would pick the same experts always
            t[p + "mlp.gate.weight"] = w(sh.n_routed_experts, h, scale=1.0 / np.sqrt(h),
                                         dtype=np.float32)
            t[p + "mlp.gate.e_score_correction_bias"] = w(sh.n_routed_experts, scale=0.1,
                                                          dtype=np.float32)
            t.update(mlp(p + "mlp.shared_experts.",
                         sh.moe_intermediate_size * sh.n_shared_experts))
            for e in range(sh.n_routed_experts):
                t.update(mlp(f"{p}mlp.experts.{e}.", sh.moe_intermediate_size))
        wr.shard(f"model-layer-{i:03d}.safetensors", t)
    return wr.finish()
