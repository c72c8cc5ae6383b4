"""Image preprocessing against transformers' image processors (the pixel-tensor oracle)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from support import has_module, import_torchvision, requires
from warp_providers import ImageError, vision

KIMI = {
    "patch_size": 14, "merge_size": 2, "max_patches": 1024,
    "size": {"max_height": 512, "max_width": 512},
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "resample": 3, "rescale_factor": 1 / 255,
}
GLM = {
    "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
    "min_image_tokens": 4, "max_image_tokens": 300,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
}


def _oracles():
    requires(has_module("transformers"), "transformers")
    import_torchvision()
    from transformers.models.glm5_next.image_processing_glm5_next import Glm5NextImageProcessor
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor
    return Kimi_K25ImageProcessor, Glm5NextImageProcessor


def _noise(h, w, mode="RGB", seed=0):
    rs = np.random.RandomState(seed + h * 7 + w)
    # smooth gradients plus noise: resizing then mixes many distinct values
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)),
                     ((x + y) * 3) % 256], axis=-1)
    arr = np.clip(base + rs.randint(-40, 40, base.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr)
    if mode == "RGBA":
        alpha = Image.fromarray(rs.randint(0, 256, (h, w)).astype(np.uint8))
        im = im.convert("RGBA")
        im.putalpha(alpha)
    elif mode == "L":
        im = im.convert("L")
    elif mode == "P":
        im = im.convert("P", palette=Image.Palette.ADAPTIVE, colors=37)
    return im


def _encode(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _exif_rotated_jpeg(h, w, orientation=6):
    im = _noise(h, w)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _encode(im, "JPEG", quality=90, exif=exif.tobytes())


FIXTURES = {
    "png-300x500": lambda: _encode(_noise(300, 500), "PNG"),
    "png-tiny-3x5": lambda: _encode(_noise(3, 5), "PNG"),
    "png-square-28": lambda: _encode(_noise(28, 28), "PNG"),
    "png-large-1500x1100": lambda: _encode(_noise(1500, 1100), "PNG"),
    "png-tall-900x60": lambda: _encode(_noise(900, 60), "PNG"),
    "png-rgba": lambda: _encode(_noise(120, 97, "RGBA"), "PNG"),
    "png-gray": lambda: _encode(_noise(77, 130, "L"), "PNG"),
    "png-palette": lambda: _encode(_noise(64, 200, "P"), "PNG"),
    "jpeg-333x517": lambda: _encode(_noise(333, 517), "JPEG", quality=85),
    "jpeg-1200x1600": lambda: _encode(_noise(1200, 1600), "JPEG", quality=85),
    "jpeg-exif-rotated": lambda: _exif_rotated_jpeg(180, 420),
    "gif": lambda: _encode(_noise(90, 150, "P"), "GIF"),
    "webp": lambda: _encode(_noise(111, 222), "WEBP", quality=80),
}


def _reference_input(data):
    # what a caller hands the transformers processor after loading the file
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("family", ["kimi", "glm"])
def test_pixels_equal_transformers_processor(name, family):
    kimi_cls, glm_cls = _oracles()
    data = FIXTURES[name]()
    cfg = KIMI if family == "kimi" else GLM
    ref_cls = kimi_cls if family == "kimi" else glm_cls
    mine = vision.for_vision({"arch": "kimi_k25" if family == "kimi" else "glm5_next",
                              "preprocessor": cfg}).prepare(data)
    ref = ref_cls(**cfg)(_reference_input(data), return_tensors="np")
    assert mine.pixel_values.dtype == np.float32
    assert mine.pixel_values.shape == ref["pixel_values"].shape
    assert mine.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0])
    assert float(np.abs(mine.pixel_values - ref["pixel_values"]).max()) <= 1e-6
    t, h, w = mine.grid_thw
    assert mine.n_tokens == t * h * w // 4
    n = mine.pixel_values.shape[0]
    assert mine.rows.shape == (n, int(np.prod(mine.pixel_values.shape[1:])))


def test_some_fixture_needs_resizing_and_padding():
    # the fixture set exercises the resize path, not only pad-and-patchify
    big = vision.for_vision({"arch": "kimi_k25", "preprocessor": KIMI}).prepare(
        FIXTURES["jpeg-1200x1600"]())
    assert big.grid_thw[1] * big.grid_thw[2] <= KIMI["max_patches"] + 2 * 40
    assert (big.height, big.width) == (1200, 1600)


def test_exif_orientation_is_applied():
    data = _exif_rotated_jpeg(180, 420)
    img = vision.decode_image(data)
    assert img.size == (180, 420)  # orientation 6: rotated a quarter turn
    p = vision.for_vision({"arch": "kimi_k25", "preprocessor": KIMI}).prepare(data)
    assert p.grid_thw[1] > p.grid_thw[2]


@pytest.mark.parametrize("family", ["kimi", "glm"])
def test_detail_maps_to_a_patch_budget(family):
    kimi_cls, glm_cls = _oracles()
    data = FIXTURES["jpeg-1200x1600"]()
    cfg = KIMI if family == "kimi" else GLM
    proc = vision.for_vision({"arch": "kimi_k25" if family == "kimi" else "glm5_next",
                              "preprocessor": cfg})
    low, high, auto = (proc.prepare(data, detail=d) for d in ("low", "high", "auto"))
    # kimi's budget counts patches before padding to the merge grid: a few more may result
    assert low.n_tokens <= vision.LOW_DETAIL_TOKENS * 5 // 4 < high.n_tokens
    assert auto.n_tokens == high.n_tokens and auto.digest == high.digest
    assert low.n_tokens == proc.tokens_for(1600, 1200, detail="low")
    assert high.n_tokens == proc.tokens_for(1600, 1200, detail="high")
    # "low" is the processor run with the smaller budget
    if family == "kimi":
        ref = kimi_cls(**{**cfg, "max_patches": vision.LOW_DETAIL_TOKENS * 4})
    else:
        ref = glm_cls(**{**cfg, "max_image_tokens": vision.LOW_DETAIL_TOKENS})
    out = ref(_reference_input(data), return_tensors="np")
    assert float(np.abs(low.pixel_values - out["pixel_values"]).max()) <= 1e-6
    with pytest.raises(ValueError, match="detail"):
        proc.prepare(data, detail="medium")


def test_k3_normalisation_comes_from_its_config():
    data = FIXTURES["png-300x500"]()
    k3 = vision.for_vision({"arch": "kimi_k3", "preprocessor": KIMI}).prepare(data)
    clip = {**KIMI, "image_mean": GLM["image_mean"], "image_std": GLM["image_std"]}
    other = vision.for_vision({"arch": "kimi_k25", "preprocessor": clip}).prepare(data)
    assert k3.grid_thw == other.grid_thw and k3.digest != other.digest
    assert -1.0 <= float(k3.pixel_values.min()) and float(k3.pixel_values.max()) <= 1.0


def test_required_keys_are_never_assumed():
    from warp_providers import ModelFormatError
    cfg = dict(KIMI)
    del cfg["image_mean"]
    with pytest.raises(ModelFormatError, match="image_mean"):
        vision.for_vision({"arch": "kimi_k25", "preprocessor": cfg})
    with pytest.raises(ModelFormatError, match="arch"):
        vision.for_vision({"arch": "llava", "preprocessor": KIMI})


def test_tower_geometry_fills_missing_keys():
    cfg = {k: v for k, v in KIMI.items() if k not in ("patch_size", "merge_size")}
    proc = vision.for_vision({"arch": "kimi_k25", "preprocessor": cfg, "patch_size": 14,
                              "merge_size": 2})
    assert (proc.patch_size, proc.merge_size) == (14, 2)


def test_same_pixels_same_digest_different_pixels_different():
    proc = vision.for_vision({"arch": "glm5_next", "preprocessor": GLM})
    a = FIXTURES["png-300x500"]()
    assert proc.prepare(a).digest == proc.prepare(Image.open(io.BytesIO(a))).digest
    assert proc.prepare(a).digest != proc.prepare(FIXTURES["jpeg-333x517"]()).digest


def test_bad_inputs_are_clear_image_errors():
    good = FIXTURES["png-300x500"]()
    with pytest.raises(ImageError, match="truncated|cannot"):
        vision.decode_image(good[: len(good) // 2])
    with pytest.raises(ImageError, match="unsupported"):
        vision.decode_image(_encode(_noise(20, 20), "BMP"))
    with pytest.raises(ImageError, match="unsupported"):
        vision.decode_image(b"not an image at all")
    huge = _encode(Image.new("1", (20000, 20000)), "PNG")
    with pytest.raises(ImageError, match="limit"):
        vision.decode_image(huge)
    assert isinstance(ImageError("x"), ValueError)
    with pytest.raises(TypeError):
        vision.decode_image("a string")
