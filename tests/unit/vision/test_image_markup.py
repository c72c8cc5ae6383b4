"""Each model's media markers rendered as markup around one placeholder per image."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "chat"))
from chat_helpers import GLM_MARKERS, MEDIA_MARKERS, XTML_MARKERS, make_hf  # noqa: E402

from warp_providers.chat.base import ChatFormatError, ImageInfo, M, T  # noqa: E402
from warp_providers.chat.formats.glm import IMAGE_BLOCK, IMAGE_MARKERS, GlmFormat  # noqa: E402
from warp_providers.chat.formats.xtml import XtmlFormat  # noqa: E402
from warp_providers.vision import expand_placeholders, image_spans  # noqa: E402

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _req(text="see <|image|> and <|media_pad|>"):
    return {"messages": [
        {"role": "user", "content": [IMG, {"type": "text", "text": "first"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": text}, IMG, IMG]},
    ]}


def test_glm_places_its_image_block_as_markup():
    tok = make_hf((*GLM_MARKERS, *IMAGE_MARKERS))
    fmt = GlmFormat().bind(tok)
    images = [ImageInfo(10, 20), ImageInfo(30, 40), ImageInfo(5, 5)]
    prompt = fmt.render(_req(), images=images)
    assert sum(1 for s in prompt if s == M(IMAGE_BLOCK)) == 3
    assert T("see <|image|> and <|media_pad|>") in list(prompt)
    ids = fmt.encode(prompt)
    ph = tok.marker_id("<|image|>")
    assert ids.count(ph) == 3  # the marker in user text stayed text
    out = expand_placeholders(ids, ph, [4, 1, 6])
    starts = image_spans(out, ph, [4, 1, 6])
    assert [out[s - 1] for s in starts] == [tok.marker_id("<|begin_of_image|>")] * 3
    assert [out[s + n] for s, n in zip(starts, [4, 1, 6])] == [
        tok.marker_id("<|end_of_image|>")] * 3
    # the image block ends the last user turn: the very last placeholder run precedes the
    # assistant hand-over only by markup
    assert out.count(ph) == 11


def test_glm_without_image_markers_still_refuses_images():
    fmt = GlmFormat().bind(make_hf(GLM_MARKERS))
    with pytest.raises(ChatFormatError, match="image"):
        fmt.render(_req(), images=[ImageInfo(1, 1)] * 3)


def test_k3_places_one_pad_per_image_inside_its_media_block():
    tok = make_hf((*XTML_MARKERS, *MEDIA_MARKERS))
    fmt = XtmlFormat().bind(tok)
    prompt = fmt.render(_req(), images=[ImageInfo(10, 20), ImageInfo(30, 40), ImageInfo(5, 5)])
    ids = fmt.encode(prompt)
    ph = tok.marker_id("<|media_pad|>")
    assert ids.count(ph) == 3
    assert ids.count(tok.marker_id("<|media_begin|>")) == 3
    out = expand_placeholders(ids, ph, [2, 2, 3])
    assert out.count(ph) == 7


def test_expansion_refuses_a_count_mismatch():
    with pytest.raises(ValueError, match="places 1 images"):
        expand_placeholders([1, 9, 2], 9, [3, 3])
    with pytest.raises(ValueError):
        image_spans([1, 9, 9, 2, 9], 9, [2])
