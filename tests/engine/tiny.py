"""Tiny generated containers for engine tests (no torch): a random Qwen3-MoE, converted."""

from __future__ import annotations

from pathlib import Path

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
