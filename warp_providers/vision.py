"""Images: bytes in, the pixel tensor a vision tower takes out, and the prompt's image runs.

Owns: decoding (PNG, JPEG, WebP, GIF first frame) with Pillow, EXIF orientation, RGB
conversion, each model's resize/pad/normalise/patchify equal to transformers'
`Kimi_K25ImageProcessor` (also `kimi_k3`) and `Glm5NextImageProcessor` (the resize is the
antialiased int16 fixed-point filter those processors run on uint8, not Pillow's own);
image references (data: URLs, allowed local files); placeholder expansion in a prompt.
Every parameter comes from the container's `vision.preprocessor`. `detail`: "low" is a
budget of `LOW_DETAIL_TOKENS` positions, "high"/"auto" the checkpoint's own.
Refuses (`ImageError`): other formats, corrupt data, images above `MAX_SOURCE_PIXELS`
(before decoding), http(s) URLs, paths outside the allowed directory.
Called by `ChatSession` (and through it every surface) and `Engine.stream`.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ImageError, ModelFormatError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
"""Container formats accepted, as Pillow names them."""
MAX_SOURCE_PIXELS = 64_000_000
"""Largest source image (width * height) decoded; larger ones are refused before decoding."""
LOW_DETAIL_TOKENS = 64
"""Positions an image takes at most under `detail="low"`."""
DETAILS = ("auto", "low", "high")

_BICUBIC_A = -0.5  # the Keys kernel parameter of the processors' antialiased bicubic
_BILINEAR, _BICUBIC = 2, 3  # PIL resample codes, as preprocessor configs store them


@dataclass(frozen=True)
class PreparedImage:
    """One image as the tower takes it."""

    pixel_values: np.ndarray = field(repr=False)
    """float32, the processor's layout (kimi: [n_patches, C, p, p]; glm: [n_patches, C*t*p*p])."""
    grid_thw: tuple[int, int, int]
    """(t, h, w) in patches."""
    n_tokens: int
    """Positions the image takes in the prompt: t*h*w / merge_size**2."""
    digest: str
    """sha256 of the pixel tensor and its grid (equal only when the tower sees the same)."""
    width: int
    """Source width in pixels (after EXIF orientation)."""
    height: int
    """Source height in pixels (after EXIF orientation)."""

    @property
    def rows(self) -> np.ndarray:
        """The pixels as a 2-D C-contiguous float32 array, one row per patch."""
        flat = self.pixel_values.reshape(self.pixel_values.shape[0], -1)
        return np.ascontiguousarray(flat, dtype=np.float32)


# --------------------------------------------------------------------------- decoding
def decode_image(data: bytes, *, max_pixels: int = MAX_SOURCE_PIXELS) -> Any:
    """Decode image bytes into an RGB Pillow image (EXIF orientation applied, first frame).

    Transparency is composited onto white, as transformers' `convert_to_rgb` does.

    Raises:
        ImageError: Unsupported format, undecodable or truncated data, or too large.

    """
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError:
        raise ImageError(
            "reading images needs Pillow: pip install 'warp-providers[images]'"
        ) from None

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"image data must be bytes, not {type(data).__name__}")
    try:
        image = Image.open(io.BytesIO(bytes(data)), formats=list(FORMATS))
    except Image.DecompressionBombError:
        raise ImageError(
            f"the image is above the {max_pixels:,}-pixel limit; downscale it before sending"
        ) from None
    except UnidentifiedImageError:
        raise ImageError(
            "unsupported or unrecognised image format (accepted: PNG, JPEG, WebP, GIF)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ImageError(f"cannot read the image: {exc}") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError("the image has no pixels")
    if width * height > max_pixels:
        raise ImageError(
            f"the image is {width}x{height} pixels, above the {max_pixels:,}-pixel limit; "
            "downscale it before sending"
        )
    try:
        image.seek(0)
        image.load()
        image = ImageOps.exif_transpose(image)
        return _to_rgb(image)
    except (OSError, ValueError, SyntaxError) as exc:
        raise ImageError(f"cannot decode the image (truncated or corrupt): {exc}") from None


def _to_rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


# --------------------------------------------------------------------------- resize
def _filter(name: int) -> tuple[float, Any]:
    if name == _BICUBIC:
        a = _BICUBIC_A

        def cubic(x: np.ndarray) -> np.ndarray:
            x = np.abs(x)
            near = ((a + 2) * x - (a + 3)) * x * x + 1
            far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
            return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))

        return 2.0, cubic
    if name == _BILINEAR:

        def triangle(x: np.ndarray) -> np.ndarray:
            x = np.abs(x)
            return np.where(x < 1.0, 1.0 - x, 0.0)

        return 1.0, triangle
    raise ImageError(f"resample filter {name!r} is not supported (bilinear=2 or bicubic=3)")


def _axis_weights(in_size: int, out_size: int, resample: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Start index, int16 weights [out, k] and their precision for one antialiased axis."""
    half, kernel = _filter(resample)
    scale = in_size / out_size
    support = half * scale if scale >= 1.0 else half
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    k = int(math.ceil(support)) * 2 + 1
    centre = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    xmin = np.maximum((centre - support + 0.5).astype(np.int64), 0)
    xmax = np.minimum((centre + support + 0.5).astype(np.int64), in_size)
    xsize = np.clip(xmax - xmin, 0, k)
    j = np.arange(k, dtype=np.float64)
    w = kernel((j[None, :] + xmin[:, None] - centre[:, None] + 0.5) * invscale)
    w = np.where(j[None, :] < xsize[:, None], w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total != 0.0)
    max_weight = float(w.max())
    precision = 0
    while precision < 22:
        if int(0.5 + max_weight * (1 << (precision + 1))) >= (1 << 15):
            break
        precision += 1
    scaled = w * (1 << precision)
    fixed = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int64)
    return xmin, fixed, precision


def _resample_axis(src: np.ndarray, out_size: int, axis: int, resample: int) -> np.ndarray:
    in_size = src.shape[axis]
    xmin, weights, precision = _axis_weights(in_size, out_size, resample)
    moved = np.moveaxis(src, axis, 0).astype(np.int64)
    acc = np.full((out_size, *moved.shape[1:]), 1 << (precision - 1) if precision else 0,
                  dtype=np.int64)
    shape = (out_size,) + (1,) * (moved.ndim - 1)
    for j in range(weights.shape[1]):
        col = weights[:, j]
        if not col.any():
            continue
        idx = np.minimum(xmin + j, in_size - 1)
        acc += col.reshape(shape) * moved[idx]
    out = np.clip(acc >> precision, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def resize_uint8(pixels: np.ndarray, height: int, width: int,
                 resample: int = _BICUBIC) -> np.ndarray:
    """Antialiased resize of an [H, W, C] uint8 array (width first, then height; each pass
    rounds to uint8), as transformers' image processors resize uint8 images."""
    out = pixels
    if out.shape[1] != width:
        out = _resample_axis(out, width, 1, resample)
    if out.shape[0] != height:
        out = _resample_axis(out, height, 0, resample)
    return out


# --------------------------------------------------------------------------- processors
def _get(cfg: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = cfg.get(key)
    return default if value is None else value


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ModelFormatError(f"the container's vision.preprocessor lacks {key!r}")
    return value


class ImageProcessor:
    """Turns decoded images into `PreparedImage`s for one model (built by `for_vision`)."""

    def __init__(self, preprocessor: Mapping[str, Any]) -> None:
        """Read the parameters from the checkpoint's preprocessor config dict."""
        cfg = dict(preprocessor)
        self.config = cfg
        self.patch_size = int(_require(cfg, "patch_size"))
        self.merge_size = int(_require(cfg, "merge_size"))
        self.mean = np.asarray(_require(cfg, "image_mean"), dtype=np.float64).reshape(-1)
        self.std = np.asarray(_require(cfg, "image_std"), dtype=np.float64).reshape(-1)
        self.rescale_factor = float(_get(cfg, "rescale_factor", 1 / 255))
        self.do_resize = bool(_get(cfg, "do_resize", True))
        self.do_rescale = bool(_get(cfg, "do_rescale", True))
        self.do_normalize = bool(_get(cfg, "do_normalize", True))
        self.resample = int(_get(cfg, "resample", _BICUBIC))
        _filter(self.resample)

    def prepare(self, data: bytes | Any, *, detail: str = "auto") -> PreparedImage:
        """Decode (bytes) or take (a Pillow image) one image and preprocess it.

        Args:
            data: Encoded image bytes, or an RGB-convertible Pillow image.
            detail: "low", "high" or "auto" (see the module docstring).

        Raises:
            ImageError: The image cannot be used.
            ValueError: `detail` is not one of `DETAILS`.

        """
        if detail not in DETAILS:
            raise ValueError(f"detail must be one of {list(DETAILS)}, not {detail!r}")
        raw = isinstance(data, (bytes, bytearray, memoryview))
        image = decode_image(data) if raw else _to_rgb(data)
        pixels = np.asarray(image, dtype=np.uint8)
        canvas = self._resize_pad(pixels, detail)
        values, grid = self._patchify(self._normalise(canvas))
        digest = hashlib.sha256(values.tobytes() + repr(grid).encode()).hexdigest()
        n_tokens = grid[0] * grid[1] * grid[2] // (self.merge_size**2)
        return PreparedImage(values, grid, n_tokens, digest, image.width, image.height)

    def _normalise(self, canvas: np.ndarray) -> np.ndarray:
        chw = np.ascontiguousarray(canvas.transpose(2, 0, 1))
        if self.do_rescale and self.do_normalize:
            mean = (self.mean.astype(np.float32) * np.float32(1.0 / self.rescale_factor))
            std = (self.std.astype(np.float32) * np.float32(1.0 / self.rescale_factor))
            out = chw.astype(np.float32)
            return (out - mean[:, None, None]) / std[:, None, None]
        out = chw.astype(np.float32)
        if self.do_rescale:
            out = out * np.float32(self.rescale_factor)
        if self.do_normalize:
            mean = self.mean.astype(np.float32)[:, None, None]
            out = (out - mean) / self.std.astype(np.float32)[:, None, None]
        return out

    def _resize_pad(self, pixels: np.ndarray, detail: str) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _patchify(self, chw: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        raise NotImplementedError  # pragma: no cover

    def tokens_for(self, width: int, height: int, *, detail: str = "auto") -> int:
        """Positions an image of this size takes (without decoding it)."""
        h, w = self._canvas_size(height, width, detail)
        return (h // self.patch_size) * (w // self.patch_size) // self.merge_size**2

    def _canvas_size(self, height: int, width: int, detail: str) -> tuple[int, int]:
        raise NotImplementedError  # pragma: no cover


def _pad(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = pixels.shape[:2]
    if (h, w) == (height, width):
        return pixels
    return np.pad(pixels, ((0, height - h), (0, width - w), (0, 0)))


#: The keys of a Moonshot release's own ``media_proc_cfg`` (Kimi K3's, K2.5's remote-code
#: processor) -> those of transformers' Kimi_K25ImageProcessor, the same processor family.
MEDIA_PROC_KEYS = {"patch_size": "patch_size", "merge_kernel_size": "merge_size",
                   "image_mean": "image_mean", "image_std": "image_std",
                   "in_patch_limit": "max_patches"}


def kimi_preprocessor(preprocessor: Mapping[str, Any]) -> dict[str, Any]:
    """A Kimi preprocessor config in transformers' flat keys: as given, or, from a release's
    ``media_proc_cfg`` object (the keys of `MEDIA_PROC_KEYS`, ``patch_limit_on_one_side``
    as ``size.max_height``/``max_width``), over the flat keys present. A key the release
    sets to null is left to the processor's default."""
    cfg = dict(preprocessor)
    media = cfg.get("media_proc_cfg")
    if not isinstance(media, Mapping):
        return cfg
    for src, dst in MEDIA_PROC_KEYS.items():
        if media.get(src) is not None:
            value = media[src]
            if src == "merge_kernel_size" and isinstance(value, (list, tuple)):
                if len(value) != 2 or value[0] != value[1]:
                    raise ModelFormatError(
                        f"media_proc_cfg.merge_kernel_size {value!r}: not two equal sizes")
                value = value[0]
            cfg[dst] = value
    side = media.get("patch_limit_on_one_side")
    if side is not None:
        cfg["size"] = {"max_height": int(side), "max_width": int(side)}
    return cfg


class KimiImageProcessor(ImageProcessor):
    """MoonViT's preprocessing (`kimi_k25`, `kimi_k3`): fit a patch budget, pad, [n, C, p, p].

    Reads transformers' keys, or a release's ``media_proc_cfg`` (`kimi_preprocessor`)."""

    def __init__(self, preprocessor: Mapping[str, Any]) -> None:
        """Read `max_patches` and `size.max_height` besides the shared keys."""
        super().__init__(kimi_preprocessor(preprocessor))
        self.max_patches = int(_get(self.config, "max_patches", 16384))
        size = _get(self.config, "size", {"max_height": 512, "max_width": 512})
        self.max_side = int(size.get("max_height") or 512)

    def budget(self, detail: str) -> int:
        """The patch budget for a `detail` value."""
        if detail == "low":
            return min(self.max_patches, LOW_DETAIL_TOKENS * self.merge_size**2)
        return self.max_patches

    def _fit(self, height: int, width: int, detail: str) -> tuple[tuple[int, int], tuple[int, int]]:
        p, side = self.patch_size, self.max_side
        n_h = max(1.0, height // p)
        n_w = max(1.0, width // p)
        scale = min(1.0, math.sqrt(self.budget(detail) / (n_h * n_w)),
                    (side * p) / height, (side * p) / width)
        new_h = min(max(1, int(height * scale)), side * p)
        new_w = min(max(1, int(width * scale)), side * p)
        factor = self.merge_size * p
        return (new_h, new_w), (new_h + (factor - new_h % factor) % factor,
                                new_w + (factor - new_w % factor) % factor)

    def _canvas_size(self, height: int, width: int, detail: str) -> tuple[int, int]:
        return self._fit(height, width, detail)[1] if self.do_resize else (height, width)

    def _resize_pad(self, pixels: np.ndarray, detail: str) -> np.ndarray:
        if not self.do_resize:
            return pixels
        (h, w), (ph, pw) = self._fit(pixels.shape[0], pixels.shape[1], detail)
        return _pad(resize_uint8(pixels, h, w, self.resample), ph, pw)

    def _patchify(self, chw: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        c, height, width = chw.shape
        p = self.patch_size
        gh, gw = height // p, width // p
        patches = chw.reshape(c, gh, p, gw, p).transpose(1, 3, 0, 2, 4)
        return np.ascontiguousarray(patches.reshape(gh * gw, c, p, p)), (1, gh, gw)


class GlmImageProcessor(ImageProcessor):
    """GLM-5.3-Flash's preprocessing (`glm5_next`): an aligned canvas within a token budget,
    patches in merge order with the frame repeated `temporal_patch_size` times."""

    def __init__(self, preprocessor: Mapping[str, Any]) -> None:
        """Read the temporal patch and the token bounds besides the shared keys."""
        super().__init__(preprocessor)
        self.temporal = int(_get(self.config, "temporal_patch_size", 2))
        self.expand = int(_get(self.config, "patch_expand_factor", 1))
        self.min_tokens = int(_get(self.config, "min_image_tokens", 16))
        self.max_tokens = int(_get(self.config, "max_image_tokens", 8000))

    def budget(self, detail: str) -> int:
        """The token budget (merged positions) for a `detail` value."""
        if detail == "low":
            return max(self.min_tokens, min(self.max_tokens, LOW_DETAIL_TOKENS))
        return self.max_tokens

    def _target(self, height: int, width: int, detail: str) -> tuple[int, int]:
        t = self.temporal
        factor = self.patch_size * self.merge_size * self.expand
        per_token = t * factor**2
        min_px = self.min_tokens * per_token
        max_px = self.budget(detail) * per_token

        def align(v: float) -> int:
            return math.ceil(v / factor) * factor

        frames = t  # one image is one aligned temporal group
        ah, aw = align(height), align(width)
        if frames * ah * aw < min_px:
            scale = math.sqrt(min_px / (t * height * width))
            ah = align(max(1, math.ceil(height * scale)))
            aw = align(max(1, math.ceil(width * scale)))
        if frames * ah * aw > max_px:
            if max_px < frames * factor**2:
                raise ImageError("the image budget is smaller than one aligned patch")
            low, high = 1, height
            ah, aw = factor, factor
            while low <= high:
                mid = (low + high) // 2
                cw = max(1, math.floor(width * mid / height))
                h2, w2 = align(mid), align(cw)
                if frames * h2 * w2 <= max_px:
                    ah, aw = h2, w2
                    low = mid + 1
                else:
                    high = mid - 1
        return ah, aw

    def _canvas_size(self, height: int, width: int, detail: str) -> tuple[int, int]:
        return self._target(height, width, detail) if self.do_resize else (height, width)

    def _resize_pad(self, pixels: np.ndarray, detail: str) -> np.ndarray:
        if not self.do_resize:
            return pixels
        height, width = pixels.shape[:2]
        th, tw = self._target(height, width, detail)
        t = self.temporal
        factor = self.patch_size * self.merge_size * self.expand
        scale = min(th / height, tw / width)
        if t * height * width >= t * factor**2 * self.min_tokens:
            scale = min(1.0, scale)
        ch = max(1, min(th, math.floor(height * scale)))
        cw = max(1, min(tw, math.floor(width * scale)))
        if (ch, cw) != (height, width):
            pixels = resize_uint8(pixels, ch, cw, self.resample)
        return _pad(pixels, th, tw)

    def _patchify(self, chw: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        c, height, width = chw.shape
        p, m, t = self.patch_size, self.merge_size, self.temporal
        gh, gw = height // p, width // p
        patches = chw.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
        return np.ascontiguousarray(patches.reshape(gh * gw, c * t * p * p)), (1, gh, gw)


_PROCESSORS: dict[str, type[ImageProcessor]] = {
    "kimi_k25": KimiImageProcessor,
    "kimi_k3": KimiImageProcessor,
    "glm5_next": GlmImageProcessor,
}


def for_vision(info: Mapping[str, Any]) -> ImageProcessor:
    """The processor for a container's `vision` metadata (`Context.vision_info()`).

    The tower's own `patch_size`/`merge_size`/`temporal_patch_size` fill keys the
    preprocessor dict leaves out.

    Raises:
        ModelFormatError: Unknown arch, or a required key is missing.

    """
    arch = info.get("arch")
    cls = _PROCESSORS.get(str(arch))
    if cls is None:
        raise ModelFormatError(
            f"no image preprocessing for vision arch {arch!r} (known: {sorted(_PROCESSORS)})"
        )
    pre = dict(info.get("preprocessor") or {})
    for key in ("patch_size", "merge_size", "temporal_patch_size"):
        if pre.get(key) is None and info.get(key) is not None:
            pre[key] = info[key]
    return cls(pre)


# --------------------------------------------------------------------------- references
def image_refs(messages: Any) -> list[tuple[str, str]]:
    """(reference, detail) of every image part, in conversation order.

    A part is `{"type": "image_url", "image_url": {"url", "detail"} | str}`, or
    `{"type": "image", ...}` with `image_url`, `url`, or `base64` + `mime_type` (LangChain's
    standard block, turned into a data URL here).

    Raises:
        ImageError: A part names no image.

    """
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(messages or ()):
        content = msg.get("content") if isinstance(msg, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in ("image", "image_url"):
                continue
            ref: Any = part.get("image_url") or part.get("url") or part.get("image")
            detail: Any = part.get("detail")
            if isinstance(ref, Mapping):
                detail = ref.get("detail", detail)
                ref = ref.get("url")
            if not ref and part.get("base64"):
                mime = part.get("mime_type") or "image/png"
                ref = f"data:{mime};base64,{part['base64']}"
            if not isinstance(ref, str) or not ref:
                raise ImageError(f"messages[{i}].content[{j}] is an image with no url")
            detail = detail or "auto"
            if detail not in DETAILS:
                raise ImageError(
                    f"messages[{i}].content[{j}]: detail must be one of {list(DETAILS)}, "
                    f"not {detail!r}"
                )
            out.append((ref, detail))
    return out


def load_image_ref(ref: str, *, allow_local: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes an image reference names.

    `data:` URLs are decoded; `http(s)` URLs are refused (this library opens no sockets);
    `file://` URLs and paths are read only when `allow_local` names a directory that
    holds them (the path resolved, symlinks followed, must stay inside it).

    Raises:
        ImageError: Bad base64, a remote URL, a local path not allowed, or unreadable.

    """
    if ref.startswith("data:"):
        head, sep, payload = ref.partition(",")
        if not sep or ";base64" not in head:
            raise ImageError("a data: URL must be base64-encoded (data:image/png;base64,...)")
        try:
            return base64.b64decode("".join(payload.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("the data: URL's base64 payload does not decode") from None
    lower = ref[:8].lower()
    if lower.startswith(("http://", "https://")):
        raise ImageError(
            "image URLs over http(s) are not fetched (this library never opens sockets): "
            "send the image as a base64 data: URL"
        )
    if "://" in ref and not lower.startswith("file://"):
        raise ImageError(f"unsupported image URL scheme in {ref[:40]!r}")
    if allow_local is None:
        raise ImageError(
            "local image paths are refused unless the host allows a directory "
            "(allow_local_images=DIR); send the image as a base64 data: URL"
        )
    path = ref[len("file://"):] if lower.startswith("file://") else ref
    root = os.path.realpath(os.fspath(allow_local))
    target = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, target]) != root:
        raise ImageError("the image path is outside the allowed image directory")
    try:
        with open(target, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ImageError(f"cannot read the image file: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------- token stream
def expand_placeholders(ids: list[int], placeholder: int, counts: list[int]) -> list[int]:
    """Replace the k-th placeholder token of a rendered prompt by `counts[k]` of them.

    Placeholders only come from markup (message text cannot encode control tokens), so
    the prompt holds exactly one per image.

    Raises:
        ValueError: The prompt holds another number of placeholders than images.

    """
    found = ids.count(placeholder)
    if found != len(counts):
        raise ValueError(f"the prompt places {found} images, and {len(counts)} were given")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == placeholder:
            out.extend([placeholder] * counts[k])
            k += 1
        else:
            out.append(t)
    return out


def image_spans(ids: list[int], placeholder: int, counts: list[int]) -> list[int]:
    """Start position of each image's placeholder run in an expanded prompt.

    Raises:
        ValueError: The runs do not match `counts`.

    """
    starts: list[int] = []
    pos, n = 0, len(ids)
    for c in counts:
        while pos < n and ids[pos] != placeholder:
            pos += 1
        if pos + c > n or any(t != placeholder for t in ids[pos:pos + c]):
            raise ValueError("the prompt's placeholder runs do not match the images")
        starts.append(pos)
        pos += c
    if placeholder in ids[pos:]:
        raise ValueError("the prompt holds more placeholder tokens than the images fill")
    return starts
