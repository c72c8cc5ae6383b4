"""Random DeepSeek-V3 checkpoints (MLA, grouped sigmoid routing) for the benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from warp_providers.synth._common import Writer, tokenizer_files


@dataclass(frozen=True)
class DeepseekV3Shape:
    """The shape of a generated DeepSeek-V3 checkpoint (MLA, grouped sigmoid routing)."""

    hidden_size: int = 2048
    num_hidden_layers: int = 12
    first_k_dense_replace: int = 1
    intermediate_size: int = 5632
    n_routed_experts: int = 64
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    n_shared_experts: int = 1
    moe_intermediate_size: int = 1024
    num_attention_heads: int = 16
    q_lora_rank: int = 512
    kv_lora_rank: int = 256
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64

    def expert_params(self) -> int:
        """Parameters of all routed experts."""
        moe_layers = self.num_hidden_layers - self.first_k_dense_replace
        return 3 * self.hidden_size * self.moe_intermediate_size * self.n_routed_experts * \
            moe_layers


def make_deepseek_v3_checkpoint(out: str | Path, shape: DeepseekV3Shape | None = None,
                                seed: int = 0, tokenizer: str | Path | None = None,
                                prefix: str = "") -> Path:
    """Write a random DeepSeek-V3 checkpoint (float16 safetensors, one shard per layer).

    The config names `scoring_func` "sigmoid" and `topk_method` "noaux_tc" explicitly
    (llama.cpp's converter otherwise falls back to softmax routing) and carries a random
    `e_score_correction_bias`, so grouped selection differs from plain top-k.

    Args:
        out: the directory to create.
        shape: sizes (default ~4.7 G parameters, 9.4 GB of float16).
        seed: the RNG seed; the same seed gives the same bytes.
        tokenizer: as for `make_moe_checkpoint` (a directory with tokenizer.json).
        prefix: put before every tensor name (``language_model.`` for the text model of a
            Kimi K2.5 checkpoint, whose config then nests this one as ``text_config``).

    Returns:
        The directory, ready for `warp convert`.

    """
    shape = shape or DeepseekV3Shape()
    tok_json, tok_cfg, vocab = tokenizer_files(tokenizer)
    vocab_padded = (vocab + 31) // 32 * 32
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        **asdict(shape), "num_key_value_heads": shape.num_attention_heads,
        "vocab_size": vocab_padded, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "moe_layer_freq": 1, "rope_theta": 10000.0,
        "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": vocab - 1, "torch_dtype": "float16",
    }
    wr = Writer(Path(out), cfg, tok_json, tok_cfg, seed, prefix=prefix)
    w = wr.w
    h, nh = shape.hidden_size, shape.num_attention_heads
    qk = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    std = 1.0 / np.sqrt(h)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float16)

    def mlp(p: str, inter: int) -> dict[str, np.ndarray]:
        return {p + "gate_proj.weight": w(inter, h, scale=std),
                p + "up_proj.weight": w(inter, h, scale=std),
                p + "down_proj.weight": w(h, inter, scale=1.0 / np.sqrt(inter))}

    wr.shard("model-embed.safetensors", {
        "model.embed_tokens.weight": w(vocab_padded, h, scale=1.0),
        "model.norm.weight": ones(h),
        "lm_head.weight": w(vocab_padded, h, scale=std),
    })
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t = {
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            a + "q_a_proj.weight": w(shape.q_lora_rank, h, scale=std),
            a + "q_a_layernorm.weight": ones(shape.q_lora_rank),
            a + "q_b_proj.weight": w(nh * qk, shape.q_lora_rank,
                                     scale=1.0 / np.sqrt(shape.q_lora_rank)),
            a + "kv_a_proj_with_mqa.weight": w(shape.kv_lora_rank + shape.qk_rope_head_dim, h,
                                               scale=std),
            a + "kv_a_layernorm.weight": ones(shape.kv_lora_rank),
            a + "kv_b_proj.weight": w(nh * (shape.qk_nope_head_dim + shape.v_head_dim),
                                      shape.kv_lora_rank, scale=1.0 / np.sqrt(shape.kv_lora_rank)),
            a + "o_proj.weight": w(h, nh * shape.v_head_dim,
                                   scale=1.0 / np.sqrt(nh * shape.v_head_dim)),
        }
        if i < shape.first_k_dense_replace:
            t.update(mlp(p + "mlp.", shape.intermediate_size))
        else:
            # router logits ~ N(0, 1): sigmoid scores spread over (0, 1); a larger scale
            # saturates them at 1.0 and the bias alone would pick the same experts always
            t[p + "mlp.gate.weight"] = w(shape.n_routed_experts, h, scale=std)
            t[p + "mlp.gate.e_score_correction_bias"] = (
                wr.rng.standard_normal(shape.n_routed_experts, dtype=np.float32) * 0.1)
            t.update(mlp(p + "mlp.shared_experts.",
                         shape.moe_intermediate_size * shape.n_shared_experts))
            for e in range(shape.n_routed_experts):
                t.update(mlp(f"{p}mlp.experts.{e}.", shape.moe_intermediate_size))
        wr.shard(f"model-layer-{i:03d}.safetensors", t)
    return wr.finish()
