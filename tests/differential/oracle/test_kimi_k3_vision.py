"""kimi_k3 images: the K3 tower + projector and the text model with images vs a PyTorch
reference, on a tiny random checkpoint in the released layout (warp_providers.synth,
``vision=KimiK3VisionShape()``: 2 heads of 24 over a 32-wide tower, so the attention is
wider than the tower as in K3; an 8 x 8 position grid; patch 14).

The reference tower (`K3Tower`, below) takes transformers' kimi_k25 vision pieces where
the two towers agree (its axial 2D rotary table and rotation, the attention, the GELU-tanh
MLP) and writes out what K3 does differently: RMSNorm without an eps (nn.RMSNorm(dim):
float32's eps) in place of LayerNorm, the position grid resized with
F.interpolate(mode="bilinear", align_corners=False) in place of bicubic, no biases, the
checkpoint's interleaved q/k pairs (permuted here to the rotate-half layout transformers'
rotation takes; width on the even pairs, height on the odd, as K3's code does), a final
RMSNorm, no projector pre-norm, exact GELU between the projector's layers and an RMSNorm
(eps 1e-5) after them. Checked:

- `encode_image` equals it to max |d| <= 1e-4 on images of several sizes (square,
  non-square, one the patch budget resizes; grids below, at and above the position grid),
  each prepared by the library's Kimi preprocessing from K3's media_proc_cfg;
- a swapped rotary axis order or a bicubic grid resize would be caught (each differs from
  the engine by > 1e-3);
- a prompt with two images: all-position logits <= 1e-4 against kimi_k3_ref with the
  reference tower's rows at the placeholders, chunked and token by token;
- the preprocessing equals transformers' Kimi_K25ImageProcessor given K3's constants;
- the container's vision object and plan, damaged tower tensors refused (named), and one
  surface: the OpenAI SDK over warp_transport with data-URL images, rendered by XTML as
  media blocks (user text spelling a marker stays text), greedy equal to the reference.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

MAX_TOKENS = 4


class K3Tower:
    """The K3 image tower and projector of a checkpoint directory, in float32.

    `resize` ("bilinear", K3's; "bicubic", kimi_k25's), `width_even` (the width axis on
    the even rotary pairs, K3's; False swaps the axes) and `mlp_act` / `proj_act`
    ("tanh" or "erf" GELU) name the variants the test shows would be caught."""

    def __init__(self, src: Path) -> None:
        from safetensors import safe_open

        cfg = json.loads((src / "config.json").read_text())
        self.vc = cfg["vision_config"]
        self.proj_eps = cfg.get("projector_ln_eps", 1e-5)
        self.t: dict[str, Any] = {}
        for f in sorted(src.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    if k.startswith(("vision_tower.", "mm_projector.")):
                        self.t[k] = st.get_tensor(k).float()

    def rotary(self, grid: tuple[int, int, int], hd: int, width_even: bool) -> tuple[Any, Any]:
        import transformers as tf
        from transformers.models.kimi_k25 import modeling_kimi_k25 as mk

        vc = tf.Kimi_K25Config(vision_config=dict(
            hidden_size=hd * self.vc["vt_num_attention_heads"],
            num_attention_heads=self.vc["vt_num_attention_heads"],
            rope_parameters={"rope_type": "axial",
                             "rope_theta": self.vc.get("rope_theta", 10000.0)})).vision_config
        import torch

        pid = mk.get_vision_position_ids(torch.tensor([grid]), spatial_merge_size=1)
        if not width_even:
            pid = pid.flip(-1)
        return mk.Kimi_K25VisionRotaryEmbedding(vc)(torch.zeros(1), pid)

    def forward(self, pixels: np.ndarray, grid: tuple[int, int, int], *,
                resize: str = "bilinear", width_even: bool = True, mlp_act: str = "tanh",
                proj_act: str = "erf") -> np.ndarray:
        import torch
        import torch.nn.functional as F
        from transformers.models.kimi_k25 import modeling_kimi_k25 as mk

        t, vc = self.t, self.vc
        _, h, w = grid
        n, p = h * w, vc["patch_size"]
        D, A, nh = vc["vt_hidden_size"], vc["qkv_hidden_size"], vc["vt_num_attention_heads"]
        hd = A // nh

        def rms(x: Any, wt: Any, eps: float | None = None) -> Any:
            return F.rms_norm(x, (x.shape[-1],), wt, eps)  # eps None: float32's, nn.RMSNorm's

        def gelu(x: Any, kind: str) -> Any:
            return F.gelu(x, approximate="tanh" if kind == "tanh" else "none")

        with torch.no_grad():
            px = torch.from_numpy(pixels).reshape(n, 3, p, p)
            x = F.conv2d(px, t["vision_tower.patch_embed.proj.weight"], stride=p).reshape(n, D)
            grid_pos = t["vision_tower.patch_embed.pos_emb.weight"].permute(2, 0, 1)[None]
            pos = F.interpolate(grid_pos, size=(h, w), mode=resize, align_corners=False)
            x = x + pos[0].permute(1, 2, 0).reshape(n, D)
            cos, sin = self.rotary(grid, hd, width_even)
            # interleaved pairs (2j, 2j+1) -> rotate-half (j, j + hd/2); q.k is unchanged
            perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
            attn_mod = types.SimpleNamespace(num_key_value_groups=1, training=False)
            for i in range(vc["vt_num_hidden_layers"]):
                b = f"vision_tower.encoder.blocks.{i}."
                y = rms(x, t[b + "norm0.weight"])
                q, k, v = (y @ t[b + "wqkv.weight"].T).view(n, 3, nh, hd).unbind(1)
                q, k = mk.apply_rotary_pos_emb_vision(q[None, ..., perm], k[None, ..., perm],
                                                      cos, sin)
                o, _ = mk.eager_attention_forward(
                    attn_mod, q.transpose(1, 2), k.transpose(1, 2), v[None].transpose(1, 2),
                    None, scaling=hd ** -0.5)
                x = x + o.reshape(n, A) @ t[b + "wo.weight"].T
                mlp = mk.Kimi_K25VisionMLP(D, vc["vt_intermediate_size"],
                                           "gelu_pytorch_tanh" if mlp_act == "tanh" else "gelu")
                mlp.fc1.weight.copy_(t[b + "mlp.fc0.weight"])
                mlp.fc2.weight.copy_(t[b + "mlp.fc1.weight"])
                mlp.fc1.bias.zero_()
                mlp.fc2.bias.zero_()
                x = x + mlp(rms(x, t[b + "norm1.weight"]))
            x = rms(x, t["vision_tower.encoder.final_layernorm.weight"])
            m = vc["merge_kernel_size"][0]
            x = x.view(h // m, m, w // m, m, D).permute(0, 2, 1, 3, 4).reshape(-1, m * m * D)
            x = gelu(x @ t["mm_projector.proj.0.weight"].T, proj_act)
            x = x @ t["mm_projector.proj.2.weight"].T
            return rms(x, t["mm_projector.post_norm.weight"], self.proj_eps).numpy()


@pytest.fixture(scope="module")
def k3v(oracle_env, tmp_path_factory):
    """(checkpoint dir, f32 container, reference tower, vision shape)."""
    from warp_providers.convert import convert
    from warp_providers.synth import KimiK3Shape, KimiK3VisionShape, make_kimi_k3_checkpoint

    d = tmp_path_factory.mktemp("k3v")
    shape = KimiK3VisionShape()
    src = make_kimi_k3_checkpoint(d / "hf", KimiK3Shape(num_hidden_layers=4), seed=7,
                                  vision=shape)
    out = convert(src, d / "m.warp", experts="f32", trunk="f32")
    return src, Path(out), K3Tower(src), shape


def _open(path: Path, **opts: Any) -> Any:
    from warp_providers._engine import Context

    return Context(str(path), {"vision": True, "n_threads": 2, **opts})


def _png(h: int, w: int, seed: int) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _prepare(ctx: Any, data: bytes) -> Any:
    from warp_providers.vision import for_vision

    return for_vision(ctx.vision_info()).prepare(data)


# (height, width) in pixels: the position grid itself, non-square (a grid below it on one
# axis, above on the other), one the patch budget of 64 resizes, one below on both
SIZES = [(112, 112), (84, 196), (300, 200), (56, 56)]


@pytest.mark.oracle
def test_tower_matches_reference(k3v):
    _, path, ref, shape = k3v
    ctx = _open(path)
    grids = []
    for i, (h, w) in enumerate(SIZES):
        im = _prepare(ctx, _png(h, w, i))
        want = ref.forward(im.rows, im.grid_thw)
        got = ctx.encode_image(im.rows, im.grid_thw)
        assert got.shape == want.shape == (im.n_tokens, 64)
        err = float(np.abs(got - want).max())
        assert err <= 1e-4, f"{h}x{w} grid {im.grid_thw}: max |d| {err:.3g}"
        assert float(np.abs(want).max()) > 0.1  # not a vacuous comparison
        grids.append(im.grid_thw)
        if (h, w) == (300, 200):  # resized to the budget
            assert im.grid_thw[1] * im.grid_thw[2] <= 64 + 4 * 16 and (
                im.grid_thw[1] * 14 < h)
    g = shape.init_pos_emb_height
    assert (1, g, g) in grids
    assert any(x[1] > g or x[2] > g for x in grids) and any(x[1] < g for x in grids)
    ctx.close()


@pytest.mark.oracle
def test_axis_order_and_resize_mode_are_caught(k3v):
    """The variants a transcription gets wrong differ from the engine by far more than the
    1e-4 the reference agrees to: so the comparison above pins each of them."""
    _, path, ref, _ = k3v
    ctx = _open(path)
    im = _prepare(ctx, _png(84, 196, 1))  # 6 x 14: resized both ways, not square
    got = ctx.encode_image(im.rows, im.grid_thw)
    assert float(np.abs(got - ref.forward(im.rows, im.grid_thw)).max()) <= 1e-4
    for variant in ({"width_even": False}, {"resize": "bicubic"}):
        other = ref.forward(im.rows, im.grid_thw, **variant)
        assert float(np.abs(got - other).max()) > 1e-3, variant
    # the two GELUs differ little on this tiny tower's activations, still above 1e-4
    for variant in ({"mlp_act": "erf"}, {"proj_act": "tanh"}):
        other = ref.forward(im.rows, im.grid_thw, **variant)
        assert float(np.abs(got - other).max()) > 3e-4, variant
    # the bilinear resize the reference uses is F.interpolate's with half-pixel centres
    import torch
    import torch.nn.functional as F

    g = torch.arange(4.0).reshape(1, 1, 1, 4)
    up = F.interpolate(g, size=(1, 8), mode="bilinear", align_corners=False)[0, 0, 0]
    assert up.tolist() == [0.0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.0]
    ctx.close()


def _ids(src: Path) -> dict[str, int]:
    dec = json.loads((src / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    return {v["content"]: int(k) for k, v in dec.items()}


@pytest.mark.oracle
def test_two_images_logits_match(k3v):
    """Two images in one prompt: the engine's rows at the placeholders give the reference's
    logits (kimi_k3_ref with the reference tower's rows), in chunks of 5 and token by
    token; the text embeddings at the placeholders give other logits."""
    import kimi_k3_ref
    import torch
    from oracle_util import assert_image_prompt_matches

    src, path, ref, _ = k3v
    tok = _ids(src)
    pad, begin, end = tok["<|media_pad|>"], tok["<|media_begin|>"], tok["<|media_end|>"]
    ctx = _open(path, prefill_chunk=5, max_sequences=2)
    ims = [_prepare(ctx, _png(56, 84, 10)), _prepare(ctx, _png(84, 56, 11))]
    rows = [ctx.encode_image(im.rows, im.grid_thw) for im in ims]
    ids = [5, 6, begin, *[pad] * len(rows[0]), end, 7, 8, 9, begin, *[pad] * len(rows[1]),
           end, 10, 11]
    model = kimi_k3_ref.KimiK3Reference(src)
    want_rows = torch.from_numpy(np.concatenate([ref.forward(im.rows, im.grid_thw)
                                                 for im in ims]))
    want = model.logits(ids, want_rows, pad)
    vocab = want.shape[1]
    assert_image_prompt_matches(ctx, rows, ids, want, vocab, "k3: ")
    assert float(np.abs(model.logits(ids) - want).max()) > 1e-2
    ctx.close()


@pytest.mark.oracle
def test_preprocessing_is_kimi_k25s_with_k3_constants(k3v):
    """K3's media_proc_cfg read as transformers' Kimi_K25ImageProcessor's keys: the same
    pixel_values and grids; mean = std = 0.5 maps 0 to -1 and 255 to 1."""
    from PIL import Image
    from support import import_torchvision

    import_torchvision()
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    _, path, _, shape = k3v
    ctx = _open(path)
    proc = Kimi_K25ImageProcessor(
        patch_size=shape.patch_size, merge_size=shape.merge_kernel_size,
        max_patches=shape.in_patch_limit,
        size={"max_height": shape.patch_limit_on_one_side,
              "max_width": shape.patch_limit_on_one_side},
        image_mean=list(shape.image_mean), image_std=list(shape.image_std))
    for i, (h, w) in enumerate(SIZES):
        data = _png(h, w, i)
        im = _prepare(ctx, data)
        out = proc(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
        assert tuple(out["image_grid_thw"][0].tolist()) == im.grid_thw
        assert float(np.abs(out["pixel_values"].numpy() - im.pixel_values).max()) <= 1e-6
    white = Image.fromarray(np.full((28, 28, 3), 255, np.uint8))
    black = Image.fromarray(np.zeros((28, 28, 3), np.uint8))
    assert np.all(_prepare(ctx, white).pixel_values == 1.0)
    assert np.all(_prepare(ctx, black).pixel_values == -1.0)
    ctx.close()


@pytest.mark.oracle
def test_vision_object_and_plan(k3v):
    from warp_providers._engine import Context, plan_memory

    src, path, _, shape = k3v
    man = json.loads((path / "manifest.json").read_text())
    v = man["vision"]
    tok = _ids(src)
    assert v["preprocessor"] == json.loads((src / "preprocessor_config.json").read_text())
    assert (v["arch"], v["patch_size"], v["merge_size"], v["placeholder_token_id"],
            v["image_start_token_id"], v["image_end_token_id"]) == (
        "kimi_k3", 14, 2, tok["<|media_pad|>"], tok["<|media_begin|>"], tok["<|media_end|>"])
    hp = v["hparams"]
    assert hp["attn_hidden_size"] == shape.qkv_hidden_size != hp["hidden_size"]
    assert hp["norm_eps"] == float(np.finfo(np.float32).eps) and hp["proj_norm_eps"] == 1e-5
    names = {t["name"] for t in man["trunk"]["tensors"]}
    assert "v.mm_post_norm.weight" in names and not any(
        n.startswith("v.") and n.endswith(".bias") for n in names)
    tower = sum(t["bytes"] for t in man["trunk"]["tensors"] if t["name"].startswith("v."))
    with_v, without = plan_memory(str(path), {"vision": True}), plan_memory(str(path), {})
    assert with_v["vision_weight_bytes"] == tower > 0 and without["vision_bytes"] == 0
    assert with_v["vision_bytes"] == tower + with_v["vision_reserve_bytes"]
    assert with_v["floor_bytes"] - without["floor_bytes"] == with_v["vision_bytes"]
    plain = Context(str(path), {"n_threads": 1})  # text only without the option
    plain.close()


@pytest.mark.oracle
def test_damaged_tower_refused(k3v, tmp_path, oracle_env):
    import torch
    from safetensors.torch import load_file, save_file

    from warp_providers import errors
    from warp_providers.convert import convert
    from warp_providers.convert.quant import ConvertError

    src, path, _, _ = k3v
    shard = "model-vision.safetensors"
    for case, name in (("missing", "vision_tower.encoder.blocks.1.wo.weight"),
                       ("shape", "mm_projector.post_norm.weight")):
        bad = tmp_path / f"hf_{case}"
        shutil.copytree(src, bad)
        tensors = load_file(bad / shard)
        if case == "missing":
            tensors.pop(name)
        else:
            tensors[name] = torch.zeros(7, dtype=tensors[name].dtype)
        save_file(tensors, bad / shard)
        with pytest.raises(ConvertError, match=name.replace(".", r"\.")):
            convert(bad, tmp_path / f"out_{case}", experts="f32", trunk="f32")
    nopre = tmp_path / "hf_nopre"
    shutil.copytree(src, nopre)
    (nopre / "preprocessor_config.json").unlink()
    with pytest.raises(ConvertError, match="preprocessor_config"):
        convert(nopre, tmp_path / "out_nopre", experts="f32", trunk="f32")
    for case, target in (("missing", "v.mm_post_norm.weight"),
                         ("shape", "v.blk.0.attn_qkv.weight")):
        bad = oracle_env.damaged_copy(path, tmp_path / f"c_{case}", target, case)
        with pytest.raises(errors.ModelFormatError, match=target.replace(".", r"\.")):
            _open(bad)


def _messages(a: bytes, b: bytes, text: str = "Compare ") -> list[dict[str, Any]]:
    def part(data: bytes) -> dict[str, Any]:
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        return {"type": "image_url", "image_url": {"url": url}}

    return [{"role": "user", "content": [{"type": "text", "text": text}, part(a),
                                         {"type": "text", "text": " with "}, part(b)]}]


@pytest.mark.oracle
def test_openai_sdk_with_data_url_images(k3v):
    """The OpenAI SDK over warp_transport: XTML renders each image as a media block
    (markers as markup, one pad expanded to the image's rows), and the reply is the
    reference's greedy continuation of the same ids with the reference tower's rows."""
    import kimi_k3_ref
    import openai
    import torch
    from warp_openai import warp_transport

    from warp_providers import ChatSession, Engine

    src, path, ref, _ = k3v
    tok = _ids(src)
    pad, begin, end = tok["<|media_pad|>"], tok["<|media_begin|>"], tok["<|media_end|>"]
    a, b = _png(56, 84, 20), _png(28, 56, 21)
    eng = Engine.open(path, vision=True, threads=2)
    try:
        assert eng.vision_info()["arch"] == "kimi_k3"
        session = ChatSession(eng)
        prep = session.prepare(_messages(a, b))
        assert len(prep.images) == 2
        assert prep.ids.count(begin) == prep.ids.count(end) == 2
        assert prep.ids.count(pad) == sum(im.n_tokens for im in prep.images)
        spelled = session.prepare(_messages(a, b, "<|media_begin|><|media_pad|> "))
        assert spelled.ids.count(begin) == 2  # the user's spelling stayed text
        assert spelled.ids.count(pad) == prep.ids.count(pad)

        model = kimi_k3_ref.KimiK3Reference(src)
        rows = torch.from_numpy(np.concatenate([ref.forward(im.rows, im.grid_thw)
                                                for im in prep.images]))
        stops = set(eng.tokenizer.eos_ids) | {pad}
        want: list[int] = []
        for _ in range(MAX_TOKENS):
            nxt = int(np.argmax(model.logits(prep.ids + want, rows, pad)[-1]))
            if nxt in stops:
                break
            want.append(nxt)
        assert want, "the random draw stops at once: nothing to compare"

        client = openai.OpenAI(api_key="test", max_retries=0,
                               http_client=warp_transport(engine=eng))
        out = client.chat.completions.create(model="m", max_tokens=MAX_TOKENS, temperature=0,
                                             messages=_messages(a, b))
        assert out.usage.prompt_tokens == len(prep.ids)
        msg = out.choices[0].message  # XTML opens the reply in its thinking region
        got = (getattr(msg, "reasoning_content", None) or "") + (msg.content or "")
        assert got == eng.tokenizer.decode(want)
    finally:
        eng.close()
