"""The image tower's cost against its patch count: `Context.encode_image` at 256 and 1024 patches.

On a random MoonViT-sized kimi_k25 tower (hidden 1152, 16 heads, MLP 4304, patch 14;
`--layers` encoder layers; a tiny text model) converted at f32, it times the tower plus
projector on 16 x 16 and 32 x 32 patch grids (best of `--repeat` after one warm-up) and
prints both and their ratio. Per layer the linear parts cost 4x from 256 to 1024 patches
and the attention 16x, a small share of the flops at these sizes: the ratio is expected
near 5; far above that, the attention is bound by memory, not by its arithmetic.

    python benchmarks/vision.py --dir tower-bench [--layers 2] [--threads 2] [--json out.json]

The checkpoint and container are built under --dir once and reused. Needs torch and
transformers (to draw the checkpoint). Figures: docs/BENCHMARKS.md, "The image tower".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def build(root: Path, layers: int) -> Path:
    """The f32 container under root (drawn and converted on the first run)."""
    out = root / f"f32-{layers}"
    if (out / "manifest.json").exists():
        return out
    import torch
    import transformers as tf

    sys.path.insert(0, str(HERE.parent / "tests"))
    from fake_engine import tokenizer_json
    from support import import_torchvision

    import_torchvision()  # transformers imports it for the image models when installed
    text = dict(model_type="deepseek_v3", vocab_size=320, hidden_size=64, intermediate_size=96,
                moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_group=1,
                topk_group=1, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    vision = dict(patch_size=14, pos_emb_height=64, pos_emb_width=64, pos_emb_time=4,
                  num_attention_heads=16, num_hidden_layers=layers, hidden_size=1152,
                  intermediate_size=4304, merge_kernel_size=[2, 2],
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    cfg = tf.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=1152,
                            projection_layer_norm_eps=1e-5, image_token_id=300,
                            video_token_id=301, vision_start_token_id=302,
                            vision_end_token_id=303)
    torch.manual_seed(0)
    hf = root / f"hf-{layers}"
    tf.Kimi_K25ForConditionalGeneration(cfg).eval().save_pretrained(hf, safe_serialization=True)
    (hf / "tokenizer.json").write_text(tokenizer_json())
    (hf / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Kimi_K25ImageProcessor", "patch_size": 14, "merge_size": 2,
        "max_patches": 16384, "size": {"max_height": 512, "max_width": 512},
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    from warp_providers.convert import convert

    return convert(hf, out, trunk="f32", experts="f32", embedding="f32", output="f32")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where the checkpoint and container live")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args(argv)
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    from warp_providers._engine import Context

    ctx = Context(str(build(root, a.layers)), {"vision": True, "n_threads": a.threads})
    rng = np.random.default_rng(0)
    seconds = {}
    for side in (16, 32):
        pv = rng.standard_normal((side * side, 3 * 14 * 14)).astype(np.float32)
        ctx.encode_image(pv, (1, side, side))
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            ctx.encode_image(pv, (1, side, side))
            best = min(best, time.perf_counter() - t0)
        seconds[side * side] = best
        print(f"{side * side:>5} patches  {best:8.3f} s")
    ctx.close()
    ratio = seconds[1024] / seconds[256]
    print(f"1024 / 256     {ratio:8.2f}x  (load average {os.getloadavg()[0]:.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"layers": a.layers, "threads": a.threads,
                                            "seconds": seconds, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
