"""Generated random-weight checkpoints: Qwen3-MoE-shaped HF directories of any size.

Owns: writing config.json, a tokenizer and safetensors shards layer by layer (memory
bounded by one layer), deterministic from a seed. Used by the demo, the benchmarks and the
streaming tests to get a model larger than a budget without downloading anything.
Refuses nothing: the weights are random, so the text is not meaningful — only speed,
memory and exactness are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["MoeShape", "make_moe_checkpoint"]


@dataclass(frozen=True)
class MoeShape:
    """The shape of a generated Qwen3-MoE checkpoint."""

    hidden_size: int = 1024
    num_hidden_layers: int = 16
    num_experts: int = 64
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 512
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 128

    def expert_params(self) -> int:
        """Parameters of all routed experts."""
        return 3 * self.hidden_size * self.moe_intermediate_size * self.num_experts * \
            self.num_hidden_layers


def _byte_tokenizer_json() -> tuple[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    hf = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return hf.to_str(), hf.get_vocab_size()


_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_moe_checkpoint(out: str | Path, shape: MoeShape | None = None, seed: int = 0) -> Path:
    """Writes a random Qwen3-MoE checkpoint (float16 safetensors, one shard per layer).

    Args:
        out: the directory to create.
        shape: sizes (default ~1.6 G parameters, 3.2 GB of float16).
        seed: the RNG seed; the same seed gives the same bytes.

    Returns:
        The directory, ready for `warp convert`.
    """
    from safetensors.numpy import save_file

    shape = shape or MoeShape()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok_json, vocab = _byte_tokenizer_json()
    vocab_padded = (vocab + 31) // 32 * 32
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        **asdict(shape), "vocab_size": vocab_padded, "intermediate_size": 4 * shape.hidden_size,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "norm_topk_prob": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "bos_token_id": None, "eos_token_id": vocab - 1, "torch_dtype": "float16",
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": _CHATML, "eos_token": "<|im_end|>"}))
    rng = np.random.default_rng(seed)
    h, d = shape.hidden_size, shape.head_dim
    std = 1.0 / np.sqrt(h)

    def w(*dims: int, scale: float = std) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * scale).astype(np.float16)

    weight_map: dict[str, str] = {}

    def shard(name: str, tensors: dict[str, np.ndarray]) -> None:
        save_file(tensors, str(out / name))
        weight_map.update({k: name for k in tensors})

    shard("model-embed.safetensors", {
        "model.embed_tokens.weight": w(vocab_padded, h, scale=1.0),
        "model.norm.weight": np.ones(h, np.float16),
        "lm_head.weight": w(vocab_padded, h),
    })
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        t = {
            p + "input_layernorm.weight": np.ones(h, np.float16),
            p + "post_attention_layernorm.weight": np.ones(h, np.float16),
            p + "self_attn.q_proj.weight": w(shape.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": w(shape.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": w(shape.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": w(h, shape.num_attention_heads * d),
            p + "self_attn.q_norm.weight": np.ones(d, np.float16),
            p + "self_attn.k_norm.weight": np.ones(d, np.float16),
            p + "mlp.gate.weight": w(shape.num_experts, h, scale=1.0),
        }
        for e in range(shape.num_experts):
            q = f"{p}mlp.experts.{e}."
            t[q + "gate_proj.weight"] = w(shape.moe_intermediate_size, h)
            t[q + "up_proj.weight"] = w(shape.moe_intermediate_size, h)
            t[q + "down_proj.weight"] = w(h, shape.moe_intermediate_size,
                                          scale=1.0 / np.sqrt(shape.moe_intermediate_size))
        shard(f"model-layer-{i:03d}.safetensors", t)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return out
