"""Generated random-weight checkpoints of any size, one module per architecture.

Owns: writing config.json, a tokenizer and float16 safetensors shards layer by layer
(memory bounded by one layer), deterministic from a seed; for Qwen3-MoE also a
container written straight (`make_moe_container`, `python -m warp_providers.synth`: no
checkpoint on disk, memory bounded by one expert). Used by the demo, the
benchmarks and the tests to get a model larger than a budget without downloading
anything. The weights are random, so the text is not meaningful — only speed, memory
and exactness are.
"""

from warp_providers.synth.deepseek_v3 import DeepseekV3Shape, make_deepseek_v3_checkpoint
from warp_providers.synth.deepseek_v4 import DeepseekV4Shape, make_deepseek_v4_checkpoint
from warp_providers.synth.glm5_next import Glm5NextShape, make_glm5_next_checkpoint
from warp_providers.synth.kimi_k3 import KimiK3Shape, KimiK3VisionShape, make_kimi_k3_checkpoint
from warp_providers.synth.qwen3_moe import MoeShape, make_moe_checkpoint, make_moe_container

__all__ = [
    "DeepseekV3Shape",
    "DeepseekV4Shape",
    "Glm5NextShape",
    "KimiK3Shape",
    "MoeShape",
    "make_deepseek_v3_checkpoint",
    "make_deepseek_v4_checkpoint",
    "make_glm5_next_checkpoint",
    "make_kimi_k3_checkpoint",
    "KimiK3VisionShape",
    "make_moe_checkpoint",
    "make_moe_container",
]
