"""glm5_next's image tower and merger vs transformers (tiny random models, no download).

A tiny `Glm5NextForConditionalGeneration` (every text layer kind of test_glm5_next.py, a
two-layer tower with biases, q/k norms and a SwiGLU clamp that binds) with a
`preprocessor_config.json` from transformers' own `Glm5NextImageProcessorPil`, converted
to an f32 container and opened with the vision option:

- `encode_image` on the processor's pixel_values equals `get_image_features` to max
  |d| <= 1e-4 on images of several sizes: square, non-square, and ones the processor's
  token budget shrinks or grows;
- a prompt with two images: all-position logits <= 1e-4, in prefill chunks that split
  the image runs and token by token on a second sequence;
- the vision object (the shipped preprocessor config, the marker ids), tower bytes in
  the plan only with the vision option, damaged tower tensors refused at convert and at
  open, and a checkpoint without a preprocessor config converting text-only as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

VOCAB = 272
IMG, START, END = 266, 267, 268
PROCESSOR = dict(min_image_tokens=4, max_image_tokens=24)


def _build(out: Path, ids: tuple[int, int, int] = (IMG, START, END),
           tokenizer: str | None = None) -> Any:
    """Saves the model (and the byte-level test tokenizer, or `tokenizer` text) under `out`;
    `ids`: the image placeholder, start and end marker ids."""
    import torch
    import transformers as tf
    from fake_engine import tokenizer_json
    from test_glm5_next import _VISION, _text_config

    cfg = tf.Glm5NextConfig(text_config=_text_config(),
                            vision_config=dict(_VISION, depth=2, swiglu_limit=1.5),
                            image_token_id=ids[0], image_start_token_id=ids[1],
                            image_end_token_id=ids[2])
    torch.manual_seed(1)
    model = tf.Glm5NextForConditionalGeneration(cfg).to(torch.float32)
    with torch.no_grad():  # as test_glm5_next.py draws, the tower's matrices wider
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("_hc.scale"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_((0.2 if "visual" in name else 0.1) * torch.randn_like(p))
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.5 * torch.randn_like(buf))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(tokenizer or tokenizer_json())
    _processor().save_pretrained(out)
    return model


def _processor() -> Any:
    from transformers.models.glm5_next.image_processing_pil_glm5_next import (
        Glm5NextImageProcessorPil,
    )

    return Glm5NextImageProcessorPil(**PROCESSOR)


@pytest.fixture(scope="module")
def glm(oracle_env, tmp_path_factory):
    """(torch model, HF dir, f32 container)."""
    d = tmp_path_factory.mktemp("glm5v")
    model = _build(d / "hf")
    return model, d / "hf", oracle_env.convert_to(
        d / "hf", d / "f32", trunk="f32", experts="f32", embedding="f32", output="f32")


def _open(path: Path, **opts: Any) -> Any:
    from warp_providers._engine import Context

    return Context(str(path), {"vision": True, "n_threads": 2, **opts})


def _pixels(h: int, w: int, seed: int) -> tuple[np.ndarray, tuple[int, int, int], Any]:
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))
    out = _processor()(images=[img], return_tensors="pt")
    pv = out["pixel_values"]
    return np.ascontiguousarray(pv.numpy(), dtype=np.float32), tuple(out["image_grid_thw"][0].tolist()), pv


# square, non-square, shrunk by the token budget, grown to the minimum, thin
SIZES = [(56, 56), (40, 90), (300, 200), (20, 20), (28, 140)]


@pytest.mark.oracle
def test_tower_matches_transformers(glm):
    import torch

    model, _, path = glm
    ctx = _open(path)
    grids = []
    for i, (h, w) in enumerate(SIZES):
        pv, grid, t = _pixels(h, w, i)
        grids.append(grid)
        with torch.no_grad():
            ref = model.model.get_image_features(t, torch.tensor([grid])).pooler_output[0].numpy()
        got = ctx.encode_image(pv, grid)
        assert got.shape == ref.shape == (grid[1] * grid[2] // 4, 64)
        err = float(np.abs(got - ref).max())
        assert err <= 1e-4, f"{h}x{w} grid {grid}: max |d| {err:.3g}"
        assert float(np.abs(ref).max()) > 0.1
    assert len(set(grids)) >= 4 and any(g[1] != g[2] for g in grids)
    assert grids[2][1] * grids[2][2] < (300 // 14) * (200 // 14)  # resized down
    ctx.close()


@pytest.mark.oracle
def test_two_images_logits_match(glm):
    import torch
    from oracle_util import assert_image_prompt_matches

    model, _, path = glm
    imgs = [_pixels(56, 84, 10), _pixels(30, 30, 11)]
    ctx = _open(path, prefill_chunk=5, max_sequences=2)
    rows = [ctx.encode_image(pv, g) for pv, g, _ in imgs]
    ids = [5, 6, START, *[IMG] * len(rows[0]), END, 7, 8, START, *[IMG] * len(rows[1]), END, 9]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), pixel_values=torch.cat([t for _, _, t in imgs]),
                    image_grid_thw=torch.tensor([g for _, g, _ in imgs])).logits[0].numpy()
    assert_image_prompt_matches(ctx, rows, ids, ref, VOCAB)
    ctx.close()


@pytest.mark.oracle
def test_vision_object_and_plan(glm):
    from warp_providers import errors
    from warp_providers._engine import Context, plan_memory

    _, hf, path = glm
    man = json.loads((path / "manifest.json").read_text())
    v = man["vision"]
    assert v["preprocessor"] == json.loads((hf / "preprocessor_config.json").read_text())
    assert (v["arch"], v["patch_size"], v["merge_size"], v["temporal_patch_size"],
            v["placeholder_token_id"], v["image_start_token_id"],
            v["image_end_token_id"]) == ("glm5_next", 14, 2, 2, IMG, START, END)
    assert v["hparams"]["max_patches"] == 24 * 4 and v["hparams"]["glu_limit"] == 1.5
    tower = sum(t["bytes"] for t in man["trunk"]["tensors"] if t["name"].startswith("v."))
    on, off = plan_memory(str(path), {"vision": True}), plan_memory(str(path), {})
    assert on["vision_weight_bytes"] == tower and off["vision_bytes"] == 0
    assert on["floor_bytes"] - off["floor_bytes"] == tower + on["vision_reserve_bytes"]
    ctx = _open(path)
    assert ctx.vision_info()["tower_bytes"] == tower
    pv, grid, _ = _pixels(56, 56, 0)
    with pytest.raises(ValueError, match="grid t"):
        ctx.encode_image(np.concatenate([pv, pv]), (2, grid[1], grid[2]))
    ctx.close()
    plain = Context(str(path), {"n_threads": 1})
    with pytest.raises(errors.UnsupportedModelError):
        plain.encode_image(pv, grid)
    plain.close()


@pytest.mark.oracle
def test_damaged_tower_and_text_only(glm, tmp_path, oracle_env):
    from safetensors.numpy import load_file, save_file

    from warp_providers import errors
    from warp_providers.convert.quant import ConvertError

    _, hf, path = glm
    for case, name in (("missing", "model.visual.blocks.1.attn.q_norm.weight"),
                       ("shape", "model.visual.merger.up_proj.weight")):
        src = tmp_path / f"hf_{case}"
        shutil.copytree(hf, src)
        (st,) = src.glob("*.safetensors")
        tensors = load_file(st)
        if case == "missing":
            tensors.pop(name)
        else:
            tensors[name] = np.zeros((3, 64), np.float32)
        save_file(tensors, st)
        with pytest.raises(ConvertError, match=name.replace(".", r"\.")):
            oracle_env.convert_to(src, tmp_path / f"out_{case}", trunk="f32")
    bad = tmp_path / "c_missing"
    shutil.copytree(path, bad)
    man = json.loads((bad / "manifest.json").read_text())
    man["trunk"]["tensors"] = [t for t in man["trunk"]["tensors"]
                               if t["name"] != "v.mm_ffn_down.weight"]
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(errors.ModelFormatError, match=r"v\.mm_ffn_down\.weight"):
        _open(bad)
    # no preprocessor config: the tower is skipped, the container text-only
    src = tmp_path / "hf_text"
    shutil.copytree(hf, src)
    (src / "preprocessor_config.json").unlink()
    out = oracle_env.convert_to(src, tmp_path / "text", trunk="f32")
    man = json.loads((out / "manifest.json").read_text())
    assert "vision" not in man and not any(t["name"].startswith("v.")
                                           for t in man["trunk"]["tensors"])
    with pytest.raises(errors.UnsupportedModelError, match="no image tower"):
        _open(out)
