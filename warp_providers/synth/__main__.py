"""`python -m warp_providers.synth qwen3_moe ... -o DIR`: a random container of a given shape.

Writes the container straight (no checkpoint on disk, memory bounded by one expert), e.g.
the Kimi-Linear-48B-A3B expert shape:

    python -m warp_providers.synth qwen3_moe --layers 27 --experts 256 --top-k 8 \\
        --hidden 2304 --moe-intermediate 1024 --dtype q4_0 -o kimi-shape.warp

`--checkpoint` writes the float16 HF checkpoint instead (for `warp convert` or other tools).

`--random-blocks` (benchmark only, `--dtype q4_0`) writes each expert matrix as random
Q4_0 blocks (random nibbles under one fixed float16 scale) instead of drawing floats and
quantizing them: the container is written at about the disk's speed (minutes for the
27 GB shape above instead of about an hour). Its activations stay finite, and nothing
else about its weights means anything.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from warp_providers.synth.qwen3_moe import MoeShape, make_moe_checkpoint, make_moe_container


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m warp_providers.synth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", choices=["qwen3_moe"])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--moe-intermediate", type=int, default=512)
    p.add_argument("--heads", type=int, default=None, help="default hidden / 128")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="q4_0", help="expert dtype (q4_0, q8_0, f16, bf16, f32)")
    p.add_argument("--trunk", default="q8_0", help="attention dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", action="store_true", help="write the f16 HF checkpoint")
    p.add_argument("--random-blocks", action="store_true",
                   help="benchmark only: experts as random Q4_0 blocks (fast)")
    p.add_argument("-o", "--out", required=True, type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    heads = a.heads or max(1, a.hidden // 128)
    shape = MoeShape(hidden_size=a.hidden, num_hidden_layers=a.layers, num_experts=a.experts,
                     num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_intermediate,
                     num_attention_heads=heads, num_key_value_heads=min(a.kv_heads, heads),
                     head_dim=a.head_dim)
    t0 = time.perf_counter()
    if a.checkpoint:
        out = make_moe_checkpoint(a.out, shape, seed=a.seed)
    else:
        out = make_moe_container(a.out, shape, seed=a.seed, experts=a.dtype, trunk=a.trunk,
                                 random_blocks=a.random_blocks)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    dt = time.perf_counter() - t0
    print(f"{out}: {size / 1e9:.2f} GB in {dt:.1f} s ({size / 1e6 / dt:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
