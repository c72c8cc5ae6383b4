"""The image tower's cost against its patch count: `Context.encode_image` at 256 and 1024 patches.

On a random MoonViT-sized kimi_k25 tower (hidden 1152, 16 heads, MLP 4304, patch 14;
`--layers` encoder layers; a tiny text model) converted at f32, it times the tower plus
projector on 16 x 16 and 32 x 32 patch grids (best of `--repeat` after one warm-up) and
prints both and their ratio. Per layer the linear parts cost 4x from 256 to 1024 patches
and the attention 16x, a small share of the flops at these sizes: the ratio is expected
near 5; far above that, the attention is bound by memory, not by its arithmetic.

    python benchmarks/vision.py --dir tower-bench [--layers 2] [--threads 2] [--json out.json]

`--prefill` measures instead what an image costs the text model: on a generated
kimi_k25-shaped model of a few GB (the generator's DeepSeek-V3 text model under
`language_model.`, `--text-hidden`/`--text-layers`/`--experts`/`--moe-inter`, Q8_0
experts, with the MoonViT-width tower of `--layers` layers), per image of 256 and 1024
patches (64 and 256 positions after the 2x2 merge): the tower's time, then the prefill
of its positions (the tower's rows queued, one placeholder id per row) against the
prefill of as many text tokens after the same 8-token start, interleaved, best of
`--repeat`, with every expert cached (one warm-up pass of each first): ms per image
position, ms per text position and their ratio.

    python benchmarks/vision.py --dir tower-bench --prefill [--layers 2] [--threads 2]

The checkpoint and container are built under --dir once and reused. Needs torch and
transformers (to draw the tower). Figures: docs/BENCHMARKS.md, "The image tower".
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
    from support import load_torchvision

    load_torchvision()  # transformers imports it for the image models when installed
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


def _tiny_k25(text: dict, layers: int, media: list[int]):  # noqa: ANN202
    """A transformers Kimi K2.5 with a MoonViT-width tower and a 1-layer text model of
    `text`'s hidden size: its tower and projector are the benchmark's."""
    import torch
    import transformers as tf

    sys.path.insert(0, str(HERE.parent / "tests"))
    from support import load_torchvision

    load_torchvision()
    small = dict(model_type="deepseek_v3", vocab_size=text["vocab_size"],
                 hidden_size=text["hidden_size"], intermediate_size=64,
                 moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                 n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32,
                 kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                 n_group=1, topk_group=1, max_position_embeddings=512)
    vision = dict(patch_size=14, pos_emb_height=64, pos_emb_width=64, pos_emb_time=4,
                  num_attention_heads=16, num_hidden_layers=layers, hidden_size=1152,
                  intermediate_size=4304, merge_kernel_size=[2, 2],
                  rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    cfg = tf.Kimi_K25Config(text_config=small, vision_config=vision,
                            projection_hidden_size=1152, projection_layer_norm_eps=1e-5,
                            image_token_id=media[0], video_token_id=media[1],
                            vision_start_token_id=media[2], vision_end_token_id=media[3])
    torch.manual_seed(0)
    return tf.Kimi_K25ForConditionalGeneration(cfg).eval()


def build_large(root: Path, a: argparse.Namespace) -> Path:
    """The kimi_k25-shaped container of a few GB under root (generated on the first run)."""
    out = root / f"k25-{a.text_hidden}x{a.text_layers}-{a.experts}e-{a.layers}v"
    if (out / "manifest.json").exists():
        return out
    from safetensors.numpy import save_file

    from warp_providers.convert import convert
    from warp_providers.synth import DeepseekV3Shape, make_deepseek_v3_checkpoint

    hf = root / "hf-large"
    shape = DeepseekV3Shape(hidden_size=a.text_hidden, num_hidden_layers=a.text_layers,
                            n_routed_experts=a.experts, moe_intermediate_size=a.moe_inter,
                            intermediate_size=4 * a.text_hidden)
    make_deepseek_v3_checkpoint(hf, shape, prefix="language_model.")
    text = json.loads((hf / "config.json").read_text())
    media = [text["vocab_size"] - k for k in (2, 3, 4, 5)]  # padded rows past the tokenizer
    model = _tiny_k25(text, a.layers, media)
    model.save_pretrained(root / "hf-tower", safe_serialization=True)  # release names
    from safetensors.numpy import load_file

    tower = {}
    for shard in sorted((root / "hf-tower").glob("*.safetensors")):
        tower.update({k: v for k, v in load_file(str(shard)).items()
                      if k.startswith(("vision_tower.", "mm_projector.", "model.mm_projector."))})
    save_file(tower, str(hf / "vision.safetensors"))
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    index["weight_map"].update({k: "vision.safetensors" for k in tower})
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    outer = model.config.to_dict()
    outer["text_config"] = text
    outer["architectures"] = ["Kimi_K25ForConditionalGeneration"]
    (hf / "config.json").write_text(json.dumps(outer))
    (hf / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Kimi_K25ImageProcessor", "patch_size": 14, "merge_size": 2,
        "max_patches": 16384, "size": {"max_height": 512, "max_width": 512},
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return convert(hf, out, experts="q8_0")


def prefill(a: argparse.Namespace) -> dict:
    """Tower time and prefill ms per image vs text position (see the module docstring)."""
    from warp_providers._engine import Context

    path = build_large(Path(a.dir), a)
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    ctx = Context(str(path), {"vision": True, "n_threads": a.threads})
    ph = ctx.placeholder_token_id
    vocab = ctx.info()["vocab_size"]
    rng = np.random.default_rng(1)
    start = rng.integers(0, 256, 8).astype(np.int32)
    logits = np.empty(vocab, np.float32)
    print(f"# container {size / 2**30:.2f} GiB, tower {a.layers} layers, "
          f"{a.threads} threads")
    print(f"{'patches':>7} {'positions':>9} {'tower s':>8} {'ms/img pos':>10} "
          f"{'ms/text pos':>11} {'img/text':>8}")
    rows_out = []
    for side in (16, 32):
        pv = rng.standard_normal((side * side, 3 * 14 * 14)).astype(np.float32)
        t0 = time.perf_counter()
        rows = ctx.encode_image(pv, (1, side, side))
        tower_s = time.perf_counter() - t0
        n = rows.shape[0]
        text_ids = rng.integers(0, 256, n).astype(np.int32)
        img_ids = np.full(n, ph, np.int32)

        def once(image: bool) -> float:
            ctx.reset()
            ctx.eval(start, logits, False)
            if image:
                ctx.push_embeds(rows)
            t = time.perf_counter()
            ctx.eval(img_ids if image else text_ids, logits, False)
            return time.perf_counter() - t

        once(True), once(False)  # warm-up: every expert either routes to is read once
        best = {True: float("inf"), False: float("inf")}
        for _ in range(a.repeat):
            for image in (True, False):
                best[image] = min(best[image], once(image))
        per_img, per_text = 1e3 * best[True] / n, 1e3 * best[False] / n
        print(f"{side * side:>7} {n:>9} {tower_s:>8.3f} {per_img:>10.3f} {per_text:>11.3f} "
              f"{per_img / per_text:>7.2f}x")
        rows_out.append({"patches": side * side, "positions": n, "tower_s": tower_s,
                         "ms_per_image_position": per_img, "ms_per_text_position": per_text})
    ctx.close()
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return {"container_bytes": size, "layers": a.layers, "threads": a.threads,
            "rows": rows_out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="where the checkpoint and container live")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--prefill", action="store_true",
                    help="image vs text positions on a kimi_k25-shaped model of a few GB")
    ap.add_argument("--text-hidden", type=int, default=1536)
    ap.add_argument("--text-layers", type=int, default=10)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--moe-inter", type=int, default=768)
    a = ap.parse_args(argv)
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    if a.prefill:
        figures = prefill(a)
        if a.json:
            Path(a.json).write_text(json.dumps(figures))
        return 0
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
