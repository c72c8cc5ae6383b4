"""Tiny generated containers for engine tests (no torch): a random Qwen3-MoE, converted."""

from __future__ import annotations

from pathlib import Path

from support import tiny_glm5_next_shape
from warp_providers.synth import MoeShape

TINY = MoeShape(hidden_size=64, num_hidden_layers=3, num_experts=16, num_experts_per_tok=4,
                moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16)


def tiny_moe(root: Path, *, shape: MoeShape = TINY, experts: str = "q8_0",
             trunk: str = "q8_0", seed: int = 0) -> Path:
    """Generates and converts a random MoE under root; returns the container path."""
    from warp_providers.convert import convert
    from warp_providers.synth import make_moe_checkpoint

    src = make_moe_checkpoint(root / f"hf-{seed}", shape, seed=seed)
    return convert(src, root / f"moe-{seed}-{experts}.warp", experts=experts, trunk=trunk)


def tiny_deepseek_v4(root: Path, *, experts: str, trunk: str = "f32") -> Path:
    """A converted two-layer DeepSeek-V4 (a hash-routed first layer, every attention kind)."""
    from warp_providers.convert import convert
    from warp_providers.synth import DeepseekV4Shape, make_deepseek_v4_checkpoint

    shape = DeepseekV4Shape(
        hidden_size=32, num_hidden_layers=2, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, num_attention_heads=2, head_dim=32, q_lora_rank=16,
        qk_rope_head_dim=8, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=16,
        index_topk=2, compress_rate_csa=4, compress_rate_hca=8, sliding_window=8,
        hc_mult=2, num_hash_layers=1)
    src = make_deepseek_v4_checkpoint(root / "hf", shape, seed=5)
    return convert(src, root / "v4.warp", experts=experts, trunk=trunk)


def tiny_glm5_next(root: Path, *, experts: str, trunk: str = "f32") -> Path:
    """A converted five-layer GLM-5.3-Flash: KDA, MLA with its own DSA indexer and with the
    previous layer's selection, a dense first layer, hyper-connections."""
    from warp_providers.convert import convert
    from warp_providers.synth import make_glm5_next_checkpoint

    shape = tiny_glm5_next_shape()
    src = make_glm5_next_checkpoint(root / "hf", shape, seed=1)
    return convert(src, root / "glm5.warp", experts=experts, trunk=trunk)


def tiny_kimi_k3(root: Path, *, experts: str, trunk: str = "f32") -> Path:
    """A converted five-layer Kimi K3: KDA and MLA layers, a dense first layer, latent MoE,
    Attention Residuals over three blocks of two layers."""
    from warp_providers.convert import convert
    from warp_providers.synth import KimiK3Shape, make_kimi_k3_checkpoint

    shape = KimiK3Shape(num_hidden_layers=5, layer_pattern="KKM", num_experts=8,
                        num_experts_per_token=2, attn_res_block_size=2)
    src = make_kimi_k3_checkpoint(root / "hf", shape, seed=3)
    return convert(src, root / "k3.warp", experts=experts, trunk=trunk)
