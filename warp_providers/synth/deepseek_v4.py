"""Random DeepSeek-V4 checkpoints in the release's tensor names, of any size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from warp_providers.synth._common import Writer, tokenizer_files


@dataclass(frozen=True)
class DeepseekV4Shape:
    """The shape of a generated DeepSeek-V4 checkpoint (default ~3.3 GB of float16)."""

    hidden_size: int = 1024
    num_hidden_layers: int = 16
    n_routed_experts: int = 64
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 512
    num_attention_heads: int = 8
    head_dim: int = 128
    q_lora_rank: int = 256
    qk_rope_head_dim: int = 32
    o_groups: int = 4
    o_lora_rank: int = 256
    index_n_heads: int = 8
    index_head_dim: int = 64
    index_topk: int = 64
    compress_rate_csa: int = 4
    compress_rate_hca: int = 64
    sliding_window: int = 128
    hc_mult: int = 4
    num_hash_layers: int = 2

    def expert_params(self) -> int:
        """Parameters of all routed experts."""
        return 3 * self.hidden_size * self.moe_intermediate_size * self.n_routed_experts * \
            self.num_hidden_layers


def make_deepseek_v4_checkpoint(out: str | Path, shape: DeepseekV4Shape | None = None,
                                seed: int = 0, tokenizer: str | Path | None = None) -> Path:
    """Write a random DeepSeek-V4 checkpoint in the release's tensor names.

    Float16 safetensors, one shard per layer; the first `num_hash_layers` layers are
    hash-routed and the attention kinds cycle sliding-only, CSA, HCA.

    Returns:
        The directory, ready for `warp convert`.

    """
    sh = shape or DeepseekV4Shape()
    tok_json, tok_cfg, vocab = tokenizer_files(tokenizer)
    vocab_padded = (vocab + 31) // 32 * 32
    n = sh.num_hidden_layers
    kinds = [("sliding_attention", "compressed_sparse_attention",
              "heavily_compressed_attention")[i % 3] for i in range(n)]
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": vocab_padded, "hidden_size": sh.hidden_size, "num_hidden_layers": n,
        "num_attention_heads": sh.num_attention_heads, "num_key_value_heads": 1,
        "head_dim": sh.head_dim, "q_lora_rank": sh.q_lora_rank,
        "partial_rotary_factor": sh.qk_rope_head_dim / sh.head_dim,
        "moe_intermediate_size": sh.moe_intermediate_size,
        "n_routed_experts": sh.n_routed_experts, "num_experts_per_tok": sh.num_experts_per_tok,
        "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
        "layer_types": kinds,
        "mlp_layer_types": ["hash_moe" if i < sh.num_hash_layers else "moe" for i in range(n)],
        "compress_rates": {"compressed_sparse_attention": sh.compress_rate_csa,
                           "heavily_compressed_attention": sh.compress_rate_hca},
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
        "hc_mult": sh.hc_mult, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0,
        "sliding_window": sh.sliding_window, "o_groups": sh.o_groups,
        "o_lora_rank": sh.o_lora_rank, "index_n_heads": sh.index_n_heads,
        "index_head_dim": sh.index_head_dim, "index_topk": sh.index_topk,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": vocab - 1, "torch_dtype": "float16",
    }
    wr = Writer(Path(out), cfg, tok_json, tok_cfg, seed)
    rng = wr.rng
    h, d, hc = sh.hidden_size, sh.head_dim, sh.hc_mult
    std = 1.0 / np.sqrt(h)

    def w(*dims: int, scale: float = std, dtype: type = np.float16) -> np.ndarray:
        return wr.w(*dims, scale=scale, dtype=dtype)

    def ones(k: int) -> np.ndarray:
        return np.ones(k, np.float32)

    shard = wr.shard

    shard("model-embed.safetensors", {
        "embed.weight": w(vocab_padded, h, scale=1.0),
        "norm.weight": ones(h),
        "head.weight": w(vocab_padded, h),
        "hc_head_fn": w(hc, hc * h, scale=0.02, dtype=np.float32),
        "hc_head_base": np.zeros(hc, np.float32),
        "hc_head_scale": ones(1),
    })
    r = (2 + hc) * hc
    nh, ql, ihd = sh.num_attention_heads, sh.q_lora_rank, sh.index_head_dim
    for i in range(n):
        p, a = f"layers.{i}.", f"layers.{i}.attn."
        t = {
            p + "attn_norm.weight": ones(h), p + "ffn_norm.weight": ones(h),
            a + "wq_a.weight": w(ql, h), a + "q_norm.weight": ones(ql),
            a + "wq_b.weight": w(nh * d, ql, scale=1.0 / np.sqrt(ql)),
            a + "wkv.weight": w(d, h), a + "norm.weight": ones(d),
            a + "wo_a.weight": w(sh.o_groups * sh.o_lora_rank, nh * d // sh.o_groups,
                                 scale=1.0 / np.sqrt(nh * d // sh.o_groups)),
            a + "wo_b.weight": w(h, sh.o_groups * sh.o_lora_rank,
                                 scale=1.0 / np.sqrt(sh.o_groups * sh.o_lora_rank)),
            a + "attn_sink": np.zeros(nh, np.float32),
            p + "ffn.gate.weight": w(sh.n_routed_experts, h, dtype=np.float32),
        }
        for part in ("attn", "ffn"):
            t[f"{p}hc_{part}_fn"] = w(r, hc * h, scale=0.02, dtype=np.float32)
            t[f"{p}hc_{part}_base"] = np.zeros(r, np.float32)
            t[f"{p}hc_{part}_scale"] = ones(3)
        if kinds[i] != "sliding_attention":
            csa = kinds[i] == "compressed_sparse_attention"
            m, cw = (sh.compress_rate_csa, 2 * d) if csa else (sh.compress_rate_hca, d)
            c = a + "compressor."
            t.update({c + "wkv.weight": w(cw, h), c + "wgate.weight": w(cw, h),
                      c + "ape": np.zeros((m, cw), np.float32), c + "norm.weight": ones(d)})
            if csa:
                x = a + "indexer."
                t.update({
                    x + "compressor.wkv.weight": w(2 * ihd, h),
                    x + "compressor.wgate.weight": w(2 * ihd, h),
                    x + "compressor.ape": np.zeros((m, 2 * ihd), np.float32),
                    x + "compressor.norm.weight": ones(ihd),
                    x + "wq_b.weight": w(sh.index_n_heads * ihd, ql, scale=1.0 / np.sqrt(ql)),
                    x + "weights_proj.weight": w(sh.index_n_heads, h),
                })
        if i < sh.num_hash_layers:
            t[p + "ffn.gate.tid2eid"] = rng.integers(
                0, sh.n_routed_experts, (vocab_padded, sh.num_experts_per_tok), dtype=np.int64)
        else:
            t[p + "ffn.gate.bias"] = np.zeros(sh.n_routed_experts, np.float32)
        mi = sh.moe_intermediate_size
        for e in [*range(sh.n_routed_experts), None]:
            q = f"{p}ffn.experts.{e}." if e is not None else f"{p}ffn.shared_experts."
            t[q + "w1.weight"] = w(mi, h)
            t[q + "w3.weight"] = w(mi, h)
            t[q + "w2.weight"] = w(h, mi, scale=1.0 / np.sqrt(mi))
        shard(f"model-layer-{i:03d}.safetensors", t)
    return wr.finish()
