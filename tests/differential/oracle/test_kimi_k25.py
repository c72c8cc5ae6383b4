"""kimi_k25: the MoonViT tower + projector and the text model vs transformers (no download).

Tiny random `Kimi_K25ForConditionalGeneration` models built from config objects (two
draws: 2 heads of 16 on an 8 x 8 position grid; 4 heads of 8 on a 6 x 6 grid with a
wider text model), converted to f32 containers and opened with the vision option:

- `encode_image` equals transformers' `get_image_features` to max |d| <= 1e-4 on images
  of several sizes: square, non-square and one the processor's patch budget resizes
  (grids smaller and larger than the position grid, so the bicubic resampling of the
  learned positions is exercised both ways);
- a prompt with two images (placeholder runs between the media markers, as the model
  reads them): all-position logits <= 1e-4, evaluated in prefill chunks that split the
  image runs, and token by token through `eval_batch` on a second sequence;
- the container's vision object (the contract's keys, preprocessor_config.json verbatim),
  the plan's tower bytes (counted only with the vision option), the refusals: no tower
  loaded, a grid the tower refuses, damaged tower tensors at convert and at open.

The tower is compared on the pixel_values and grids transformers' own
Kimi_K25ImageProcessor returns with the shipped config (it needs torchvision), and, so
the tower stays checked without torchvision, on tensors made by its steps (resize to the
patch budget, pad to the merge size, rescale, normalize, patchify) with Pillow and numpy.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

VOCAB = 320
IMG, START, END = 300, 302, 303
PREPROCESSOR = {
    "image_processor_type": "Kimi_K25ImageProcessor", "patch_size": 4, "merge_size": 2,
    "max_patches": 64, "size": {"max_height": 16, "max_width": 16},
    "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3],
    "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
}


def _config(draw: str, ids: tuple[int, int, int] = (IMG, START, END)) -> Any:
    """The two draws; `ids`: the image placeholder, start and end marker ids."""
    import transformers as tf

    wide = draw == "wide"
    text = dict(model_type="deepseek_v3", vocab_size=VOCAB, hidden_size=96 if wide else 64,
                intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                v_head_dim=16, n_group=1, topk_group=1, max_position_embeddings=512,
                bos_token_id=1, eos_token_id=2)
    vision = dict(patch_size=4, pos_emb_height=6 if wide else 8, pos_emb_width=6 if wide else 8,
                  pos_emb_time=4, num_attention_heads=4 if wide else 2,
                  num_hidden_layers=3 if wide else 2, hidden_size=32, intermediate_size=48,
                  merge_kernel_size=[2, 2],
                  rope_parameters={"rope_type": "axial", "rope_theta": 100.0 if wide else 10000.0})
    return tf.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                             projection_layer_norm_eps=1e-5, image_token_id=ids[0],
                             video_token_id=301, vision_start_token_id=ids[1],
                             vision_end_token_id=ids[2])


def _build(draw: str, out: Path, ids: tuple[int, int, int] = (IMG, START, END),
           tokenizer: str | None = None) -> Any:
    """Saves a draw (and the byte-level test tokenizer, or `tokenizer` text) under `out`."""
    import torch
    import transformers as tf
    from fake_engine import tokenizer_json

    torch.manual_seed(3 if draw == "wide" else 0)
    model = tf.Kimi_K25ForConditionalGeneration(_config(draw, ids)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            around = 1.0 if "norm" in name and name.endswith("weight") else 0.0
            p.copy_(torch.randn_like(p) * 0.1 + around)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.json").write_text(tokenizer or tokenizer_json())
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return model


def _open(path: Path, **opts: Any) -> Any:
    from warp_providers._engine import Context

    return Context(str(path), {"vision": True, "n_threads": 2, **opts})


@pytest.fixture(scope="module")
def k25(oracle_env, tmp_path_factory):
    """draw -> (torch model, HF dir, f32 container)."""
    out = {}
    for draw in ("base", "wide"):
        d = tmp_path_factory.mktemp(f"k25_{draw}")
        model = _build(draw, d / "hf")
        out[draw] = (model, d / "hf", oracle_env.convert_to(
            d / "hf", d / "f32", trunk="f32", experts="f32", embedding="f32", output="f32"))
    return out


def _navit(h: int, w: int, p: int, m: int, budget: int, side: int) -> tuple[int, int, int, int]:
    """Kimi_K25ImageProcessor's resize (never up) and padded size, in pixels."""
    scale = min(1.0, math.sqrt(budget / (max(1, h // p) * max(1, w // p))),
                side * p / h, side * p / w)
    nh = min(max(1, int(h * scale)), side * p)
    nw = min(max(1, int(w * scale)), side * p)
    f = m * p
    return nh, nw, nh + (f - nh % f) % f, nw + (f - nw % f) % f


def pixel_values(img: Any, pp: dict[str, Any]) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image's pixel_values [n_patches, 3 * p * p] and grid (1, gh, gw)."""
    from PIL import Image

    p, m = pp["patch_size"], pp["merge_size"]
    w, h = img.size
    nh, nw, ph, pw = _navit(h, w, p, m, pp["max_patches"], pp["size"]["max_height"])
    if (nh, nw) != (h, w):
        img = img.resize((nw, nh), Image.BICUBIC)
    a = np.zeros((ph, pw, 3), np.float32)
    a[:nh, :nw] = np.asarray(img.convert("RGB"), np.float32)
    a = (a * pp["rescale_factor"] - np.array(pp["image_mean"], np.float32)) / np.array(
        pp["image_std"], np.float32)
    gh, gw = ph // p, pw // p
    patches = a.transpose(2, 0, 1).reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(patches.reshape(gh * gw, 3 * p * p)), (1, gh, gw)


def processed(img: Any) -> tuple[np.ndarray, tuple[int, int, int]]:
    """transformers' Kimi_K25ImageProcessor on one image, with the shipped config:
    pixel_values flattened to [n_patches, 3 * p * p] (the rows the tower takes), grid."""
    from support import import_torchvision

    import_torchvision()
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    proc = Kimi_K25ImageProcessor(
        **{k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"})
    out = proc(images=[img], return_tensors="pt")
    pv = out["pixel_values"].numpy()
    assert pv.ndim == 4 and pv.shape[1:] == (3, PREPROCESSOR["patch_size"],
                                             PREPROCESSOR["patch_size"])
    t, h, w = (int(x) for x in out["image_grid_thw"][0].tolist())
    return np.ascontiguousarray(pv.reshape(len(pv), -1), dtype=np.float32), (t, h, w)


def _pixels(source: str, img: Any) -> tuple[np.ndarray, tuple[int, int, int]]:
    return processed(img) if source == "processor" else pixel_values(img, PREPROCESSOR)


def _image(h: int, w: int, seed: int) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _reference(model: Any, pv: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
    import torch

    p = model.config.vision_config.patch_size
    with torch.no_grad():
        out = model.model.get_image_features(
            torch.from_numpy(pv).reshape(-1, 3, p, p), torch.tensor([grid]))
    return out.pooler_output[0].numpy()


# (height, width): square, non-square, resized by the budget, tall and thin, one merge block
SIZES = [(32, 32), (20, 44), (100, 60), (64, 8), (8, 8)]


@pytest.mark.oracle
@pytest.mark.parametrize("source", ["processor", "steps"])
@pytest.mark.parametrize("draw", ["base", "wide"])
def test_tower_matches_transformers(k25, draw, source):
    model, _, path = k25[draw]
    ctx = _open(path)
    grids = set()
    for i, (h, w) in enumerate(SIZES):
        pv, grid = _pixels(source, _image(h, w, i))
        grids.add(grid)
        ref = _reference(model, pv, grid)
        got = ctx.encode_image(pv, grid)
        assert got.shape == ref.shape == (grid[1] * grid[2] // 4, model.config.text_config.hidden_size)
        err = float(np.abs(got - ref).max())
        assert err <= 1e-4, f"{draw} {h}x{w} grid {grid}: max |d| {err:.3g}"
        assert float(np.abs(ref).max()) > 0.1  # not a vacuous comparison
    # the resized one fits the budget; grids below and above the position grid
    assert (1, 8, 4) in grids or any(g[1] * g[2] <= 64 and g != (1, 8, 8) for g in grids)
    side = model.config.vision_config.pos_emb_height
    assert any(g[1] > side for g in grids) and any(g[2] < side for g in grids)
    ctx.close()


def _prompt(n1: int, n2: int) -> list[int]:
    return [5, 6, START, *[IMG] * n1, END, 7, 8, 9, START, *[IMG] * n2, END, 10, 11]


@pytest.mark.oracle
@pytest.mark.parametrize("draw", ["base", "wide"])
def test_two_images_logits_match(k25, draw):
    """Two images in one prompt: the engine's rows at the placeholders give transformers'
    logits, in chunks of 5 (splitting the image runs) and token by token."""
    import torch
    from oracle_util import assert_image_prompt_matches

    model, _, path = k25[draw]
    imgs = [processed(_image(28, 44, 10)), processed(_image(8, 16, 11))]
    ctx = _open(path, prefill_chunk=5, max_sequences=2)
    rows = [ctx.encode_image(pv, g) for pv, g in imgs]
    ids = _prompt(len(rows[0]), len(rows[1]))
    p = model.config.vision_config.patch_size
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]),
                    pixel_values=torch.cat([torch.from_numpy(pv).reshape(-1, 3, p, p)
                                            for pv, _ in imgs]),
                    image_grid_thw=torch.tensor([g for _, g in imgs])).logits[0].numpy()
    assert_image_prompt_matches(ctx, rows, ids, ref, VOCAB, f"{draw}: ")
    # the image rows matter: the text embedding at the placeholders gives other logits
    ctx.reset()
    plain = model.model.language_model
    with torch.no_grad():
        text_only = model.lm_head(plain(input_ids=torch.tensor([ids])).last_hidden_state)[0]
    assert float(np.abs(text_only.numpy() - ref).max()) > 1e-2
    ctx.close()


@pytest.mark.oracle
def test_vision_object_plan_and_refusals(k25):
    from warp_providers import errors
    from warp_providers._engine import Context, plan_memory

    model, _, path = k25["base"]
    man = json.loads((path / "manifest.json").read_text())
    v = man["vision"]
    assert v["preprocessor"] == PREPROCESSOR  # as shipped
    assert (v["arch"], v["patch_size"], v["merge_size"], v["temporal_patch_size"],
            v["hidden_size"], v["placeholder_token_id"], v["image_start_token_id"],
            v["image_end_token_id"]) == ("kimi_k25", 4, 2, 1, 64, IMG, START, END)
    tower = sum(t["bytes"] for t in man["trunk"]["tensors"] if t["name"].startswith("v."))
    assert tower > 0
    with_v = plan_memory(str(path), {"vision": True})
    without = plan_memory(str(path), {})
    assert with_v["vision_weight_bytes"] == without["vision_weight_bytes"] == tower
    assert with_v["vision_reserve_bytes"] > 0 and without["vision_bytes"] == 0
    assert with_v["vision_bytes"] == tower + with_v["vision_reserve_bytes"]
    assert with_v["floor_bytes"] - without["floor_bytes"] == with_v["vision_bytes"]
    assert with_v["trunk_bytes"] == man["trunk"]["bytes"] - tower - _padding(man)

    ctx = _open(path)
    info = ctx.vision_info()
    assert set(info) >= {"arch", "preprocessor", "patch_size", "merge_size",
                         "temporal_patch_size", "hidden_size", "placeholder_token_id",
                         "image_start_token_id", "image_end_token_id", "tower_bytes",
                         "reserve_bytes"}
    assert info["tower_bytes"] == tower and ctx.placeholder_token_id == IMG
    pv, grid = pixel_values(_image(16, 16, 0), PREPROCESSOR)
    with pytest.raises(ValueError, match="merge size"):
        ctx.encode_image(pv[:12], (1, 3, 4))
    with pytest.raises(ValueError, match="wide"):
        ctx.encode_image(np.ascontiguousarray(pv[:, :-1]), grid)
    with pytest.raises(ValueError, match="limit"):
        big = np.zeros((400, pv.shape[1]), np.float32)
        ctx.encode_image(big, (1, 20, 20))
    with pytest.raises(ValueError, match="placeholder"):
        ctx.eval(np.array([5, IMG], np.int32), np.zeros(VOCAB, np.float32), False)
    assert ctx.position == 0
    ctx.close()
    plain = Context(str(path), {"n_threads": 1})
    with pytest.raises(errors.UnsupportedModelError, match="vision option"):
        plain.encode_image(pv, grid)
    plain.close()


def _padding(man: dict[str, Any]) -> int:
    """trunk.bin bytes between tensors (64-byte alignment)."""
    return man["trunk"]["bytes"] - sum(t["bytes"] for t in man["trunk"]["tensors"])


@pytest.mark.oracle
def test_damaged_tower_refused(k25, tmp_path, oracle_env):
    from safetensors.numpy import load_file, save_file

    from warp_providers import errors
    from warp_providers.convert.quant import ConvertError

    _, hf, path = k25["base"]
    # at convert: a missing and a misshapen tower tensor, named
    for case, edit in (("missing", lambda t: t.pop("vision_tower.encoder.blocks.1.wo.weight")),
                       ("shape", lambda t: t.update({"mm_projector.proj.0.bias":
                                                     np.zeros(7, np.float32)}))):
        src = tmp_path / f"hf_{case}"
        shutil.copytree(hf, src)
        (st,) = src.glob("*.safetensors")
        tensors = load_file(st)
        edit(tensors)
        save_file(tensors, st)
        name = ("vision_tower.encoder.blocks.1.wo.weight" if case == "missing"
                else "mm_projector.proj.0.bias")
        with pytest.raises(ConvertError, match=name.replace(".", r"\.")):
            oracle_env.convert_to(src, tmp_path / f"out_{case}", trunk="f32")
    # at open: a tower tensor missing from the manifest, or of another shape
    for case in ("missing", "shape"):
        target = "v.blk.0.attn_qkv.weight"
        bad = oracle_env.damaged_copy(path, tmp_path / f"c_{case}", target, case)
        with pytest.raises(errors.ModelFormatError, match=target.replace(".", r"\.")):
            _open(bad)
