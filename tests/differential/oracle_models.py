"""Tiny randomly initialised HF models, built from config objects (no download).

Each builder returns a transformers model whose weights are drawn by `randomize` (norm
weights perturbed around 1) so routing and norm mistakes show in the logits. `save`
writes it with `save_pretrained` plus the byte-level test tokenizer, ready for
`warp convert`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from fake_engine import CHATML_TEMPLATE, tokenizer_json

VOCAB = 272  # >= the 265 ids of the test tokenizer
STD = 0.1  # weight std: within 0.1-0.2 so routing errors show
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
    tie_word_embeddings=False, initializer_range=STD, bos_token_id=1, eos_token_id=2,
    pad_token_id=0,
)


def _configs() -> dict[str, Any]:
    import transformers as tf

    return {
        "llama": tf.LlamaConfig(**COMMON, intermediate_size=128, head_dim=16),
        "llama_rope3": tf.LlamaConfig(
            **{**COMMON, "tie_word_embeddings": True}, intermediate_size=128, head_dim=16,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64}),
        "qwen3_moe": tf.Qwen3MoeConfig(
            **COMMON, head_dim=16, intermediate_size=128, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0]),
        "qwen2_moe": tf.Qwen2MoeConfig(
            **COMMON, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False),
        "mixtral": tf.MixtralConfig(
            **COMMON, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2),
        "olmoe": tf.OlmoeConfig(
            **COMMON, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False),
    }


ARCHS = ["llama", "llama_rope3", "qwen3_moe", "qwen2_moe", "mixtral", "olmoe"]


def randomize(model: torch.nn.Module, *, std: float = STD, bias_std: float = 0.1,
              routing_bias_std: float = 0.1) -> torch.nn.Module:
    """Redraws every weight (the torch seed is set by the caller); returns model in eval.

    Norm weights are perturbed around 1, biases and sinks drawn with ``bias_std``, matrices
    with ``std``; ``e_score_correction_bias`` buffers (selection-only routing bias) with
    ``routing_bias_std``.
    """
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "layernorm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(bias_std * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(routing_bias_std * torch.randn_like(b))
    return model.eval()


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The tiny model of an architecture, in eval mode, float32."""
    import transformers as tf

    cfg = _configs()[name]
    torch.manual_seed(seed)
    return randomize(tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32))


def save(model: torch.nn.Module, out: Path) -> Path:
    """save_pretrained plus the test tokenizer; returns out."""
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(tokenizer_json())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>",
    }))
    return out


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """All-position float32 logits [len(ids), vocab]."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()
