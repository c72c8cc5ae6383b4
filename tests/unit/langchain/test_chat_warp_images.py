"""ChatWarp with image content blocks, on the fake vision tower."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from langchain_core.messages import HumanMessage

from fake_vision import expected_logits, png, vision_engine
from langchain_warp import ChatWarp
from warp_providers import ChatFormatError, ChatSession


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _expected_text(eng, parts):
    prep = ChatSession(eng).prepare([{"role": "user", "content": parts}])
    return eng.tokenizer.decode([int(np.argmax(expected_logits(eng, prep.ids, prep.images)))])


@pytest.mark.parametrize("block", [
    lambda d: {"type": "image", "base64": _b64(d), "mime_type": "image/png"},
    lambda d: {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_b64(d)}"}},
    lambda d: {"type": "image_url", "image_url": f"data:image/png;base64,{_b64(d)}"},
])
def test_image_blocks_reach_the_tower(block):
    eng = vision_engine()
    data = png(50, 70, 1)
    out = ChatWarp(engine=eng, max_tokens=1).invoke(
        [HumanMessage([{"type": "text", "text": "Describe this image."}, block(data)])])
    url = f"data:image/png;base64,{_b64(data)}"
    want = _expected_text(eng, [{"type": "text", "text": "Describe this image."},
                                {"type": "image_url", "image_url": {"url": url}}])
    assert out.content == want
    assert len(eng._ctx.encoded) >= 1


def test_detail_passes_through():
    eng = vision_engine()
    big = _b64(png(900, 1200, 2))
    llm = ChatWarp(engine=eng, max_tokens=1)
    counts = []
    for detail in ("low", "high"):
        msg = HumanMessage([{"type": "image_url",
                             "image_url": {"url": f"data:image/png;base64,{big}",
                                           "detail": detail}}])
        counts.append(llm.invoke([msg]).usage_metadata["input_tokens"])
    assert counts[0] < counts[1]


def test_profile_says_whether_images_are_read():
    assert ChatWarp(engine=vision_engine()).profile["image_inputs"] is True
    assert ChatWarp(engine=vision_engine(vision=False)).profile["image_inputs"] is False


def test_a_model_without_a_tower_refuses():
    llm = ChatWarp(engine=vision_engine(vision=False), max_tokens=1)
    with pytest.raises(ChatFormatError, match="vision tower"):
        llm.invoke([HumanMessage([{"type": "image", "base64": _b64(png(20, 20)),
                                   "mime_type": "image/png"}])])
